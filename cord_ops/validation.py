"""Input validation shared by every public entry point of cord_ops.

Each check raises before any state is touched, with a message that names the array,
the first offending row and what was expected. Arrays come back as float64 (scores,
probabilities) or int64 (labels) so the numerics downstream need no further checks.
"""

from __future__ import annotations

import numpy as np

#: Rows of a probability array must sum to 1 within this absolute tolerance. It is loose
#: enough for float32 softmax outputs of K = 1,000 classes and tight enough to catch
#: logits or unnormalised scores passed by mistake.
PROBABILITY_SUM_ATOL = 1e-4


def _first_row(mask: np.ndarray) -> int:
    """Index of the first row where ``mask`` (n,) or (n, K) is true."""
    rows = mask if mask.ndim == 1 else mask.any(axis=1)
    return int(np.flatnonzero(rows)[0])


def check_layout(x, name: str = "scores", *, n_classes: int | None = None) -> np.ndarray:
    """The checks of ``check_scores`` that need no pass over the values: a real numeric
    dtype, rank 2, n >= 1, K >= 2 and K == ``n_classes`` when given. Returns the array as
    given (no dtype conversion, no copy)."""
    arr = np.asarray(x)
    if arr.dtype == object or arr.dtype.kind not in "iuf":
        raise TypeError(
            f"{name}: expected a real numeric array, got dtype {arr.dtype!s}"
        )
    if arr.ndim != 2:
        raise ValueError(f"{name}: expected a 2-D array (n, K), got shape {arr.shape}")
    n, k = arr.shape
    if n == 0:
        raise ValueError(f"{name}: expected at least one row, got shape {arr.shape}")
    if k < 2:
        raise ValueError(f"{name}: expected K >= 2 classes, got shape {arr.shape}")
    if n_classes is not None and k != n_classes:
        raise ValueError(f"{name}: expected {n_classes} classes (columns), got {k}")
    return arr


def check_scores(x, name: str = "scores", *, n_classes: int | None = None) -> np.ndarray:
    """Validate an n x K real array (logits or probabilities) and return it as float64.

    Rejects object/string/bool/complex dtypes, rank other than 2, n == 0, K < 2, a width
    other than ``n_classes`` when given, and NaN/inf entries.
    """
    arr = check_layout(x, name, n_classes=n_classes).astype(np.float64, copy=False)
    # min/max propagate NaN and expose inf without an n x K temporary; the row is only
    # searched for once something is wrong.
    if not (np.isfinite(arr.min()) and np.isfinite(arr.max())):
        row = _first_row(~np.isfinite(arr))
        raise ValueError(f"{name}: row {row} contains NaN or inf; expected finite values")
    return arr


def check_probabilities(
    p, name: str = "probabilities", *, n_classes: int | None = None,
    atol: float = PROBABILITY_SUM_ATOL,
) -> np.ndarray:
    """Validate an n x K array of probability rows (non-negative, rows summing to 1)."""
    arr = check_scores(p, name, n_classes=n_classes)
    if arr.min() < 0:
        row = _first_row(arr < 0)
        raise ValueError(
            f"{name}: row {row} has a negative entry ({arr[row].min().item()!r}); "
            "expected probabilities >= 0"
        )
    sums = arr.sum(axis=1)
    off = np.abs(sums - 1.0) > atol
    if off.any():
        row = _first_row(off)
        raise ValueError(
            f"{name}: row {row} sums to {sums[row].item()!r}; expected rows summing to 1 "
            f"within {atol:g}"
        )
    return arr


def check_labels(y, n_rows: int, n_classes: int, name: str = "labels") -> np.ndarray:
    """Validate integer class labels in [0, n_classes) for ``n_rows`` examples."""
    arr = np.asarray(y)
    if arr.dtype == object or arr.dtype.kind not in "iuf":
        raise TypeError(f"{name}: expected integer class labels, got dtype {arr.dtype!s}")
    if arr.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D array (n,), got shape {arr.shape}")
    if arr.shape[0] != n_rows:
        raise ValueError(f"{name}: expected {n_rows} labels (one per row), got {arr.shape[0]}")
    if arr.dtype.kind == "f":
        bad = ~np.isfinite(arr) | (arr != np.round(arr))
        if bad.any():
            row = _first_row(bad)
            raise ValueError(
                f"{name}: row {row} is {arr[row].item()!r}; expected an integer class label"
            )
    out_of_range = (arr < 0) | (arr >= n_classes)
    if out_of_range.any():
        row = _first_row(out_of_range)
        raise ValueError(
            f"{name}: row {row} is {arr[row].item()!r}; expected a class in [0, {n_classes})"
        )
    return arr.astype(np.int64)


