"""Recalibration on a Dask cluster for labelled outputs in Parquet shards (docs/ layout:
score columns and ``labels``), one shard a partition, out of core.

Order of events, so that bad input stops everything before a cluster is contacted:

1. list the shards (a folder or glob, ``flows.files.expand_inputs``) and read their
   footers (:func:`describe_shards`): every shard must hold the same score layout and K, a
   ``labels`` column and rows; a calibrator that cannot be fitted from partition sums is
   refused naming the ones that can (``cord_ops.names.REDUCIBLE``);
2. connect to ``dask_address`` or start a local cluster; each worker reads and validates
   its shards once (``data.load_parquet``: a bad value is reported naming the file, column
   and row), splits the rows (``reduce.split_rows``) and writes each part's scores to a
   raw ``.npy`` scratch file in its local directory (float32 when that is exact, never
   pickle); only labels and sample keys stay in worker memory;
3. every later pass reads the scratch files memory-mapped, in row blocks of about
   ``BLOCK_BYTES`` of float64 (file pages are the page cache's, not the worker's heap), on
   the worker that wrote them: fit the calibrator from reduced sums, CORD's per-row
   scalars (kept in memory, 24 bytes a row) and eta* from exact partition sums
   (``cord_ops.reduce``), then the evaluation metrics. Closing the session deletes the
   scratch files.

The numerics live in ``cord_ops.reduce`` (pure numpy); this module only moves them.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from distributed import Client, LocalCluster, get_worker, wait

from cord_ops import data
from cord_ops.calibrators import calibrator_from_dict
from cord_ops.calibrators.temperature import BETA_RTOL
from cord_ops.cord import CORD, check_cord_params
from cord_ops.reduce import (
    PASS_ONLY,
    REDUCIBLE,
    cord_partition_pass,
    cord_pass_sums,
    fit_calibrator,
    fit_cord,
    fit_temperature,
    label_counts,
    metrics_from_sums,
    repaired_metric_sums,
    split_rows,
    temperature_step,
)
from flows.files import expand_inputs

#: Size of one row block's float64 scores during a pass (the worker's working set). Small
#: enough that a block's temporaries stay in the caches two workers share: the TS moment
#: pass costs 10.4 ns an entry with 32 MB blocks and 5.5 with 3 MB ones (K = 100).
BLOCK_BYTES = 4 << 20
#: Calibration rows gathered to the driver for the calibrator's warm start (TS; VS's
#: sample grows with the data, ``warm_start_rows``).
WARM_START_ROWS = 20_000
#: Most bytes of float64 scores the VS warm-start sample may take on the driver.
WARM_START_BYTES = 80 << 20


def warm_start_rows(name: str, n: int, k: int) -> int:
    """Rows of the warm-start sample: ``WARM_START_ROWS`` for TS (Halley needs a start
    within ~1e-2); for VS one row in 20, between that and 100,000 rows and within
    ``WARM_START_BYTES`` (its fit and Hessian cost ~3 s at 100,000 x 100 on the driver;
    a better start and preconditioner save full passes: 1M x 100 rows, 10 passes from
    20,000 rows, 5 from 100,000)."""
    if name != "vs":
        return WARM_START_ROWS
    return max(WARM_START_ROWS, min(n // 20, 100_000, WARM_START_BYTES // (8 * k)))


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


# ---------------------------------------------------------------- worker side
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


def _add_all(values):
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
    ``cord_ops.reduce`` returns sums (exact integers stay exact)."""
    total = None
    for block in blocks(part):
        value = fn(block, *args)
        total = value if total is None else _add(total, value)
    return total


