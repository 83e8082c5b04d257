"""onnxruntime sessions for exported pipelines: provider choice, threads, quiet logs,
batched runs.

``provider``: "cpu" runs on CPUExecutionProvider; "cuda" requires CUDAExecutionProvider
(the ``gpu`` extra installs onnxruntime-gpu) and a visible GPU, and raises otherwise;
"auto" uses CUDA when both are there and the CPU otherwise.

IO binding (:func:`to_device`, :func:`run_on_device`) lets a caller keep inputs and
outputs where the session computes (on the GPU for a CUDA session), as OrtValues, instead
of copying numpy arrays in and out on every run; on a CPU session the same calls work with
device "cpu". :func:`node_providers` tells which execution provider ran each node, so a
graph that fell back to the CPU in part is caught (docs/gpu.md).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from onnx_export.export import compute_itemsize

PROVIDERS = ("auto", "cpu", "cuda")
CPU, CUDA = "CPUExecutionProvider", "CUDAExecutionProvider"
#: CUDAExecutionProvider options: no TF32 (onnxruntime's default lets cuBLAS run float32
#: MatMul on tensor cores with a 10-bit mantissa, far outside the float32 parity bound of
#: docs/contract.md and able to move a calibrated top-1 the repair's float32 guard relies on).
CUDA_OPTIONS = {"use_tf32": "0"}
#: onnxruntime log severity for quiet sessions: 3 = errors only.
QUIET_SEVERITY = 3


def cuda_available() -> bool:
    """Whether this onnxruntime build has the CUDA provider (it still needs a GPU to run)."""
    return CUDA in ort.get_available_providers()


def open_session(model, provider: str = "auto", threads: int | None = None,
                 quiet: bool = True, spin: bool = True,
                 profile_dir: str | Path | None = None) -> ort.InferenceSession:
    """An InferenceSession for ``model`` (a path, serialized bytes or a ModelProto).

    ``threads`` sets the intra-op thread count (None: onnxruntime's default, one per core).
    ``spin=False`` lets idle intra-op threads sleep instead of spinning between operations
    (onnxruntime's ``session.intra_op.allow_spinning``): on a machine whose cores other
    processes also use, spinning threads take the CPU the working ones need, so that two
    threads can run slower than one (docs/performance.md, "ONNX graphs: lean VS + CORD at
    K = 1,000"). With ``quiet`` onnxruntime logs errors only.
    ``profile_dir``: onnxruntime profiles every run into a JSON file in that folder (what
    :func:`node_providers` reads). Raises
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
    providers = [(CUDA, CUDA_OPTIONS), CPU] \
        if provider == "cuda" or (provider == "auto" and cuda_available()) else [CPU]
    options = ort.SessionOptions()
    if threads is not None:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    if quiet:
        options.log_severity_level = QUIET_SEVERITY
    if not spin:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if profile_dir is not None:
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(profile_dir) / "ort-profile")
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


#: The IO-binding device of each execution provider.
DEVICES = {CPU: "cpu", CUDA: "cuda"}


def session_device(session: ort.InferenceSession) -> str:
    """"cuda" for a session on CUDAExecutionProvider, "cpu" otherwise: where its outputs
    are computed and where :func:`run_on_device` keeps them by default."""
    return DEVICES.get(session.get_providers()[0], "cpu")


def _check_device(session: ort.InferenceSession, device: str) -> None:
    if device not in DEVICES.values():
        raise ValueError(f"device: expected one of {tuple(DEVICES.values())}, got {device!r}")
    if device == "cuda" and CUDA not in session.get_providers():
        raise RuntimeError("device 'cuda': the session does not run on CUDAExecutionProvider "
                           f"(its providers: {session.get_providers()})")


def to_device(array: np.ndarray, device: str = "cpu", device_id: int = 0) -> ort.OrtValue:
    """A copy of ``array`` as an OrtValue on ``device`` ("cpu" or "cuda"), to bind to a
    session's input run after run without copying it again."""
    if device not in DEVICES.values():
        raise ValueError(f"device: expected one of {tuple(DEVICES.values())}, got {device!r}")
    return ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array), device, device_id)


