"""The paper's experimental protocol as one Prefect flow whose tasks run on a Dask cluster.

``cord-ops reproduce`` evaluates CORD over every .npz file of a directory x calibrators x
seeded splits (paper, Experimental Setup), one :func:`flows.reproduce.cell.evaluate_cell`
task per (file, calibrator, seed). The flow then writes the tables and figures
(:mod:`flows.reproduce.report`) and records one MLflow parent run with a nested child run
per (file, calibrator, seed); the tables and figures are the parent's artifacts.

Tasks run through prefect-dask's ``DaskTaskRunner``: a local cluster (2 single-threaded
worker processes by default) or an existing scheduler (``--dask-address tcp://host:8786``).
Workers only compute; everything that writes (tables, figures, MLflow) runs in the flow's
own process.
"""

from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path

from prefect import flow, get_run_logger

from flows.platform.prefect_api import api_environment
from flows.platform.progress import Progress
from flows.reproduce import report
from flows.reproduce.cell import evaluate_cell
from flows.reproduce.defaults import DEFAULT_OUT, DEFAULT_SEEDS, DEFAULT_WORKERS, EXPERIMENT
from flows.reproduce.plan import SweepPlan, plan_sweep
from flows.store import tracking

#: Dask's own INFO lines (cluster start, worker registration) drown the flow's log.
DASK_LOG_LEVEL = "warning"


def _outcome(key: tuple[str, str, int], future) -> tuple[dict | None, dict | None]:
    """(result, None) for a finished cell, (None, failure record) for a failed one."""
    path, calibrator, seed = key
    future.wait()
    if future.state.is_completed():
        return future.result(), None
    try:
        future.result()
        error = f"task ended in state {future.state.type.value}"
    except Exception as exc:  # the failure is recorded, then the sweep goes on
        error = f"{type(exc).__name__}: {exc}"
    return None, {"file": Path(path).stem, "calibrator": calibrator, "seed": seed,
                  "error": error}


def _collect(futures: dict, progress: Progress | None = None) -> tuple[list[dict], list[dict]]:
    """Results of finished futures and a record of each that failed (the sweep goes on),
    both in submission order; ``progress`` advances as each cell finishes."""
    from prefect.futures import as_completed

    keys = {future.task_run_id: key for key, future in futures.items()}
    outcomes = {}
    for future in as_completed(list(futures.values())):
        key = keys[future.task_run_id]
        outcomes[key] = _outcome(key, future)
        if progress is not None:
            failed = " FAILED" if outcomes[key][1] else ""
            progress.advance(note=f"{Path(key[0]).stem}/{key[1]}/seed{key[2]}{failed}")
    results = [outcomes[key][0] for key in futures if outcomes[key][0] is not None]
    failures = [outcomes[key][1] for key in futures if outcomes[key][1] is not None]
    return results, failures


@flow(name="cord-ops-reproduce", persist_result=False)
def reproduce(data_dir: str, out_dir: str = str(DEFAULT_OUT), seeds: int = DEFAULT_SEEDS,
              calibrators: list[str] | None = None, quick: bool = False,
              experiment: str = EXPERIMENT, task_timeout: float | None = None,
              n_bootstrap: int | None = None, tracking_uri: str | None = None,
              progress: bool = False) -> dict:
    """Run the sweep; returns the summary (parent run id, counts, failures, artifact paths).

    ``tracking_uri``: the MLflow store (default: MLFLOW_TRACKING_URI, else the embedded
    store of the working directory). ``progress``: report cells done of the total with an
    ETA on stderr (:class:`flows.platform.progress.Progress`).

    Reads top to bottom: plan -> submit one task per (file, calibrator, seed) to the Dask
    workers -> collect -> write tables and figures -> log the MLflow parent and child runs.
    Failed cells are listed in the summary and the report, the parent run ends FAILED.
    """
    logger = get_run_logger()
    started = time.perf_counter()
    uri = tracking.store_uri(tracking_uri)
    plan = plan_sweep(data_dir, seeds=seeds, calibrators=calibrators, quick=quick)
    logger.info("reproduce: %d files x %d calibrators x %d seeds; size study for %s",
                len(plan.files), len(plan.calibrators), len(plan.seeds),
                ", ".join(plan.size_calibrators) or "none")
    cell_task = evaluate_cell.with_options(timeout_seconds=task_timeout)

    futures = {
        (path, calibrator, seed): cell_task.submit(
            path, calibrator, seed, plan.local_weights,
            plan.size_fractions if calibrator in plan.size_calibrators else ())
        for path, calibrator, seed in plan.cells()
    }
    tracker = Progress(len(futures), "reproduce") if progress else None
    if tracker is not None:
        tracker.start()
    cells, failures = _collect(futures, tracker)
    compute_seconds = time.perf_counter() - started
    logger.info("reproduce: %d cells done in %.1f s, %d failed", len(cells),
                compute_seconds, len(failures))

    written = report.write_report(
        cells, failures, out_dir, **({"n_bootstrap": n_bootstrap} if n_bootstrap else {}))
    run_id = log_sweep(uri, plan, cells, failures, out_dir, experiment,
                       {"compute_seconds": compute_seconds,
                        "flow_seconds": time.perf_counter() - started})
    return {"parent_run_id": run_id, "cells": len(cells), "failures": failures,
            "out_dir": str(out_dir), "tracking_uri": uri,
            "artifacts": [str(p) for p in written], "compute_seconds": compute_seconds,
            "flow_seconds": time.perf_counter() - started}


