"""The label-free monitoring flow (``cord-ops monitor --data BATCH`` on batches without
labels): :mod:`flows.monitor.label_free.records` holds the batches, thresholds and MLflow
records, this module the Prefect flow and its tasks.

The champion is run once on its pinned reference split and every batch together (one
download, one predict); a champion that cannot be scored, or has no usable reference split,
stops the flow before any run is created, and its health tag is recorded as the labelled
monitor does.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from prefect import flow, get_run_logger

from cord_ops import label_free as estimators
from flows.errors import in_words
from flows.monitor.label_free import records
from flows.platform.task_presets import compute_task, store_task
from flows.promotion.champion import ChampionUnhealthyError, record_health
from flows.store import reference, registry, tracking

ALERT_EVENT = "cord-ops.monitor.alert"


@dataclass
class ChampionOnBatches:
    version: str
    reference_rows: int
    reference_labels: np.ndarray
    scored_reference: records.Scored
    scored_batches: list[records.Scored]


def champion_to_monitor(client, model_name: str):
    """``model_name@champion``'s ModelVersion; LookupError naming the fix when unset."""
    current = registry.champion_version(client, model_name)
    if current is None:
        raise LookupError(f"model '{model_name}' has no @{registry.CHAMPION} to monitor; "
                          "run `cord-ops recalibrate` first")
    return current


@store_task
def score_champion(uri: str, model_name: str, batches: list[records.Batch]) -> ChampionOnBatches:
    """``@champion``'s outputs on its reference split and on every batch."""
    client = tracking.client(uri)
    current = champion_to_monitor(client, model_name)
    version = str(current.version)
    try:
        split = reference.load_reference_split(client, current.run_id)
    except reference.ReferenceUnavailable as exc:
        raise LookupError(f"champion v{version} of '{model_name}' has no usable reference "
                          f"split ({exc}); label-free monitoring compares against it, so "
                          "recalibrate once to pin one") from None
    width = batches[0].scores.shape[1]
    if split.n_classes != width:
        raise LookupError(f"champion v{version}'s reference split has {split.n_classes} "
                          f"classes, the batches {width}")
    problem = None
    try:
        scored = records.score_version(client, model_name, version,
                                       [split.scores, *(b.scores for b in batches)])
    except Exception as exc:  # whatever breaks, the champion is not servable as is
        problem = in_words(exc)[:1000]
    record_health(client, model_name, version, problem)
    if problem is not None:
        raise ChampionUnhealthyError(model_name, version, problem)
    return ChampionOnBatches(version, split.n, np.asarray(split.labels), scored[0], scored[1:])


@compute_task
def estimate_batch(profile: estimators.ReferenceProfile, scored: records.Scored,
                   thresholds: records.Thresholds):
    est = profile.estimate(scored.repaired, scored.original)
    cbpe_raw = estimators.cbpe_accuracy(scored.original)
    return est, cbpe_raw, records.alert_reasons(est, profile, thresholds)


@compute_task
def prior_shift_candidate(scored: records.Scored, profile: estimators.ReferenceProfile,
                          est: estimators.Estimates) -> dict:
    return records.prior_shift_candidate(scored, profile, est)


@store_task
def log_batch(uri: str, model_name: str, version: str, batch: records.Batch, values: dict,
              reasons: list[str], thresholds: records.Thresholds,
              est: estimators.Estimates, reference_priors: np.ndarray,
              candidate: dict | None) -> str:
    return records.log_batch_run(tracking.client(uri), model_name, version, batch, values,
                                 reasons, thresholds, est, reference_priors, candidate)


@store_task
def register_candidate(uri: str, model_name: str, version: str, run_id: str,
                       batch: records.Batch) -> str:
    """:func:`flows.monitor.label_free.candidate.register_candidate` as a task."""
    from flows.monitor.label_free import candidate as label_free_register

    return label_free_register.register_candidate(uri, model_name, version, run_id, batch)


@store_task
def settle(uri: str, model_name: str, batch: records.Batch,
           scored_by: dict[str, records.Scored] | None = None) -> dict[str, dict[str, float]]:
    """:func:`flows.monitor.label_free.records.meet_labels` as a task."""
    return records.meet_labels(tracking.client(uri), model_name, batch, scored_by)


