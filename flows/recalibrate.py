"""The recalibration flow: calibrate a fixed classifier's outputs, repair them with CORD so no
top-1 decision changes, export one ONNX graph, track everything in MLflow, register the
model and let it take ``@champion`` only when it wins.

Reads top to bottom: load and validate -> split -> fit calibrator -> fit CORD -> evaluate
uncal / base / cord on the evaluation split -> export ONNX -> verify ONNX parity with
onnxruntime on the evaluation split -> log to MLflow -> register -> gate.

Failure contract: a bad data file or option raises before any MLflow run exists. After the
run is created, any failing task marks it FAILED, withdraws a version it registered (the
alias goes back to where it was) and raises :class:`RecalibrationError` naming the step.
Tasks that talk to the tracking store retry on transient store errors.
"""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from prefect import flow, get_run_logger

from cord_ops import CORD, cord, data, metrics
from cord_ops.calibrators import make_calibrator
from cord_ops.validation import top1
from flows import plots, registry, tracking
from flows.tasks import compute_task, store_task

REPORTS = ("uncal", "base", "cord")
METRICS = ("ece", "ece_em", "smece", "nll", "brier", "accuracy", "tpcr")
#: Max-abs tolerance of the ONNX graph against cord_ops on the same inputs (docs/contract.md).
PARITY_TOLERANCE = {"float32": 1e-5, "float64": 1e-12}
MODEL_ARTIFACT = "model"
INPUT_EXAMPLE_ROWS = 5


class RecalibrationError(RuntimeError):
    """A recalibration failed; ``step`` is the task that raised."""

    def __init__(self, step: str, cause: BaseException):
        self.step = step
        super().__init__(f"recalibration failed in step '{step}': "
                         f"{type(cause).__name__}: {cause}")


@dataclass(frozen=True)
class Evaluation:
    """The three probability reports on the evaluation split and their metrics."""

    labels: np.ndarray
    uncal: np.ndarray
    base: np.ndarray
    cord: np.ndarray
    reports: dict[str, dict[str, float]]
    changes: dict[str, int]


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


@dataclass
class RecalibrationResult:
    """What one recalibration produced and where to find it.

    ``timings``: seconds per task as the flow saw them (task body plus Prefect's per-task
    overhead), summed over repeated calls.
    """

    run_id: str
    experiment_id: str
    tracking_uri: str
    model_name: str
    version: str
    decision: registry.GateDecision
    eta_star: float
    reports: dict[str, dict[str, float]]
    changes: dict[str, int]
    onnx_max_abs_diff: float
    timings: dict[str, float] = field(default_factory=dict)


class Steps:
    """Calls the flow's tasks in order, timing each and remembering which one is running."""

    def __init__(self):
        self.current = "start"
        self.timings: dict[str, float] = {}

    def __call__(self, step, *args, **kwargs):
        self.current = step.name
        start = time.perf_counter()
        result = step(*args, **kwargs)
        elapsed = time.perf_counter() - start
        self.timings[step.name] = self.timings.get(step.name, 0.0) + elapsed
        return result


# ---------------------------------------------------------------- compute tasks
@compute_task
def load_dataset(path: str, input_kind: str) -> data.Dataset:
    """Load and validate an .npz file of classifier outputs (errors name file, array, row)."""
    return data.load_npz(path, input_kind=input_kind)


@compute_task
def check_options(calibrator: str, dtype: str, seed: int, fraction: float,
                  dataset: data.Dataset, eval_dataset: data.Dataset | None) -> None:
    """Reject a bad option before a run exists: unknown calibrator or dtype, a seed or
    fraction the split refuses, an evaluation file that does not match ``dataset``."""
    make_calibrator(calibrator, input_kind=dataset.input_kind)
    if dtype not in PARITY_TOLERANCE:
        raise ValueError(f"dtype: expected one of {tuple(PARITY_TOLERANCE)}, got {dtype!r}")
    if eval_dataset is None:
        data.split_indices(dataset.n, seed, fraction)
        return
    if eval_dataset.n_classes != dataset.n_classes:
        raise ValueError(f"{eval_dataset.path}: has {eval_dataset.n_classes} classes but "
                         f"{dataset.path} has {dataset.n_classes}")
    if eval_dataset.input_kind != dataset.input_kind:
        raise ValueError(f"{eval_dataset.path}: holds {eval_dataset.input_kind} but "
                         f"{dataset.path} holds {dataset.input_kind}")