def _child_values(cell: dict) -> tuple[dict[str, float], dict[int, dict[str, float]]]:
    """A child run's step-0 metrics and its size-study curves (step = calibration %)."""
    values = {f"{report_name}.{name}": value
              for report_name, report_values in cell["reports"].items()
              for name, value in report_values.items()}
    values["eta_star"] = cell["reports"]["cord"]["eta_star"]
    values.update({f"time.{name}": seconds for name, seconds in cell["timings"].items()})
    curves: dict[int, dict[str, float]] = {}
    for point in cell["size_points"]:
        step = round(100 * point["fraction"])
        curves.setdefault(step, {}).update(
            {f"size.{point['report']}.{name}": point[name]
             for name in ("tpcr", "ece", "nll", "brier")})
    return values, curves


def log_sweep(uri: str, plan: SweepPlan, cells: list[dict], failures: list[dict],
              out_dir, experiment: str, timings: dict[str, float]) -> str:
    """One parent run (plan as params, timings, tables and figures as artifacts) with a
    nested child run per (file, calibrator, seed) in the store at ``uri``. Returns the
    parent run id.

    The parent ends FINISHED when every task succeeded and FAILED otherwise; a failed
    cell's child run is FAILED and carries the error as a tag.
    """
    client = tracking.client(uri)
    exp_id = tracking.experiment_id(client, experiment)
    parent = client.create_run(exp_id, run_name="reproduce",
                               tags={"cord_ops.kind": "reproduce"})
    parent_id = parent.info.run_id
    try:
        tracking.log_values(client, parent_id, params={
            "files": ",".join(Path(f).stem for f in plan.files),
            "calibrators": ",".join(plan.calibrators),
            "seeds": len(plan.seeds),
            "size_calibrators": ",".join(plan.size_calibrators),
            "size_fractions": ",".join(f"{f:g}" for f in plan.size_fractions),
            "local_weights": ",".join(f"{w:g}" for w in plan.local_weights),
        }, metrics={**{f"time.{k}": v for k, v in timings.items()},
                    "cells": len(cells), "failed_tasks": len(failures)})
        for cell in cells:
            key = (cell["file"], cell["calibrator"], cell["seed"])
            child = client.create_run(exp_id, run_name=f"{key[0]}/{key[1]}/seed{key[2]}",
                                      tags={"mlflow.parentRunId": parent_id})
            params = {name: cell[name] for name in (
                "file", "dataset", "classifier", "calibrator", "seed", "n_classes",
                "n_calibration", "n_evaluation")}
            values, curves = _child_values(cell)
            tracking.log_values(client, child.info.run_id, metrics=values, params=params,
                                steps=curves, finite_only=True)
            client.set_terminated(child.info.run_id, "FINISHED")
        for failure in failures:
            child = client.create_run(
                exp_id, run_name=f"{failure['file']}/{failure['calibrator']}/seed"
                                 f"{failure['seed']}",
                tags={"mlflow.parentRunId": parent_id})
            tracking.log_values(client, child.info.run_id,
                                tags={"error": failure["error"][:5000]})
            client.set_terminated(child.info.run_id, "FAILED")
        client.log_artifacts(parent_id, str(out_dir))
    except BaseException:
        client.set_terminated(parent_id, "FAILED")
        raise
    client.set_terminated(parent_id, "FAILED" if failures else "FINISHED")
    return parent_id


def task_runner(dask_address: str | None = None, workers: int = DEFAULT_WORKERS):
    """A DaskTaskRunner on ``dask_address``, or on a local cluster of ``workers``
    single-threaded processes (numpy's BLAS threads are pinned to 1 per worker by
    distributed's nanny, so 2 workers use the 2 cores without oversubscription).

    Local workers are started with the quiet environment (telemetry off, Dask's log at
    warning) and the current Prefect API URL; Prefect also hands its settings to every
    task it submits, which is how workers of an external scheduler find the API.
    """
    from prefect_dask import DaskTaskRunner

    if dask_address:
        return DaskTaskRunner(address=dask_address)
    if workers < 1:
        raise ValueError(f"--workers: expected at least 1, got {workers!r}")
    env = {"DASK_LOGGING__DISTRIBUTED": DASK_LOG_LEVEL, **api_environment()}
    env = {k: v for k, v in tracking.subprocess_environment(env).items()
           if k in (*tracking.QUIET_ENVIRONMENT, *env)}
    # security=True: TLS with certificates made for this cluster, so another local account
    # cannot connect to its scheduler and run functions as this user.
    return DaskTaskRunner(cluster_kwargs={"n_workers": workers, "threads_per_worker": 1,
                                          "processes": True, "dashboard_address": None,
                                          "env": env, "security": True})


@contextlib.contextmanager
def quiet_dask_logs():
    """Dask's scheduler runs in this process: hold its loggers at :data:`DASK_LOG_LEVEL`
    while inside, then put their levels back."""
    import distributed  # noqa: F401  (sets its loggers' levels on import: quiet them after)

    loggers = [logging.getLogger(name) for name in ("distributed", "distributed.scheduler")]
    previous = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(DASK_LOG_LEVEL.upper())
    try:
        yield
    finally:
        for logger, level in zip(loggers, previous, strict=True):
            logger.setLevel(level)


