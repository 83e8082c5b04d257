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

import hashlib
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from distributed import Client, LocalCluster

from cord_ops import data
from cord_ops.cord import CORD
from cord_ops.reduce import (
    REDUCIBLE,
    cord_partition_scalars,
    evaluation_sums,
    fit_calibrator,
    fit_cord,
    label_counts,
    metrics_from_sums,
    split_rows,
)
from cord_ops.reduce import rows as partition_rows
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


# ---------------------------------------------------------------- the recalibration flow's
# view of shards: a seeded per-row calibration/evaluation split inside every shard, fits on
# the calibration rows, metrics over every evaluation row and a bounded sample of those
# rows for what needs rows on the driver (docs/scale.md, "cord-ops recalibrate on shards").


@dataclass(frozen=True)
class ShardSet:
    """Parquet shards named by one folder or glob, described from their footers.

    ``sha256`` is filled by :func:`open_session` (it needs every byte): the SHA-256 of the
    lines ``<path relative to root> <file's sha256>``, one per shard, in sorted order.
    Provides the attributes of ``data.Dataset`` that provenance tags read (``path``,
    ``sha256``, ``n``, ``n_classes``, ``input_kind``).
    """

    path: str
    root: str
    files: tuple[str, ...]
    rows: tuple[int, ...]
    input_kind: str
    n_classes: int
    sha256: str = ""

    @property
    def n(self) -> int:
        return int(sum(self.rows))

    def relative(self, file: str) -> str:
        return Path(file).relative_to(self.root).as_posix()

    def key(self, file: str) -> int:
        """The shard's seed component: from its path relative to the root, so a shard
        keeps its rows' split when other shards are added or the folder moves."""
        return int.from_bytes(hashlib.sha256(self.relative(file).encode()).digest()[:8],
                              "little")


def _list_width(path, column: str, arrow_type) -> int:
    """K of a list score column: the fixed size, or the length of the first row."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if pa.types.is_fixed_size_list(arrow_type):
        return int(arrow_type.list_size)
    batch = next(pq.ParquetFile(path).iter_batches(batch_size=1, columns=[column]), None)
    return 0 if batch is None or batch.num_rows == 0 else len(batch.column(0)[0])


def describe_shards(spec, input_kind: str = "auto") -> ShardSet:
    """The shards of ``spec`` from their footers: one score layout and K across shards, a
    label column, at least one row each; raises ValueError naming the first shard that
    breaks that (nothing is read beyond footers and one row)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root, files = expand_inputs(spec)
    kind = shard_kind(files, input_kind)
    rows, width, first = [], None, None
    for path in files:
        try:
            meta = pq.ParquetFile(path)
        except (pa.ArrowException, OSError) as exc:
            raise ValueError(f"{path}: not a readable Parquet file ({exc})") from None
        n = int(meta.metadata.num_rows)
        if n == 0:
            raise ValueError(f"{path}: has no rows; expected at least one")
        schema = meta.schema_arrow
        _, columns = data.score_columns(schema.names, str(path), kind)
        k = (len(columns) if len(columns) > 1
             else _list_width(path, columns[0], schema.field(columns[0]).type))
        if width is None:
            width, first = k, path
        elif k != width:
            raise ValueError(f"{path}: holds {k} classes but {first} holds {width}; "
                             "expected one K across shards")
        rows.append(n)
    if width < 2:
        raise ValueError(f"{first}: holds {width} classes; expected K >= 2")
    return ShardSet(str(spec), str(root), tuple(str(f) for f in files), tuple(rows), kind,
                    int(width))


@dataclass(frozen=True)
class ShardPlan:
    """What a recalibration on shards will read: ``data`` and optionally separate
    ``evaluation`` shards, the split's seed and calibration fraction (1.0 when
    ``evaluation`` is given), and the exact split sizes, known from the footers."""

    data: ShardSet
    evaluation: ShardSet | None
    seed: int
    fraction: float
    n_calibration: int
    n_evaluation: int

    @property
    def n_classes(self) -> int:
        return self.data.n_classes

    @property
    def input_kind(self) -> str:
        return self.data.input_kind


def plan_shards(spec, eval_spec=None, input_kind: str = "auto", seed: int = 0,
                fraction: float = 0.5) -> ShardPlan:
    """Describe the shards (:func:`describe_shards`) and count the split's rows by drawing
    each shard's split (``reduce.split_rows``) from its footer's row count."""
    shards = describe_shards(spec, input_kind)
    evaluation = None
    if eval_spec is not None:
        evaluation = describe_shards(eval_spec, shards.input_kind)
        if evaluation.n_classes != shards.n_classes:
            raise ValueError(f"{eval_spec}: has {evaluation.n_classes} classes but {spec} "
                             f"has {shards.n_classes}")
        fraction = 1.0
    n_cal = sum(int(split_rows(n, seed, fraction, shards.key(f))[0].sum())
                for f, n in zip(shards.files, shards.rows, strict=True))
    n_eval = shards.n - n_cal + (0 if evaluation is None else evaluation.n)
    return ShardPlan(shards, evaluation, int(seed), float(fraction), n_cal, n_eval)