def cord_scalars(part, calibrator_state, input_kind, local_weight, metrics=False,
                 temperature=False) -> dict:
    """CORD's per-row scalars (b, min I, g) of the partition, kept in worker memory for
    the bisection (24 bytes a row), with what ``reduce.cord_partition_pass`` adds on
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
    out["sums"] = _add_all([p["sums"] for p in parts])
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


# ---------------------------------------------------------------- the old entry point
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


def fit_shards(spec, calibrator: str = "ts", *, dask_address: str | None = None,
               client: Client | None = None, n_workers: int = 2,
               memory_limit: str | None = None, input_kind: str = "auto",
               cord: CORD | None = None, gather: bool = False) -> DistributedFit:
    """Fit ``calibrator`` (a name in REDUCIBLE, or an already fitted calibrator, which is
    kept) + CORD on every row of the Parquet shards of ``spec`` (folder or glob) on Dask:
    ``client``, else the scheduler at ``dask_address``, else a local cluster of
    ``n_workers`` single-threaded processes (``memory_limit`` each). ``metrics`` are over
    the same rows. ``gather`` selects ``fit_cord``'s gathered mode (eta* bit-identical to
    ``CORD.fit`` on all rows)."""
    if not isinstance(calibrator, str):
        calibrator.check_is_fitted()  # a fitted calibrator: only CORD is fitted here
    elif calibrator not in REDUCIBLE:
        raise ValueError(f"calibrator {calibrator!r} cannot be fitted on Dask partitions "
                         f"(it needs every row at once); expected one of "
                         f"{', '.join(REDUCIBLE)}")
    cord = CORD() if cord is None else cord
    check_cord_params(cord)
    shards = describe_shards(spec, input_kind)
    plan = ShardPlan(shards, None, 0, 1.0, shards.n, 0)
    with open_session(plan, dask_address=dask_address, client=client, n_workers=n_workers,
                      memory_limit=memory_limit) as session:
        if isinstance(calibrator, str):
            cal = fit_calibrator_on(session, calibrator)
        else:
            cal = calibrator
            if cal.n_classes_ != shards.n_classes or cal.input_kind != shards.input_kind:
                raise ValueError(f"calibrator: fitted for K = {cal.n_classes_} "
                                 f"{cal.input_kind}; the shards hold K = {shards.n_classes} "
                                 f"{shards.input_kind}")
        fitted, cal, metrics = fit_cord_on(session, cal, cord, gather=gather, metrics=True)
        return DistributedFit(cal, fitted, metrics, shards.n, shards.n_classes,
                              shards.input_kind, list(shards.files), dict(session.seconds))


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
    """Scores per row of a list score column: the fixed size, or the length of the first
    row; 1 for a plain numeric column (a binary model's one score column)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if pa.types.is_floating(arrow_type) or pa.types.is_integer(arrow_type):
        return 1
    if pa.types.is_fixed_size_list(arrow_type):
        return int(arrow_type.list_size)
    batch = next(pq.ParquetFile(path).iter_batches(batch_size=1, columns=[column]), None)
    return 0 if batch is None or batch.num_rows == 0 else len(batch.column(0)[0])


def describe_shards(spec, input_kind: str = "auto") -> ShardSet:
    """The shards of ``spec`` (a folder, a glob or one file) from their footers: one score
    layout and K across shards, a label column, at least one row each; raises ValueError
    naming the first shard that breaks that (nothing is read beyond footers and one row)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    single = Path(str(spec))
    if single.is_file():  # one file is one shard (e.g. --eval-data holdout.parquet)
        root, files = single.absolute().parent, [single.absolute()]
    else:
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
        k = 2 if k == 1 else k  # one score column: a binary model (data.table_scores)
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


class ShardSession:
    """A Dask client whose workers hold the split shards of a :class:`ShardPlan`:
    ``calibration`` and ``evaluation`` are lists of futures of non-empty partitions
    (scratch-file handles), each pinned to the worker that wrote its file. Close it (or
    use it as a context manager) to release the partitions, delete the scratch files and
    stop a local cluster it started.

    The pinning is loose (``allow_other_workers``), so a dead worker is never waited for:
    the scheduler recomputes its partitions from their lineage on another worker (which
    re-reads the shard and writes a new scratch file), and a task that runs away from
    its partition's scratch file (work stealing, a recomputed handle) re-reads those rows
    from the shard (``part_scores``): slower, the same numbers."""

    def __init__(self, plan: ShardPlan, client: Client, cluster=None, owns_client=True):
        self.plan, self.client, self.cluster = plan, client, cluster
        self.owns_client = owns_client
        self.id = uuid.uuid4().hex
        self.calibration: list = []
        self.evaluation: list = []
        self.home: dict = {}  # future key -> the worker holding its scratch file
        self.seconds: dict = {}
        self.unconfirmed: dict | None = None  # a TS state fit_cord_on must confirm

    def reduce(self, which: str):
        """``reduce(fn, *args)``: ``fn`` summed over the row blocks of every
        ``calibration`` or ``evaluation`` partition, on the partition's worker."""
        return self.reducer(getattr(self, which), summed)

    def reducer(self, futures, wrapper=None):
        """``reduce(fn, *args)`` applying ``fn`` (through ``wrapper(part, fn, *args)``
        when given) to every future's partition on its own worker; results in the
        futures' order. One task per worker and call, looping over that worker's
        partitions (``apply_each``): a pass then costs two scheduler round trips in all,
        not one per shard."""
        client = self.client
        groups: dict = {}
        for i, f in enumerate(futures):
            groups.setdefault(tuple(self.home.get(f.key) or ()), []).append(i)

        def reduce(fn, *args):
            calls = [client.submit(apply_each, wrapper, fn, args,
                                   *(futures[i] for i in members), pure=False,
                                   workers=list(where) or None, allow_other_workers=True)
                     for where, members in groups.items()]
            out = [None] * len(futures)
            for members, found in zip(groups.values(), client.gather(calls), strict=True):
                for i, value in zip(members, found, strict=True):
                    out[i] = value
            return out
        return reduce

    def pinned(self, fn, futures, *args) -> list:
        """Futures of ``fn(part, *args)`` computed where each partition lives."""
        out = []
        for f in futures:
            new = self.client.submit(fn, f, *args, pure=False, workers=self.home.get(f.key),
                                     allow_other_workers=True)
            self.home[new.key] = self.home.get(f.key)
            out.append(new)
        return out

    def close(self) -> None:
        self.calibration, self.evaluation = [], []
        try:
            try:
                self.client.run(remove_scratch, self.id)
            finally:
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


#: Worker environment for the clusters this module starts. Dask's nanny sets
#: MALLOC_TRIM_THRESHOLD_ = 64 KiB, and setting any malloc threshold turns glibc's adaptive
#: ones off: every numpy temporary over 128 KiB is then a fresh mmap, and every free of one
#: hands its pages back, so each block's temporaries fault their pages in again. Measured
#: in a worker thread holding earlier partitions' results (K = 100, 4 MB blocks): TS
#: moments 20 ns an entry with Dask's setting, 7 with these two (block temporaries come
#: from the arena, and a trim keeps 64 MiB at its top), 6 with glibc's defaults; CORD's
#: pass 40 vs 23 ns. Dask's own trimming of larger frees is kept. Workers of a cluster
#: given by address need them in their own environment (docs/scale.md).
WORKER_ENV = {"MALLOC_MMAP_THRESHOLD_": 32 << 20, "MALLOC_TOP_PAD_": 64 << 20}


def local_cluster(n_workers: int, memory_limit: str | None = None) -> LocalCluster:
    """A local cluster of ``n_workers`` single-threaded worker processes started with
    ``WORKER_ENV``. The nanny prefers a value already in ``os.environ`` to its config
    (and writes its own there: an earlier cluster in this process leaves Dask's), so the
    values are put there while the workers spawn and the previous ones restored after."""
    import dask

    values = {key: str(value) for key, value in WORKER_ENV.items()}
    before = {key: os.environ.get(key) for key in values}
    environ = {f"distributed.nanny.pre-spawn-environ.{key}": value
               for key, value in values.items()}
    os.environ.update(values)
    try:
        with dask.config.set(environ):
            return LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True,
                                dashboard_address=None, memory_limit=memory_limit)
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def open_session(plan: ShardPlan, *, dask_address: str | None = None,
                 client: Client | None = None, n_workers: int = 2,
                 memory_limit: str | None = None,
                 connect_timeout: float = 10.0) -> ShardSession:
    """Connect (``client``, the scheduler at ``dask_address``, else a local cluster of
    ``n_workers`` single-threaded processes) and load every shard once on the workers:
    reads and validates every row, splits, writes the scratch files and fills the shard
    sets' ``sha256``. The plan's split sizes are checked against what the workers found."""
    cluster = None
    if client is None and dask_address is None:
        cluster = local_cluster(n_workers, memory_limit)
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
                                plan.seed, fraction, shards.key(f), session.id, pure=False)
                  for f in shards.files]
        try:
            found = client.gather([client.submit(shard_digest, p, pure=False)
                                   for p in loaded])
        except BaseException:
            wait(loaded)  # the other shards' scratch files are written before close
            raise
        digests.append(found)
        where = client.who_has(loaded)
        for part, (_, _, n_cal, n_eval) in zip(loaded, found, strict=True):
            session.home[part.key] = list(where[part.key])
            for name, count in (("calibration", n_cal), ("evaluation", n_eval)):
                if count:
                    getattr(session, name).extend(session.pinned(pick, [part], name))
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