def settle_labelled(uri: str, model_name: str, dataset) -> dict[str, dict[str, float]]:
    """For the labelled monitor: settle the label-free runs of ``dataset``'s scores."""
    batch = records.Batch(str(dataset.path), np.asarray(dataset.scores),
                          np.asarray(dataset.labels), dataset.sha256,
                          records.scores_digest(dataset.scores))
    return settle(uri, model_name, batch)


def emit_alert(model_name: str, report: records.BatchReport, version: str) -> None:
    """A Prefect event other deployments can trigger on (``cord-ops.monitor.alert``)."""
    from prefect.events import emit_event

    emit_event(event=ALERT_EVENT,
               resource={"prefect.resource.id": f"cord-ops.model.{model_name}",
                         "prefect.resource.name": model_name},
               payload={"run_id": report.run_id, "batch": report.path,
                        "champion_version": version, "reasons": report.reasons,
                        "estimated_accuracy": report.estimates.cbpe})


@flow(name="monitor-label-free", persist_result=False)
def monitor_label_free(data: str | Path | list[str], model_name: str = "cord-ops",
                       alpha: float = records.DEFAULT_ALPHA,
                       max_accuracy_drop: float = records.DEFAULT_MAX_ACCURACY_DROP,
                       max_prior_shift: float = records.DEFAULT_MAX_PRIOR_SHIFT,
                       emit_events: bool = False,
                       tracking_uri: str | None = None,
                       register_candidates: bool = False) -> records.LabelFreeResult:
    """Score ``model_name@champion`` on every batch ``data`` names (one file, a folder or a
    glob of .npz/.parquet files, or a list of files; labels optional) and log one label-free
    run per batch (:mod:`flows.monitor.label_free.records`). Batches that carry labels are
    settled at once (:func:`flows.monitor.label_free.records.meet_labels`). A batch whose EM
    priors moved past the threshold gets the prior-shift candidate's state logged with its
    run (:func:`flows.monitor.label_free.records.prior_shift_candidate`). With ``emit_events``,
    every alert is also a Prefect event :data:`ALERT_EVENT`. With ``register_candidates``, each
    such candidate is also registered as a new, label-free version of the model
    (:mod:`flows.monitor.label_free.candidate`; ``@champion`` stays)."""
    from flows import inputs

    uri = tracking.store_uri(tracking_uri)
    thresholds = records.Thresholds(alpha, max_accuracy_drop, max_prior_shift).check()
    reads = inputs.model_reads(uri, f"models:/{model_name}@{registry.CHAMPION}")
    if reads is None:
        raise LookupError(f"model '{model_name}' has no @{registry.CHAMPION} in {uri} whose "
                          "classes and input kind can be read")
    n_classes, input_kind, _ = reads
    batches = [records.read_batch(path, n_classes, input_kind)
               for path in (data if isinstance(data, list) else records.batch_files(data))]
    champion = score_champion(uri, model_name, batches)
    # the classifier's own probabilities order the rows CORD repaired to a tie
    profile = estimators.ReferenceProfile().fit(champion.scored_reference.repaired,
                                                champion.reference_labels,
                                                champion.scored_reference.original)
    result = records.LabelFreeResult(champion.version, profile.accuracy_,
                                     champion.reference_rows)
    logger = get_run_logger()
    for batch, scored in zip(batches, champion.scored_batches, strict=True):
        est, cbpe_raw, reasons = estimate_batch(profile, scored, thresholds)
        values = records.estimate_values(est, cbpe_raw, profile)
        candidate = (prior_shift_candidate(scored, profile, est)
                     if any(r.startswith(records.PRIOR_SHIFT_REASON) for r in reasons)
                     else None)
        run_id = log_batch(uri, model_name, champion.version, batch, values, reasons,
                           thresholds, est, profile.priors_, candidate)
        report = records.BatchReport(batch.path, run_id, batch.n, batch.scores_sha256, est,
                                     cbpe_raw, reasons)
        if register_candidates and candidate is not None:
            report.candidate_version = register_candidate(uri, model_name, champion.version,
                                                          run_id, batch)
            logger.info("registered the label-free prior-shift candidate of %s as v%s",
                        batch.path, report.candidate_version)
        if batch.labels is not None:
            report.realised = settle(uri, model_name, batch,
                                     {champion.version: scored}).get(run_id)
        if reasons:
            logger.warning("champion v%s on %s: %s", champion.version, batch.path,
                           "; ".join(reasons))
            if emit_events:
                emit_alert(model_name, report, champion.version)
        result.reports.append(report)
    return result
