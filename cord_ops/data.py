"""Classifier outputs on disk: validated .npz and Parquet loading, atomic saving, the
paper's split, and a bundled miscalibrated dataset (sklearn digits) for fresh clones and the
demo.

An .npz file holds exactly one of ``logits`` or ``probs`` (n x K) and ``labels`` (n,). It is
read with ``allow_pickle=False``; every problem raises before anything is returned, with a
message that starts with the file path and names the array, the row and the expectation.
A binary model's outputs may be one score column, (n,) or (n, 1): the positive class's
probability (``probs``) or a logit / ``decision_function`` margin (``logits``); they load
as the two columns they stand for (``cord_ops.validation.two_columns``). Probability rows
are renormalised once, within the storage dtype's rounding
(``cord_ops.validation.normalised_probabilities``); the worst row's error is kept.

A Parquet file (``.parquet`` / ``.pq``) holds the same data as columns (docs/data-formats.md):
an integer ``labels`` column and the scores either as one list column named ``logits`` or
``probs`` (every row a list of K floats) or as K float columns ``logits_0`` ..
``logits_{K-1}`` (or ``probs_0`` ..); for a binary model also one numeric column ``probs``
or ``logits`` (one score per row) or a list column of one-element lists. Other columns
(ids, timestamps) are ignored here and carried through by ``cord-ops predict``. Messages
name the file, the column and the row.

Parquet is read with pyarrow, imported inside the functions that read it: the numerics of
cord_ops never need it, so ``import cord_ops`` stays numpy/scipy/scikit-learn only and a
caller who only has .npz files needs no pyarrow at all.
"""

from __future__ import annotations

import hashlib
import io
import zipfile
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from cord_ops import read_budget
from cord_ops.atomic import atomic_path
from cord_ops.names import INPUT_KINDS
from cord_ops.validation import check_labels, stored_scores

PARQUET_SUFFIXES = (".parquet", ".pq")
LABEL_COLUMN = "labels"


@dataclass(frozen=True, eq=False)
class Dataset:
    """Classifier outputs and labels of one split.

    ``scores`` is a read-only float64 n x K array of logits or probabilities
    (``input_kind``), ``labels`` a read-only int64 (n,) array in [0, K). ``path`` is the
    source file (None for generated data) and ``sha256`` the hex digest of the source
    file's bytes, or for generated data of the float64 scores' bytes then the int64
    labels' bytes. ``width`` is the number of score columns as stored (1 for a binary
    model's one-column form, else K); ``sum_error`` the worst |row sum - 1| of stored
    probabilities before they were renormalised (one column: the worst distance of p
    outside [0, 1] before it was clipped), in row ``sum_error_row`` (0.0 for logits).
    """

    scores: np.ndarray
    labels: np.ndarray
    input_kind: str
    path: str | None
    sha256: str
    width: int | None = None
    sum_error: float = 0.0
    sum_error_row: int = 0

    def __post_init__(self):
        if self.width is None:
            object.__setattr__(self, "width", int(self.scores.shape[1]))

    @property
    def n(self) -> int:
        return int(self.scores.shape[0])

    @property
    def n_classes(self) -> int:
        return int(self.scores.shape[1])

    def load_note(self) -> str | None:
        """One line on what loading changed (the one-column binary form, renormalised
        probability rows), or None when the file was used as stored."""
        parts = []
        if self.width == 1:
            form = "positive-class probability" if self.input_kind == "probs" else "margin"
            parts.append(f"one score column ({form}) read as two")
        if self.input_kind == "probs" and self.sum_error > 0:
            parts.append(clip_note(self.width, self.sum_error, self.sum_error_row))
        return f"{self.path}: {'; '.join(parts)}" if parts else None

    def probabilities(self) -> np.ndarray:
        """The scores as probabilities: softmax of logits, or the stored probabilities."""
        if self.input_kind == "logits":
            from cord_ops.softmax import softmax

            return softmax(self.scores)
        return self.scores.copy()


def clip_note(width: int, sum_error: float, sum_error_row: int) -> str:
    """What loading did to stored probabilities off by their rounding: rows renormalised,
    or (one score column) values outside [0, 1] clipped."""
    if width == 1:
        return (f"positive-class probabilities clipped to [0, 1], worst row {sum_error_row} "
                f"was {sum_error:.3g} outside")
    return (f"probability rows renormalised, worst row {sum_error_row} "
            f"summed to 1 +- {sum_error:.3g}")


