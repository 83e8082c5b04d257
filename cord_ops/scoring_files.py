"""Reading a file to score: the input half of ``onnx_export.predict``, kept free of onnx and
onnxruntime so a command can check a file against the model's K and input kind (read from
the model's metadata or its registered run) before it loads the model or opens a session.

The load rule is ``cord_ops.validation.stored_scores`` (one score column is a binary
model's, probability rows renormalised within their dtype's rounding); the layouts are
docs/data-formats.md's.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from cord_ops import data, read_budget
from cord_ops.validation import PROBABILITY_SUM_ATOL, narrowed, stored_scores

WRITTEN = ("repaired", "calibrated", "label", "confidence")
#: Keys looked up in the input archive, in order, when it holds more than one array.
INPUT_KEYS = ("scores", "logits", "probs")
#: Array names that say which input kind the file holds.
KINDS = ("logits", "probs")


def read_input(path, n_classes: int, input_kind: str, dtype: np.dtype):
    """The validated scores of ``path`` (.npz) for a model, as
    ``cord_ops.validation.StoredScores`` with ``scores`` cast to ``dtype``.

    The load rule of every file (``validation.stored_scores``): a binary model's one score
    column becomes two, probability rows are renormalised within their dtype's tolerance.
    Raises ValueError/TypeError naming the file, and for bad values the first bad row:
    a missing or pickled array, a non-float dtype, a shape other than (n >= 1, n_classes)
    (or one column for a binary model), NaN/inf, and for probability models negative
    entries or rows not summing to 1.

    The input kind must match the model's: an array named ``logits`` for a model that reads
    probabilities (or ``probs`` for one that reads logits) is refused, and so is an
    unnamed array of probability rows (non-negative, summing to 1) for a logits model,
    which would run without error and return garbage.
    """
    path = Path(path)
    read_budget.check_npz(path)
    try:
        archive = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: not a readable .npz file ({exc})") from exc
    with archive:
        keys = list(archive.files)
        key = keys[0] if len(keys) == 1 else next((k for k in INPUT_KEYS if k in keys), None)
        if key is None:
            raise ValueError(
                f"{path}: expected one array, or one named {INPUT_KEYS}; found {keys}"
            )
        try:
            scores = archive[key]
        except ValueError as exc:  # object arrays need pickle, which is refused
            raise ValueError(f"{path}: array {key!r} cannot be read without pickle") from exc
    name = f"{path.name}[{key!r}]"
    if key in KINDS and key != input_kind:
        raise ValueError(f"{path}: holds {key} but the model reads {input_kind}")
    if scores.dtype.kind != "f":
        raise TypeError(f"{name}: expected a floating-point array, got dtype {scores.dtype}")
    stored = stored_scores(scores, input_kind, name, n_classes=n_classes)
    if input_kind == "logits" and key not in KINDS and stored.width > 1 \
            and _all_probability_rows(scores):
        raise ValueError(f"{name}: every row is a probability vector (non-negative, sums to 1) "
                         "but the model reads logits; save the array as 'logits' if these "
                         "really are logits")
    return stored._replace(scores=narrowed(stored, dtype))


def read_parquet_input(path, n_classes: int, input_kind: str, dtype: np.dtype):
    """(StoredScores, passthrough table) of a Parquet input for a model reading
    ``input_kind`` with ``n_classes`` columns; validated with the same messages as
    ``cord_ops.data``. The passthrough table is every column but the scores and the true
    ``labels`` (docs/data-formats.md)."""
    where = str(path)
    table = data.read_parquet_table(path)
    stored, _ = data.table_scores(table, where, input_kind)
    if stored.scores.shape[1] != n_classes:
        held = "one score column (a binary model's)" if stored.width == 1 else \
            f"{stored.width} classes"
        raise ValueError(f"{where}: {input_kind} has {held}; the model expects {n_classes}")
    _, columns = data.score_columns(table.column_names, where, input_kind)
    # The true labels stay behind: the output's one label column is the model's top-1.
    passthrough = table.drop_columns(
        [*columns, *([data.LABEL_COLUMN] if data.LABEL_COLUMN in table.column_names else [])])
    clash = sorted(set(passthrough.column_names) & set(WRITTEN))
    if clash:
        raise ValueError(f"{where}: column {clash[0]!r} would be overwritten by the output "
                         f"of the same name; rename it")
    return stored._replace(scores=narrowed(stored, dtype)), passthrough


def read_any_input(path, n_classes: int, input_kind: str, dtype: np.dtype):
    """(StoredScores, passthrough table or None) of an .npz or Parquet input."""
    if data.is_parquet(path):
        return read_parquet_input(path, n_classes, input_kind, dtype)
    return read_input(path, n_classes, input_kind, dtype), None


def _all_probability_rows(scores: np.ndarray) -> bool:
    return bool(np.all(scores >= 0)) and bool(
        np.allclose(scores.sum(axis=1, dtype=np.float64), 1.0, atol=PROBABILITY_SUM_ATOL))
