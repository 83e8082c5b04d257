"""Batch prediction from a saved pipeline model: ``.npz`` or Parquet in, ``.npz`` or
Parquet out.

``predict_file`` validates the whole input before it runs anything, streams it through an
onnxruntime session in batches with a progress bar on stderr, and writes ``repaired``,
``calibrated``, ``label`` and ``confidence`` atomically: a failure at any point leaves no
output file (and an existing one untouched).

Parquet input follows ``cord_ops.data``'s layout (a ``logits``/``probs`` list column or K
numbered columns; docs/data-formats.md). Parquet output (an output path ending in
``.parquet`` or ``.pq``) holds ``label`` (int64), ``confidence``, and ``repaired`` and
``calibrated`` as fixed-size list columns, after every input column that is neither a
score column nor the true ``labels`` (ids, timestamps), so rows can be joined back to
their source; ``label`` is the only label column of the output.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

from cord_ops import data
from cord_ops.atomic import atomic_path
from cord_ops.scoring_files import (  # noqa: F401 - the reading half lives in cord_ops
    INPUT_KEYS,
    KINDS,
    WRITTEN,
    read_any_input,
    read_input,
    read_parquet_input,
)
from onnx_export.export import load_model, pipeline_input
from onnx_export.runtime import input_dtype, open_session, run_batched


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
    n_classes, input_kind = pipeline_input(model, model_path)
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