def _frozen(array: np.ndarray) -> np.ndarray:
    array = np.array(array, copy=True)
    array.setflags(write=False)
    return array


def _check_input_kind(input_kind: str, allowed: tuple[str, ...]) -> None:
    if input_kind not in allowed:
        raise ValueError(f"input_kind: expected one of {allowed}, got {input_kind!r}")


def _validated_arrays(scores, labels, input_kind: str, prefix: str):
    """(StoredScores, labels int64) checked for ``input_kind``; errors begin with prefix."""
    stored = stored_scores(scores, input_kind, f"{prefix}{input_kind}")
    n, k = stored.scores.shape
    labels = check_labels(labels, n, k, f"{prefix}labels")
    return stored, labels


def _dataset(stored, labels, kind: str, where: str | None, digest: str) -> Dataset:
    return Dataset(_frozen(stored.scores), _frozen(labels), kind, where, digest,
                   stored.width, stored.sum_error, stored.sum_error_row)


def _read_array(archive, key: str, where: str) -> np.ndarray:
    try:
        array = archive[key]
    except ValueError as exc:
        if "allow_pickle" in str(exc):
            raise ValueError(
                f"{where}: array '{key}' is an object (pickled) array; expected a numeric "
                "array (files are read with allow_pickle=False)"
            ) from None
        raise ValueError(f"{where}: array '{key}' cannot be read ({exc})") from None
    except (OSError, EOFError, zipfile.BadZipFile) as exc:
        raise ValueError(f"{where}: array '{key}' is corrupt ({exc})") from None
    # NpzFile hands back raw bytes for a member without the .npy header
    if not isinstance(array, np.ndarray):
        raise ValueError(f"{where}: array '{key}' is corrupt (member is not in .npy format)")
    return array


def load_npz(path, *, input_kind: str = "auto") -> Dataset:
    """Load and validate classifier outputs from an .npz file.

    The file must hold ``labels`` and exactly one of ``logits`` / ``probs``; ``input_kind``
    "auto" takes whichever is present, "logits" or "probs" additionally requires that one.
    Logits must be finite; probabilities must also be non-negative with rows summing to 1
    within ``validation.sum_tolerance`` of their dtype, and are renormalised. One score
    column is a binary model's (module docstring). Labels must be integers (integer dtype,
    or floats with integral values) in [0, K), one per row. Scores come back as float64
    n x K, labels as int64; the arrays are read-only.

    Raises FileNotFoundError for a missing file, TypeError for non-numeric arrays and
    ValueError for everything else, each message starting with the path; an archive
    that would decompress beyond the read budget, or whose .npy header declares more
    than the file holds, is refused before any array is read (:mod:`cord_ops.read_budget`).
    """
    _check_input_kind(input_kind, ("auto", *INPUT_KINDS))
    where = str(path)
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise FileNotFoundError(f"{where}: no such file") from None
    # numpy answers bytes that are neither .npz nor .npy with advice to enable pickle; say
    # what the file is not instead (a lone .npy array is reported below).
    if not raw.startswith(b"\x93NUMPY") and not zipfile.is_zipfile(io.BytesIO(raw)):
        raise ValueError(f"{where}: not an .npz archive (numpy.savez's zip of .npy arrays); "
                         "expected 'logits' or 'probs' and 'labels'")
    read_budget.check_npz(raw, where)
    try:
        archive = np.load(io.BytesIO(raw), allow_pickle=False)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
        raise ValueError(f"{where}: not a readable .npz archive ({exc})") from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise ValueError(f"{where}: holds a single .npy array; expected an .npz archive with "
                         "'logits' or 'probs' and 'labels'")
    with archive:
        keys = set(archive.files)
        present = [kind for kind in INPUT_KINDS if kind in keys]
        if len(present) != 1:
            found = "both" if present else "neither"
            raise ValueError(f"{where}: holds {found} of 'logits' and 'probs' (arrays: "
                             f"{sorted(keys)}); expected exactly one")
        kind = present[0]
        if input_kind != "auto" and input_kind != kind:
            raise ValueError(f"{where}: input_kind={input_kind!r} but the file holds '{kind}'")
        if "labels" not in keys:
            raise ValueError(f"{where}: missing array 'labels' (arrays: {sorted(keys)})")
        scores = _read_array(archive, kind, where)
        labels = _read_array(archive, "labels", where)
    stored, labels = _validated_arrays(scores, labels, kind, f"{where}: ")
    return _dataset(stored, labels, kind, where, hashlib.sha256(raw).hexdigest())


