"""onnxruntime sessions for exported pipelines: provider choice, threads, quiet logs,
batched runs.

``provider``: "cpu" runs on CPUExecutionProvider; "cuda" requires CUDAExecutionProvider
(the ``gpu`` extra installs onnxruntime-gpu) and a visible GPU, and raises otherwise;
"auto" uses CUDA when both are there and the CPU otherwise.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from onnx_export.export import compute_itemsize

PROVIDERS = ("auto", "cpu", "cuda")
CPU, CUDA = "CPUExecutionProvider", "CUDAExecutionProvider"
#: onnxruntime log severity for quiet sessions: 3 = errors only.
QUIET_SEVERITY = 3


def cuda_available() -> bool:
    """Whether this onnxruntime build has the CUDA provider (it still needs a GPU to run)."""
    return CUDA in ort.get_available_providers()


def open_session(model, provider: str = "auto", threads: int | None = None,
                 quiet: bool = True, spin: bool = True) -> ort.InferenceSession:
    """An InferenceSession for ``model`` (a path, serialized bytes or a ModelProto).

    ``threads`` sets the intra-op thread count (None: onnxruntime's default, one per core).
    ``spin=False`` lets idle intra-op threads sleep instead of spinning between operations
    (onnxruntime's ``session.intra_op.allow_spinning``): on a machine whose cores other
    processes also use, spinning threads take the CPU the working ones need (two spinning
    threads ran a lean VS graph 2.6x slower than one thread at load average 6 on 2 cores;
    without spinning, as fast). With ``quiet`` onnxruntime logs errors only. Raises
    RuntimeError when "cuda" is asked for and the session cannot place the graph on
    CUDAExecutionProvider.
    """
    if provider not in PROVIDERS:
        raise ValueError(f"provider: expected one of {PROVIDERS}, got {provider!r}")
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads: expected a positive integer, got {threads!r}")
    if provider == "cuda" and not cuda_available():
        raise RuntimeError(
            "provider 'cuda': this onnxruntime has no CUDAExecutionProvider; install the "
            "gpu extra (pip install 'cord-ops[gpu]', which brings onnxruntime-gpu)"
        )
    providers = [CUDA, CPU] if provider == "cuda" or (provider == "auto" and cuda_available()) \
        else [CPU]
    options = ort.SessionOptions()
    if threads is not None:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    if quiet:
        options.log_severity_level = QUIET_SEVERITY
    if not spin:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if isinstance(model, onnx.ModelProto):
        model = model.SerializeToString()
    elif isinstance(model, str | Path):
        model = str(model)
    session = ort.InferenceSession(model, sess_options=options, providers=providers)
    if provider == "cuda" and CUDA not in session.get_providers():
        raise RuntimeError(
            "provider 'cuda': CUDAExecutionProvider is installed but could not start "
            "(no visible GPU or CUDA libraries missing)"
        )
    return session


def input_dtype(session: ort.InferenceSession) -> np.dtype:
    """The numpy dtype of the session's single input."""
    kind = session.get_inputs()[0].type
    return {"tensor(float)": np.dtype(np.float32),
            "tensor(double)": np.dtype(np.float64)}[kind]


#: Rows per batch are chosen so that each thread's share of a [rows, K] intermediate takes
#: about this many bytes and stays in its core's L2 cache (1 MiB on the development
#: machine): with 2**20-element batches (8 MiB in float64) the isotonic graphs ran 1.4x
#: slower than with 2**17 on one thread, and VS float32 at K = 1,000 1.15x slower than
#: with 2**18. More threads take proportionally more rows, which also spreads each
#: operation's fixed cost of waking them over more rows.
BATCH_BYTES = 1 << 20
#: Bounds on the rows per batch: fewer rows let per-node overhead dominate, more gain
#: nothing once it is amortised.
MIN_BATCH_ROWS, MAX_BATCH_ROWS = 64, 16384


def default_batch_size(n_classes: int, itemsize: int = 4, threads: int = 1) -> int:
    """Rows per batch for K classes computed with ``itemsize``-byte numbers on ``threads``
    threads: about BATCH_BYTES per thread and [rows, K] intermediate, between
    MIN_BATCH_ROWS and MAX_BATCH_ROWS."""
    rows = max(1, threads) * BATCH_BYTES // (max(1, n_classes) * itemsize)
    return int(min(MAX_BATCH_ROWS, max(MIN_BATCH_ROWS, rows)))


def session_batch_size(session: ort.InferenceSession, width: int) -> int:
    """default_batch_size for an exported pipeline's session: K and the compute width from
    its metadata (``export.compute_itemsize``; the input's width and dtype for other
    models) and the session's intra-op threads (0, onnxruntime's default, is one per
    core)."""
    metadata = session.get_modelmeta().custom_metadata_map
    itemsize = compute_itemsize(metadata) or input_dtype(session).itemsize
    try:
        n_classes = int(metadata["cord.n_classes"])
    except (KeyError, ValueError):
        n_classes = width
    threads = session.get_session_options().intra_op_num_threads or os.cpu_count() or 1
    return default_batch_size(n_classes, itemsize, threads)


def batches(n: int, batch_size: int) -> Iterator[slice]:
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size: expected a positive integer, got {batch_size!r}")
    for start in range(0, n, batch_size):
        yield slice(start, min(start + batch_size, n))


def run_batched(session: ort.InferenceSession, scores: np.ndarray, batch_size: int | None = None,
                outputs: list[str] | None = None,
                on_batch: Callable[[int], None] | None = None) -> dict[str, np.ndarray]:
    """Run ``scores`` [N, K] through the session ``batch_size`` rows at a time.

    Returns {output name: array over all N rows}; ``outputs`` picks a subset (default all);
    ``batch_size`` defaults to :func:`session_batch_size`.
    ``on_batch(rows)`` is called after each batch with the number of rows it held. The
    input is cast to the session's dtype; it is not validated here (see predict_file).
    """
    names = outputs or [o.name for o in session.get_outputs()]
    scores = np.ascontiguousarray(scores, dtype=input_dtype(session))
    input_name = session.get_inputs()[0].name
    if batch_size is None:
        batch_size = session_batch_size(session, scores.shape[1])
    result: dict[str, np.ndarray] = {}
    for rows in batches(scores.shape[0], batch_size):
        values = session.run(names, {input_name: scores[rows]})
        for name, value in zip(names, values, strict=True):
            if name not in result:
                result[name] = np.empty((scores.shape[0],) + value.shape[1:], value.dtype)
            result[name][rows] = value
        if on_batch is not None:
            on_batch(rows.stop - rows.start)
    return result
