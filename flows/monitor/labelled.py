"""The monitoring flow: score ``@champion`` on a new labelled batch, log how it does, and
recalibrate (as a subflow) when its calibration has drifted.

Drift is measured against the champion's own numbers at registration: the ``cord.ece``
and ``cord.nll`` its recalibration run logged on its evaluation split. The batch triggers
a recalibration when ECE rose by more than ``max_ece_increase`` or NLL by more than
``max_nll_increase``.

A champion that cannot be scored on the batch (broken artifact, foreign model, other K or
input kind) stops the monitor with :class:`flows.promotion.champion.ChampionUnhealthyError`
and records the problem in the registered-model tag ``cord.champion.health``. A
drift-triggered recalibration fits on the batch but reaches ``@champion`` only through the
gate (:mod:`flows.promotion.rules`), which also scores it on the champion's pinned reference
split: a batch with broken labels cannot promote a model that learned them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from prefect import flow, get_run_logger

from cord_ops import data, metrics
from flows.errors import in_words
from flows.monitor.label_free.flow import champion_to_monitor, settle_labelled
from flows.platform import pinned, tick_lines
from flows.platform.task_presets import compute_task, store_task
from flows.promotion.champion import ChampionUnhealthyError, record_health
from flows.recalibrate.compute import load_dataset
from flows.recalibrate.flow import RecalibrationResult, recalibrate
from flows.store import registry, tracking

DRIFT_METRICS = ("ece", "nll")


@dataclass(frozen=True)
class ChampionOnBatch:
    """The champion's version, its metrics on the batch and its registration baseline."""

    version: str
    metrics: dict[str, float]
    baseline: dict[str, float]


@dataclass
class MonitorResult:
    """One monitoring pass; ``recalibration`` is set when drift triggered the subflow."""

    run_id: str
    champion_version: str
    metrics: dict[str, float]
    baseline: dict[str, float]
    drift: dict[str, float]
    reasons: list[str]
    recalibration: RecalibrationResult | None
    #: label-free runs of the same scores settled by this batch's labels, by run id
    settled: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def degraded(self) -> bool:
        return bool(self.reasons)


@store_task
def score_champion_on_batch(uri: str, model_name: str,
                            batch: data.Dataset) -> ChampionOnBatch:
    """Run ``model_name@champion`` on the batch; read its baseline from its own run."""
    client = tracking.client(uri)
    current = champion_to_monitor(client, model_name)
    version = str(current.version)
    reads = current.tags.get(registry.INPUT_KIND_TAG)  # None: registered without the tag
    problem = None
    if reads not in (None, batch.input_kind):
        problem = f"it reads {reads}, {batch.path} holds {batch.input_kind}"
    else:
        try:
            # The version the alias named a moment ago, so metrics and baseline describe
            # one model.
            outputs = registry.run_registered_model(client, f"models:/{model_name}/{version}",
                                                    batch.scores)
            repaired = np.asarray(outputs["repaired"], dtype=np.float64)
            original = np.asarray(outputs["original"], dtype=np.float64)
            if repaired.shape != batch.scores.shape:
                raise ValueError(f"'repaired' has shape {repaired.shape}, expected "
                                 f"{batch.scores.shape}")
            logged = client.get_run(current.run_id).data.metrics
            baseline = {name: logged[f"cord.{name}"] for name in DRIFT_METRICS}
        except Exception as exc:  # whatever breaks, the champion is not servable as is
            problem = in_words(exc)[:1000]
    record_health(client, model_name, version, problem)
    if problem is not None:
        raise ChampionUnhealthyError(model_name, version, problem)
    return ChampionOnBatch(version, metrics.evaluate(repaired, batch.labels, reference=original),
                           baseline)


@store_task
def has_champion(uri: str, model_name: str) -> bool:
    """Whether ``model_name`` has a champion in the store ``uri`` (a missing model: no)."""
    return registry.champion_version(tracking.client(uri), model_name) is not None


@compute_task
def find_drift(scored: ChampionOnBatch, max_ece_increase: float,
               max_nll_increase: float) -> tuple[dict[str, float], list[str]]:
    """Increase of each drift metric over the baseline, and the thresholds it crossed."""
    limits = {"ece": max_ece_increase, "nll": max_nll_increase}
    drift = {name: scored.metrics[name] - scored.baseline[name] for name in DRIFT_METRICS}
    reasons = [f"{name} rose by {drift[name]:.4g} (> {limits[name]:g}): "
               f"{scored.baseline[name]:.4g} -> {scored.metrics[name]:.4g}"
               for name in DRIFT_METRICS if drift[name] > limits[name]]
    return drift, reasons


