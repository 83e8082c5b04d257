"""The paper's experimental protocol as one Prefect flow whose tasks run on a Dask cluster.

``cord-ops reproduce`` evaluates CORD over every .npz file of a directory x calibrators x
seeded splits (paper, Experimental Setup): for seed s the rows are permuted by
``np.random.default_rng(s).permutation(n)`` and the first half is the calibration split
(``cord_ops.data.split_indices``). One task per (file, calibrator, seed) fits the
calibrator ONCE on the calibration half and reuses its outputs for CORD, minimal repair
(Table 2), the three other mean targets (Tables 3, 10) and the local-weight sweep
(Appendix B, Table 6); for the size-study calibrators the same task also refits on nested
10%..90% prefixes of the calibration half with the evaluation half fixed (Figure 4 /
Appendix G; 100% is the main fit). The flow then writes the tables and figures
(:mod:`flows.reproduce_report`) and records one MLflow parent run with a nested child run
per (file, calibrator, seed); the tables and figures are the parent's artifacts.

Tasks run through prefect-dask's ``DaskTaskRunner``: a local cluster (2 single-threaded
worker processes by default) or an existing scheduler (``--dask-address tcp://host:8786``).
Tasks receive file paths, not arrays, so workers on other machines need the data directory
at the same path (a shared filesystem). Workers only compute; everything that writes
(tables, figures, MLflow) runs in the flow's own process.

``cord-ops bench`` prints the performance table (calibrator fit times, CORD fit/transform
next to the paper's Table 5, ONNX throughput, end-to-end flow time) and logs it to MLflow.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from cord_ops import CORD, data, metrics, minimal_repair
from cord_ops.validation import top1
from flows import reproduce_report, tracking
from flows.reproduce_cli import (
    CALIBRATORS,
    DEFAULT_OUT,
    DEFAULT_SEEDS,
    DEFAULT_WORKERS,
    EXPERIMENT,
    default_data_dir,
)
from flows.reproduce_paper import (
    LOCAL_WEIGHTS,
    MEAN_TARGET_VARIANTS,
    SIZE_CALIBRATORS,
    SIZE_FRACTIONS,
)

QUICK_CALIBRATORS = ("vs", "svs", "irova")
QUICK_FILES = 2
SERVER_STARTUP_SECONDS = 120
#: Cost order of one task, most expensive first (measured single-threaded on 5000 CIFAR-100
#: rows: Dir-ODIR ~90 s, MS ~5 s, VS ~1 s x 10 fits of the size study, ...). Submitting the
#: slow tasks first keeps both workers busy to the end instead of leaving a long fit for last.
FIT_COST_ORDER = ("dir-odir", "ms", "mcct-i", "vs", "sms", "irova-ts", "irova", "svs",
                  "ts-tva", "irm", "ts")

compute_task = task(cache_policy=NO_CACHE, persist_result=False)


def dataset_and_classifier(path: str | os.PathLike) -> tuple[str, str]:
    """Split a file stem ``<dataset>_<classifier>`` (e.g. cifar10_resnet56) at its first
    underscore; a stem without one is a dataset of its own."""
    stem = Path(path).stem
    dataset, _, classifier = stem.partition("_")
    return dataset, classifier or stem


@dataclass(frozen=True)
class SweepPlan:
    """What one reproduction evaluates (all fields plain, so the plan logs as params)."""

    files: tuple[str, ...]
    calibrators: tuple[str, ...]
    seeds: tuple[int, ...]
    size_calibrators: tuple[str, ...]
    size_fractions: tuple[float, ...]
    local_weights: tuple[float, ...]

    def cells(self) -> list[tuple[str, str, int]]:
        """(file, calibrator, seed) triples, the slowest fits first."""
        rank = {name: i for i, name in enumerate(FIT_COST_ORDER)}
        sizes = {path: Path(path).stat().st_size for path in self.files}
        return sorted(((f, c, s) for f in self.files for c in self.calibrators
                       for s in self.seeds),
                      key=lambda cell: (rank.get(cell[1], 0), -sizes[cell[0]], cell))


def plan_sweep(data_dir, *, seeds: int = DEFAULT_SEEDS, calibrators=None,
               quick: bool = False) -> SweepPlan:
    """Validate the inputs and fix what the sweep covers; raises before anything runs.

    Every .npz in ``data_dir`` is loaded and validated here (so a bad file fails the
    command before any task or run exists). ``quick`` keeps 1 seed, 2 files (one per
    dataset where there are several) and 3 calibrators (vs, svs, irova) unless
    ``calibrators`` names others.
    """
    root = Path(data_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"--data: {root} is not a directory")
    files = sorted(str(p.resolve()) for p in root.glob("*.npz"))
    if not files:
        raise FileNotFoundError(f"--data: {root} holds no .npz files")
    chosen = tuple(calibrators) if calibrators else (QUICK_CALIBRATORS if quick else CALIBRATORS)
    unknown = [c for c in chosen if c not in CALIBRATORS]
    if unknown:
        raise ValueError(f"--calibrators: unknown {unknown}; expected names from {CALIBRATORS}")
    if len(set(chosen)) != len(chosen):
        raise ValueError(f"--calibrators: {list(chosen)} names a calibrator twice")
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise ValueError(f"--seeds: expected a positive number of splits, got {seeds!r}")
    if quick:
        seeds = 1
        files = _one_per_dataset(files)[:QUICK_FILES]
    for path in files:
        data.load_npz(path)
    return SweepPlan(files=tuple(files), calibrators=chosen, seeds=tuple(range(seeds)),
                     size_calibrators=tuple(c for c in chosen if c in SIZE_CALIBRATORS),
                     size_fractions=SIZE_FRACTIONS, local_weights=LOCAL_WEIGHTS)


def _one_per_dataset(files: list[str]) -> list[str]:
    """The files reordered so the first file of every dataset comes first."""
    firsts, rest, seen = [], [], set()
    for path in files:
        dataset = dataset_and_classifier(path)[0]
        (rest if dataset in seen else firsts).append(path)
        seen.add(dataset)
    return firsts + rest


def repair_metrics(p0: np.ndarray, q: np.ndarray, repaired: np.ndarray,
                   labels: np.ndarray) -> dict[str, float]:
    """Metrics of a repaired report plus |mean s - mean b| in pp (Table 3's last column):
    s_i and b_i are the repaired and the direct output's mass on the original top-1."""
    out = metrics.evaluate(repaired, labels, reference=p0)
    rows = np.arange(p0.shape[0])
    a = top1(p0)
    out["mean_gap_pp"] = 100.0 * abs(float(repaired[rows, a].mean() - q[rows, a].mean()))
    return out


def _reliability(probs: np.ndarray, labels: np.ndarray) -> dict[str, list]:
    bins = metrics.reliability_diagram(probs, labels)
    return {key: bins[key].tolist() for key in ("count", "confidence", "accuracy")}


def _fitted_outputs(dataset: data.Dataset, calibrator: str, cal_idx: np.ndarray,
                    eval_idx: np.ndarray) -> tuple[np.ndarray, np.ndarray, dict[str, float]]:
    """Fit ``calibrator`` on the calibration rows; its outputs on both halves and timings."""
    from cord_ops.calibrators import make_calibrator

    model = make_calibrator(calibrator, input_kind=dataset.input_kind)
    start = time.perf_counter()
    model.fit(dataset.scores[cal_idx], dataset.labels[cal_idx])
    fitted = time.perf_counter()
    q_cal = model.predict_proba(dataset.scores[cal_idx])
    q_eval = model.predict_proba(dataset.scores[eval_idx])
    done = time.perf_counter()
    return q_cal, q_eval, {"calibrator_fit": fitted - start, "calibrator_predict": done - fitted}


@compute_task
def evaluate_cell(path: str, calibrator: str, seed: int,
                  local_weights: tuple[float, ...] = LOCAL_WEIGHTS,
                  size_fractions: tuple[float, ...] = ()) -> dict:
    """Everything the tables need from one (file, calibrator, seed).

    The calibrator is fitted once on the calibration half; CORD (eq. 6-8), minimal repair,
    the mean-target variants and the local-weight sweep (eq. 25) all repair the same direct
    outputs. Reports are keyed uncal, base, cord, minimal, mean_<target>, lambda_<weight>;
    each holds the metrics of ``cord_ops.metrics.evaluate`` on the evaluation half (TPCR
    against the original top-1) and, for repairs, ``eta_star`` and ``mean_gap_pp``.

    With ``size_fractions``, ``size_points`` adds the calibration-size study (Figure 4):
    Base and Base+CORD metrics when calibrator and CORD see only the first
    round(f * n_cal) rows of the permuted calibration half (nested subsets), the
    evaluation half fixed; the 100% point reuses the full fit.
    """
    timings: dict[str, float] = {}
    start = time.perf_counter()
    dataset = data.load_npz(path)
    cal_idx, eval_idx = data.split_indices(dataset.n, seed)
    p0 = dataset.probabilities()
    p0_cal, p0_eval, y_eval = p0[cal_idx], p0[eval_idx], dataset.labels[eval_idx]
    timings["load_split"] = time.perf_counter() - start

    q_cal, q_eval, fit_times = _fitted_outputs(dataset, calibrator, cal_idx, eval_idx)
    timings.update(fit_times)

    start = time.perf_counter()
    cord = CORD().fit(p0_cal, q_cal)
    fitted = time.perf_counter()
    repaired = cord.transform(p0_eval, q_eval)
    timings["cord_fit"] = fitted - start
    timings["cord_transform"] = time.perf_counter() - fitted

    start = time.perf_counter()
    variants: dict[str, tuple[np.ndarray, float]] = {"cord": (repaired, cord.eta_)}
    for target in MEAN_TARGET_VARIANTS:
        model = CORD(mean_target=target).fit(p0_cal, q_cal)
        variants[f"mean_{target}"] = (model.transform(p0_eval, q_eval), model.eta_)
    for weight in local_weights:
        if weight == CORD().local_weight:
            continue
        model = CORD(local_weight=weight).fit(p0_cal, q_cal)
        variants[f"lambda_{weight:g}"] = (model.transform(p0_eval, q_eval), model.eta_)
    variants["minimal"] = (minimal_repair(p0_eval, q_eval), float("nan"))
    timings["variants"] = time.perf_counter() - start

    start = time.perf_counter()
    reports = {"uncal": metrics.evaluate(p0_eval, y_eval, reference=p0_eval),
               "base": metrics.evaluate(q_eval, y_eval, reference=p0_eval)}
    reports["base"].update(metrics.prediction_changes(p0_eval, q_eval, y_eval))
    for name, (probs, eta) in variants.items():
        reports[name] = repair_metrics(p0_eval, q_eval, probs, y_eval)
        reports[name]["eta_star"] = eta
    if CORD().local_weight in local_weights:
        reports[f"lambda_{CORD().local_weight:g}"] = dict(reports["cord"])
    reliability = {name: _reliability(probs, y_eval)
                   for name, probs in (("uncal", p0_eval), ("base", q_eval), ("cord", repaired))}
    timings["metrics"] = time.perf_counter() - start

    start = time.perf_counter()
    size_points = []
    for fraction in size_fractions:
        if fraction == 1.0:
            q_eval_f, repaired_f, n_sub = q_eval, repaired, cal_idx.size
        else:
            subset = cal_idx[:max(2, round(fraction * cal_idx.size))]
            q_sub, q_eval_f, _ = _fitted_outputs(dataset, calibrator, subset, eval_idx)
            repaired_f = CORD().fit(p0[subset], q_sub).transform(p0_eval, q_eval_f)
            n_sub = subset.size
        for report, probs in (("base", q_eval_f), ("cord", repaired_f)):
            size_points.append({"fraction": fraction, "n_calibration": int(n_sub),
                                "report": report,
                                **metrics.evaluate(probs, y_eval, reference=p0_eval)})
    if size_fractions:
        timings["size_study"] = time.perf_counter() - start

    dataset_name, classifier = dataset_and_classifier(path)
    return {"file": Path(path).stem, "dataset": dataset_name, "classifier": classifier,
            "calibrator": calibrator, "seed": seed, "n_classes": dataset.n_classes,
            "n_calibration": int(cal_idx.size), "n_evaluation": int(eval_idx.size),
            "reports": reports, "reliability": reliability, "timings": timings,
            "size_points": size_points, "worker": f"{socket.gethostname()}:{os.getpid()}"}


def _collect(futures: dict) -> tuple[list[dict], list[dict]]:
    """Results of finished futures and a record of each that failed (the sweep goes on)."""
    results, failures = [], []
    for (path, calibrator, seed), future in futures.items():
        future.wait()
        state = future.state
        if state.is_completed():
            results.append(future.result())
            continue
        try:
            future.result()
            error = f"task ended in state {state.type.value}"
        except Exception as exc:  # the failure is recorded, then the sweep goes on
            error = f"{type(exc).__name__}: {exc}"
        failures.append({"file": Path(path).stem, "calibrator": calibrator, "seed": seed,
                         "error": error})
    return results, failures


@flow(name="cord-ops-reproduce", persist_result=False)
def reproduce(data_dir: str, out_dir: str = str(DEFAULT_OUT), seeds: int = DEFAULT_SEEDS,
              calibrators: list[str] | None = None, quick: bool = False,
              experiment: str = EXPERIMENT, task_timeout: float | None = None,
              n_bootstrap: int | None = None) -> dict:
    """Run the sweep; returns the summary (parent run id, counts, failures, artifact paths).

    Reads top to bottom: plan -> submit one task per (file, calibrator, seed) to the Dask
    workers -> collect -> write tables and figures -> log the MLflow parent and child runs.
    Failed cells are listed in the summary and the report, the parent run ends FAILED.
    """
    logger = get_run_logger()
    started = time.perf_counter()
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
    cells, failures = _collect(futures)
    compute_seconds = time.perf_counter() - started
    logger.info("reproduce: %d cells done in %.1f s, %d failed", len(cells),
                compute_seconds, len(failures))

    written = reproduce_report.write_report(
        cells, failures, out_dir, **({"n_bootstrap": n_bootstrap} if n_bootstrap else {}))
    run_id = log_sweep(plan, cells, failures, out_dir, experiment,
                       {"compute_seconds": compute_seconds,
                        "flow_seconds": time.perf_counter() - started})
    return {"parent_run_id": run_id, "cells": len(cells), "failures": failures,
            "out_dir": str(out_dir),
            "artifacts": [str(p) for p in written], "compute_seconds": compute_seconds,
            "flow_seconds": time.perf_counter() - started}


def _child_metrics(cell: dict) -> list:
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    out = []
    for report, values in cell["reports"].items():
        for name, value in values.items():
            if value is not None and np.isfinite(value):
                out.append(Metric(f"{report}.{name}", float(value), now, 0))
    out.append(Metric("eta_star", float(cell["reports"]["cord"]["eta_star"]), now, 0))
    for name, seconds in cell["timings"].items():
        out.append(Metric(f"time.{name}", float(seconds), now, 0))
    # one curve per metric: the step is the calibration fraction in percent
    for point in cell["size_points"]:
        step = round(100 * point["fraction"])
        for name in ("tpcr", "ece", "nll", "brier"):
            out.append(Metric(f"size.{point['report']}.{name}", float(point[name]), now, step))
    return out


def log_sweep(plan: SweepPlan, cells: list[dict], failures: list[dict],
              out_dir, experiment: str, timings: dict[str, float]) -> str:
    """One parent run (plan as params, timings, tables and figures as artifacts) with a
    nested child run per (file, calibrator, seed). Returns the parent run id.

    The parent ends FINISHED when every task succeeded and FAILED otherwise; a failed
    cell's child run is FAILED and carries the error as a tag.
    """
    from mlflow import MlflowClient
    from mlflow.entities import Param, RunTag

    tracking.configure_tracking()
    client = MlflowClient()
    exp_id = tracking.experiment_id(experiment)
    parent = client.create_run(exp_id, run_name="reproduce",
                               tags={"cord_ops.kind": "reproduce"})
    parent_id = parent.info.run_id
    try:
        client.log_batch(parent_id, params=[
            Param("files", ",".join(Path(f).stem for f in plan.files)),
            Param("calibrators", ",".join(plan.calibrators)),
            Param("seeds", str(len(plan.seeds))),
            Param("size_calibrators", ",".join(plan.size_calibrators)),
            Param("size_fractions", ",".join(f"{f:g}" for f in plan.size_fractions)),
            Param("local_weights", ",".join(f"{w:g}" for w in plan.local_weights)),
        ])
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        client.log_batch(parent_id, metrics=[
            Metric(f"time.{k}", float(v), now, 0) for k, v in timings.items()
        ] + [Metric("cells", float(len(cells)), now, 0),
             Metric("failed_tasks", float(len(failures)), now, 0)])
        for cell in cells:
            key = (cell["file"], cell["calibrator"], cell["seed"])
            child = client.create_run(exp_id, run_name=f"{key[0]}/{key[1]}/seed{key[2]}",
                                      tags={"mlflow.parentRunId": parent_id})
            params = {"file": cell["file"], "dataset": cell["dataset"],
                      "classifier": cell["classifier"], "calibrator": cell["calibrator"],
                      "seed": cell["seed"], "n_classes": cell["n_classes"],
                      "n_calibration": cell["n_calibration"],
                      "n_evaluation": cell["n_evaluation"]}
            client.log_batch(child.info.run_id,
                             metrics=_child_metrics(cell),
                             params=[Param(k, str(v)) for k, v in params.items()])
            client.set_terminated(child.info.run_id, "FINISHED")
        for failure in failures:
            child = client.create_run(
                exp_id, run_name=f"{failure['file']}/{failure['calibrator']}/seed"
                                 f"{failure['seed']}",
                tags={"mlflow.parentRunId": parent_id})
            client.log_batch(child.info.run_id, tags=[RunTag("error", failure["error"][:5000])])
            client.set_terminated(child.info.run_id, "FAILED")
        client.log_artifacts(parent_id, str(out_dir))
    except BaseException:
        client.set_terminated(parent_id, "FAILED")
        raise
    client.set_terminated(parent_id, "FAILED" if failures else "FINISHED")
    return parent_id


# --------------------------------------------------------------------------- running


def task_runner(dask_address: str | None = None, workers: int = DEFAULT_WORKERS):
    """A DaskTaskRunner on ``dask_address``, or on a local cluster of ``workers``
    single-threaded processes (numpy's BLAS threads are pinned to 1 per worker by
    distributed's nanny, so 2 workers use the 2 cores without oversubscription)."""
    os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "warning")
    from prefect_dask import DaskTaskRunner

    if dask_address:
        return DaskTaskRunner(address=dask_address)
    if workers < 1:
        raise ValueError(f"--workers: expected at least 1, got {workers!r}")
    return DaskTaskRunner(cluster_kwargs={"n_workers": workers, "threads_per_worker": 1,
                                          "processes": True, "dashboard_address": ":0"})


