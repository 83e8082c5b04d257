"""The tasks that run on Dask workers: read, validate and split one shard into scratch
files (:func:`load_split_shard`), read a partition back in row blocks of about
``BLOCK_BYTES`` of float64 from its memory-mapped scratch file (:func:`blocks`), and apply
the per-partition reducers of ``cord_ops.partition_sums`` to it (:func:`summed`,
:func:`cord_scalars`, :func:`evaluation_partition`, ...).

Dask ships these to the workers by reference (module and name), so every task here stays
a module-level function of this module.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from pathlib import Path

import numpy as np
from distributed import get_worker

from cord_ops import data
from cord_ops.cord import CORD
from cord_ops.partition_sums import (
    PASS_ONLY,
    cord_partition_pass,
    cord_pass_sums,
    repaired_metric_sums,
)
from cord_ops.reduce import split_rows

#: Size of one row block's float64 scores during a pass (the worker's working set). Small
#: enough that a block's temporaries stay in the caches two workers share, which roughly
#: halves a pass's cost per entry against blocks too large for them (docs/scale.md, "What
#: the workers do").
BLOCK_BYTES = 4 << 20


def _scratch_folder(session_id: str) -> Path:
    """This worker's scratch folder for a session (its local directory; the system's
    temporary folder outside a worker)."""
    try:
        base = get_worker().local_directory
    except ValueError:
        base = tempfile.gettempdir()
    folder = Path(base) / f"cord-ops-{session_id}"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def remove_scratch(session_id: str, dask_worker=None) -> None:
    """Delete a worker's scratch folder of the session (``Client.run`` on every worker
    passes the worker as ``dask_worker``)."""
    base = tempfile.gettempdir() if dask_worker is None else dask_worker.local_directory
    shutil.rmtree(Path(base) / f"cord-ops-{session_id}", ignore_errors=True)


def load_split_shard(path: str, kind: str, k: int, seed: int, fraction: float, key: int,
                     session_id: str) -> dict:
    """Read and validate one shard (errors name the file, column and row), split its rows
    (``reduce.split_rows``) and write each part's scores to a scratch ``.npy`` (a worker
    task). Returns the shard's digest and its ``calibration`` and ``evaluation``
    partitions: handles holding the scratch file, the row count, the labels and (for the
    evaluation part) the sample keys."""
    dataset = data.load_parquet(path, input_kind=kind)
    if dataset.n_classes != k:
        raise ValueError(f"{path}: holds {dataset.n_classes} classes; expected {k} like the "
                         "first shard")
    calibration, keys = split_rows(dataset.n, seed, fraction, key)
    scores = dataset.scores
    narrow = scores.astype(np.float32)
    if np.array_equal(narrow, scores):  # float32 outputs: half the scratch, same values
        scores = narrow
    del narrow
    folder = _scratch_folder(session_id)
    out = {"path": path, "sha256": dataset.sha256}
    for name, chosen in (("calibration", calibration), ("evaluation", ~calibration)):
        file = folder / f"{name}-{uuid.uuid4().hex}.npy"
        if chosen.all():  # every row (a separate evaluation set, or fraction 1): no copy
            np.save(file, scores, allow_pickle=False)
        elif chosen.any():
            np.save(file, scores[chosen], allow_pickle=False)
        out[name] = {"path": path, "scratch": str(file), "n": int(chosen.sum()),
                     "labels": dataset.labels[chosen], "keys": keys[chosen], "part": name,
                     "source": (path, kind, k, seed, fraction, key)}
    return out


def part_scores(part):
    """The partition's scores: its scratch file memory-mapped, or, on a worker that does
    not have the file (a task Dask moved, or a partition recomputed after its worker
    died), the same rows re-read from the shard (the split is deterministic)."""
    file = Path(part["scratch"])
    if file.is_file():
        return np.load(file, mmap_mode="r", allow_pickle=False)
    path, kind, k, seed, fraction, key = part["source"]
    dataset = data.load_parquet(path, input_kind=kind)
    chosen, _ = split_rows(dataset.n, seed, fraction, key)
    return dataset.scores[chosen if part["part"] == "calibration" else ~chosen]


def blocks(part):
    """The partition in row blocks: dicts with ``scores`` (float64 copy of the block's
    rows, read from the memory-mapped scratch file) and every per-row array sliced."""
    scores = part_scores(part)
    step = max(1, BLOCK_BYTES // (8 * scores.shape[1]))
    for start in range(0, part["n"], step):
        stop = min(part["n"], start + step)
        block = {key: value[start:stop] for key, value in part.items()
                 if isinstance(value, np.ndarray)}
        block["scores"] = np.asarray(scores[start:stop], dtype=np.float64)
        block["path"] = part["path"]
        block["first_row"] = start
        yield block


def _add(a, b):
    """Sum of two reducer results of the same shape (numbers, arrays, tuples, dicts)."""
    if isinstance(a, dict):
        return {key: _add(a[key], b[key]) for key in a}
    if isinstance(a, tuple | list):
        return type(a)(_add(x, y) for x, y in zip(a, b, strict=True))
    return a + b


def add_all(values):
    """``_add`` over a non-empty list of reducer results."""
    total = values[0]
    for value in values[1:]:
        total = _add(total, value)
    return total


def apply_each(wrapper, fn, args, *parts) -> list:
    """``fn(part, *args)`` (or ``wrapper(part, fn, *args)``) for each partition, in order:
    one worker task covering all the partitions that live on that worker."""
    if wrapper is None:
        return [fn(part, *args) for part in parts]
    return [wrapper(part, fn, *args) for part in parts]


def summed(part, fn, *args):
    """``fn(block, *args)`` summed over the partition's row blocks: every reducer of
    ``cord_ops.partition_sums`` returns sums (exact integers stay exact)."""
    total = None
    for block in blocks(part):
        value = fn(block, *args)
        total = value if total is None else _add(total, value)
    return total


def cord_scalars(part, calibrator_state, input_kind, local_weight, metrics=False,
                 temperature=False) -> dict:
    """CORD's per-row scalars (b, min I, g) of the partition, kept in worker memory for
    the bisection (24 bytes a row), with what ``partition_sums.cord_partition_pass`` adds on
    request (``metrics``: 25 more bytes a row kept for the repaired output's sums, and the
    original and calibrated outputs' metric sums; ``temperature``: TS's slope sums), the
    sums under ``sums``; errors name the shard."""
    found = []
    for block in blocks(part):
        try:
            found.append(cord_partition_pass(block, calibrator_state, input_kind,
                                              local_weight, block["first_row"],
                                              metrics=metrics, temperature=temperature))
        except ValueError as exc:
            raise ValueError(f"{part['path']}: {exc}") from None
    rows = {key: np.concatenate([f[key] for f in found]) for key in found[0]}
    rows["labels"] = part["labels"]
    merged = {key: value for key, value in rows.items()
              if key not in PASS_ONLY and key != "labels"}
    merged["sums"] = cord_pass_sums(rows)
    return merged


def merge_scalars(*parts) -> dict:
    """Partitions' CORD scalars in one (row arrays concatenated, ``sums`` added): on one
    worker the bisection then costs one task per step, not one per shard (exact sums do
    not depend on the order)."""
    out = {key: np.concatenate([p[key] for p in parts]) for key in parts[0] if key != "sums"}
    out["sums"] = add_all([p["sums"] for p in parts])
    return out


def pass_sums(part) -> dict:
    """The sums ``cord_scalars`` gathered on its pass."""
    return part["sums"]


def partition_rows(part) -> int:
    return int(part["n"])


def shard_digest(loaded) -> tuple[str, str, int, int]:
    """(path, sha256, calibration rows, evaluation rows) of a loaded shard."""
    return (loaded["path"], loaded["sha256"], partition_rows(loaded["calibration"]),
            partition_rows(loaded["evaluation"]))


def pick(loaded, name: str) -> dict:
    return loaded[name]


def sample_below(part, threshold: float) -> tuple:
    """(scores, labels, keys) of the partition's rows whose sample key is below
    ``threshold`` (only those rows are read from the scratch file)."""
    chosen = np.flatnonzero(part["keys"] < threshold)
    scores = part_scores(part)
    return (np.asarray(scores[chosen], dtype=np.float64), part["labels"][chosen],
            part["keys"][chosen])



def evaluation_partition(part, calibrator_state, cord_state, input_kind) -> dict:
    """Metric sums of the original, calibrated and repaired outputs over one partition:
    ``cord_scalars``' pass with the report's per-row values, then the repaired output's
    sums at the fitted eta* (``partition_sums.repaired_metric_sums``) without its K-vectors."""
    cord = CORD.from_dict(cord_state)
    rows = cord_scalars(part, calibrator_state, input_kind, float(cord.local_weight),
                        metrics=True)
    sums = rows.pop("sums")
    sums["repaired"] = repaired_metric_sums(rows, cord.eta_)
    return sums

