"""The recalibration flow: calibrate a fixed classifier's outputs, repair them with CORD so no
top-1 decision changes, export one ONNX graph, track everything in MLflow, register the
model and let it take ``@champion`` only when it wins.

Reads top to bottom: load and validate -> skip when the data, calibrator and options are
those of the champion's run (:func:`skip_if_unchanged`) -> split -> fit calibrator -> fit
CORD -> evaluate uncal / base / cord on the evaluation split -> export ONNX -> verify ONNX
parity with onnxruntime on the evaluation split -> log to MLflow (with the evaluation split
pinned as the run's reference dataset input) -> register -> gate (rules in
:mod:`flows.promotion.gate`).

Splits too small to fit at all fail before any run exists; splits large enough to fit but
not to trust are registered and rejected by the gate with the reason. Warnings the
calibrator raises while fitting (non-convergence, capped iterations) are kept: run tag
``cord.fit.warnings`` and :attr:`RecalibrationResult.warnings`.

Failure contract: a bad data file or option, or a store that cannot be used, raises
before any MLflow run exists. After the run is created, any failing task marks it FAILED,
withdraws a version it registered (the alias goes back to where it was) and raises
:class:`RecalibrationError` naming the step; when the store itself is what failed, that
record goes to a local journal (:mod:`flows.registry.journal`) that the next command replays.

Concurrency contract: fitting, evaluation and logging run in parallel with other
recalibrations; the registry section (clean-up -> register -> score the champion ->
decide -> move the alias -> finish) holds the model's registry lock (:mod:`flows.registry.lock`)
and reads the champion only after acquiring it. Every run records its owner process
(:mod:`flows.registry.owner`), so clean-up touches only what a dead process left.

Tasks that talk to the tracking store retry only a momentarily locked sqlite database
(:mod:`flows.registry.retries`); with MLflow's bounded HTTP retries, a store that is down fails the
command within ``store_timeout`` seconds.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import time
import warnings
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from prefect import flow, get_run_logger

from cord_ops import CORD, cord_kernels, data, metrics
from cord_ops.calibrators import make_calibrator
from cord_ops.validation import top1
from flows.errors import CordOpsError
from flows.preflight import checks as inputs
from flows.promotion import gate as gating
from flows.recalibration import plots
from flows.registry import journal, owner, reference, tracking
from flows.registry import lock as registry_lock
from flows.registry import versions as registry
from flows.registry.retries import is_store_outage
from flows.runtime import checkpoints
from flows.runtime.tasks import compute_task, store_task
from onnx_export import parity

REPORTS = ("uncal", "base", "cord")
METRICS = ("ece", "ece_em", "smece", "nll", "brier", "accuracy", "tpcr")
MODEL_ARTIFACT = "model"
INPUT_EXAMPLE_ROWS = 5
DEFAULT_EVAL_SAMPLE = inputs.DEFAULT_EVAL_SAMPLE



#: Name of the digest manifest artifact of a run, and the run tag holding its own digest.
DIGESTS_ARTIFACT = "digests.json"
DIGESTS_TAG = "cord.artifacts.sha256"


class RecalibrationError(CordOpsError, RuntimeError):
    """A recalibration failed; ``step`` is the task that raised.

    The message is one line: the step, the error's type and first line, the tracking URI
    when the store was involved, and where the failure was journaled when the store could
    not record it (``journal``).
    """

    def __init__(self, step: str, cause: BaseException, tracking_uri: str | None = None,
                 journal: str | None = None):
        self.step = step
        self.journal = journal
        text = str(cause).strip()
        first = text.splitlines()[0] if text else ""
        first = first if len(first) <= 300 else first[:297] + "..."
        message = f"recalibration failed in step '{step}': {type(cause).__name__}: {first}"
        if tracking_uri is not None:
            message += f" (tracking URI {tracking_uri})"
        if journal is not None:
            message += (f"; the store could not record this failure, so it was journaled to "
                        f"{journal} and the next command against this store records it")
        super().__init__(message)


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
    overhead), summed over repeated calls. ``warnings``: the fit's warnings, and the
    do-no-harm warning when the calibrator lost to the identity map on its own
    calibration split (:func:`harm_warnings`).
    """

    run_id: str
    experiment_id: str
    tracking_uri: str
    model_name: str
    version: str | None
    decision: gating.GateDecision | None
    eta_star: float
    reports: dict[str, dict[str, float]]
    changes: dict[str, int]
    onnx_max_abs_diff: float
    timings: dict[str, float] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    #: what loading changed in the input files (``data.Dataset.load_note``)
    input_notes: list[str] = field(default_factory=list)
    #: Why nothing was fitted or registered (:func:`skip_if_unchanged`); then ``version``
    #: and ``decision`` are None and the reports empty.
    skipped: str | None = None