@compute_task
def split_dataset(dataset: data.Dataset, eval_dataset: data.Dataset | None, seed: int,
                  fraction: float) -> tuple[data.Dataset, data.Dataset]:
    """(calibration, evaluation): the paper's seeded split, or all of ``dataset`` against a
    separate evaluation file."""
    if eval_dataset is not None:
        return dataset, eval_dataset
    return data.split(dataset, seed, fraction)


@compute_task
def fit_calibrator(calibration: data.Dataset, name: str):
    """Fit calibrator ``name`` on the calibration split."""
    fitted = make_calibrator(name, input_kind=calibration.input_kind)
    return fitted.fit(calibration.scores, calibration.labels)


@compute_task
def fit_cord(calibration: data.Dataset, calibrator) -> CORD:
    """Fit eta* (paper eq. 18) on the calibration split's original and calibrated outputs."""
    original = calibration.probabilities()
    return CORD().fit(original, calibrator.predict_proba(calibration.scores))


@compute_task
def evaluate_reports(evaluation: data.Dataset, calibrator, repair: CORD) -> Evaluation:
    """Metrics of uncal (the classifier), base (the calibrator) and cord (the repair).

    TPCR is measured against the classifier's own top-1, the decision CORD preserves.
    """
    uncal = evaluation.probabilities()
    base = calibrator.predict_proba(evaluation.scores)
    repaired = repair.transform(uncal, base)
    y = evaluation.labels
    reports = {
        "uncal": metrics.evaluate(uncal, y),
        "base": metrics.evaluate(base, y, reference=uncal),
        "cord": metrics.evaluate(repaired, y, reference=uncal),
    }
    changes = metrics.prediction_changes(uncal, base, y)
    return Evaluation(y, uncal, base, repaired, reports, changes)


@compute_task
def export_model(calibrator, repair: CORD, n_classes: int, input_kind: str, dtype: str):
    """One ONNX graph: calibrator then the closed-form repair with eta* baked in."""
    from onnx_export import export_onnx

    return export_onnx(calibrator, repair, n_classes, input_kind=input_kind, dtype=dtype)


@compute_task
def verify_parity(model, evaluation: data.Dataset, reference: Evaluation, dtype: str) -> Parity:
    """Run the graph with onnxruntime (CPU) on the evaluation split and compare with cord_ops.

    ``argmax_agreement`` is the share of rows whose repaired top-1 is the classifier's
    top-1 computed by cord_ops in float64, so a float32 rounding that moves a decision
    counts against the graph.
    """
    from onnx_export.runtime import open_session

    session = open_session(model, provider="cpu")
    (repaired,) = session.run(["repaired"], {"scores": evaluation.scores.astype(dtype)})
    repaired = repaired.astype(np.float64)
    diff = float(np.max(np.abs(repaired - reference.cord)))
    agreement = float(np.mean(top1(repaired) == top1(reference.uncal)))
    return Parity(diff, agreement, PARITY_TOLERANCE[dtype], repaired)


# ---------------------------------------------------------------- tracking tasks
@store_task
def start_run(uri: str, model_name: str, dataset: data.Dataset,
              eval_dataset: data.Dataset | None, options: dict[str, str]) -> tuple[str, str]:
    """Create the MLflow run (experiment = model name); tags carry data provenance."""
    client = tracking.client(uri)
    experiment = tracking.experiment_id(client, model_name)
    tags = {"cord.model_name": model_name, **{f"cord.{k}": v for k, v in options.items()},
            **_data_tags("data", dataset)}
    if eval_dataset is not None:
        tags.update(_data_tags("eval_data", eval_dataset))
    flow_run_id = _prefect_flow_run_id()
    if flow_run_id:
        tags["prefect.flow_run_id"] = flow_run_id
    run = client.create_run(experiment, tags=tags,
                                    run_name=f"{options['calibrator']}-seed{options['seed']}")
    return run.info.run_id, experiment