@store_task
def log_monitoring(uri: str, model_name: str, batch: data.Dataset, scored: ChampionOnBatch,
                   drift: dict[str, float], reasons: list[str],
                   thresholds: dict[str, float]) -> str:
    """One MLflow run (tag ``cord.kind=monitor``) with the batch metrics, baseline and drift."""
    client = tracking.client(uri)
    run = client.create_run(
        tracking.experiment_id(client, model_name), run_name=f"monitor-v{scored.version}",
        tags={"cord.kind": "monitor", "cord.model_name": model_name,
              "cord.champion_version": scored.version, "data.sha256": batch.sha256,
              "data.shape": f"{batch.n}x{batch.n_classes}", "data.path": str(batch.path),
              "cord.drift": "; ".join(reasons) or "none"},
    )
    values = {f"monitor.{k}": v for k, v in scored.metrics.items()}
    values.update({f"baseline.{k}": v for k, v in scored.baseline.items()})
    values.update({f"drift.{k}": v for k, v in drift.items()})
    tracking.log_values(client, run.info.run_id, metrics=values,
                        params={k: repr(v) for k, v in thresholds.items()})
    client.set_terminated(run.info.run_id, "FINISHED")
    return run.info.run_id


@flow(name="monitor", persist_result=False)
def monitor(data: str | Path, model_name: str = "cord-ops", max_ece_increase: float = 0.02,
            max_nll_increase: float = 0.05, input_kind: str = "auto",
            recalibrate_on_drift: bool = True, calibrator: str = "auto", fraction: float = 0.5,
            seed: int = 0, dtype: str = "float32", gate_options: dict | None = None,
            tracking_uri: str | None = None,
            skip_without_champion: bool = False) -> MonitorResult | None:
    """Score ``model_name@champion`` on the labelled batch ``data`` (.npz or Parquet) and log
    it.

    When ECE or NLL rose past its threshold and ``recalibrate_on_drift`` is set, runs
    :func:`flows.recalibrate.flow.recalibrate` on the batch as a subflow (its gate still decides
    whether the new version takes ``@champion``; ``gate_options`` are its threshold
    overrides, as :func:`flows.recalibrate.flow.recalibrate` takes them).

    ``skip_without_champion`` (set by ``cord-ops schedule``): while the model has no
    champion yet (the first scheduled recalibration has not finished), log that and return
    None instead of failing the run.

    A run of a deployment whose parameters are not the deployment's is refused first
    (:func:`flows.platform.pinned.check`).
    """
    pinned.check()
    uri = tracking.store_uri(tracking_uri)
    if skip_without_champion and not has_champion(uri, model_name):
        tick_lines.log_result(f"monitor: model '{model_name}' has no @{registry.CHAMPION} in "
                              f"{uri} yet: nothing to monitor, skipping this pass")
        return None
    batch = load_dataset(str(data), input_kind)
    scored = score_champion_on_batch(uri, model_name, batch)
    drift, reasons = find_drift(scored, max_ece_increase, max_nll_increase)
    thresholds = {"max_ece_increase": max_ece_increase, "max_nll_increase": max_nll_increase}
    run_id = log_monitoring(uri, model_name, batch, scored, drift, reasons, thresholds)
    settled = settle_labelled(uri, model_name, batch)
    recalibration = None
    if reasons:
        get_run_logger().warning("champion v%s drifted: %s", scored.version, "; ".join(reasons))
        if recalibrate_on_drift:
            recalibration = recalibrate(data=str(data), calibrator=calibrator, fraction=fraction,
                                        seed=seed, model_name=model_name,
                                        input_kind=batch.input_kind, dtype=dtype,
                                        tracking_uri=uri, **(gate_options or {}))
    result = MonitorResult(run_id, scored.version, scored.metrics, scored.baseline, drift,
                           reasons, recalibration, settled)
    tick_lines.log_result(result_line(result, str(data)))
    return result


def result_line(result: MonitorResult, data: str) -> str:
    """A monitoring pass in one line (a scheduled run's console line,
    :mod:`flows.platform.tick_lines`): the champion's metrics against its baseline, the
    drift, and what a recalibration on drift decided."""
    metrics = ", ".join(f"{name} {result.metrics[name]:.5f} (baseline "
                        f"{result.baseline[name]:.5f})" for name in DRIFT_METRICS)
    line = (f"monitor: champion v{result.champion_version} on {data}: {metrics}; drift: "
            + ("; ".join(result.reasons) if result.reasons else "none"))
    recal = result.recalibration
    if recal is not None and getattr(recal, "decision", None) is not None:
        line += f"; recalibrated: v{recal.version} {recal.decision.label}"
    elif recal is not None and getattr(recal, "skipped", None):
        line += f"; recalibration skipped: {recal.skipped}"
    return line
