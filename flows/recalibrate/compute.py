"""The recalibration flow's compute tasks: load and check the inputs, split, fit the
calibrator and CORD, evaluate, export the ONNX graph and verify its parity; on Parquet
shards the same steps run on Dask (:mod:`flows.shards`).

None of them talks to the tracking store (those are in :mod:`flows.recalibrate.store_steps`).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field, replace

import numpy as np
from prefect import get_run_logger

from cord_ops import CORD, data, metrics
from cord_ops.calibrators import make_calibrator
from cord_ops.threshold import decisions
from flows import inputs
from flows.files import read_once
from flows.platform.task_presets import compute_task
from flows.promotion import rules
from onnx_export import parity


@dataclass(frozen=True)
class Evaluation:
    """The three probability reports on the evaluation split and their metrics."""

    labels: np.ndarray
    uncal: np.ndarray
    base: np.ndarray
    cord: np.ndarray
    reports: dict[str, dict[str, float]]
    changes: dict[str, int]
    #: what the repair did (``cord_ops.metrics.repair_effect``)
    effect: dict[str, float] = field(default_factory=dict)
    #: the binary decision threshold the decisions are taken at (None: the argmax)
    threshold: float | None = None


@dataclass(frozen=True)
class Parity:
    """ONNX graph vs cord_ops on the evaluation split."""

    max_abs_diff: float
    argmax_agreement: float
    tolerance: float
    repaired: np.ndarray

    @property
    def ok(self) -> bool:
        return self.max_abs_diff <= self.tolerance and self.argmax_agreement == 1.0


# ---------------------------------------------------------------- compute tasks
@compute_task
def load_dataset(path: str, input_kind: str) -> data.Dataset:
    """Load and validate an .npz or Parquet file of classifier outputs (errors name the file,
    the array or column, and the row); one this process loaded already is not read again
    (:func:`flows.files.preloaded`)."""
    return read_once(path, input_kind, lambda: data.load(path, input_kind=input_kind))


@compute_task
def check_options(calibrator: str, dtype: str, seed: int, fraction: float,
                  dataset: data.Dataset, eval_dataset: data.Dataset | None,
                  gate_options: dict | None = None,
                  decision_threshold: float | None = None) -> rules.Policy:
    """Reject a bad option before a run exists: unknown calibrator or dtype, a seed or
    fraction the split refuses, an evaluation file that does not match ``dataset``, a gate
    threshold out of range, splits too small to fit at all (the check the CLI runs before
    anything starts, :func:`flows.inputs.check_recalibration`). Returns the gate's
    policy."""
    if dtype not in rules.DTYPES:
        raise ValueError(f"dtype: expected one of {rules.DTYPES}, got {dtype!r}")
    return inputs.check_recalibration(dataset, eval_dataset, calibrator, fraction, seed,
                                      gate_options, decision_threshold)


@compute_task
def split_dataset(dataset: data.Dataset, eval_dataset: data.Dataset | None, seed: int,
                  fraction: float) -> tuple[data.Dataset, data.Dataset]:
    """(calibration, evaluation): the paper's seeded split, or all of ``dataset`` against a
    separate evaluation file."""
    if eval_dataset is not None:
        return dataset, eval_dataset
    return data.split(dataset, seed, fraction)


def _capturing_warnings(fit):
    """Call ``fit()``; return (result, the warnings it raised as "Category: message")."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fit()
    seen = []
    for w in caught:
        text = f"{w.category.__name__}: {w.message}"
        if text not in seen:
            seen.append(text)
    if seen:
        logger = get_run_logger()
        for text in seen:
            logger.warning("fit: %s", text)
    return result, seen


@compute_task
def fit_calibrator(calibration: data.Dataset, name: str):
    """Fit calibrator ``name`` on the calibration split; returns (fitted, warnings)."""
    fitted = make_calibrator(name, input_kind=calibration.input_kind)
    return _capturing_warnings(lambda: fitted.fit(calibration.scores, calibration.labels))


@compute_task
def fit_cord(calibration: data.Dataset, calibrator, decision_threshold: float | None = None):
    """Fit eta* (paper eq. 18) on the calibration split's original and calibrated outputs,
    keeping the decisions at ``decision_threshold`` when given (``cord_ops.threshold``);
    returns (CORD, warnings)."""
    original = calibration.probabilities()
    calibrated = calibrator.predict_proba(calibration.scores)
    repair = CORD(decision_threshold=decision_threshold)
    return _capturing_warnings(lambda: repair.fit(original, calibrated))


