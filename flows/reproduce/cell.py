"""One (file, calibrator, seed) of the paper's protocol, as a Prefect task run on a Dask
worker.

For seed s the rows are permuted by ``np.random.default_rng(s).permutation(n)`` and the
first half is the calibration split (``cord_ops.data.split_indices``; paper, Experimental
Setup). The calibrator is fitted ONCE on the calibration half and its outputs are reused
for CORD, minimal repair (Table 2), the three other mean targets (Tables 3, 10) and the
local-weight sweep (Appendix B, Table 6); for the size-study calibrators the same task
also refits on nested 10%..90% prefixes of the calibration half with the evaluation half
fixed (Figure 4 / Appendix G; 100% is the main fit).

The task receives a file path, not arrays, so workers on other machines need the data
directory at the same path (a shared filesystem). It only computes and returns plain
Python values; everything that writes runs in the flow's own process.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import numpy as np

from cord_ops import CORD, data, metrics, minimal_repair
from cord_ops.calibrators import make_calibrator
from cord_ops.validation import top1
from flows.platform.task_presets import compute_task
from flows.reproduce.defaults import LOCAL_WEIGHTS, MEAN_TARGET_VARIANTS, dataset_and_classifier


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