#: A warm-started TS fit stops once a Halley step is this small (relative) and the CORD
#: pass confirms it (``reduce.fit_temperature``'s ``settle``): the step after a 1e-5 Halley
#: step is ~1e-15, well inside BETA_RTOL = 1e-12.
TS_SETTLE = 1e-5


def fit_calibrator_on(session: ShardSession, name: str):
    """Calibrator ``name`` (one of REDUCIBLE) fitted on every calibration row. A TS fit
    stops at ``TS_SETTLE`` and is confirmed by :func:`fit_cord_on`'s pass (it records the
    unconfirmed beta on the session)."""
    start = time.perf_counter()
    plan = session.plan
    sample = _sample(session, "calibration", plan.n_calibration,
                     warm_start_rows(name, plan.n_calibration, plan.n_classes))
    settle = TS_SETTLE if name == "ts" else None
    fitted = fit_calibrator(name, session.reduce("calibration"), plan.n_calibration,
                            plan.n_classes, input_kind=plan.input_kind,
                            sample=(sample[0], sample[1]), settle=settle)
    session.unconfirmed = fitted.to_dict() if settle is not None else None
    session.seconds["calibrator"] = time.perf_counter() - start
    return fitted


def fit_cord_on(session: ShardSession, calibrator, cord: CORD | None = None, *,
                gather: bool = False, metrics: bool = False):
    """(CORD, calibrator, sums): eta* from exact sums over every calibration row
    (``reduce.fit_cord``; its ``gather`` mode on request), on one pass that also confirms
    a TS beta :func:`fit_calibrator_on` left unconfirmed — when it is not (its Newton step
    is above BETA_RTOL, which a cubically converging fit does not reach in practice), the
    fit resumes from there to full convergence and the pass is repeated, and the
    calibrator returned is that one. ``metrics``: ``sums`` holds the metric sums of the
    original, calibrated and repaired outputs over the calibration rows from the same
    pass (``reduce.cord_partition_pass``), else it is None."""
    start = time.perf_counter()
    cord = CORD() if cord is None else cord
    plan = session.plan
    state = calibrator.to_dict()
    check = session.unconfirmed == state
    scalars = session.pinned(cord_scalars, session.calibration, state, plan.input_kind,
                             float(cord.local_weight), metrics, check)
    if not gather:  # gather keeps partition order: CORD.fit's pairwise means depend on it
        scalars = _per_worker(session, scalars)
    reduce = session.reducer(scalars)
    sums = reduce(pass_sums)
    if check:
        session.unconfirmed = None
        moments = _add_all([s["temperature"] for s in sums])
        if temperature_step(calibrator.beta_, moments, plan.n_calibration) > BETA_RTOL:
            del scalars, reduce
            params, _ = fit_temperature(session.reduce("calibration"), plan.n_calibration,
                                        input_kind=plan.input_kind, start=calibrator.beta_)
            polished = calibrator_from_dict({**state, "params": params})
            return fit_cord_on(session, polished, cord, gather=gather, metrics=metrics)
    fitted = fit_cord(reduce, plan.n_calibration, plan.n_classes, cord, gather=gather)
    found = None
    if metrics:
        repaired = reduce(repaired_metric_sums, fitted.eta_)
        found = {name: metrics_from_sums([s[name] for s in sums])
                 for name in ("original", "calibrated")}
        found["repaired"] = metrics_from_sums(repaired)
    del scalars, reduce
    session.seconds["cord"] = time.perf_counter() - start
    return fitted, calibrator, found


