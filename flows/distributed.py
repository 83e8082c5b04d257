"""Recalibration on a Dask cluster for labelled outputs in Parquet shards (docs/ layout:
score columns and ``labels``), one shard a partition.

Order of events, so that bad input stops everything before a cluster is contacted:

1. list the shards (a folder or glob, ``batch_predict.expand_inputs``) and read each one's
   schema: every shard must hold the same score layout and a ``labels`` column; a
   calibrator that cannot be fitted from partition sums is refused naming the ones that
   can (``cord_ops.reduce.REDUCIBLE``);
2. connect to ``dask_address`` or start a local cluster; each worker loads its shards once
   (``data.load_parquet``: a bad value is reported naming the file, column and row) and
   keeps them for the passes below;
3. fit the calibrator from reduced sums, then CORD's per-row scalars per partition and eta*
   from exact partition sums (``cord_ops.reduce``), then reduce the evaluation metrics.

The numerics live in ``cord_ops.reduce`` (pure numpy); this module only moves them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from distributed import Client, LocalCluster

from cord_ops import data
from cord_ops.cord import CORD
from cord_ops.reduce import (
    REDUCIBLE,
    cord_partition_scalars,
    evaluation_sums,
    fit_calibrator,
    fit_cord,
    metrics_from_sums,
)
from flows.batch_predict import expand_inputs


def shard_kind(files, input_kind: str = "auto") -> str:
    """The score layout all shards share; raises naming the first shard that differs or
    lacks the label column (step 1)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    kinds = {}
    for path in files:
        try:
            names = pq.read_schema(path).names
        except (pa.ArrowException, OSError) as exc:
            raise ValueError(f"{path}: not a readable Parquet file ({exc})") from None
        kind, _ = data.score_columns(names, str(path), input_kind)
        if data.LABEL_COLUMN not in names:
            raise ValueError(f"{path}: missing column '{data.LABEL_COLUMN}' (columns: "
                             f"{sorted(names)})")
        first = next(iter(kinds.items()), None)
        if first is not None and first[1] != kind:
            raise ValueError(f"{path}: holds '{kind}' scores but {first[0]} holds "
                             f"'{first[1]}'; expected one layout across shards")
        kinds[path] = kind
    return next(iter(kinds.values()))


def load_shard(path: str, input_kind: str) -> dict:
    """One partition: the shard's validated scores and labels (a worker task)."""
    dataset = data.load_parquet(path, input_kind=input_kind)
    return {"path": path, "scores": dataset.scores, "labels": dataset.labels}


def shard_shape(part) -> tuple[int, int]:
    return int(part["scores"].shape[0]), int(part["scores"].shape[1])


def with_cord_scalars(part, calibrator_state, input_kind, local_weight) -> dict:
    """The partition plus CORD's per-row scalars; errors name the shard."""
    try:
        b, lower, g = cord_partition_scalars(part, calibrator_state, input_kind,
                                             local_weight, 0)
    except ValueError as exc:
        raise ValueError(f"{part['path']}: {exc}") from None
    return {**part, "b": b, "lower": lower, "g": g}


@dataclass
class DistributedFit:
    calibrator: object
    cord: CORD
    metrics: dict
    n: int
    n_classes: int
    input_kind: str
    shards: list[str]
    seconds: dict = field(default_factory=dict)


def _reducer(client: Client, futures):
    def reduce(fn, *args):
        return client.gather([client.submit(fn, f, *args, pure=False) for f in futures])
    return reduce


def fit_shards(spec, calibrator: str = "ts", *, dask_address: str | None = None,
               client: Client | None = None, n_workers: int = 2,
               memory_limit: str | None = None, input_kind: str = "auto",
               cord: CORD | None = None, gather: bool = False) -> DistributedFit:
    """Fit ``calibrator`` (a name in REDUCIBLE, or an already fitted calibrator, which is
    kept) + CORD on the Parquet shards of ``spec`` (folder or glob) on
    Dask: ``client``, else the scheduler at ``dask_address``, else a local cluster of
    ``n_workers`` single-threaded processes (``memory_limit`` each). ``gather`` selects
    ``fit_cord``'s gathered mode (eta* bit-identical to ``CORD.fit`` on all rows)."""
    if not isinstance(calibrator, str):
        calibrator._check_fitted()  # a fitted calibrator: only CORD is fitted here
    elif calibrator not in REDUCIBLE:
        raise ValueError(f"calibrator {calibrator!r} cannot be fitted on Dask partitions "
                         f"(it needs every row at once); expected one of "
                         f"{', '.join(REDUCIBLE)}")
    cord = CORD() if cord is None else cord
    cord._check_params()
    _, files = expand_inputs(spec)
    kind = shard_kind(files, input_kind)
    cluster = None
    try:
        if client is None and dask_address is None:
            cluster = LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True,
                                   dashboard_address=None, memory_limit=memory_limit)
        with (Client(dask_address or cluster) if client is None else _borrowed(client)) as c:
            return _fit(c, files, calibrator, kind, cord, gather)
    finally:
        if cluster is not None:
            cluster.close()


class _borrowed:
    """A caller's client as a context manager that leaves it open."""

    def __init__(self, client):
        self.client = client

    def __enter__(self):
        return self.client

    def __exit__(self, *exc):
        return False


def _fit(client, files, calibrator, kind, cord, gather) -> DistributedFit:
    seconds = {}
    start = time.perf_counter()
    parts = [client.submit(load_shard, str(path), kind, pure=False) for path in files]
    shapes = client.gather([client.submit(shard_shape, p, pure=False) for p in parts])
    k = shapes[0][1]
    for path, (_, width) in zip(files, shapes, strict=True):
        if width != k:
            raise ValueError(f"{path}: holds {width} classes; {files[0]} holds {k}")
    n = sum(rows for rows, _ in shapes)
    seconds["load"] = time.perf_counter() - start

    start = time.perf_counter()
    if isinstance(calibrator, str):
        cal = fit_calibrator(calibrator, _reducer(client, parts), n, k, input_kind=kind)
    else:
        cal = calibrator
        if cal.n_classes_ != k or cal.input_kind != kind:
            raise ValueError(f"calibrator: fitted for K = {cal.n_classes_} "
                             f"{cal.input_kind}; the shards hold K = {k} {kind}")
    state = cal.to_dict()
    seconds["calibrator"] = time.perf_counter() - start

    start = time.perf_counter()
    scalars = [client.submit(with_cord_scalars, p, state, kind, float(cord.local_weight),
                             pure=False) for p in parts]
    del parts  # the partitions now live on inside ``scalars``
    fitted = fit_cord(_reducer(client, scalars), n, k, cord, gather=gather)
    seconds["cord"] = time.perf_counter() - start

    start = time.perf_counter()
    sums = _reducer(client, scalars)(evaluation_sums, state, fitted.to_dict(), kind)
    metrics = {name: metrics_from_sums([s[name] for s in sums])
               for name in ("original", "calibrated", "repaired")}
    seconds["evaluate"] = time.perf_counter() - start
    return DistributedFit(cal, fitted, metrics, n, k, kind, [str(f) for f in files], seconds)