def load_split_shard(path: str, kind: str, k: int, seed: int, fraction: float,
                     key: int) -> dict:
    """Read and validate one shard (errors name the file, column and row) and split its
    rows (``reduce.split_rows``): a worker task. Returns the shard's digest and its
    ``calibration`` and ``evaluation`` partitions (the latter with the sample keys)."""
    dataset = data.load_parquet(path, input_kind=kind)
    if dataset.n_classes != k:
        raise ValueError(f"{path}: holds {dataset.n_classes} classes; expected {k} like the "
                         "first shard")
    calibration, keys = split_rows(dataset.n, seed, fraction, key)
    scores, labels = dataset.scores, dataset.labels
    evaluation = ~calibration
    return {"path": path, "sha256": dataset.sha256,
            "calibration": {"path": path, "scores": scores[calibration],
                            "labels": labels[calibration]},
            "evaluation": {"path": path, "scores": scores[evaluation],
                           "labels": labels[evaluation], "keys": keys[evaluation]}}


def shard_digest(loaded) -> tuple[str, str, int, int]:
    """(path, sha256, calibration rows, evaluation rows) of a loaded shard."""
    return (loaded["path"], loaded["sha256"], partition_rows(loaded["calibration"]),
            partition_rows(loaded["evaluation"]))


def pick(loaded, name: str) -> dict:
    return loaded[name]


def sample_below(part, threshold: float) -> tuple:
    """(scores, labels, keys) of the partition's rows whose sample key is below
    ``threshold``."""
    chosen = part["keys"] < threshold
    return part["scores"][chosen], part["labels"][chosen], part["keys"][chosen]


class ShardSession:
    """A Dask client whose workers hold the split shards of a :class:`ShardPlan`:
    ``calibration`` and ``evaluation`` are lists of futures of non-empty partitions.
    Close it (or use it as a context manager) to release the partitions and a local
    cluster it started."""

    def __init__(self, plan: ShardPlan, client: Client, cluster=None, owns_client=True):
        self.plan, self.client, self.cluster = plan, client, cluster
        self.owns_client = owns_client
        self.calibration: list = []
        self.evaluation: list = []
        self.seconds: dict = {}

    def reduce(self, which: str):
        """``reduce(fn, *args)`` over the ``calibration`` or ``evaluation`` partitions."""
        return _reducer(self.client, getattr(self, which))

    def close(self) -> None:
        self.calibration, self.evaluation = [], []
        try:
            if self.owns_client:
                self.client.close()
        finally:
            if self.cluster is not None:
                self.cluster.close()
                self.cluster = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def open_session(plan: ShardPlan, *, dask_address: str | None = None,
                 client: Client | None = None, n_workers: int = 2,
                 memory_limit: str | None = None,
                 connect_timeout: float = 10.0) -> ShardSession:
    """Connect (``client``, the scheduler at ``dask_address``, else a local cluster of
    ``n_workers`` single-threaded processes) and load every shard once on the workers:
    reads and validates every row, splits, and fills the shard sets' ``sha256``. The
    plan's split sizes are checked against what the workers found."""
    cluster = None
    if client is None and dask_address is None:
        cluster = LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True,
                               dashboard_address=None, memory_limit=memory_limit)
    try:
        if client is not None:
            session = ShardSession(plan, client, cluster, owns_client=False)
        else:
            session = ShardSession(plan, Client(dask_address or cluster,
                                                timeout=connect_timeout), cluster)
    except BaseException:
        if cluster is not None:
            cluster.close()
        raise
    try:
        _load(session)
    except BaseException:
        session.close()
        raise
    return session


