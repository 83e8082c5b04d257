"""Input validation shared by every public entry point of cord_ops.

Each check raises before any state is touched, with a message that names the array,
the first offending row and what was expected. Arrays come back as float64 (scores,
probabilities) or int64 (labels) so the numerics downstream need no further checks.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

#: Rows of a probability array must sum to 1 within this absolute tolerance. It is loose
#: enough for float32 softmax outputs of K = 1,000 classes and tight enough to catch
#: logits or unnormalised scores passed by mistake.
PROBABILITY_SUM_ATOL = 1e-4
#: A probability file's rows may miss 1 by up to SUM_TOLERANCE_ULPS * K * eps(storage
#: dtype) (and always by PROBABILITY_SUM_ATOL): a softmax computed in the storage dtype
#: rounds each of its K exponentials, their sum and each quotient, about K + 2 roundings of
#: eps/2 per row, and 8 leaves room for a producer's own extra steps (a clip, a cast).
SUM_TOLERANCE_ULPS = 8


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


def _check_non_negative(arr: np.ndarray, name: str) -> None:
    if arr.min() < 0:
        row = _first_row(arr < 0)
        raise ValueError(
            f"{name}: row {row} has a negative entry ({arr[row].min().item()!r}); "
            "expected probabilities >= 0"
        )


def check_probabilities(
    p, name: str = "probabilities", *, n_classes: int | None = None,
    atol: float = PROBABILITY_SUM_ATOL,
) -> np.ndarray:
    """Validate an n x K array of probability rows (non-negative, rows summing to 1)."""
    arr = check_scores(p, name, n_classes=n_classes)
    _check_non_negative(arr, name)
    sums = arr.sum(axis=1)
    off = np.abs(sums - 1.0) > atol
    if off.any():
        row = _first_row(off)
        raise ValueError(
            f"{name}: row {row} sums to {sums[row].item()!r}; expected rows summing to 1 "
            f"within {atol:g}"
        )
    return arr


def sum_tolerance(dtype, n_classes: int) -> float:
    """How far a stored probability row of ``n_classes`` entries in ``dtype`` may miss 1.

    max(PROBABILITY_SUM_ATOL, SUM_TOLERANCE_ULPS * K * eps(dtype)): 1e-4 for float64 files
    (which often hold float32 softmax outputs upcast), 1e-4 for float32 up to K = 104
    (9.5e-4 at K = 1,000), 0.016 for float16 at K = 2 and 0.078 at K = 10. Integer arrays
    (exact 0/1 rows) are held to float64's.
    """
    dtype = np.dtype(dtype)
    eps = float(np.finfo(dtype if dtype.kind == "f" else np.float64).eps)
    return max(PROBABILITY_SUM_ATOL, SUM_TOLERANCE_ULPS * int(n_classes) * eps)


def normalised_probabilities(p, name: str = "probabilities", *,
                             n_classes: int | None = None) -> tuple[np.ndarray, float, int]:
    """(rows divided by their sums as float64, worst |row sum - 1|, its row) of a stored
    probability array: the one load rule for files, batches, payloads and shards.

    The array must pass :func:`check_scores`, be non-negative, and every row must sum to 1
    within :func:`sum_tolerance` of its own dtype; then each row is divided once by its
    float64 sum, so every row sums to 1 to float64 rounding and no entry exceeds 1 (a
    non-negative entry is at most its row's sum). Exact zeros, exact ones and ties stay
    what they are (equal entries divided by one sum stay equal). Rows already summing to 1
    are returned unchanged, and so is a float32/float16 row whose two largest entries,
    one ulp apart, would round to a tie when the renormalised row is cast back to its
    storage dtype (as a float32 graph's input is): within the tolerance it is used as
    stored, its top-1 intact. A refusal names the row, its sum and the tolerance.
    """
    stored = np.asarray(p)
    arr = check_scores(stored, name, n_classes=n_classes)
    _check_non_negative(arr, name)
    sums = arr.sum(axis=1)
    off = np.abs(sums - 1.0)
    worst_row = int(np.argmax(off))
    worst = float(off[worst_row])
    tolerance = sum_tolerance(stored.dtype, arr.shape[1])
    if worst > tolerance:
        row = _first_row(off > tolerance)
        raise ValueError(
            f"{name}: row {row} sums to {sums[row].item()!r}; expected rows summing to 1 "
            f"within {tolerance:.3g} ({SUM_TOLERANCE_ULPS} x K x eps({stored.dtype}), at "
            f"least {PROBABILITY_SUM_ATOL:g})"
        )
    if worst > 0:
        scaled = arr / sums[:, None]
        if stored.dtype.kind == "f" and stored.dtype.itemsize < 8:
            # Keep rows whose top-1 a cast back to the storage dtype would tie (see
            # narrowed): a float32 graph fed these rows must see the stored order.
            moved = top1(scaled.astype(stored.dtype)) != top1(arr)
            scaled[moved] = arr[moved]
        arr = scaled
    return arr, worst, worst_row


#: Binary scores logged as one column: the positive class's probability p, or a logit /
#: decision_function margin m. Either becomes the two columns every calibrator reads.
ONE_COLUMN_FORMS = {"probs": "p -> [1 - p, p]", "logits": "m -> [0, m]"}


def is_one_column(x) -> bool:
    """Whether ``x`` has the one-score-column binary shape: (n,) or (n, 1)."""
    shape = np.shape(x)
    return len(shape) == 1 or (len(shape) == 2 and shape[1] == 1)


def two_columns(x, kind: str, name: str = "scores") -> np.ndarray:
    """One binary score column, (n,) or (n, 1), as the n x 2 float64 scores it stands for.

    ``probs``: p -> [1 - p, p] (p the positive class's probability, in [0, 1] within
    :func:`one_column_tolerance`, see :func:`one_column_probabilities`); ``logits``:
    m -> [0, m], the logits whose softmax is [sigmoid(-m), sigmoid(m)], exact for any
    finite margin (class 1 is the positive class, as in scikit-learn's
    ``decision_function``). Both rows sum to 1 to float64 rounding, and a tie (p = 1/2,
    m = 0) keeps class 0 on top under the tie rule.
    """
    if kind == "probs":
        return one_column_probabilities(x, name)[0]
    column = _column(x, name)
    return np.column_stack([np.zeros_like(column), column])


def _column(x, name: str) -> np.ndarray:
    arr = np.asarray(x)
    return _one_column_values(arr[:, 0] if arr.ndim == 2 else arr, name)


def one_column_tolerance(dtype) -> float:
    """How far a stored positive-class probability in ``dtype`` may lie outside [0, 1]:
    :func:`sum_tolerance` of a two-column row, since p stands for the row [1 - p, p] and
    p > 1 is the row [0, p] whose sum misses 1 by p - 1 (1e-4 for float32 and float64)."""
    return sum_tolerance(dtype, 2)


def one_column_probabilities(x, name: str = "scores") -> tuple[np.ndarray, float, int]:
    """(n x 2 rows [1 - p, p], worst distance of a stored p outside [0, 1], its row) of
    one stored positive-class probability column: the column twin of
    :func:`normalised_probabilities`.

    A float32 ``predict_proba(X)[:, 1]`` can exceed 1 (or fall below 0) by its rounding;
    within :func:`one_column_tolerance` of its dtype such a p is clipped once to [0, 1]:
    the same row the two-column form [0, p] gives after renormalising (p / p = 1), so both
    forms load to the same bits and the same uncalibrated NLL. The excess is reported as
    the row-sum error is (``StoredScores.sum_error``). Beyond the tolerance the first such
    row is refused, naming its value.
    """
    stored = np.asarray(x)
    column = _column(stored, name)
    tolerance = one_column_tolerance(stored.dtype)
    clipped = np.clip(column, 0.0, 1.0)
    off = np.abs(column - clipped)
    worst_row = int(np.argmax(off))
    worst = float(off[worst_row])
    if worst > tolerance:
        row = int(np.flatnonzero(off > tolerance)[0])
        raise ValueError(f"{name}: row {row} is {column[row].item()!r}; expected a "
                         "positive-class probability in [0, 1] (one score column)")
    return np.column_stack([1.0 - clipped, clipped]), worst, (worst_row if worst else 0)


class StoredScores(NamedTuple):
    """Scores as the numerics read them, and what loading did to reach that form."""

    #: n x K float64: two columns for a one-column binary input, rows renormalised for probs
    scores: np.ndarray
    #: columns as stored: 1 for the one-score-column binary form, else K
    width: int
    #: worst |row sum - 1| before renormalising (for one probability column the worst
    #: distance of p outside [0, 1] before clipping; 0.0 for logits)
    sum_error: float
    #: the row where that was (0 when nothing was off)
    sum_error_row: int
    #: the array as given (for :func:`narrowed`)
    stored: np.ndarray | None = None


def stored_scores(x, kind: str, name: str = "scores", *,
                  n_classes: int | None = None) -> StoredScores:
    """The load rule of every file, batch, payload and shard: a stored ``kind`` array
    (``logits`` or ``probs``) as validated float64 n x K scores.

    One score column, (n,) or (n, 1), is a binary model's (:func:`two_columns`) where
    ``n_classes`` is 2 or not given; probability rows are renormalised within the storage
    dtype's tolerance (:func:`normalised_probabilities`); logits must be finite
    (:func:`check_scores`). Messages name ``name``, the row and the expectation.
    """
    if kind not in ("logits", "probs"):
        raise ValueError(f"kind: expected 'logits' or 'probs', got {kind!r}")
    shape = np.shape(x)
    if n_classes == 2 and len(shape) == 2 and shape[1] != 2 and not is_one_column(x):
        raise ValueError(f"{name}: expected 2 classes (columns), or one score column for "
                         f"this binary model, got {shape[1]}")
    if is_one_column(x) and n_classes in (None, 2):
        # [1 - p, p] sums to 1 by construction (to float64 rounding): nothing to renormalise
        if kind == "probs":
            scores, worst, row = one_column_probabilities(x, name)
            return StoredScores(scores, 1, worst, row, np.asarray(x))
        return StoredScores(two_columns(x, kind, name), 1, 0.0, 0, np.asarray(x))
    if kind == "probs":
        scores, worst, row = normalised_probabilities(x, name, n_classes=n_classes)
        return StoredScores(scores, scores.shape[1], worst, row, np.asarray(x))
    scores = check_scores(x, name, n_classes=n_classes)
    return StoredScores(scores, scores.shape[1], 0.0, 0, np.asarray(x))


def narrowed(loaded: StoredScores, dtype) -> np.ndarray:
    """The scores of :func:`stored_scores` in a graph's ``dtype``, top-1 kept on every row.

    Renormalising moves two entries one float32 ulp apart by a relative (1 - sum), and the
    cast back to float32 can then round them to the same value, a tie the graph would give
    to the smaller index (6 rows in 300,000 such near-ties off by up to 9e-5). Those rows
    take the stored row itself, whose order is the original's.
    """
    scores, stored = loaded.scores, loaded.stored
    out = np.ascontiguousarray(scores, dtype=dtype)
    if out.dtype == scores.dtype or stored is None or stored.shape != scores.shape:
        return out
    moved = top1(out) != top1(scores)
    if moved.any():
        out[moved] = stored[moved]
    return out


def _one_column_values(arr: np.ndarray, name: str) -> np.ndarray:
    """The checks of :func:`check_scores` for a single score column, as float64."""
    if arr.dtype == object or arr.dtype.kind not in "iuf":
        raise TypeError(f"{name}: expected a real numeric array, got dtype {arr.dtype!s}")
    if arr.shape[0] == 0:
        raise ValueError(f"{name}: expected at least one row, got shape {arr.shape}")
    column = arr.astype(np.float64, copy=False)
    if not (np.isfinite(column.min()) and np.isfinite(column.max())):
        row = int(np.flatnonzero(~np.isfinite(column))[0])
        raise ValueError(f"{name}: row {row} contains NaN or inf; expected finite values")
    return column


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
#: (input rows, a working copy) stay in a core's L2 cache, so each n x K input is
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