class Steps:
    """Calls the flow's tasks in order, timing each and remembering which one is running."""

    def __init__(self):
        self.current = "start"
        self.timings: dict[str, float] = {}

    def mark(self, name: str) -> None:
        """Name a stretch of the flow that is not a task (waiting for the registry lock)."""
        self.current = name

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
    """Load and validate an .npz or Parquet file of classifier outputs (errors name the file,
    the array or column, and the row)."""
    return data.load(path, input_kind=input_kind)


@compute_task
def check_options(calibrator: str, dtype: str, seed: int, fraction: float,
                  dataset: data.Dataset, eval_dataset: data.Dataset | None,
                  gate_options: dict | None = None) -> gating.Policy:
    """Reject a bad option before a run exists: unknown calibrator or dtype, a seed or
    fraction the split refuses, an evaluation file that does not match ``dataset``, a gate
    threshold out of range, splits too small to fit at all (the check the CLI runs before
    anything starts, :func:`flows.preflight.checks.check_recalibration`). Returns the gate's
    policy."""
    if dtype not in gating.DTYPES:
        raise ValueError(f"dtype: expected one of {gating.DTYPES}, got {dtype!r}")
    return inputs.check_recalibration(dataset, eval_dataset, calibrator, fraction, seed,
                                      gate_options)


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
def fit_cord(calibration: data.Dataset, calibrator):
    """Fit eta* (paper eq. 18) on the calibration split's original and calibrated outputs;
    returns (CORD, warnings)."""
    original = calibration.probabilities()
    calibrated = calibrator.predict_proba(calibration.scores)
    return _capturing_warnings(lambda: CORD().fit(original, calibrated))


def no_harm_warning(calibration: data.Dataset, calibrator, repair: CORD,
                    tolerance: float = gating.DEFAULT_NLL_TOLERANCE) -> str | None:
    """The do-no-harm check of a fit: on its own calibration split, the calibrator's NLL
    (the metric reported, :func:`cord_ops.metrics.nll`) must be no worse than the identity
    map's, the classifier's own probabilities (within ``tolerance``, relative: rounding).
    Returns the warning when it is worse, else None.

    A fit that loses (a degenerate optimum, a family with no finite optimum on these
    rows, a floor other than the shared one) is kept, and said: the warning goes to the
    run tags (``cord.fit.warnings``, ``cord.fit.harm``) and the summary, and the gate
    refuses any version worse than the uncalibrated model on the evaluation split
    (:mod:`flows.promotion.gate`, rule 4). Keeping it, rather than falling back to the identity map,
    leaves the registered calibrator the one that was asked for, so what the operator
    reads is what was fitted. CORD repairs after the calibrator, so both are reported.
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


# ---------------------------------------------------------------- compute tasks on shards
@compute_task
def plan_shard_inputs(data: str, eval_data: str | None, input_kind: str, seed: int,
                      fraction: float):
    """The shards' layout, K and exact split sizes from their footers
    (:func:`flows.shards.distributed.plan_shards`); errors name the shard."""
    from flows.shards.distributed import plan_shards

    return plan_shards(data, eval_data, input_kind, seed, fraction)


@compute_task
def check_shard_options(calibrator: str, dtype: str, eval_sample: int, plan,
                        gate_options: dict | None = None) -> gating.Policy:
    """:func:`check_options` for shards: the calibrator must be fittable from partition
    sums (:func:`flows.preflight.checks.check_shard_recalibration`)."""
    if dtype not in gating.DTYPES:
        raise ValueError(f"dtype: expected one of {gating.DTYPES}, got {dtype!r}")
    return inputs.check_shard_recalibration(plan, calibrator, eval_sample, gate_options)


@compute_task
def load_shards(plan, dask_address: str | None, dask_workers: int):
    """Connect to the Dask cluster (or start a local one) and read, validate and split
    every shard once on the workers; returns the open
    :class:`flows.shards.distributed.ShardSession`."""
    from flows.shards.distributed import open_session

    return open_session(plan, dask_address=dask_address, n_workers=dask_workers)


@compute_task
def fit_calibrator_on_shards(session, name: str):
    """Fit calibrator ``name`` on every calibration row from partition sums; returns
    (fitted, warnings)."""
    from flows.shards.distributed import fit_calibrator_on

    return _capturing_warnings(lambda: fit_calibrator_on(session, name))


@compute_task
def fit_cord_on_shards(session, calibrator):
    """eta* (paper eq. 18) from exact sums over every calibration row, on the pass that
    also confirms a TS fit's beta; returns ((CORD, calibrator), warnings): the calibrator
    given, or the TS fit resumed when the pass did not confirm it."""
    from flows.shards.distributed import fit_cord_on

    return _capturing_warnings(lambda: fit_cord_on(session, calibrator)[:2])


@compute_task
def evaluate_shards(session, calibrator, repair: CORD, eval_sample: int):
    """(Evaluation, sample, label counts): ECE, NLL, Brier, accuracy, TPCR and the
    prediction-change counts over every evaluation row; ECE-EM and smECE, and the
    Evaluation's arrays, on the evaluation sample (docs/scale.md)."""
    from flows.shards.distributed import evaluate_on

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
    evaluation = Evaluation(sample.labels, uncal, base, repaired, reports, changes)
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
    tolerance = parity.parity_tolerance(calibrator, repair, evaluation.scores, dtype)
    return Parity(diff, agreement, tolerance, repaired)