def no_harm_warning(calibration: data.Dataset, calibrator, repair: CORD,
                    tolerance: float = rules.DEFAULT_NLL_TOLERANCE) -> str | None:
    """The do-no-harm check of a fit: on its own calibration split, the calibrator's NLL
    (the metric reported, :func:`cord_ops.metrics.nll`) must be no worse than the identity
    map's, the classifier's own probabilities (within ``tolerance``, relative: rounding).
    Returns the warning when it is worse, else None.

    A fit that loses (a degenerate optimum, a family with no finite optimum on these
    rows, a floor other than the shared one) is kept, and said: the warning goes to the
    run tags (``cord.fit.warnings``, ``cord.fit.harm``) and the summary, and the gate
    refuses any version worse than the uncalibrated model on the evaluation split
    (:mod:`flows.promotion.rules`, rule 4). Keeping it, rather than falling back to the
    identity map, leaves the registered calibrator the one that was asked for, so what the
    operator reads is what was fitted. CORD repairs after the calibrator, so both are reported.
    """
    uncal = calibration.probabilities()
    base = calibrator.predict_proba(calibration.scores)
    before = metrics.nll(uncal, calibration.labels)
    after = metrics.nll(base, calibration.labels)
    if after <= before + tolerance * abs(before):
        return None
    repaired = metrics.nll(repair.transform(uncal, base), calibration.labels)
    return (f"DoNoHarmWarning: {calibrator.name} raises the NLL on its own calibration "
            f"split from {before:.6g} (uncalibrated) to {after:.6g} ({repaired:.6g} after "
            "CORD); the gate promotes no version worse than the uncalibrated model")


@compute_task
def check_no_harm(calibration: data.Dataset, calibrator, repair: CORD) -> list[str]:
    """:func:`no_harm_warning` as a step of the flow (logged); returns [] or [warning]."""
    text = no_harm_warning(calibration, calibrator, repair)
    if text is None:
        return []
    get_run_logger().warning("fit: %s", text)
    return [text]


@compute_task
def evaluate_reports(evaluation: data.Dataset, calibrator, repair: CORD) -> Evaluation:
    """Metrics of uncal (the classifier), base (the calibrator) and cord (the repair).

    TPCR is measured against the classifier's own top-1, the decision CORD preserves (with
    a decision threshold, accuracy, TPCR and the changes are of the decisions at it).
    """
    uncal = evaluation.probabilities()
    base = calibrator.predict_proba(evaluation.scores)
    repaired = repair.transform(uncal, base)
    y = evaluation.labels
    t = repair.decision_threshold
    reports = {
        "uncal": metrics.evaluate(uncal, y, threshold=t),
        "base": metrics.evaluate(base, y, reference=uncal, threshold=t),
        "cord": metrics.evaluate(repaired, y, reference=uncal, threshold=t),
    }
    changes = metrics.prediction_changes(uncal, base, y, threshold=t)
    return Evaluation(y, uncal, base, repaired, reports, changes,
                      metrics.repair_effect(uncal, base, repaired, y, threshold=t), t)


# ---------------------------------------------------------------- compute tasks on shards
@compute_task
def plan_shard_inputs(data: str, eval_data: str | None, input_kind: str, seed: int,
                      fraction: float):
    """The shards' layout, K and exact split sizes from their footers
    (:func:`flows.shards.plan.plan_shards`); errors name the shard."""
    from flows.shards.plan import plan_shards

    return plan_shards(data, eval_data, input_kind, seed, fraction)


@compute_task
def check_shard_options(calibrator: str, dtype: str, eval_sample: int, plan,
                        gate_options: dict | None = None) -> rules.Policy:
    """:func:`check_options` for shards: the calibrator must be fittable from partition
    sums (:func:`flows.inputs.check_shard_recalibration`)."""
    if dtype not in rules.DTYPES:
        raise ValueError(f"dtype: expected one of {rules.DTYPES}, got {dtype!r}")
    return inputs.check_shard_recalibration(plan, calibrator, eval_sample, gate_options)


@compute_task
def load_shards(plan, dask_address: str | None, dask_workers: int):
    """Connect to the Dask cluster (or start a local one) and read, validate and split
    every shard once on the workers; returns the open
    :class:`flows.shards.session.ShardSession`."""
    from flows.shards.session import open_shard_session

    return open_shard_session(plan, dask_address=dask_address, n_workers=dask_workers)


