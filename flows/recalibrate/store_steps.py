"""The recalibration flow's tasks that talk to the tracking store: prepare it, start the run,
skip an unchanged one, log params, metrics, artifacts and the ONNX model, verify what was
uploaded byte for byte, and (under the registry lock) register, gate and finish.

They retry only a momentarily locked sqlite database
(:data:`flows.platform.task_presets.store_task`,
:mod:`flows.store.retries`).
"""

from __future__ import annotations

import json
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from prefect import get_run_logger

from cord_ops import CORD, data, metrics
from flows.platform import checkpoints
from flows.platform.task_presets import compute_task, store_task
from flows.promotion import rules
from flows.promotion.champion import (
    champion_reference,
    push_history,
    record_health,
    score_champion,
)
from flows.recalibrate import plots
from flows.recalibrate.artifacts import (
    METRICS,
    REPORTS,
    check_digests,
    data_tags,
    file_digests,
    metrics_markdown,
)
from flows.recalibrate.compute import Evaluation, Parity
from flows.store import graphs, journal, owner, reference, registry, tracking

MODEL_ARTIFACT = "model"
INPUT_EXAMPLE_ROWS = 5


@store_task
def start_run(uri: str, model_name: str, dataset: data.Dataset,
              eval_dataset: data.Dataset | None, options: dict[str, str]) -> tuple[str, str]:
    """Create the MLflow run (experiment = model name); tags carry data provenance and the
    owner process (host, pid, start time) that clean-up judges liveness by."""
    client = tracking.client(uri)
    experiment = tracking.experiment_id(client, model_name)
    tags = {"cord.model_name": model_name, **{f"cord.{k}": v for k, v in options.items()},
            **data_tags("data", dataset), **owner.Owner.current().record()}
    if eval_dataset is not None:
        tags.update(data_tags("eval_data", eval_dataset))
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
                 "cord.dtype", "cord.eval_sample", "cord.promote", "cord.decision_threshold")
#: The version tag of a binary model's decision threshold (absent: the argmax).
THRESHOLD_TAG = "cord.decision_threshold"


@store_task
def champion_threshold(uri: str, model_name: str) -> float | None:
    """The decision threshold the current champion keeps (its version tag), or None: a
    recalibration given no threshold keeps the champion's, so a scheduled or drift-started
    run never silently moves a fraud model's decisions back to the argmax."""
    holder = registry.champion_version(tracking.client(uri), model_name)
    text = None if holder is None else holder.tags.get(THRESHOLD_TAG)
    return None if text is None else float(text)


SKIPPED_TAG = "cord.skipped"


@store_task
def skip_if_unchanged(uri: str, run_id: str, model_name: str) -> str | None:
    """When this run's data digests, calibrator and options (:data:`IDENTITY_TAGS`) equal
    those of the current champion's run, record the run as skipped (tag ``cord.skipped``
    with the reason, FINISHED, no version) and return the reason; else None.

    A scheduled recalibration of unchanged data would refit the same graph, register a
    version that ties the champion and churn the registry; the gate would reject the tie
    (:mod:`flows.promotion.rules`), but only after minutes of fitting and logging.
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


def repair_metrics(effect: dict[str, float]) -> dict[str, float]:
    """The repair's effect as run metrics: ``cord.moved_share``, ``cord.boundary_share``,
    ``cord.flat_share``, ``cord.flat_value`` (left out when no value is shared) and, for
    K = 2, ``{uncal,base,cord}.auc``."""
    out = {}
    for key, value in effect.items():
        if key.startswith("auc_"):
            out[f"{key[4:]}.auc"] = value
        elif value == value:  # NaN: no flat value to record
            out[f"cord.{key}"] = value
    return out


@store_task
def log_params_and_metrics(uri: str, run_id: str, params: dict[str, str],
                           evaluation: Evaluation,
                           repair: CORD, parity: Parity, fit_warnings: list[str] | None = None,
                           policy: rules.Policy | None = None, choice=None) -> None:
    """Every param and metric the MLflow contract (docs/contract.md) names, in one batch,
    with the fit's
    warnings (tag ``cord.fit.warnings``, "none" when clean) and the gate's thresholds."""
    values = {"eta_star": repair.eta_}
    for report in REPORTS:
        for name in METRICS:
            values[f"{report}.{name}"] = evaluation.reports[report][name]
    for name, count in evaluation.changes.items():
        values[f"base.{name}"] = count
    values.update(repair_metrics(evaluation.effect))
    values["onnx.max_abs_diff"] = parity.max_abs_diff
    values["onnx.argmax_agreement"] = parity.argmax_agreement
    values["onnx.tolerance"] = parity.tolerance
    harm = [w for w in fit_warnings or [] if w.startswith("DoNoHarmWarning")]
    tags = {"cord.fit.warnings": "; ".join(fit_warnings or [])[:8000] or "none",
            "cord.repair.warning": (metrics.flat_warning(evaluation.effect, evaluation.threshold)
                                    or "none"),
            "cord.fit.warning_count": str(len(fit_warnings or [])),
            "cord.fit.harm": harm[0][:5000] if harm else "none",
            **(policy.as_tags() if policy is not None else {})}
    if choice is not None:  # the family's choice (flows.recalibrate.selection)
        values.update(choice.metrics())
        tags.update(choice.tags())
    tracking.log_values(tracking.client(uri), run_id, metrics=values, params=params,
                        tags=tags)