# ---------------------------------------------------------------- tracking tasks
@store_task
def start_run(uri: str, model_name: str, dataset: data.Dataset,
              eval_dataset: data.Dataset | None, options: dict[str, str]) -> tuple[str, str]:
    """Create the MLflow run (experiment = model name); tags carry data provenance and the
    owner process (host, pid, start time) that clean-up judges liveness by."""
    client = tracking.client(uri)
    experiment = tracking.experiment_id(client, model_name)
    tags = {"cord.model_name": model_name, **{f"cord.{k}": v for k, v in options.items()},
            **_data_tags("data", dataset), **owner.Owner.current().record()}
    if eval_dataset is not None:
        tags.update(_data_tags("eval_data", eval_dataset))
    flow_run_id = _prefect_flow_run_id()
    if flow_run_id:
        tags["prefect.flow_run_id"] = flow_run_id
    run = client.create_run(experiment, tags=tags,
                            run_name=f"{options['calibrator']}-seed{options['seed']}")
    return run.info.run_id, experiment


#: Run tags that determine what a recalibration fits and exports: when they are all equal
#: to those of the champion's run, the run would rebuild the champion's graph.
IDENTITY_TAGS = ("data.sha256", "data.input_kind", "eval_data.sha256",
                 "eval_data.input_kind", "cord.calibrator", "cord.seed", "cord.fraction",
                 "cord.dtype", "cord.eval_sample", "cord.promote")
SKIPPED_TAG = "cord.skipped"


@store_task
def skip_if_unchanged(uri: str, run_id: str, model_name: str) -> str | None:
    """When this run's data digests, calibrator and options (:data:`IDENTITY_TAGS`) equal
    those of the current champion's run, record the run as skipped (tag ``cord.skipped``
    with the reason, FINISHED, no version) and return the reason; else None.

    A scheduled recalibration of unchanged data would refit the same graph, register a
    version that ties the champion and churn the registry; the gate would reject the tie
    (:mod:`flows.promotion.gate`), but only after minutes of fitting and logging.
    """
    client = tracking.client(uri)
    holder = registry.champion_version(client, model_name)
    # Only a settled champion counts: a pending one may be a killed run's, which the
    # registry section's clean-up is about to undo.
    if holder is None or not holder.run_id or \
            holder.tags.get(registry.REGISTRATION_TAG) != registry.COMPLETE:
        return None
    from mlflow.exceptions import MlflowException

    try:
        champion_run = client.get_run(holder.run_id)
    except MlflowException:  # the champion's run was deleted: nothing to compare with
        return None
    if champion_run.info.status != "FINISHED":
        return None
    champion_tags = champion_run.data.tags
    mine = client.get_run(run_id).data.tags
    if any(mine.get(key) != champion_tags.get(key) for key in IDENTITY_TAGS) \
            or champion_tags.get("data.sha256") is None:
        return None
    reason = (f"unchanged: data sha256 {mine['data.sha256'][:12]}, calibrator "
              f"{mine.get('cord.calibrator')} and options equal champion v{holder.version}'s "
              f"run {holder.run_id}; nothing fitted or registered")
    client.set_tag(run_id, SKIPPED_TAG, reason)
    client.set_terminated(run_id, "FINISHED")
    return reason


@store_task
def log_params_and_metrics(uri: str, run_id: str, params: dict[str, str],
                           evaluation: Evaluation,
                           repair: CORD, parity: Parity, fit_warnings: list[str] | None = None,
                           policy: gating.Policy | None = None) -> None:
    """Every param and metric the MLflow contract (docs/contract.md) names, in one batch,
    with the fit's
    warnings (tag ``cord.fit.warnings``, "none" when clean) and the gate's thresholds."""
    values = {"eta_star": repair.eta_}
    for report in REPORTS:
        for name in METRICS:
            values[f"{report}.{name}"] = evaluation.reports[report][name]
    for name, count in evaluation.changes.items():
        values[f"base.{name}"] = count
    values["onnx.max_abs_diff"] = parity.max_abs_diff
    values["onnx.argmax_agreement"] = parity.argmax_agreement
    values["onnx.tolerance"] = parity.tolerance
    harm = [w for w in fit_warnings or [] if w.startswith("DoNoHarmWarning")]
    tags = {"cord.fit.warnings": "; ".join(fit_warnings or [])[:8000] or "none",
            "cord.fit.warning_count": str(len(fit_warnings or [])),
            "cord.fit.harm": harm[0][:5000] if harm else "none",
            **(policy.as_tags() if policy is not None else {})}
    tracking.log_values(tracking.client(uri), run_id, metrics=values, params=params,
                        tags=tags)