def check_class_labels(y, n_rows: int, n_classes: int,
                       name: str = "labels") -> tuple[np.ndarray, np.ndarray]:
    """(classes, codes): the K column labels and each row's column index in [0, K).

    Numeric labels go through ``check_labels`` (integers in [0, K), classes 0 .. K-1, a
    class may be absent). Any other labels (strings, booleans) must be orderable and take
    exactly ``n_classes`` distinct values, matched to the columns in sorted order: the
    scikit-learn convention that column k of ``predict_proba`` belongs to ``classes_[k]``.
    """
    arr = np.asarray(y)
    if arr.dtype != object and arr.dtype.kind in "iuf":
        return np.arange(n_classes), check_labels(arr, n_rows, n_classes, name)
    if arr.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D array (n,), got shape {arr.shape}")
    if arr.shape[0] != n_rows:
        raise ValueError(f"{name}: expected {n_rows} labels (one per row), got {arr.shape[0]}")
    if arr.dtype.kind not in "USbO":
        raise TypeError(f"{name}: expected class labels (integers or strings), got dtype "
                        f"{arr.dtype!s}")
    if arr.dtype == object:
        kinds = [type(v) for v in arr]
        first = kinds[0]
        allowed = (str, bool, np.str_, np.bool_)
        odd = [i for i, kind in enumerate(kinds) if kind is not first or kind not in allowed]
        if odd:
            row = odd[0]
            raise TypeError(
                f"{name}: row {row} is {arr[row]!r} ({type(arr[row]).__name__}); expected "
                f"labels of one type, all strings or all booleans (row 0 is {first.__name__})"
            )
    classes, codes = np.unique(arr, return_inverse=True)
    if classes.shape[0] != n_classes:
        raise ValueError(
            f"{name}: {classes.shape[0]} distinct labels for {n_classes} score columns; "
            "non-integer labels are matched to the columns in sorted order, so exactly "
            f"{n_classes} must appear (or pass integer labels in [0, {n_classes}))"
        )
    return classes, codes.reshape(-1).astype(np.int64)


def check_pair(first: np.ndarray, second: np.ndarray, names: tuple[str, str]) -> None:
    """Both arrays must have the same number of rows and classes."""
    if first.shape[0] != second.shape[0]:
        raise ValueError(
            f"{names[1]}: expected {first.shape[0]} rows to match {names[0]}, "
            f"got {second.shape[0]}"
        )
    if first.shape[1] != second.shape[1]:
        raise ValueError(
            f"{names[1]}: expected {first.shape[1]} classes to match {names[0]}, "
            f"got {second.shape[1]}"
        )


def top1(probs: np.ndarray) -> np.ndarray:
    """Top-1 class per row with the paper's tie rule: the smallest maximizing index.

    ``np.argmax`` returns the first occurrence of the maximum, which is exactly that rule;
    every module calls this function so the rule lives in one place.
    """
    return np.argmax(probs, axis=1)


#: Bytes of one float64 block in a row-blocked sweep: the few blocks a sweep keeps live
#: (input rows, a working copy) stay in a 2 MiB per-core L2 cache, so each n x K input is
#: read from memory once however many row reductions a block needs.
BLOCK_BYTES = 1 << 19


def row_blocks(n: int, k: int, block_bytes: int | None = None):
    """Consecutive row slices covering range(n), each about ``block_bytes`` of float64."""
    rows = max(1, (BLOCK_BYTES if block_bytes is None else block_bytes) // (8 * k))
    for start in range(0, n, rows):
        yield slice(start, min(start + rows, n))


def probability_rows_ok(block: np.ndarray, row_min: np.ndarray, row_max: np.ndarray,
                        atol: float = PROBABILITY_SUM_ATOL, sums: np.ndarray | None = None
                        ) -> bool:
    """Whether a float64 block passes ``check_probabilities``' value checks, given its row
    minima and maxima: every entry finite and >= 0, every row summing to 1 within ``atol``.

    Row-wise form of the same tests (a NaN or inf shows in the row's min or max, the sums
    are the same per-row sums), so a sweep can run them block by block and call
    ``check_probabilities`` only to word the error when this returns False. ``sums`` are
    the block's row sums when the caller has them (else ``block.sum(axis=1)``).
    """
    if not (np.isfinite(row_min).all() and np.isfinite(row_max).all()):
        return False
    if (row_min < 0).any():
        return False
    if sums is None:
        sums = block.sum(axis=1)
    return not (np.abs(sums - 1.0) > atol).any()

