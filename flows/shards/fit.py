"""Fits and evaluation on a :class:`flows.shards.session.ShardSession`: the calibrator
from reduced sums (:func:`fit_calibrator_on`), CORD's eta* from exact partition sums on
one pass that also confirms a TS fit (:func:`fit_cord_on`), the metrics over every
evaluation row with a bounded sample of them (:func:`evaluate_on`), and the one-call
entry point over every row of the shards (:func:`fit_shards`). The numerics live in
``cord_ops.reduce`` (pure numpy); this module only moves them.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field

import numpy as np
from distributed import Client

from cord_ops import data
from cord_ops.calibrators import calibrator_from_dict
from cord_ops.calibrators.temperature import BETA_RTOL
from cord_ops.cord import CORD, check_cord_params
from cord_ops.names import REDUCIBLE
from cord_ops.partition_sums import partition_label_counts, repaired_metric_sums
from cord_ops.reduce import (
    fit_calibrator_from_sums,
    fit_cord_from_sums,
    fit_temperature,
    metrics_from_sums,
    temperature_step,
)
from flows.shards.plan import ShardPlan, describe_shards
from flows.shards.session import ShardSession, open_shard_session
from flows.shards.worker import (
    add_all,
    cord_scalars,
    evaluation_partition,
    merge_scalars,
    pass_sums,
    sample_below,
)

#: Calibration rows gathered to the driver for the calibrator's warm start (TS; VS's
#: sample grows with the data, ``warm_start_rows``).
WARM_START_ROWS = 20_000
#: Most bytes of float64 scores the VS warm-start sample may take on the driver.
WARM_START_BYTES = 80 << 20


def warm_start_rows(name: str, n: int, k: int) -> int:
    """Rows of the warm-start sample: ``WARM_START_ROWS`` for TS (Halley needs a start
    within ~1e-2); for VS one row in 20, between that and 100,000 rows and within
    ``WARM_START_BYTES`` (a larger sample costs the driver a longer fit and Hessian, but
    its better start and preconditioner save full passes over the shards: docs/scale.md,
    "What the workers do")."""
    if name != "vs":
        return WARM_START_ROWS
    return max(WARM_START_ROWS, min(n // 20, 100_000, WARM_START_BYTES // (8 * k)))



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
    fitted = fit_calibrator_from_sums(name, session.reduce("calibration"), plan.n_calibration,
                            plan.n_classes, input_kind=plan.input_kind,
                            sample=(sample[0], sample[1]), settle=settle)
    session.unconfirmed = fitted.to_dict() if settle is not None else None
    session.seconds["calibrator"] = time.perf_counter() - start
    return fitted


def fit_cord_on(session: ShardSession, calibrator, cord: CORD | None = None, *,
                gather: bool = False, metrics: bool = False):
    """(CORD, calibrator, sums): eta* from exact sums over every calibration row
    (``reduce.fit_cord_from_sums``; its ``gather`` mode on request), on one pass that also confirms
    a TS beta :func:`fit_calibrator_on` left unconfirmed — when it is not (its Newton step
    is above BETA_RTOL, which a cubically converging fit does not reach in practice), the
    fit resumes from there to full convergence and the pass is repeated, and the
    calibrator returned is that one. ``metrics``: ``sums`` holds the metric sums of the
    original, calibrated and repaired outputs over the calibration rows from the same
    pass (``partition_sums.cord_partition_pass``), else it is None."""
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
        moments = add_all([s["temperature"] for s in sums])
        if temperature_step(calibrator.beta_, moments, plan.n_calibration) > BETA_RTOL:
            del scalars, reduce
            params, _ = fit_temperature(session.reduce("calibration"), plan.n_calibration,
                                        input_kind=plan.input_kind, start=calibrator.beta_)
            polished = calibrator_from_dict({**state, "params": params})
            return fit_cord_on(session, polished, cord, gather=gather, metrics=metrics)
    fitted = fit_cord_from_sums(reduce, plan.n_calibration, plan.n_classes, cord, gather=gather)
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
        partition_label_counts, k))) for which in ("calibration", "evaluation")]
    scores, labels, _ = _sample(session, "evaluation", plan.n_evaluation, sample_rows)
    digest = hashlib.sha256(scores.tobytes() + labels.tobytes()).hexdigest()
    source = plan.data if plan.evaluation is None else plan.evaluation
    scores.flags.writeable = labels.flags.writeable = False  # like a loaded Dataset's
    sample = data.Dataset(scores, labels, kind, source.path, digest)
    session.seconds["evaluate"] = time.perf_counter() - start
    return ShardEvaluation(found, counts[0], counts[1], sample)


# ------------------------------------------------------------ the library entry point
@dataclass
class DistributedFit:
    """What :func:`fit_shards` returns: the calibrator and CORD fitted on every row, the
    metrics over the same rows, and which shards they came from."""

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
    the same rows. ``gather`` selects ``fit_cord_from_sums``'s gathered mode (eta* bit-identical to
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
    with open_shard_session(plan, dask_address=dask_address, client=client, n_workers=n_workers,
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