@store_task
def log_reference(uri: str, run_id: str, evaluation: data.Dataset) -> dict[str, str]:
    """Pin the evaluation split: artifact ``reference/evaluation.npz`` and the run's
    evaluation dataset input (digest and source), so later gates can score on it.
    Returns its digest by artifact path, for :func:`verify_artifacts`."""
    from mlflow import MlflowClient

    sha256 = reference.log_reference_split(MlflowClient(uri), run_id, evaluation)
    return {f"{reference.ARTIFACT_DIR}/{reference.ARTIFACT_NAME}": sha256}


@store_task
def log_report_artifacts(uri: str, run_id: str, evaluation: Evaluation, calibrator,
                         repair: CORD) -> dict[str, str]:
    """Reliability PNGs, the metrics table (Markdown and JSON) and both fitted states.

    Returns the SHA-256 of every file as written here, by artifact path, for
    :func:`verify_artifacts`.
    """
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
        digests = file_digests(root)
        tracking.client(uri).log_artifacts(run_id, str(root))
    return digests


@store_task
def log_onnx_model(uri: str, run_id: str, experiment_id: str, model, evaluation: data.Dataset,
                   dtype: str):
    """Log the graph as the pyfunc model of :mod:`flows.pyfunc_model`: the ``.onnx`` file
    (also an ``onnx`` flavour) plus a models-from-code wrapper that validates its input,
    with the graph's outputs as signature and a few evaluation rows as input example.

    The requirements are stated (pinned), which skips MLflow's inference: it re-imports
    the model in a subprocess for several seconds.
    """
    from mlflow import MlflowClient

    from flows import pyfunc_model

    example = np.asarray(evaluation.scores[:INPUT_EXAMPLE_ROWS], dtype=dtype)
    return pyfunc_model.log_model(MlflowClient(uri), run_id, experiment_id, model, example,
                                  name=MODEL_ARTIFACT)