@store_task
def log_reference(uri: str, run_id: str, evaluation: data.Dataset) -> dict[str, str]:
    """Pin the evaluation split: artifact ``reference/evaluation.npz`` and the run's
    evaluation dataset input (digest and source), so later gates can score on it.
    Returns its digest by artifact path, for :func:`verify_artifacts`."""
    sha256 = reference.log_reference_split(tracking.client(uri), run_id, evaluation)
    return {f"{reference.ARTIFACT_DIR}/{reference.ARTIFACT_NAME}": sha256}


@store_task
def log_report_artifacts(uri: str, run_id: str, evaluation: Evaluation, calibrator,
                         repair: CORD, choice=None) -> dict[str, str]:
    """Reliability PNGs, the metrics table (Markdown and JSON), both fitted states and the
    family's selection table when one was cross-validated (``select/selection.json``).

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
                 "repair": {k: (v if v == v else None) for k, v in evaluation.effect.items()},
                 "eta_star": repair.eta_, "eta_star_repr": repr(repair.eta_)}
        (root / "report" / "metrics.json").write_text(json.dumps(table, indent=2) + "\n")
        (root / "report" / "metrics.md").write_text(metrics_markdown(evaluation.reports,
                                                                     repair.eta_))
        (root / "state" / "calibrator.json").write_text(
            json.dumps(calibrator.to_dict(), indent=2) + "\n")
        (root / "state" / "cord.json").write_text(json.dumps(repair.to_dict(), indent=2) + "\n")
        record = None if choice is None else choice.record()
        if record is not None:
            (root / "select").mkdir()
            (root / "select" / "selection.json").write_text(json.dumps(record, indent=2)
                                                            + "\n")
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
    from flows import pyfunc_model

    example = np.asarray(evaluation.scores[:INPUT_EXAMPLE_ROWS], dtype=dtype)
    return pyfunc_model.log_model(tracking.client(uri), run_id, experiment_id, model, example,
                                  name=MODEL_ARTIFACT)


@store_task
def verify_artifacts(uri: str, run_id: str, model_info, model, digests: dict[str, str]) -> str:
    """Download what was logged and check it byte for byte before anything is registered.

    Run artifacts must match the digests of the files as they were written; the logged
    model's ``model.onnx`` must match the graph whose parity was verified. The manifest
    of every artifact's digest (run files and every file of the logged model) is logged
    as ``digests.json`` and its own digest set as the run tag ``cord.artifacts.sha256``,
    then read back (:func:`flows.store.graphs.record_digests`): every later load of the
    version checks its graph against it. Returns that digest. Raises ValueError naming the
    first artifact that is missing or differs (a partial upload, a full disk).
    """
    with tempfile.TemporaryDirectory(prefix="cord-ops-verify-") as tmp:
        run_dir = tracking.download_from_run(uri, run_id, "", Path(tmp) / "run")
        check_digests(run_dir, digests, f"run {run_id}")
        return graphs.record_digests(tracking.client(uri), uri, run_id, model_info.model_uri,
                                     model, digests, Path(tmp))


@store_task
def ensure_model(uri: str, model_name: str) -> None:
    """The registered model exists (the ``prefect`` and ``lease`` locks publish on it)."""
    registry.ensure_registered_model(tracking.client(uri), model_name)


@store_task
def register(uri: str, run_id: str, experiment: str, model_name: str, model_info,
             parity: Parity, dataset: data.Dataset, repair: CORD,
             calibrator_name: str, choice=None) -> tuple[str, str | None]:
    """Under the registry lock: clean up after dead runs, read the champion, and create the
    model version, pending, only for a graph whose parity was verified.

    Returns (version, champion version before this registration).
    """
    if not parity.ok:
        raise ValueError(
            f"ONNX parity failed: max |onnx - cord_ops| = {parity.max_abs_diff:.3g} "
            f"(tolerance {parity.tolerance:g}), argmax agreement {parity.argmax_agreement:.6f}"
            " (expected 1.0); nothing registered")
    client = tracking.client(uri)
    for line in registry.clean_up(client, model_name, experiment):
        get_run_logger().warning("clean-up: %s", line)
    previous = registry.champion_version(client, model_name)
    previous = None if previous is None else str(previous.version)
    with tracking.registry_lookups(client):
        version = registry.register_version(
            client, model_name, run_id, model_info.model_uri, model_info.model_id,
            tags={"cord.eta_star": repr(repair.eta_), "cord.calibrator": calibrator_name,
                  registry.INPUT_KIND_TAG: dataset.input_kind, "data.sha256": dataset.sha256,
                  registry.N_CLASSES_TAG: str(dataset.n_classes),
                  **({} if choice is None else {"cord.select.how": choice.how[:5000]}),
                  **({} if repair.decision_threshold is None else
                     {THRESHOLD_TAG: repr(float(repair.decision_threshold))})},
            previous_champion=previous,
        )
    return str(version.version), previous


@store_task
def gate(uri: str, model_name: str, version: str, previous_champion: str | None,
         counts: tuple, evaluation: data.Dataset, report: Evaluation,
         parity: Parity, model, dtype: str, policy: rules.Policy,
         promote: bool) -> rules.GateDecision:
    """Score candidate and champion on the candidate's evaluation split and on the champion's
    pinned reference split, weigh the evidence, record the decision on the version and move
    the alias only to a winner.

    ``counts``: the label histograms (calibration, evaluation) of every row fitted and
    evaluated on (on shards more rows than ``evaluation``, the sample).
    Also records the champion's health as a registered-model tag; a promotion is pushed
    onto the champion history before the alias moves.
    """
    client = tracking.client(uri)
    name, kind = model_name, evaluation.input_kind
    champion = score_champion(client, name, previous_champion, evaluation.scores,
                                     evaluation.labels, kind)
    ref_split, ref_problem = champion_reference(client, name, previous_champion,
                                                       evaluation.n_classes, kind)
    scored_ref = None
    if previous_champion is not None:
        if ref_split is None or champion.problem is not None:
            scored_ref = rules.ReferenceScore(previous_champion,
                                               problem=ref_problem or "champion not scored")
        else:
            on_ref = score_champion(client, name, previous_champion, ref_split.scores,
                                           ref_split.labels, kind)
            on_graph = graphs.run_graph(model, ref_split.scores, ["repaired"])["repaired"]
            scored_ref = rules.ReferenceScore(
                previous_champion, metrics.nll(on_graph.astype(np.float64), ref_split.labels),
                on_ref.nll, on_ref.problem,
                uncalibrated_nll=metrics.nll(ref_split.probabilities(), ref_split.labels))
    evidence = rules.Evidence(
        *counts,
        None if ref_split is None else rules.label_counts(ref_split.labels,
                                                           ref_split.n_classes))
    decision = rules.decide(
        candidate_nll=metrics.nll(parity.repaired, evaluation.labels),
        candidate_tpcr=metrics.tpcr(report.uncal, parity.repaired, report.threshold),
        parity_ok=parity.ok, champion=champion,
        uncalibrated_nll=metrics.nll(report.uncal, evaluation.labels),
        evidence=evidence, policy=policy,
        reference=scored_ref, promote=promote,
        decision_change=None if previous_champion is None else rules.decision_change(
            report.threshold, _version_threshold(client, name, previous_champion),
            previous_champion),
    )
    if champion is not None:
        record_health(client, name, previous_champion, champion.problem)
    if scored_ref is not None:
        for key, value in (("reference_version", scored_ref.version),
                           ("reference_candidate_nll", repr(scored_ref.candidate_nll)),
                           ("reference_champion_nll", repr(scored_ref.champion_nll)),
                           ("reference_problem", scored_ref.problem or "none")):
            client.set_model_version_tag(name, version, f"cord.gate.{key}", value[:5000])
    registry.record_decision(client, name, version, decision)
    checkpoints.checkpoint("gate_recorded")
    if decision.promote:
        push_history(client, name, {
            "version": version, "from": previous_champion, "how": "gate", "by": "gate",
            "reason": decision.reason[:300],
            "at": datetime.now(UTC).isoformat(timespec="seconds")})
    registry.move_alias(client, name, version, decision)
    checkpoints.checkpoint("alias_moved")
    get_run_logger().info("gate: %s v%s (%s)", decision.label, version, decision.reason)
    return decision


def _version_threshold(client, name: str, version: str) -> float | None:
    text = client.get_model_version(name, version).tags.get(THRESHOLD_TAG)
    return None if text is None else float(text)


@store_task
def finish_run(uri: str, run_id: str, model_name: str, version: str) -> None:
    """Mark the run FINISHED, then the version complete: the last write of the flow."""
    client = tracking.client(uri)
    client.set_terminated(run_id, "FINISHED")
    checkpoints.checkpoint("run_finished")
    registry.complete_version(client, model_name, version)


@compute_task
def prepare_store(uri: str, store_timeout: float) -> int:
    """Create or upgrade the store once (under its file lock) and replay the failures
    journaled while it was down. Returns how many were replayed."""
    tracking.prepare_store(uri, store_timeout)
    client = tracking.client(uri)
    done = journal.replay(uri, tracking.local_store_folder(uri),
                          lambda entry: registry.record_failure(client, entry))
    for path in done:
        get_run_logger().warning("recorded a failure journaled while the store was down: %s",
                                 path)
    return len(done)



def _prefect_flow_run_id() -> str | None:
    from prefect.runtime import flow_run

    return str(flow_run.id) if flow_run.id else None
