"""Batch scoring beyond one process: ``cord-ops predict`` over a folder or glob of Parquet
files on a Dask cluster.

One input file is one task; the output folder mirrors the input's layout (``in/a/part-0.
parquet`` -> ``out/a/part-0.parquet``), each file holding the columns ``predict_file``
writes (the input's other columns, ``label``, ``confidence``, ``repaired``,
``calibrated``). Every worker opens one onnxruntime session, once, in a worker plugin
(``SessionPlugin.setup``) and every task on that worker reuses it.

Order of events, so that a failure leaves nothing behind:

1. list the input files and read each one's Parquet schema on the client: a file without
   the documented score columns, or with a column the outputs would overwrite, is refused
   naming the file before any cluster is contacted or anything is written;
2. load the model and connect to ``dask_address`` (or start a local cluster);
3. score every file into a fresh sibling folder ``<output>.partial-<id>`` (each file
   written atomically by ``write_outputs``); a value error found by a worker (NaN at a row,
   a row of the wrong width) fails the job with that worker's message, which names the
   file, the column and the row;
4. rename the folder to ``output`` only when every file is written; on any failure it is
   removed. ``output`` must not exist beforehand.

A client killed with ``kill -9`` cannot remove its partial folder. Each one therefore holds
its owner (host, pid, process start time; ``flows.store.owner``) in ``OWNER_FILE``, and the next
batch job for the same output removes the partial folders whose owner is dead, never one
whose owner still runs.
"""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from distributed import Client, LocalCluster, WorkerPlugin, get_worker

from cord_ops import data
from cord_ops.atomic import write_json_atomic
from flows.files import expand_inputs
from flows.store.owner import Owner, alive

#: Name under which the session plugin is registered on the workers, per model digest.
PLUGIN_PREFIX = "cord-ops-session-"
#: The owner record inside a partial output folder (removed before the final rename).
OWNER_FILE = ".cord-ops-owner.json"


def sweep_dead_partials(output: Path) -> list[Path]:
    """Remove the ``<output>.partial-*`` folders whose owner process is dead; returns them.
    A folder without a readable owner record is left alone (it may be being created)."""
    import json

    removed = []
    for folder in output.parent.glob(f"{glob.escape(output.name)}.partial-*"):
        try:
            record = json.loads((folder / OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and not alive(record):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def check_schemas(files: list[Path], input_kind: str) -> None:
    """Refuse, naming the file, any input whose schema lacks the model's score columns or
    has a column named like an output (step 1 of the module docstring)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from onnx_export.predict import WRITTEN

    for path in files:
        try:
            names = pq.read_schema(path).names
        except (pa.ArrowException, OSError) as exc:
            raise ValueError(f"{path}: not a readable Parquet file ({exc})") from None
        _, columns = data.score_columns(names, str(path), input_kind)
        clash = sorted((set(names) - set(columns)) & set(WRITTEN))
        if clash:
            raise ValueError(f"{path}: column {clash[0]!r} would be overwritten by the output "
                             "of the same name; rename it")


class SessionPlugin(WorkerPlugin):
    """Worker plugin holding the worker's one onnxruntime session (opened in ``setup``,
    when the plugin is registered or the worker joins later)."""

    def __init__(self, model: bytes, threads: int | None):
        self.model = model
        self.threads = threads
        self.session = None

    def setup(self, worker) -> None:
        from onnx_export.runtime import open_session

        self.session = open_session(self.model, provider="cpu", threads=self.threads)

    def teardown(self, worker) -> None:
        self.session = None


def score_file(plugin_name: str, source: str, target: str, n_classes: int, input_kind: str,
               batch_size: int | None) -> dict:
    """One task: score ``source`` with this worker's session and write ``target``."""
    from onnx_export.predict import read_parquet_input, write_outputs
    from onnx_export.runtime import input_dtype, run_batched

    worker = get_worker()
    session = worker.plugins[plugin_name].session
    stored, passthrough = read_parquet_input(source, n_classes, input_kind,
                                             input_dtype(session))
    scores = stored.scores
    outputs = run_batched(session, scores, batch_size=batch_size,
                          outputs=["repaired", "calibrated", "label", "confidence"])
    Path(target).parent.mkdir(parents=True, exist_ok=True)
    write_outputs(target, outputs, passthrough)
    return {"source": source, "rows": int(scores.shape[0]), "worker": worker.address,
            "pid": os.getpid(), "session": id(session), "sum_error": stored.sum_error}


@dataclass
class BatchResult:
    files: int
    rows: int
    seconds: float
    workers: list[str]
    tasks: list[dict]
    output: str


def predict_batch(model_path, input_spec, output, *, dask_address: str | None = None,
                  n_workers: int = 2, threads: int | None = 1,
                  batch_size: int | None = None) -> BatchResult:
    """Score every Parquet file of ``input_spec`` (folder or glob) into the folder
    ``output`` on a Dask cluster: the scheduler at ``dask_address``, or a local cluster of
    ``n_workers`` processes. ``threads`` is each session's intra-op thread count."""
    from onnx_export.export import load_model, pipeline_input

    output = Path(output)
    if output.exists():
        raise ValueError(f"{output}: already exists; batch output goes to a new folder")
    root, files = expand_inputs(input_spec)
    model = load_model(model_path)
    n_classes, input_kind = pipeline_input(model, model_path)
    check_schemas(files, input_kind)

    model_bytes = model.SerializeToString()
    plugin_name = PLUGIN_PREFIX + hashlib.sha256(model_bytes).hexdigest()[:16]
    sweep_dead_partials(output)
    partial = output.with_name(f"{output.name}.partial-{uuid.uuid4().hex[:8]}")
    started = time.perf_counter()
    cluster = None
    try:
        partial.mkdir(parents=True)
        write_json_atomic(partial / OWNER_FILE, Owner.current().record())
        if dask_address is None:
            # TLS with certificates of its own: another local account could otherwise
            # connect to the scheduler's port and run functions as this user.
            cluster = LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True,
                                   dashboard_address=None, security=True)
        with Client(dask_address or cluster) as client:
            client.register_plugin(SessionPlugin(model_bytes, threads), name=plugin_name)
            futures = [client.submit(score_file, plugin_name, str(src),
                                     str(partial / src.relative_to(root)), n_classes,
                                     input_kind, batch_size, pure=False)
                       for src in files]
            tasks = client.gather(futures)
            client.unregister_worker_plugin(plugin_name)
        (partial / OWNER_FILE).unlink()
        os.replace(partial, output)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    finally:
        if cluster is not None:
            cluster.close()
    return BatchResult(files=len(files), rows=sum(t["rows"] for t in tasks),
                       seconds=time.perf_counter() - started,
                       workers=sorted({t["worker"] for t in tasks}), tasks=tasks,
                       output=str(output))
