"""A Dask session over the shards of a :class:`flows.shards.plan.ShardPlan`: connect to a
scheduler or start a local cluster (:func:`local_cluster`, with ``WORKER_ENV``), have each
worker read, validate and split its shards once into scratch files
(``worker.load_split_shard``), and keep the partitions' futures pinned to the workers that
wrote them (:class:`ShardSession`). Closing the session deletes the scratch files.
"""

from __future__ import annotations

import hashlib
import os
import time
import uuid
from dataclasses import replace

from distributed import Client, LocalCluster, wait

from flows.shards.plan import ShardPlan, ShardSet
from flows.shards.worker import (
    apply_each,
    load_split_shard,
    pick,
    remove_scratch,
    shard_digest,
    summed,
)


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
#: hands its pages back, so each block's temporaries fault their pages in again. These two
#: bring block temporaries back from the arena (a trim keeps 64 MiB at its top), which
#: makes a pass about as fast as with glibc's defaults (docs/scale.md, "Worker memory
#: allocator" in "What the workers do"). Dask's own trimming of larger frees is kept.
#: Workers of a cluster given by address need them in their own environment
#: (docs/scale.md).
WORKER_ENV = {"MALLOC_MMAP_THRESHOLD_": 32 << 20, "MALLOC_TOP_PAD_": 64 << 20}


def local_cluster(n_workers: int, memory_limit: str | None = None) -> LocalCluster:
    """A local cluster of ``n_workers`` single-threaded worker processes started with
    ``WORKER_ENV``, speaking TLS with certificates made for it alone (``security=True``):
    its scheduler listens on a port every local account can reach, and a client it
    admitted could run any function as this user. The nanny prefers a value already in
    ``os.environ`` to its config (and writes its own there: an earlier cluster in this
    process leaves Dask's), so the values are put there while the workers spawn and the
    previous ones restored after."""
    import dask

    values = {key: str(value) for key, value in WORKER_ENV.items()}
    before = {key: os.environ.get(key) for key in values}
    environ = {f"distributed.nanny.pre-spawn-environ.{key}": value
               for key, value in values.items()}
    os.environ.update(values)
    try:
        with dask.config.set(environ):
            return LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True,
                                dashboard_address=None, memory_limit=memory_limit,
                                security=True)
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def open_shard_session(plan: ShardPlan, *, dask_address: str | None = None,
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