def is_parquet(path) -> bool:
    """Whether ``path`` names a Parquet file (by its suffix)."""
    return Path(path).suffix.lower() in PARQUET_SUFFIXES


def load(path, *, input_kind: str = "auto") -> Dataset:
    """:func:`load_parquet` for ``.parquet``/``.pq`` files, :func:`load_npz` otherwise."""
    if is_parquet(path):
        return load_parquet(path, input_kind=input_kind)
    return load_npz(path, input_kind=input_kind)


def score_columns(names, where: str, input_kind: str = "auto") -> tuple[str, list[str]]:
    """(kind, columns) of the scores in a table with column ``names``.

    Either one column ``logits``/``probs`` (a list per row, or for a binary model one
    number per row), or ``<kind>_0`` .. ``<kind>_{K-1}``; any
    other layout raises ValueError naming the file and what was found.
    """
    _check_input_kind(input_kind, ("auto", *INPUT_KINDS))
    found = {}
    for kind in INPUT_KINDS:
        numbered = sorted((int(n[len(kind) + 1:]), n) for n in names
                          if n.startswith(kind + "_") and n[len(kind) + 1:].isdigit())
        if kind in names and numbered:
            raise ValueError(f"{where}: holds both a list column '{kind}' and columns "
                             f"{numbered[0][1]}, ...; expected one layout")
        if kind in names:
            found[kind] = [kind]
        elif numbered:
            indices = [i for i, _ in numbered]
            missing = sorted(set(range(max(indices) + 1)) - set(indices))
            if missing or len(indices) < 2:
                gap = (f"missing {kind}_{missing[0]}" if missing else
                       f"only one column (a binary model's one score column is named "
                       f"'{kind}')")
                raise ValueError(f"{where}: score columns must be {kind}_0 .. {kind}_(K-1) "
                                 f"with K >= 2; {gap}")
            found[kind] = [n for _, n in numbered]
    if len(found) != 1:
        which = "both" if found else "neither"
        raise ValueError(f"{where}: holds {which} of 'logits' and 'probs' score columns "
                         f"(columns: {sorted(names)}); expected exactly one layout: a list "
                         "column, or <kind>_0 .. <kind>_(K-1)")
    kind, columns = next(iter(found.items()))
    if input_kind != "auto" and input_kind != kind:
        raise ValueError(f"{where}: input_kind={input_kind!r} but the file holds '{kind}'")
    return kind, columns