@store_task
def log_params_and_metrics(uri: str, run_id: str, params: dict[str, str],
                           evaluation: Evaluation, repair: CORD, parity: Parity) -> None:
    """Every param and metric the MLflow contract (docs/contract.md) names, in one batch."""
    values = {"eta_star": repair.eta_}
    for report in REPORTS:
        for name in METRICS:
            values[f"{report}.{name}"] = evaluation.reports[report][name]
    for name, count in evaluation.changes.items():
        values[f"base.{name}"] = count
    values["onnx.max_abs_diff"] = parity.max_abs_diff
    values["onnx.argmax_agreement"] = parity.argmax_agreement
    tracking.log_values(tracking.client(uri), run_id, metrics=values, params=params)


@store_task
def log_report_artifacts(uri: str, run_id: str, evaluation: Evaluation, calibrator,
                         repair: CORD) -> None:
    """Reliability PNGs, the metrics table (Markdown and JSON) and both fitted states."""
    with tempfile.TemporaryDirectory(prefix="cord-ops-artifacts-") as tmp:
        root = Path(tmp)
        for folder in ("plots", "report", "state"):
            (root / folder).mkdir()
        for report in REPORTS:
            plots.reliability_png(getattr(evaluation, report), evaluation.labels,
                                  root / "plots" / f"reliability_{report}.png", title=report)
        table = {"reports": evaluation.reports, "base_prediction_changes": evaluation.changes,
                 "eta_star": repair.eta_, "eta_star_repr": repr(repair.eta_)}
        (root / "report" / "metrics.json").write_text(json.dumps(table, indent=2) + "\n")
        (root / "report" / "metrics.md").write_text(metrics_markdown(evaluation.reports,
                                                                     repair.eta_))
        (root / "state" / "calibrator.json").write_text(
            json.dumps(calibrator.to_dict(), indent=2) + "\n")
        (root / "state" / "cord.json").write_text(json.dumps(repair.to_dict(), indent=2) + "\n")
        tracking.client(uri).log_artifacts(run_id, str(root))


@store_task
def log_onnx_model(uri: str, run_id: str, model, evaluation: data.Dataset, dtype: str):
    """Log the graph with the ``mlflow.onnx`` flavor: explicit signature, input example and
    CPU execution provider, so ``mlflow.pyfunc.load_model`` serves it anywhere.

    The model is filed under the run's own experiment through explicit ids
    (:func:`flows.tracking.log_model`), never through MLflow's active experiment. The
    requirements are the flavor's own (onnx, onnxruntime): stating them skips MLflow's
    inference, which re-imports the model in a subprocess for several seconds.
    """
    import mlflow.onnx

    example = {"scores": np.asarray(evaluation.scores[:INPUT_EXAMPLE_ROWS], dtype=dtype)}

    def save(path: str, mlflow_model) -> None:
        mlflow.onnx.save_model(
            model, path, mlflow_model=mlflow_model, signature=model_signature(model),
            input_example=example, onnx_execution_providers=["CPUExecutionProvider"],
            save_as_external_data=False,
            pip_requirements=mlflow.onnx.get_default_pip_requirements())

    return tracking.log_model(tracking.client(uri), run_id, MODEL_ARTIFACT, save)