def _load(session: ShardSession) -> None:
    plan, client = session.plan, session.client
    start = time.perf_counter()
    sets = [(plan.data, plan.fraction)]
    if plan.evaluation is not None:
        sets.append((plan.evaluation, 0.0))
    digests = []
    for shards, fraction in sets:
        loaded = [client.submit(load_split_shard, f, shards.input_kind, shards.n_classes,
                                plan.seed, fraction, shards.key(f), pure=False)
                  for f in shards.files]
        found = client.gather([client.submit(shard_digest, p, pure=False) for p in loaded])
        digests.append(found)
        for part, (_, _, n_cal, n_eval) in zip(loaded, found, strict=True):
            if n_cal:
                session.calibration.append(client.submit(pick, part, "calibration",
                                                         pure=False))
            if n_eval:
                session.evaluation.append(client.submit(pick, part, "evaluation",
                                                        pure=False))
        del loaded  # the partitions live on in the picks
    n_cal = sum(c for found in digests for _, _, c, _ in found)
    n_eval = sum(e for found in digests for _, _, _, e in found)
    if (n_cal, n_eval) != (plan.n_calibration, plan.n_evaluation):
        raise ValueError(f"{plan.data.path}: the workers found {n_cal} calibration and "
                         f"{n_eval} evaluation rows; the footers promised "
                         f"{plan.n_calibration} and {plan.n_evaluation} (did a shard change "
                         "while it was read?)")
    combined = [_combined_digest(shards, found)
                for (shards, _), found in zip(sets, digests, strict=True)]
    session.plan = replace(plan, data=replace(plan.data, sha256=combined[0]),
                           evaluation=None if plan.evaluation is None
                           else replace(plan.evaluation, sha256=combined[1]))
    session.seconds["load"] = time.perf_counter() - start


def _combined_digest(shards: ShardSet, found) -> str:
    lines = "".join(f"{shards.relative(path)} {digest}\n" for path, digest, _, _ in found)
    return hashlib.sha256(lines.encode()).hexdigest()


def fit_calibrator_on(session: ShardSession, name: str):
    """Calibrator ``name`` (one of REDUCIBLE) fitted on every calibration row."""
    start = time.perf_counter()
    plan = session.plan
    fitted = fit_calibrator(name, session.reduce("calibration"), plan.n_calibration,
                            plan.n_classes, input_kind=plan.input_kind)
    session.seconds["calibrator"] = time.perf_counter() - start
    return fitted


def fit_cord_on(session: ShardSession, calibrator, cord: CORD | None = None) -> CORD:
    """CORD's eta* from exact sums over every calibration row (``reduce.fit_cord``)."""
    start = time.perf_counter()
    cord = CORD() if cord is None else cord
    client, state = session.client, calibrator.to_dict()
    scalars = [client.submit(with_cord_scalars, p, state, session.plan.input_kind,
                             float(cord.local_weight), pure=False)
               for p in session.calibration]
    fitted = fit_cord(_reducer(client, scalars), session.plan.n_calibration,
                      session.plan.n_classes, cord)
    session.seconds["cord"] = time.perf_counter() - start
    return fitted


@dataclass(frozen=True)
class ShardEvaluation:
    """Metrics over every evaluation row (``metrics``: original / calibrated / repaired,
    from ``reduce.metrics_from_sums``), the label histograms of both splits, and the
    evaluation ``sample`` (a ``data.Dataset`` of at most the requested rows, ordered by
    sample key)."""

    metrics: dict
    calibration_counts: tuple[int, ...]
    evaluation_counts: tuple[int, ...]
    sample: data.Dataset


def evaluate_on(session: ShardSession, calibrator, cord: CORD,
                sample_rows: int) -> ShardEvaluation:
    """Reduce the metrics over every evaluation row and gather the sample: the
    ``sample_rows`` evaluation rows with the smallest sample keys (all of them when there
    are fewer), independent of how shards are spread over workers."""
    import numpy as np

    start = time.perf_counter()
    plan, kind, k = session.plan, session.plan.input_kind, session.plan.n_classes
    sums = session.reduce("evaluation")(evaluation_sums, calibrator.to_dict(), cord.to_dict(),
                                        kind)
    found = {name: metrics_from_sums([s[name] for s in sums])
             for name in ("original", "calibrated", "repaired")}
    counts = [tuple(int(c) for c in sum(session.reduce(which)(label_counts, k)))
              for which in ("calibration", "evaluation")]
    n_eval = plan.n_evaluation
    # a threshold that keeps about sample_rows + 6 standard deviations of rows: fewer than
    # sample_rows survive with probability below 1e-9, and the driver keeps the smallest
    threshold = (1.0 if n_eval <= sample_rows else
                 min(1.0, (sample_rows + 6.0 * sample_rows**0.5 + 20.0) / n_eval))
    parts = session.reduce("evaluation")(sample_below, threshold)
    keys = np.concatenate([p[2] for p in parts])
    order = np.argsort(keys, kind="stable")[:sample_rows]
    scores = np.concatenate([p[0] for p in parts])[order]
    labels = np.concatenate([p[1] for p in parts])[order]
    digest = hashlib.sha256(scores.tobytes() + labels.tobytes()).hexdigest()
    source = plan.data if plan.evaluation is None else plan.evaluation
    scores.flags.writeable = labels.flags.writeable = False  # like a loaded Dataset's
    sample = data.Dataset(scores, labels, kind, source.path, digest)
    session.seconds["evaluate"] = time.perf_counter() - start
    return ShardEvaluation(found, counts[0], counts[1], sample)