@contextlib.contextmanager
def prefect_api():
    """Make sure every Dask worker reports to the same Prefect API.

    With no PREFECT_API_URL configured, Prefect would start a temporary server in the
    flow's process and, separately, in every worker process. Start one here instead and
    hand its URL to the workers through the environment (and to this process through the
    settings context); drain the log queue before stopping it.
    """
    from prefect.settings import PREFECT_API_URL, temporary_settings

    if PREFECT_API_URL.value():
        yield
        return
    from prefect.logging.handlers import APILogWorker
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer()
    # a first start migrates a fresh database, slow on a busy 2-core machine
    server.start(timeout=SERVER_STARTUP_SECONDS)
    previous = os.environ.get("PREFECT_API_URL")
    os.environ["PREFECT_API_URL"] = server.api_url
    try:
        with temporary_settings(updates={PREFECT_API_URL: server.api_url}):
            yield
            with contextlib.suppress(RuntimeError):
                APILogWorker.drain_all(timeout=10)
    finally:
        if previous is None:
            os.environ.pop("PREFECT_API_URL", None)
        else:
            os.environ["PREFECT_API_URL"] = previous
        server.stop()


def write_digits_data(folder: Path) -> Path:
    """Two classifiers' held-out logits on sklearn's bundled digits (``digits_a``: split seed
    0, ``digits_b``: seed 1), so ``--quick`` runs on a fresh clone without ../shared/data."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, seed in (("digits_a", 0), ("digits_b", 1)):
        bundled = data.digits_dataset(seed)
        data.save_npz(folder / f"{name}.npz", bundled.scores, bundled.labels, "logits")
    return folder


def run_reproduce(args: argparse.Namespace) -> int:
    """``cord-ops reproduce``: run the sweep, print where the outputs went; exit code 1
    when a task failed (the tables then cover the cells that finished)."""
    tracking.disable_telemetry()
    data_dir = args.data or default_data_dir()
    if data_dir is None and args.quick:
        data_dir = write_digits_data(Path(args.out) / "digits-data")
        print(f"reproduce: ../shared/data not found; --quick runs on the bundled digits "
              f"classifier ({data_dir})")
    if data_dir is None:
        print("cord-ops reproduce: --data is required (../shared/data not found)",
              file=sys.stderr)
        return 2
    plan_sweep(data_dir, seeds=args.seeds, calibrators=args.calibrators, quick=args.quick)
    started = time.perf_counter()
    with prefect_api():
        flow_fn = reproduce.with_options(
            task_runner=task_runner(args.dask_address, args.workers))
        summary = flow_fn(data_dir=str(data_dir), out_dir=str(args.out), seeds=args.seeds,
                          calibrators=args.calibrators, quick=args.quick,
                          experiment=args.experiment, task_timeout=args.task_timeout)
    total = time.perf_counter() - started
    tracking.configure_tracking()
    from mlflow import MlflowClient

    MlflowClient().log_metric(summary["parent_run_id"], "time.end_to_end_seconds", total)
    print(f"reproduce: {summary['cells']} cells, {len(summary['failures'])} failed; "
          f"compute {summary['compute_seconds']:.1f} s, "
          f"end to end {total:.1f} s")
    print(f"reproduce: tables and figures in {args.out}; MLflow parent run "
          f"{summary['parent_run_id']}")
    for failure in summary["failures"]:
        print(f"reproduce: FAILED {failure['file']}/"
              f"{failure['calibrator']}/seed{failure['seed']}: {failure['error']}",
              file=sys.stderr)
    return 1 if summary["failures"] else 0