@store_task
def register(uri: str, run_id: str, model_name: str, model_info, parity: Parity,
             dataset: data.Dataset, repair: CORD, calibrator_name: str) -> tuple[str, str | None]:
    """Create the model version, last, and only for a graph whose parity was verified.

    Returns (version, champion version before this registration).
    """
    if not parity.ok:
        raise ValueError(
            f"ONNX parity failed: max |onnx - cord_ops| = {parity.max_abs_diff:.3g} "
            f"(tolerance {parity.tolerance:g}), argmax agreement {parity.argmax_agreement:.6f}"
            " (expected 1.0); nothing registered")
    client = tracking.client(uri)
    previous = registry.champion_version(client, model_name)
    with tracking.registry_lookups(client):
        version = registry.register_version(
            client, model_name, run_id, model_info.model_uri, model_info.model_id,
            tags={"cord.eta_star": repr(repair.eta_), "cord.calibrator": calibrator_name,
                  registry.INPUT_KIND_TAG: dataset.input_kind, "data.sha256": dataset.sha256},
        )
    return str(version.version), None if previous is None else str(previous.version)


@store_task
def gate(uri: str, model_name: str, version: str, previous_champion: str | None,
         evaluation: data.Dataset, report: Evaluation, parity: Parity,
         promote: bool) -> registry.GateDecision:
    """Score the champion on the same evaluation split and move the alias only to a winner."""
    client = tracking.client(uri)
    champion = registry.score_champion(client, model_name, previous_champion,
                                       evaluation.scores, evaluation.labels,
                                       evaluation.input_kind)
    decision = registry.decide(
        candidate_nll=metrics.nll(parity.repaired, evaluation.labels),
        candidate_tpcr=metrics.tpcr(report.uncal, parity.repaired),
        parity_ok=parity.ok, champion=champion, promote=promote,
    )
    registry.apply_decision(client, model_name, version, decision)
    get_run_logger().info("gate: %s v%s (%s)", decision.label, version, decision.reason)
    return decision


@store_task
def finish_run(uri: str, run_id: str) -> None:
    tracking.client(uri).set_terminated(run_id, "FINISHED")


# ---------------------------------------------------------------- the flow
@flow(name="recalibrate", persist_result=False)
def recalibrate(data: str | Path, eval_data: str | Path | None = None, calibrator: str = "vs",
                fraction: float = 0.5, seed: int = 0, model_name: str = "cord-ops",
                input_kind: str = "auto", dtype: str = "float32",
                promote: bool = True, tracking_uri: str | None = None) -> RecalibrationResult:
    """Recalibrate the classifier outputs in ``data`` (.npz) and register the result.

    ``eval_data`` given: calibrate on all of ``data`` and evaluate on ``eval_data``; otherwise split
    ``data`` with ``fraction`` for calibration (seeded). ``dtype`` is the ONNX graph's
    float type. With ``promote=False`` the gate is evaluated and recorded but the alias
    never moves. ``tracking_uri``: the MLflow store (default: MLFLOW_TRACKING_URI, else the
    embedded store of the working directory). Raises :class:`RecalibrationError` naming
    the failed step.
    """
    uri = tracking.store_uri(tracking_uri)
    steps = Steps()
    try:
        dataset = steps(load_dataset, str(data), input_kind)
        eval_dataset = (steps(load_dataset, str(eval_data), dataset.input_kind)
                        if eval_data is not None else None)
        steps(check_options, calibrator, dtype, seed, fraction, dataset, eval_dataset)
        options = {"calibrator": calibrator, "seed": str(seed), "fraction": repr(fraction),
                   "dtype": dtype, "promote": str(promote)}
        run_id, experiment = steps(start_run, uri, model_name, dataset, eval_dataset, options)
    except Exception as exc:
        raise RecalibrationError(steps.current, exc) from exc

    version = previous_champion = None
    try:
        calibration, evaluation = steps(split_dataset, dataset, eval_dataset, seed, fraction)
        fitted = steps(fit_calibrator, calibration, calibrator)
        repair = steps(fit_cord, calibration, fitted)
        report = steps(evaluate_reports, evaluation, fitted, repair)
        model = steps(export_model, fitted, repair, dataset.n_classes, dataset.input_kind, dtype)
        parity = steps(verify_parity, model, evaluation, report, dtype)
        params = run_params(calibrator, dataset, calibration, evaluation, seed, repair)
        steps(log_params_and_metrics, uri, run_id, params, report, repair, parity)
        steps(log_report_artifacts, uri, run_id, report, fitted, repair)
        model_info = steps(log_onnx_model, uri, run_id, model, evaluation, dtype)
        version, previous_champion = steps(register, uri, run_id, model_name, model_info, parity,
                                           dataset, repair, calibrator)
        decision = steps(gate, uri, model_name, version, previous_champion, evaluation, report,
                         parity, promote)
        steps(finish_run, uri, run_id)
    except BaseException as exc:
        _fail_run(uri, run_id, model_name, version, previous_champion, exc)
        if isinstance(exc, Exception):
            raise RecalibrationError(steps.current, exc) from exc
        raise

    return RecalibrationResult(
        run_id=run_id, experiment_id=experiment, tracking_uri=uri, model_name=model_name,
        version=version, decision=decision, eta_star=repair.eta_, reports=report.reports,
        changes=report.changes, onnx_max_abs_diff=parity.max_abs_diff, timings=steps.timings,
    )