def _per_worker(session: ShardSession, futures) -> list:
    """The futures merged into one per worker (``merge_scalars``), on that worker."""
    groups: dict = {}
    for f in futures:
        groups.setdefault(tuple(session.home.get(f.key) or ()), []).append(f)
    merged = []
    for where, group in groups.items():
        new = session.client.submit(merge_scalars, *group, pure=False,
                                    workers=list(where) or None, allow_other_workers=True)
        session.home[new.key] = list(where) or None
        merged.append(new)
    return merged


def _sample(session: ShardSession, which: str, n: int, rows: int):
    """(scores, labels, keys): the ``rows`` rows of the ``which`` partitions with the
    smallest sample keys (all when there are fewer), whatever the workers."""
    # a threshold that keeps about rows + 6 standard deviations: fewer than ``rows``
    # survive with probability below 1e-9, and the driver keeps the smallest keys
    threshold = 1.0 if n <= rows else min(1.0, (rows + 6.0 * rows**0.5 + 20.0) / n)
    parts = session.reducer(getattr(session, which))(sample_below, threshold)
    keys = np.concatenate([p[2] for p in parts])
    order = np.argsort(keys, kind="stable")[:rows]
    return (np.concatenate([p[0] for p in parts])[order],
            np.concatenate([p[1] for p in parts])[order], keys[order])


