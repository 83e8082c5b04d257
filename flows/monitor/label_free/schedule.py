"""The scheduled label-free monitor (``cord-ops schedule --label-free-data GLOB``): on every
tick, the batches the glob (or folder) names that no finished label-free run of the model
has logged yet go through :func:`flows.monitor.label_free.flow.monitor_label_free`.

"Logged yet" is by the file's SHA-256 (tag ``data.sha256`` of the model's label-free
runs), so a batch monitored by hand, or renamed, is not monitored twice, and a batch whose
run failed while logging is retried. The deployment runs one flow at a time
(:data:`flows.schedule.ONE_AT_A_TIME`), so two ticks never log one batch twice.
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow, get_run_logger

from flows.monitor.label_free import records
from flows.monitor.label_free.flow import monitor_label_free
from flows.platform import pinned
from flows.platform.task_presets import store_task
from flows.store import registry, tracking
from flows.store.graphs import sha256_file

LABEL_FREE_DEPLOYMENT = "cord-ops-monitor-label-free"
#: Runs fetched per page when collecting what was already monitored.
PAGE_SIZE = 1000


@store_task
def monitored_files(uri: str, model_name: str) -> set[str]:
    """The file SHA-256s of the model's finished label-free runs."""
    client = tracking.client(uri)
    experiment = client.get_experiment_by_name(records.monitoring_experiment(model_name))
    if experiment is None:
        return set()
    found: set[str] = set()
    token = None
    while True:
        page = client.search_runs([experiment.experiment_id],
                                  f"tags.`cord.kind` = '{records.KIND}' and "
                                  "attributes.status = 'FINISHED'",
                                  max_results=PAGE_SIZE, page_token=token)
        found.update(r.data.tags["data.sha256"] for r in page if "data.sha256" in r.data.tags)
        token = page.token
        if not token:
            return found


def new_batches(files: list[Path], monitored: set[str]) -> list[str]:
    """``files`` whose SHA-256 is not in ``monitored``, each content once, in order."""
    seen = set(monitored)
    fresh = []
    for path in files:
        digest = sha256_file(path)
        if digest not in seen:
            seen.add(digest)
            fresh.append(str(path))
    return fresh


@flow(name="monitor-label-free-new", persist_result=False)
def monitor_new_batches(data: str, model_name: str = "cord-ops",
                        alpha: float = records.DEFAULT_ALPHA,
                        max_accuracy_drop: float = records.DEFAULT_MAX_ACCURACY_DROP,
                        max_prior_shift: float = records.DEFAULT_MAX_PRIOR_SHIFT,
                        emit_events: bool = False,
                        tracking_uri: str | None = None,
                        register_candidates: bool = False) -> records.LabelFreeResult | None:
    """Monitor, without labels, the batches ``data`` names that were not monitored yet.

    None (and a log line) when the model has no ``@champion`` yet, when ``data`` names no
    batch yet, or when every batch was monitored: none of these is an error on a schedule.
    A bad new batch fails the run with its one-line reason before any run is logged (as
    ``cord-ops monitor`` does), and every later tick fails the same way until it is moved
    out of the glob. A run of a deployment whose parameters are not the deployment's is
    refused first (:func:`flows.platform.pinned.check`).
    """
    pinned.check()
    logger = get_run_logger()
    uri = tracking.store_uri(tracking_uri)
    if registry.champion_version(tracking.client(uri), model_name) is None:
        logger.info("model '%s' has no @%s yet; skipping this label-free run", model_name,
                    registry.CHAMPION)
        return None
    try:
        files = records.batch_files(data)
    except ValueError as exc:
        logger.info("no batch to monitor yet (%s)", exc)
        return None
    fresh = new_batches(files, monitored_files(uri, model_name))
    if not fresh:
        logger.info("all %d batch(es) of %s were monitored already", len(files), data)
        return None
    logger.info("%d new batch(es) of %d in %s", len(fresh), len(files), data)
    return monitor_label_free(data=fresh, model_name=model_name, alpha=alpha,
                              max_accuracy_drop=max_accuracy_drop,
                              max_prior_shift=max_prior_shift, emit_events=emit_events,
                              tracking_uri=uri, register_candidates=register_candidates)