@store_task
def verify_artifacts(uri: str, run_id: str, model_info, model, digests: dict[str, str]) -> str:
    """Download what was logged and check it byte for byte before anything is registered.

    Run artifacts must match the digests of the files as they were written; the logged
    model's ``model.onnx`` must match the graph whose parity was verified. The manifest
    of every artifact's digest (run files and every file of the logged model) is logged
    as ``digests.json`` and its own digest set as the run tag ``cord.artifacts.sha256``,
    then read back. Returns that digest. Raises ValueError naming the first artifact
    that is missing or differs (a partial upload, a full disk).
    """
    import mlflow.artifacts
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    with tempfile.TemporaryDirectory(prefix="cord-ops-verify-") as tmp:
        run_dir = Path(mlflow.artifacts.download_artifacts(
            run_id=run_id, artifact_path="", dst_path=str(Path(tmp) / "run"), tracking_uri=uri))
        _check_digests(run_dir, digests, f"run {run_id}")
        model_dir = tracking.download(uri, model_info.model_uri, Path(tmp) / "model")
        model_digests = file_digests(model_dir)
        expected = hashlib.sha256(model.SerializeToString()).hexdigest()
        onnx_files = [p for p in model_digests if p.endswith(".onnx")]
        if [model_digests[p] for p in onnx_files] != [expected]:
            raise ValueError(f"{model_info.model_uri}: the logged ONNX file(s) {onnx_files} do "
                             "not match the graph whose parity was verified; nothing registered")
        manifest = {"run": digests, "model": {"uri": model_info.model_uri,
                                              "files": model_digests}}
        payload = (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
        (Path(tmp) / DIGESTS_ARTIFACT).write_bytes(payload)
        client.log_artifact(run_id, str(Path(tmp) / DIGESTS_ARTIFACT))
        digest = hashlib.sha256(payload).hexdigest()
        client.set_tag(run_id, DIGESTS_TAG, digest)
        back = Path(mlflow.artifacts.download_artifacts(
            run_id=run_id, artifact_path=DIGESTS_ARTIFACT, dst_path=str(Path(tmp) / "back"),
            tracking_uri=uri))
        _check_digests(back.parent, {DIGESTS_ARTIFACT: digest}, f"run {run_id}")
    return digest


@store_task
def ensure_model(uri: str, model_name: str) -> None:
    """The registered model exists (the ``prefect`` and ``lease`` locks publish on it)."""
    from mlflow import MlflowClient

    registry.ensure_registered_model(MlflowClient(uri), model_name)


@store_task
def register(uri: str, run_id: str, experiment: str, model_name: str, model_info,
             parity: Parity, dataset: data.Dataset, repair: CORD,
             calibrator_name: str) -> tuple[str, str | None]:
    """Under the registry lock: clean up after dead runs, read the champion, and create the
    model version, pending, only for a graph whose parity was verified.

    Returns (version, champion version before this registration).
    """
    from mlflow import MlflowClient

    if not parity.ok:
        raise ValueError(
            f"ONNX parity failed: max |onnx - cord_ops| = {parity.max_abs_diff:.3g} "
            f"(tolerance {parity.tolerance:g}), argmax agreement {parity.argmax_agreement:.6f}"
            " (expected 1.0); nothing registered")
    client = MlflowClient(uri)
    for line in registry.clean_up(client, model_name, experiment):
        get_run_logger().warning("clean-up: %s", line)
    previous = registry.champion_version(client, model_name)
    previous = None if previous is None else str(previous.version)
    with tracking.registry_lookups(client):
        version = registry.register_version(
            client, model_name, run_id, model_info.model_uri, model_info.model_id,
            tags={"cord.eta_star": repr(repair.eta_), "cord.calibrator": calibrator_name,
                  registry.INPUT_KIND_TAG: dataset.input_kind, "data.sha256": dataset.sha256,
                  registry.N_CLASSES_TAG: str(dataset.n_classes)},
            previous_champion=previous,
        )
    return str(version.version), previous


@store_task
def gate(uri: str, model_name: str, version: str, previous_champion: str | None,
         counts: tuple, evaluation: data.Dataset, report: Evaluation,
         parity: Parity, model, dtype: str, policy: gating.Policy,
         promote: bool) -> gating.GateDecision:
    """Score candidate and champion on the candidate's evaluation split and on the champion's
    pinned reference split, weigh the evidence, record the decision on the version and move
    the alias only to a winner.

    ``counts``: the label histograms (calibration, evaluation) of every row fitted and
    evaluated on (on shards more rows than ``evaluation``, the sample).
    Also records the champion's health as a registered-model tag; a promotion is pushed
    onto the champion history before the alias moves.
    """
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    name, kind = model_name, evaluation.input_kind
    champion = gating.score_champion(client, name, previous_champion, evaluation.scores,
                                     evaluation.labels, kind)
    ref_split, ref_problem = gating.champion_reference(client, name, previous_champion,
                                                       evaluation.n_classes, kind)
    scored_ref = None
    if previous_champion is not None:
        if ref_split is None or champion.problem is not None:
            scored_ref = gating.ReferenceScore(previous_champion,
                                               problem=ref_problem or "champion not scored")
        else:
            on_ref = gating.score_champion(client, name, previous_champion, ref_split.scores,
                                           ref_split.labels, kind)
            scored_ref = gating.ReferenceScore(
                previous_champion, metrics.nll(_run_graph(model, ref_split.scores, dtype),
                                               ref_split.labels),
                on_ref.nll, on_ref.problem,
                uncalibrated_nll=metrics.nll(ref_split.probabilities(), ref_split.labels))
    evidence = gating.Evidence(
        *counts,
        None if ref_split is None else gating.label_counts(ref_split.labels,
                                                           ref_split.n_classes))
    decision = gating.decide(
        candidate_nll=metrics.nll(parity.repaired, evaluation.labels),
        candidate_tpcr=metrics.tpcr(report.uncal, parity.repaired),
        parity_ok=parity.ok, champion=champion,
        uncalibrated_nll=metrics.nll(report.uncal, evaluation.labels),
        evidence=evidence, policy=policy,
        reference=scored_ref, promote=promote,
    )
    if champion is not None:
        gating.record_health(client, name, previous_champion, champion.problem)
    if scored_ref is not None:
        for key, value in (("reference_version", scored_ref.version),
                           ("reference_candidate_nll", repr(scored_ref.candidate_nll)),
                           ("reference_champion_nll", repr(scored_ref.champion_nll)),
                           ("reference_problem", scored_ref.problem or "none")):
            client.set_model_version_tag(name, version, f"cord.gate.{key}", value[:5000])
    registry.record_decision(client, name, version, decision)
    checkpoints.checkpoint("gate_recorded")
    if decision.promote:
        gating.push_history(client, name, {
            "version": version, "from": previous_champion, "how": "gate", "by": "gate",
            "reason": decision.reason[:300],
            "at": datetime.now(UTC).isoformat(timespec="seconds")})
    registry.move_alias(client, name, version, decision)
    checkpoints.checkpoint("alias_moved")
    get_run_logger().info("gate: %s v%s (%s)", decision.label, version, decision.reason)
    return decision


def _run_graph(model, scores: np.ndarray, dtype: str) -> np.ndarray:
    """The candidate graph's repaired output on ``scores`` (onnxruntime, CPU), float64."""
    from onnx_export.runtime import open_session

    session = open_session(model, provider="cpu")
    (repaired,) = session.run(["repaired"], {"scores": np.asarray(scores, dtype=dtype)})
    return repaired.astype(np.float64)


@store_task
def finish_run(uri: str, run_id: str, model_name: str, version: str) -> None:
    """Mark the run FINISHED, then the version complete: the last write of the flow."""
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    client.set_terminated(run_id, "FINISHED")
    checkpoints.checkpoint("run_finished")
    registry.complete_version(client, model_name, version)


@compute_task
def prepare_store(uri: str, store_timeout: float) -> int:
    """Create or upgrade the store once (under its file lock) and replay the failures
    journaled while it was down. Returns how many were replayed."""
    from mlflow import MlflowClient

    tracking.prepare_store(uri, store_timeout)
    client = MlflowClient(uri)
    done = journal.replay(uri, tracking.local_store_folder(uri),
                          lambda entry: registry.record_failure(client, entry))
    for path in done:
        get_run_logger().warning("recorded a failure journaled while the store was down: %s",
                                 path)
    return len(done)


# ---------------------------------------------------------------- the flow
@flow(name="recalibrate", persist_result=False)
def recalibrate(data: str | Path, eval_data: str | Path | None = None, calibrator: str = "vs",
                fraction: float = 0.5, seed: int = 0, model_name: str = "cord-ops",
                input_kind: str = "auto", dtype: str = "float32", promote: bool = True,
                lock_timeout: float = registry_lock.DEFAULT_TIMEOUT,
                store_timeout: float = tracking.DEFAULT_STORE_TIMEOUT,
                lock: str = "auto", min_calibration: int | None = None,
                min_evaluation: int | None = None, max_class_share: float | None = None,
                max_label_shift: float | None = None,
                tracking_uri: str | None = None, dask_address: str | None = None,
                dask_workers: int = 2,
                eval_sample: int = DEFAULT_EVAL_SAMPLE) -> RecalibrationResult:
    """Recalibrate the classifier outputs in ``data`` (.npz or Parquet) and register the
    result.

    ``eval_data`` given: calibrate on all of ``data`` and evaluate on ``eval_data``; otherwise split
    ``data`` with ``fraction`` for calibration (seeded). ``dtype`` is the ONNX graph's
    float type. With ``promote=False`` the gate is evaluated and recorded but the alias
    never moves. ``lock_timeout``: seconds to wait for the model's registry lock;
    ``store_timeout``: seconds a store that is down may take to fail the flow; ``lock``:
    the registry lock's kind (``auto``: :func:`flows.registry.lock.choose`). Raises
    :class:`RecalibrationError` naming the failed step. ``min_calibration``,
    ``min_evaluation``, ``max_class_share`` and ``max_label_shift`` override the gate's
    defaults for K (:class:`flows.promotion.gate.Policy`). When the champion could not be scored,
    the candidate is registered as rejected, the run finished, and then
    :class:`flows.promotion.gate.ChampionUnhealthyError` is raised. ``tracking_uri``: the MLflow
    store (default: MLFLOW_TRACKING_URI, else ``./mlruns/mlflow.db``).

    ``data`` a folder or glob of Parquet shards, or ``dask_address`` given: the fits and
    metrics run on Dask (the scheduler at ``dask_address``, else a local cluster of
    ``dask_workers`` processes) over a seeded per-row split inside each shard, with
    ``eval_sample`` evaluation rows gathered for parity, the reference split and the gate
    (docs/scale.md).
    """
    uri = tracking.store_uri(tracking_uri)
    folder = tracking.local_store_folder(uri)
    if lock == "auto":
        lock = registry_lock.choose(folder, _prefect_api_url())
    steps = Steps()
    session = None  # the Dask session when ``data`` is shards
    gate_options = {"min_calibration": min_calibration, "min_evaluation": min_evaluation,
                    "max_class_share": max_class_share, "max_label_shift": max_label_shift}
    options = {"calibrator": calibrator, "seed": str(seed), "fraction": repr(fraction),
               "dtype": dtype, "promote": str(promote)}
    try:
        if is_shard_input(data, dask_address):
            plan = steps(plan_shard_inputs, str(data), _text(eval_data), input_kind, seed,
                         fraction)
            policy = steps(check_shard_options, calibrator, dtype, eval_sample, plan,
                           gate_options)
            session = steps(load_shards, plan, dask_address, dask_workers)
            dataset, eval_dataset = session.plan.data, session.plan.evaluation
            options.update(dask=dask_address or f"local:{dask_workers}",
                           eval_sample=str(eval_sample))
        else:
            dataset = steps(load_dataset, str(data), input_kind)
            eval_dataset = (steps(load_dataset, str(eval_data), dataset.input_kind)
                            if eval_data is not None else None)
            policy = steps(check_options, calibrator, dtype, seed, fraction, dataset,
                           eval_dataset, gate_options)
        steps(prepare_store, uri, store_timeout)
        run_id, experiment = steps(start_run, uri, model_name, dataset, eval_dataset, options)
    except Exception as exc:
        if session is not None:
            session.close()
        raise RecalibrationError(steps.current, exc, _uri_if_store(steps.current, uri)) from exc
    checkpoints.checkpoint("start_run")

    from mlflow import MlflowClient

    failure = _Failure(uri, folder, run_id, model_name)
    # Owners on this host are judged by pid; only a store other hosts reach needs beats.
    beating = owner.Heartbeat(MlflowClient(uri), run_id) if folder is None else nullcontext()
    try:
        with beating:
            skipped = steps(skip_if_unchanged, uri, run_id, model_name)
            if skipped is not None:
                if session is not None:
                    session.close()
                get_run_logger().info("skipped: %s", skipped)
                return RecalibrationResult(
                    run_id=run_id, experiment_id=experiment, tracking_uri=uri,
                    model_name=model_name, version=None, decision=None,
                    eta_star=float("nan"), reports={}, changes={},
                    onnx_max_abs_diff=float("nan"), timings=steps.timings, skipped=skipped)
            if session is None:
                calibration, evaluation = steps(split_dataset, dataset, eval_dataset, seed,
                                                fraction)
                fitted, calibrator_warnings = steps(fit_calibrator, calibration, calibrator)
                repair, cord_warnings = steps(fit_cord, calibration, fitted)
                cord_warnings = cord_warnings + steps(check_no_harm, calibration, fitted,
                                                      repair)
                report = steps(evaluate_reports, evaluation, fitted, repair)
                counts = (gating.label_counts(calibration.labels, dataset.n_classes),
                          gating.label_counts(evaluation.labels, dataset.n_classes))
            else:
                with session:  # the cluster is released once the metrics are reduced
                    fitted, calibrator_warnings = steps(fit_calibrator_on_shards, session,
                                                       calibrator)
                    (repair, fitted), cord_warnings = steps(fit_cord_on_shards, session,
                                                            fitted)
                    report, evaluation, counts = steps(evaluate_shards, session, fitted,
                                                       repair, eval_sample)
            fit_warnings = calibrator_warnings + cord_warnings
            model = steps(export_model, fitted, repair, dataset.n_classes, dataset.input_kind,
                          dtype)
            parity = steps(verify_parity, model, evaluation, report, dtype, fitted, repair)
            params = run_params(calibrator, dataset, sum(counts[0]), sum(counts[1]), seed,
                                repair)
            if session is not None:
                params.update(n_evaluation_sample=str(evaluation.n),
                              n_shards=str(len(dataset.files) + (
                                  0 if eval_dataset is None else len(eval_dataset.files))))
            steps(log_params_and_metrics, uri, run_id, params, report, repair, parity, fit_warnings,
                  policy)
            checkpoints.checkpoint("log_params")
            digests = steps(log_report_artifacts, uri, run_id, report, fitted, repair)
            digests.update(steps(log_reference, uri, run_id, evaluation))
            checkpoints.checkpoint("log_artifacts")
            model_info = steps(log_onnx_model, uri, run_id, experiment, model, evaluation,
                                        dtype)
            checkpoints.checkpoint("log_model")
            steps(verify_artifacts, uri, run_id, model_info, model, digests)
            steps(ensure_model, uri, model_name)
            # The registry section: one run of this model at a time, across processes.
            steps.mark("registry_lock")
            holder = {"run_id": run_id, **owner.Owner.current().record()}
            with registry_lock.registry_lock(lock, model_name, lock_timeout,
                                             get_run_logger(), holder,
                                             client=MlflowClient(uri), store_folder=folder):
                checkpoints.checkpoint("lock_acquired")
                try:
                    failure.version, failure.previous = steps(
                        register, uri, run_id, experiment, model_name, model_info, parity,
                        dataset, repair, calibrator)
                    checkpoints.checkpoint("registered")
                    decision = steps(gate, uri, model_name, failure.version, failure.previous,
                                     counts, evaluation, report, parity, model, dtype,
                                     policy, promote)
                    steps(finish_run, uri, run_id, model_name, failure.version)
                except BaseException as exc:
                    failure.record(exc)  # withdraw while still holding the lock
                    raise
    except BaseException as exc:
        if session is not None:
            session.close()
        failure.record(exc)
        if isinstance(exc, Exception):
            raise RecalibrationError(steps.current, exc, _uri_if_store(steps.current, uri),
                                     failure.journal) from exc
        raise

    if decision.champion_problem is not None:
        # Finished and recorded; the registry is stuck until an operator acts, so say so.
        raise gating.ChampionUnhealthyError(model_name, decision.champion_version,
                                            decision.champion_problem,
                                            candidate=failure.version)
    return RecalibrationResult(
        run_id=run_id, experiment_id=experiment, tracking_uri=uri, model_name=model_name,
        version=failure.version, decision=decision, eta_star=repair.eta_,
        reports=report.reports, changes=report.changes,
        onnx_max_abs_diff=parity.max_abs_diff, timings=steps.timings, warnings=fit_warnings,
        input_notes=[note for source in (dataset, eval_dataset)
                     if (note := getattr(source, "load_note", lambda: None)()) is not None],
    )


# ---------------------------------------------------------------- helpers
def run_params(calibrator: str, dataset: data.Dataset, n_calibration: int,
               n_evaluation: int, seed: int, repair: CORD) -> dict[str, str]:
    """The run params of the MLflow contract in docs/contract.md (floats as exact repr)."""
    return {
        "calibrator": calibrator,
        "n_classes": str(dataset.n_classes),
        "n_calibration": str(n_calibration),
        "n_evaluation": str(n_evaluation),
        "seed": str(seed),
        "input_kind": dataset.input_kind,
        "eps_num": repr(cord_kernels.EPS_NUM),
        "delta_stab": repr(cord_kernels.DELTA_STAB),
        "eta_star": repr(repair.eta_),
    }


def is_shard_input(data, dask_address: str | None = None) -> bool:
    """Whether ``data`` is read as Parquet shards on Dask: a folder or glob, or any data
    when a scheduler is named."""
    return dask_address is not None or inputs.is_batch_input(data)


def _text(path) -> str | None:
    return None if path is None else str(path)


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
    """The registered model's MLflow signature (see :func:`flows.pyfunc_model.signature`)."""
    from flows import pyfunc_model

    return pyfunc_model.signature(model)


def _data_tags(prefix: str, dataset: data.Dataset) -> dict[str, str]:
    tags = {f"{prefix}.sha256": dataset.sha256,
            f"{prefix}.shape": f"{dataset.n}x{dataset.n_classes}",
            f"{prefix}.input_kind": dataset.input_kind,
            f"{prefix}.path": str(dataset.path)}
    # What loading did (data.Dataset; shard sets have no such fields): the stored width
    # and the worst probability row's |sum - 1| before it was renormalised.
    if hasattr(dataset, "sum_error"):
        tags[f"{prefix}.input_width"] = str(dataset.width)
        tags[f"{prefix}.sum_error"] = repr(dataset.sum_error)
        tags[f"{prefix}.sum_error_row"] = str(dataset.sum_error_row)
    return tags


def _prefect_flow_run_id() -> str | None:
    from prefect.runtime import flow_run

    return str(flow_run.id) if flow_run.id else None


#: Steps that talk to the tracking store: their errors name the tracking URI.
STORE_STEPS = frozenset({"prepare_store", "start_run", "skip_if_unchanged",
                         "log_params_and_metrics",
                         "log_report_artifacts", "log_onnx_model", "verify_artifacts",
                         "ensure_model", "registry_lock", "register", "gate", "finish_run"})


def _uri_if_store(step: str, uri: str) -> str | None:
    return uri if step in STORE_STEPS else None


def _prefect_api_url() -> str | None:
    """A Prefect server other processes share, if one is configured."""
    from flows.runtime.temporary_server import configured_api_url

    return configured_api_url()


def file_digests(root: Path) -> dict[str, str]:
    """SHA-256 of every file under ``root``, by POSIX path relative to it."""
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _check_digests(root: Path, expected: dict[str, str], where: str) -> None:
    for path, digest in sorted(expected.items()):
        local = root / path
        if not local.is_file():
            raise ValueError(f"{where}: artifact {path} is missing after logging; "
                             "nothing registered")
        found = hashlib.sha256(local.read_bytes()).hexdigest()
        if found != digest:
            raise ValueError(f"{where}: artifact {path} differs from what was written "
                             f"(sha256 {found[:12]} != {digest[:12]}, {local.stat().st_size} "
                             "bytes); nothing registered")


class _Failure:
    """Records, once, why a started run failed: through the store, or in the journal.

    ``version``/``previous`` are the version this run registered and the champion before
    it, known once :func:`register` returned. ``journal`` is the journal file when the
    store could not take the record.
    """

    def __init__(self, uri: str, folder: Path | None, run_id: str, model_name: str):
        self.uri, self.folder, self.run_id, self.model_name = uri, folder, run_id, model_name
        self.version: str | None = None
        self.previous: str | None = None
        self.journal: str | None = None
        self.recorded = False

    def record(self, exc: BaseException) -> None:
        """Mark the run FAILED (KILLED on Ctrl-C) with a ``cord.error`` tag and withdraw its
        version; journal that instead when the store is what failed. Never raises: the
        caller's error is the one to report."""
        if self.recorded:
            return
        self.recorded = True
        entry = {"kind": "run_failed", "run_id": self.run_id, "model_name": self.model_name,
                 "version": self.version, "previous_champion": self.previous,
                 "error": f"{type(exc).__name__}: {exc}"[:5000],
                 "status": "FAILED" if isinstance(exc, Exception) else "KILLED"}
        logger = get_run_logger()
        if not is_store_outage(exc):  # an unreachable store would only fail again, slowly
            from mlflow import MlflowClient

            try:
                registry.record_failure(MlflowClient(self.uri), entry)
                return
            except Exception as store_exc:  # noqa: BLE001 - journaled below
                logger.warning("could not record the failure of run %s in %s (%s: %s)",
                               self.run_id, self.uri, type(store_exc).__name__,
                               str(store_exc).splitlines()[0] if str(store_exc) else "")
        try:
            self.journal = str(journal.record(self.uri, self.folder, entry))
        except OSError as journal_exc:
            logger.error("could not journal the failure of run %s either (%s); the next "
                         "registration marks it FAILED as abandoned", self.run_id, journal_exc)