def evaluation_partition(part, calibrator_state, cord_state, input_kind) -> dict:
    """Metric sums of the original, calibrated and repaired outputs over one partition:
    ``cord_scalars``' pass with the report's per-row values, then the repaired output's
    sums at the fitted eta* (``reduce.repaired_metric_sums``) without its K-vectors."""
    cord = CORD.from_dict(cord_state)
    rows = cord_scalars(part, calibrator_state, input_kind, float(cord.local_weight),
                        metrics=True)
    sums = rows.pop("sums")
    sums["repaired"] = repaired_metric_sums(rows, cord.eta_)
    return sums


def _metrics(session: ShardSession, which: str, calibrator, cord: CORD) -> dict:
    """``metrics_from_sums`` of the original, calibrated and repaired outputs over every
    row of the ``which`` partitions."""
    sums = session.reducer(getattr(session, which))(
        evaluation_partition, calibrator.to_dict(), cord.to_dict(), session.plan.input_kind)
    return {name: metrics_from_sums([s[name] for s in sums])
            for name in ("original", "calibrated", "repaired")}


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
    start = time.perf_counter()
    plan, kind, k = session.plan, session.plan.input_kind, session.plan.n_classes
    found = _metrics(session, "evaluation", calibrator, cord)
    counts = [tuple(int(c) for c in sum(session.reducer(getattr(session, which))(
        label_counts, k))) for which in ("calibration", "evaluation")]
    scores, labels, _ = _sample(session, "evaluation", plan.n_evaluation, sample_rows)
    digest = hashlib.sha256(scores.tobytes() + labels.tobytes()).hexdigest()
    source = plan.data if plan.evaluation is None else plan.evaluation
    scores.flags.writeable = labels.flags.writeable = False  # like a loaded Dataset's
    sample = data.Dataset(scores, labels, kind, source.path, digest)
    session.seconds["evaluate"] = time.perf_counter() - start
    return ShardEvaluation(found, counts[0], counts[1], sample)