def table_scores(table, where: str, input_kind: str = "auto",
                 n_classes: int | None = None):
    """(StoredScores, kind) of a pyarrow Table, validated like :func:`load_npz`.

    Messages name ``where`` (the file), the column and the first bad row: a null, a list of
    the wrong length, a non-numeric column, NaN/inf, and for ``probs`` negative entries or
    rows not summing to 1 within the dtype's tolerance. A numeric column ``logits`` or
    ``probs`` (one score per row), or a list column of one-element lists, is a binary
    model's one score column.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    kind, columns = score_columns(table.column_names, where, input_kind)
    n = table.num_rows
    if n == 0:
        raise ValueError(f"{where}: has no rows; expected at least one")
    if len(columns) == 1 and (pa.types.is_floating(table.schema.field(columns[0]).type)
                              or pa.types.is_integer(table.schema.field(columns[0]).type)):
        scores = _plain_column(table, columns[0], where)  # one binary score per row
    elif len(columns) == 1:  # one list column of K-element rows
        name = columns[0]
        column = table.column(name).combine_chunks()
        kind_type = column.type
        if not (pa.types.is_list(kind_type) or pa.types.is_large_list(kind_type)
                or pa.types.is_fixed_size_list(kind_type)):
            raise TypeError(f"{where}: column '{name}' has type {kind_type}; expected a list "
                            "of floats per row, or one number per row (a binary model)")
        if column.null_count:
            row = int(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))[0])
            raise ValueError(f"{where}: column '{name}': row {row} is null; expected a list "
                             "of scores")
        lengths = pc.list_value_length(column).to_numpy(zero_copy_only=False)
        k = int(lengths[0])
        wrong = lengths != k
        if wrong.any():
            row = int(np.flatnonzero(wrong)[0])
            raise ValueError(f"{where}: column '{name}': row {row} has {lengths[row]} scores; "
                             f"expected {k} like row 0")
        values = pc.list_flatten(column)
        _check_numeric(values.type, where, name)
        if values.null_count:
            flat = int(np.flatnonzero(values.is_null().to_numpy(zero_copy_only=False))[0])
            raise ValueError(f"{where}: column '{name}': row {flat // k} has a null score; "
                             "expected finite values")
        scores = values.to_numpy(zero_copy_only=False).reshape(n, k)
    else:
        scores = np.column_stack([_plain_column(table, name, where) for name in columns])
    return stored_scores(scores, kind, f"{where}: {kind}", n_classes=n_classes), kind


def _plain_column(table, name: str, where: str) -> np.ndarray:
    """A numeric column without nulls or NaN/inf as a numpy array (its own dtype)."""
    column = table.column(name)
    _check_numeric(column.type, where, name)
    if column.null_count:
        row = int(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))[0])
        raise ValueError(f"{where}: column '{name}': row {row} is null; expected "
                         "finite values")
    values = column.to_numpy()
    bad = ~np.isfinite(values)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{where}: column '{name}': row {row} is "
                         f"{values[row].item()!r}; expected finite values")
    return values


def _check_numeric(arrow_type, where: str, name: str) -> None:
    import pyarrow as pa

    if not (pa.types.is_floating(arrow_type) or pa.types.is_integer(arrow_type)):
        raise TypeError(f"{where}: column '{name}' holds {arrow_type}; expected numbers")


def read_parquet_table(path, columns=None):
    """The pyarrow Table of a Parquet file; a missing or unreadable file, or one that
    decompresses beyond the read budget (:mod:`cord_ops.read_budget`), raises naming it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    where = str(path)
    if not Path(path).is_file():
        raise FileNotFoundError(f"{where}: no such file")
    read_budget.check_parquet(path, where)
    try:
        return pq.read_table(path, columns=columns)
    except (pa.ArrowException, OSError) as exc:
        raise ValueError(f"{where}: not a readable Parquet file ({exc})") from None


def load_parquet(path, *, input_kind: str = "auto") -> Dataset:
    """Load and validate classifier outputs and labels from a Parquet file (module docstring).

    The same checks and exceptions as :func:`load_npz`; messages start with the path and
    name the column and the row.
    """
    _check_input_kind(input_kind, ("auto", *INPUT_KINDS))
    where = str(path)
    table = read_parquet_table(path)
    if LABEL_COLUMN not in table.column_names:
        raise ValueError(f"{where}: missing column '{LABEL_COLUMN}' (columns: "
                         f"{sorted(table.column_names)})")
    stored, kind = table_scores(table, where, input_kind)
    scores = stored.scores
    column = table.column(LABEL_COLUMN)
    _check_numeric(column.type, where, LABEL_COLUMN)
    if column.null_count:
        row = int(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))[0])
        raise ValueError(f"{where}: column '{LABEL_COLUMN}': row {row} is null; expected an "
                         "integer class label")
    labels = check_labels(column.to_numpy(), scores.shape[0], scores.shape[1],
                          f"{where}: column '{LABEL_COLUMN}'")
    digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    return _dataset(stored, labels, kind, where, digest)


def save_npz(path, scores, labels, input_kind: str) -> Path:
    """Validate, then write ``{input_kind: scores, "labels": labels}`` to ``path`` atomically.

    The arrays are validated exactly as :func:`load_npz` would (so a saved file always
    loads) and stored as :func:`load_npz` returns them: float64 n x K scores (a binary
    one-column input as its two columns, probability rows renormalised) and int64 labels.
    The archive is written to a temporary file in the destination folder and moved into
    place with ``os.replace``: a failure leaves no partial file and an existing file either
    intact or wholly replaced. Returns the path.
    """
    _check_input_kind(input_kind, INPUT_KINDS)
    target = Path(path)
    scores, labels = _validated_arrays(scores, labels, input_kind, "")
    scores = scores.scores
    with atomic_path(target) as tmp, open(tmp, "wb") as handle:
        np.savez(handle, **{input_kind: scores, "labels": labels})
    return target