# ---------------------------------------------------------------- helpers
def run_params(calibrator: str, dataset: data.Dataset, calibration: data.Dataset,
               evaluation: data.Dataset, seed: int, repair: CORD) -> dict[str, str]:
    """The run params of the MLflow contract in docs/contract.md (floats as exact repr)."""
    return {
        "calibrator": calibrator,
        "n_classes": str(dataset.n_classes),
        "n_calibration": str(calibration.n),
        "n_evaluation": str(evaluation.n),
        "seed": str(seed),
        "input_kind": dataset.input_kind,
        "eps_num": repr(cord.EPS_NUM),
        "delta_stab": repr(cord.DELTA_STAB),
        "eta_star": repr(repair.eta_),
    }


def metrics_markdown(reports: dict[str, dict[str, float]], eta_star: float) -> str:
    """The metrics table as Markdown: one row per report, one column per metric."""
    lines = ["| report | " + " | ".join(METRICS) + " |",
             "|---|" + "---|" * len(METRICS)]
    for report in REPORTS:
        row = " | ".join(f"{reports[report][m]:.6f}" for m in METRICS)
        lines.append(f"| {report} | {row} |")
    lines.append("")
    lines.append(f"eta* = {eta_star!r}")
    return "\n".join(lines) + "\n"


def model_signature(model):
    """MLflow signature from the graph's own inputs and outputs (name, dtype, shape)."""
    import onnx
    from mlflow.models import ModelSignature
    from mlflow.types import Schema, TensorSpec

    def spec(value_info) -> TensorSpec:
        tensor = value_info.type.tensor_type
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)
        shape = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim)
        return TensorSpec(np.dtype(dtype), shape, value_info.name)

    return ModelSignature(inputs=Schema([spec(v) for v in model.graph.input]),
                          outputs=Schema([spec(v) for v in model.graph.output]))


def _data_tags(prefix: str, dataset: data.Dataset) -> dict[str, str]:
    return {f"{prefix}.sha256": dataset.sha256,
            f"{prefix}.shape": f"{dataset.n}x{dataset.n_classes}",
            f"{prefix}.input_kind": dataset.input_kind,
            f"{prefix}.path": str(dataset.path)}


def _prefect_flow_run_id() -> str | None:
    from prefect.runtime import flow_run

    return str(flow_run.id) if flow_run.id else None


def _fail_run(uri: str, run_id: str, model_name: str, version: str | None, previous: str | None,
              exc: BaseException) -> None:
    """Mark the run FAILED (KILLED on Ctrl-C), record why, and withdraw its version.

    A cleanup that fails itself (the store went away) is logged, never raised, so the
    caller sees the original error; the next registration discards what is left.
    """
    client = tracking.client(uri)
    try:
        if version is not None:
            registry.withdraw_version(client, model_name, version, previous)
        client.set_tag(run_id, "cord.error", f"{type(exc).__name__}: {exc}"[:5000])
        client.set_terminated(run_id, "FAILED" if isinstance(exc, Exception) else "KILLED")
    except Exception:
        get_run_logger().exception("could not record the failure of run %s", run_id)
