"""Batch prediction from a saved pipeline model: ``.npz`` or Parquet in, ``.npz`` or
Parquet out.

``predict_file`` validates the whole input before it runs anything, streams it through an
onnxruntime session in batches with a progress bar on stderr, and writes ``repaired``,
``calibrated``, ``label`` and ``confidence`` atomically: a failure at any point leaves no
output file (and an existing one untouched).

Parquet input follows ``cord_ops.data``'s layout (a ``logits``/``probs`` list column or K
numbered columns; docs/data-formats.md). Parquet output (an output path ending in
``.parquet`` or ``.pq``) holds ``label`` (int64), ``confidence``, and ``repaired`` and
``calibrated`` as fixed-size list columns, after every input column that is not a score
column (ids, labels, timestamps), so rows can be joined back to their source.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

from cord_ops import data
from cord_ops.atomic import atomic_path
from cord_ops.validation import PROBABILITY_SUM_ATOL, narrowed, stored_scores
from onnx_export.export import load_model, model_metadata
from onnx_export.runtime import input_dtype, open_session, run_batched

WRITTEN = ("repaired", "calibrated", "label", "confidence")
#: Keys looked up in the input archive, in order, when it holds more than one array.
INPUT_KEYS = ("scores", "logits", "probs")
#: Array names that say which input kind the file holds.
KINDS = ("logits", "probs")


class _StderrBar:
    """Progress on stderr: one line redrawn in place on a terminal; elsewhere (a log file,
    a pipe, CI) a plain newline-terminated line at most every ``every`` seconds plus the
    last one, so lines never run together."""

    def __init__(self, total: int, desc: str, stream=None, every: float = 5.0):
        self.total, self.done, self.desc = total, 0, desc
        self.stream = sys.stderr if stream is None else stream
        isatty = getattr(self.stream, "isatty", None)
        self.terminal, self.every = bool(isatty and isatty()), every
        self.start = self._last = time.perf_counter()
        self._draw(first=True)

    def update(self, rows: int) -> None:
        self.done += rows
        self._draw()

    def _draw(self, first: bool = False) -> None:
        now = time.perf_counter()
        if not (self.terminal or first or self.done >= self.total
                or now - self._last >= self.every):
            return
        self._last = now
        width = 30
        filled = int(width * self.done / self.total) if self.total else width
        rate = self.done / max(now - self.start, 1e-9)
        text = (f"{self.desc} [{'#' * filled}{'.' * (width - filled)}] "
                f"{self.done}/{self.total} rows ({rate:,.0f} rows/s)")
        self.stream.write(f"\r{text}" if self.terminal else f"{text}\n")
        self.stream.flush()

    def close(self) -> None:
        if self.terminal:
            self.stream.write("\n")
            self.stream.flush()


def _progress_bar(total: int, enabled: bool):
    if not enabled:
        return None
    if not sys.stderr.isatty():  # tqdm redraws with carriage returns even in a file
        return _StderrBar(total, "predict")
    try:
        from tqdm import tqdm
    except ImportError:
        return _StderrBar(total, "predict")
    return tqdm(total=total, desc="predict", unit="rows", file=sys.stderr)


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
    ``cord_ops.data``."""
    where = str(path)
    table = data.read_parquet_table(path)
    stored, _ = data.table_scores(table, where, input_kind)
    if stored.scores.shape[1] != n_classes:
        held = "one score column (a binary model's)" if stored.width == 1 else \
            f"{stored.width} classes"
        raise ValueError(f"{where}: {input_kind} has {held}; the model expects {n_classes}")
    _, columns = data.score_columns(table.column_names, where, input_kind)
    passthrough = table.drop_columns(columns)
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


def write_outputs(path, outputs: dict[str, np.ndarray], passthrough=None) -> Path:
    """Write the outputs atomically: Parquet when ``path`` ends in .parquet/.pq (after the
    passthrough columns), .npz otherwise (passthrough columns are then not written)."""
    if not data.is_parquet(path):
        return write_npz_atomic(path, outputs)
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns = {} if passthrough is None else {
        name: passthrough.column(name) for name in passthrough.column_names}
    columns["label"] = outputs["label"]
    columns["confidence"] = outputs["confidence"]
    for name in ("repaired", "calibrated"):
        columns.update(data.score_arrays(outputs[name], name))
    with atomic_path(path) as tmp:
        pq.write_table(pa.table(columns), tmp)
    return Path(path)


def _all_probability_rows(scores: np.ndarray) -> bool:
    return bool(np.all(scores >= 0)) and bool(
        np.allclose(scores.sum(axis=1, dtype=np.float64), 1.0, atol=PROBABILITY_SUM_ATOL))


def write_npz_atomic(path, arrays: dict[str, np.ndarray]) -> Path:
    """Write ``arrays`` to ``path`` via a temp file in the same folder and os.replace."""
    with atomic_path(path) as tmp, open(tmp, "wb") as handle:
        np.savez(handle, **arrays)
    return Path(path)


def predict_file(model_path, input_path, output_path, batch_size: int | None = None,
                 provider: str = "auto", progress: bool = True,
                 threads: int | None = None) -> dict:
    """Run a saved pipeline model on an input file and write the outputs file.

    An .npz input holds one [N, K] float array (or several, one named ``scores``,
    ``logits`` or ``probs``); a Parquet input has the layout of the module docstring. The
    output is Parquet when its name ends in .parquet/.pq, else .npz. Returns a summary:
    rows, n_classes, the input's width, its worst row-sum error before renormalising
    (``sum_error``, at ``sum_error_row``), the session's providers and the output path.
    """
    model = load_model(model_path)
    meta = model_metadata(model)
    try:
        n_classes, input_kind = int(meta["cord.n_classes"]), meta["cord.input_kind"]
    except (KeyError, ValueError) as exc:
        raise ValueError(f"{model_path}: not a cord-ops pipeline model (metadata {exc})") from exc
    if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
        raise ValueError(f"batch_size: expected a positive integer, got {batch_size!r}")
    session = open_session(model, provider=provider, threads=threads)
    stored, passthrough = read_any_input(input_path, n_classes, input_kind,
                                         input_dtype(session))
    scores = stored.scores

    bar = _progress_bar(scores.shape[0], progress)
    try:
        # A lean model (export_onnx(outputs="lean")) has no ``calibrated``: write what it has.
        available = {output.name for output in session.get_outputs()}
        written = [name for name in WRITTEN if name in available]
        outputs = run_batched(session, scores, batch_size=batch_size, outputs=written,
                              on_batch=bar.update if bar is not None else None)
    finally:
        if bar is not None:
            bar.close()
    write_outputs(output_path, outputs, passthrough)
    return {"rows": int(scores.shape[0]), "n_classes": n_classes,
            "input_width": stored.width, "sum_error": stored.sum_error,
            "sum_error_row": stored.sum_error_row,
            "providers": session.get_providers(), "output": str(output_path)}