@compute_task
def fit_calibrator_on_shards(session, name: str):
    """Fit calibrator ``name`` on every calibration row from partition sums; returns
    (fitted, warnings)."""
    from flows.shards.fit import fit_calibrator_on

    return _capturing_warnings(lambda: fit_calibrator_on(session, name))


@compute_task
def fit_cord_on_shards(session, calibrator):
    """eta* (paper eq. 18) from exact sums over every calibration row, on the pass that
    also confirms a TS fit's beta; returns ((CORD, calibrator), warnings): the calibrator
    given, or the TS fit resumed when the pass did not confirm it."""
    from flows.shards.fit import fit_cord_on

    return _capturing_warnings(lambda: fit_cord_on(session, calibrator)[:2])


@compute_task
def evaluate_shards(session, calibrator, repair: CORD, eval_sample: int):
    """(Evaluation, sample, label counts): ECE, NLL, Brier, accuracy, TPCR and the
    prediction-change counts over every evaluation row; ECE-EM and smECE, and the
    Evaluation's arrays, on the evaluation sample (docs/scale.md)."""
    from flows.shards.fit import evaluate_on

    found = evaluate_on(session, calibrator, repair, eval_sample)
    sample = found.sample
    uncal = sample.probabilities()
    base = calibrator.predict_proba(sample.scores)
    repaired = repair.transform(uncal, base)
    reports = {}
    for report, name, probs in (("uncal", "original", uncal), ("base", "calibrated", base),
                                ("cord", "repaired", repaired)):
        full = found.metrics[name]
        reports[report] = {
            "ece": full["ece"], "ece_em": metrics.ece_em(probs, sample.labels),
            "smece": metrics.smece(probs, sample.labels), "nll": full["nll"],
            "brier": full["brier"], "accuracy": full["accuracy"],
            "tpcr": full.get("tpcr", 0.0)}
    changes = found.metrics["calibrated"]["changes"]
    evaluation = Evaluation(sample.labels, uncal, base, repaired, reports, changes,
                            metrics.repair_effect(uncal, base, repaired, sample.labels))
    return evaluation, sample, (found.calibration_counts, found.evaluation_counts)


@compute_task
def export_model(calibrator, repair: CORD, n_classes: int, input_kind: str, dtype: str):
    """One ONNX graph: calibrator then the closed-form repair with eta* baked in."""
    from onnx_export import export_onnx

    return export_onnx(calibrator, repair, n_classes, input_kind=input_kind, dtype=dtype)


@compute_task
def verify_parity(model, evaluation: data.Dataset, reference: Evaluation, dtype: str,
                  calibrator, repair: CORD) -> Parity:
    """Run the graph with onnxruntime (CPU) on the evaluation split and compare with cord_ops.

    The graph runs as every later score of the registered version does
    (:func:`flows.store.graphs.run_graph`), so ``repaired`` is what the gate, the run's
    metrics and ``promote`` measure. ``argmax_agreement`` is the share of rows whose
    repaired top-1 is the classifier's top-1 computed by cord_ops in float64, so a float32
    rounding that moves a decision counts against the graph (with a decision threshold,
    the decisions at it).
    """
    from flows.store.graphs import run_graph

    repaired = run_graph(model, evaluation.scores, outputs=["repaired"])["repaired"]
    repaired = repaired.astype(np.float64)
    diff = float(np.max(np.abs(repaired - reference.cord)))
    agreement = float(np.mean(decisions(repaired, reference.threshold)
                              == decisions(reference.uncal, reference.threshold)))
    tolerance = parity.parity_tolerance(calibrator, repair, evaluation.scores, dtype)
    return Parity(diff, agreement, tolerance, repaired)


def served_report(report: Evaluation, checked: Parity) -> Evaluation:
    """``report`` with its ``cord`` row measured on the exported graph's outputs
    (``checked.repaired``), the probabilities that are served, rather than on cord_ops' float64
    ones: the summary, the run's ``cord.*`` metrics, the gate and a later ``promote`` then
    give one NLL for the version on its evaluation split. The two differ within the parity
    tolerance per probability, but a true-class probability near 0 moves the NLL by far
    more: the log of a tiny probability magnifies its float32 rounding, enough for a few
    such rows to move the mean NLL of a whole split. The parity check itself compares
    against cord_ops (``report.cord``), so it runs first."""
    cord = checked.repaired
    reports = {**report.reports,
               "cord": metrics.evaluate(cord, report.labels, reference=report.uncal,
                                        threshold=report.threshold)}
    return replace(report, cord=cord, reports=reports)