def save_parquet(path, scores, labels, input_kind: str, *, layout: str = "list") -> Path:
    """Validate, then write scores and labels to a Parquet file atomically.

    ``layout="list"`` writes one list column named ``input_kind``, ``"columns"`` writes K
    float64 columns ``<input_kind>_0`` ..; both with an int64 ``labels`` column, so the file
    loads with :func:`load_parquet`. Same validation and atomicity as :func:`save_npz`.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    _check_input_kind(input_kind, INPUT_KINDS)
    if layout not in ("list", "columns"):
        raise ValueError(f"layout: expected 'list' or 'columns', got {layout!r}")
    scores, labels = _validated_arrays(scores, labels, input_kind, "")
    scores = scores.scores
    table = pa.table({**score_arrays(scores, input_kind, layout), LABEL_COLUMN: labels})
    target = Path(path)
    with atomic_path(target) as tmp:
        pq.write_table(table, tmp)
    return target


def score_arrays(scores: np.ndarray, name: str, layout: str = "list") -> dict:
    """Arrow columns of an n x K array: one fixed-size list column ``name``, or K columns
    ``name_0`` .. (the layouts :func:`table_scores` reads)."""
    import pyarrow as pa

    scores = np.ascontiguousarray(scores)
    if layout == "columns":
        return {f"{name}_{j}": scores[:, j] for j in range(scores.shape[1])}
    flat = pa.array(scores.reshape(-1))
    return {name: pa.FixedSizeListArray.from_arrays(flat, scores.shape[1])}


def split_indices(n: int, seed: int, fraction: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
    """The paper's split protocol: (calibration rows, evaluation rows).

    perm = np.random.default_rng(seed).permutation(n); the first round(fraction * n)
    entries of perm are the calibration rows and the rest the evaluation rows (Python's
    round, half to even). Deterministic in (n, seed, fraction); both parts are non-empty.
    """
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 2:
        raise ValueError(f"n: expected an integer >= 2 rows to split, got {n!r}")
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise ValueError(f"seed: expected a non-negative integer, got {seed!r}")
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"fraction: expected a calibration fraction in (0, 1), got {fraction!r}")
    n_cal = round(fraction * n)
    if not 0 < n_cal < n:
        raise ValueError(f"fraction: {fraction!r} of {n} rows leaves an empty split")
    perm = np.random.default_rng(seed).permutation(n)
    return perm[:n_cal], perm[n_cal:]


def split(dataset: Dataset, seed: int, fraction: float = 0.5) -> tuple[Dataset, Dataset]:
    """(calibration, evaluation) subsets of ``dataset`` by :func:`split_indices`.

    Both keep the source's ``input_kind``, ``path`` and ``sha256`` (provenance of the file).
    """
    cal_idx, eval_idx = split_indices(dataset.n, seed, fraction)
    return tuple(
        replace(dataset, scores=_frozen(dataset.scores[idx]), labels=_frozen(dataset.labels[idx]))
        for idx in (cal_idx, eval_idx)
    )


#: Inverse L2 strength of the digits classifier: regularisation is nearly off, so the
#: classifier fits its training half perfectly and its held-out logits are overconfident.
DIGITS_INVERSE_REGULARIZATION = 1e4


def digits_dataset(seed: int = 0) -> Dataset:
    """Held-out logits of a real, overconfident classifier on sklearn's bundled digits.

    sklearn's ``load_digits`` (1,797 8x8 images, K = 10, no network) is split with
    :func:`split_indices` (seed, fraction 0.5: 898 training rows); a multinomial
    ``LogisticRegression`` (lbfgs, C = 1e4, i.e. almost no L2 penalty, pixels scaled to
    [0, 1]) is trained on the first part and the other 899 rows' ``decision_function``
    values (pre-softmax logits) are returned with their labels. Training to separation
    without regularisation inflates the logits, so the softmax is overconfident (mean
    confidence 0.99 against accuracy 0.954, ECE 0.037 for seed 0): miscalibration for
    calibrators to fix. Deterministic in ``seed``; ``path`` is None.
    """
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression

    images, targets = load_digits(return_X_y=True)
    features = images / 16.0
    train_idx, held_idx = split_indices(targets.shape[0], seed)
    model = LogisticRegression(C=DIGITS_INVERSE_REGULARIZATION, max_iter=10_000)
    model.fit(features[train_idx], targets[train_idx])
    logits = model.decision_function(features[held_idx]).astype(np.float64)
    labels = targets[held_idx].astype(np.int64)
    digest = hashlib.sha256(logits.tobytes() + labels.tobytes()).hexdigest()
    return Dataset(_frozen(logits), _frozen(labels), "logits", None, digest)