def run_on_device(session: ort.InferenceSession, scores, outputs: list[str] | None = None,
                  device: str | None = None, device_id: int = 0) -> dict[str, ort.OrtValue]:
    """One run through IO binding: {output name: OrtValue} allocated by onnxruntime on
    ``device`` (default :func:`session_device`) and left there.

    ``scores`` is an OrtValue (already on the session's device: it is used in place; see
    :func:`to_device`) or a numpy array (cast to the session's dtype and copied to
    ``device``). ``outputs`` picks a subset (default all). An OrtValue on "cpu" gives its
    array with ``.numpy()``; one on "cuda" stays on the GPU for the caller (its
    ``data_ptr()``, ``shape()`` and ``element_type()`` describe it). A "cuda" device on a
    session that does not run on CUDAExecutionProvider raises RuntimeError.
    """
    device = session_device(session) if device is None else device
    _check_device(session, device)
    names = outputs or [o.name for o in session.get_outputs()]
    if not isinstance(scores, ort.OrtValue):
        scores = to_device(np.asarray(scores, dtype=input_dtype(session)), device, device_id)
    binding = session.io_binding()
    binding.bind_ortvalue_input(session.get_inputs()[0].name, scores)
    for name in names:
        binding.bind_output(name, device, device_id)
    session.run_with_iobinding(binding)
    return dict(zip(names, binding.get_outputs(), strict=True))


def run_host(session: ort.InferenceSession, scores: np.ndarray,
             outputs: list[str]) -> list[np.ndarray]:
    """``session.run(outputs, ...)`` on host arrays, for callers whose data arrive and
    leave as numpy (a server). On a CUDA session the input is copied to the GPU once and
    the outputs are bound to host memory, so onnxruntime writes each result straight into
    its numpy array (one device-to-host copy, no staging output on the GPU)."""
    if session_device(session) == "cpu":
        return session.run(outputs, {session.get_inputs()[0].name: scores})
    bound = run_on_device(session, to_device(scores, "cuda"), outputs, device="cpu")
    return [bound[name].numpy() for name in outputs]


def node_providers(session: ort.InferenceSession) -> dict[str, tuple[str, str]]:
    """{node name: (operator, execution provider that ran it)} over the runs since the
    session opened, from onnxruntime's profile (the session must have been opened with
    ``profile_dir``). Ends the session's profiling and removes the profile file. Nodes are
    as onnxruntime ran them, after its graph optimisations (a fused node carries its new
    name)."""
    path = session.end_profiling()
    if not path:
        raise ValueError("node_providers: the session was not opened with profile_dir")
    try:
        events = json.loads(Path(path).read_text())
    finally:
        Path(path).unlink(missing_ok=True)
    # A node's kernel event is named "<node name>_kernel_time" and carries its provider.
    return {event["name"].removesuffix("_kernel_time"):
            (event["args"].get("op_name", ""), event["args"]["provider"])
            for event in events
            if event.get("cat") == "Node" and event["name"].endswith("_kernel_time")
            and "provider" in event.get("args", {})}


def placement(model, scores: np.ndarray,
              provider: str = "auto") -> dict[str, tuple[str, str]]:
    """{node name: (operator, provider)} of one run of ``model`` on ``scores`` in a fresh
    session of ``provider`` (see :func:`node_providers`), through IO binding on the
    session's device."""
    with tempfile.TemporaryDirectory(prefix="cord-ops-profile-") as folder:
        session = open_session(model, provider=provider, profile_dir=folder)
        run_on_device(session, scores)
        return node_providers(session)


def input_dtype(session: ort.InferenceSession) -> np.dtype:
    """The numpy dtype of the session's single input."""
    kind = session.get_inputs()[0].type
    return {"tensor(float)": np.dtype(np.float32),
            "tensor(double)": np.dtype(np.float64)}[kind]


#: Rows per batch are chosen so that each thread's share of a [rows, K] intermediate takes
#: about this many bytes and stays in its core's L2 cache: batches several times larger
#: spill it and run the graphs slower (docs/performance.md, "ONNX graphs: isotonic
#: families"). More threads take proportionally more rows, which also spreads each
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
