"""Register a label-free prior-shift candidate (``cord-ops monitor --data BATCH
--register-candidate``) as a version of the model, so an operator can serve, roll out or
promote it.

The graph is the champion's own, as registered, moved to the batch's EM priors
(:func:`onnx_export.prior_shift.export_prior_shift`) from the state the monitoring run
logged (``monitor/prior_shift.json``). Everything is computed and checked before anything
is written: the graph against :class:`cord_ops.prior_shift.PriorShiftRepair` in numpy
(parity on the champion's reference split and the batch, tolerance
``max(FIXED_PARITY_TOLERANCE[dtype], the champion run's onnx.tolerance)``) and every
top-1 against the classifier's. Then it takes the path a recalibration takes: a run in the
model's experiment with the metrics :func:`flows.promotion.operations.check_promotable`
reads (``onnx.*``, ``cord.tpcr``, ``cord.nll`` on the reference split), the champion's
reference split pinned again as its own, the pyfunc + onnx flavours of
:mod:`flows.pyfunc_model` checked byte for byte and their digests recorded
(:mod:`flows.store.graphs`), and under the registry lock clean-up, a pending version,
its tags, complete, passing the named steps of :mod:`flows.platform.checkpoints` a
recalibration passes (all but ``alias_moved``), where
the crash tests kill it. ``@champion`` never moves: no label has judged the candidate,
and the version says so (``cord.label_free=true``) until labels settle it
(:func:`flows.monitor.label_free.records.record_verdict`); ``promote`` refuses it until
then without ``--allow-label-free``.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cord_ops import metrics
from cord_ops.validation import top1
from flows.monitor.label_free import records
from flows.platform import checkpoints
from flows.redact import redact
from flows.store import registry, tracking

KIND = "prior-shift-candidate"
#: Monitoring-run tag: the version a candidate was registered as.
VERSION_TAG = records.PRIOR_SHIFT_VERSION_TAG
#: Version and run tags (also in :mod:`flows.store.registry`, where promotion reads them).
LABEL_FREE_TAG = registry.LABEL_FREE_TAG
VERDICT_TAG = registry.LABEL_FREE_VERDICT_TAG
SOURCE_VERSION_TAG = registry.LABEL_FREE_SOURCE_TAG
MONITOR_RUN_TAG = "cord.label_free.monitor_run"


@dataclass
class Prepared:
    """A candidate graph checked and ready to log."""

    graph: object
    dtype: str
    state: dict
    reference: object  # the champion's reference split (data.Dataset)
    values: dict[str, float]
    champion: object  # the champion's ModelVersion
    champion_run_tags: dict[str, str]


def _repair_from_state(state: dict):
    from cord_ops import CORD
    from cord_ops.prior_shift import PriorShiftRepair

    repair = PriorShiftRepair()
    repair.priors_ = np.asarray(state["target_priors"], dtype=np.float64)
    repair.weights_ = np.asarray(state["weights"], dtype=np.float64)
    repair.cord_ = CORD.from_dict(state["cord"])
    repair.em_iterations_, repair.em_converged_ = 0, True
    return repair


def prepare(client, model_name: str, version: str, monitor_run_id: str,
            batch: records.Batch) -> Prepared:
    """Build and check the candidate of ``monitor_run_id`` (a label-free run of champion
    ``version`` on ``batch``); writes nothing. Raises ValueError saying why it cannot be
    registered (parity, a changed top-1, a champion graph without ``original``)."""
    from flows.store import graphs, reference
    from onnx_export.export import model_metadata
    from onnx_export.parity import FIXED_PARITY_TOLERANCE
    from onnx_export.prior_shift import export_prior_shift

    champion = client.get_model_version(model_name, version)
    champion_run = client.get_run(champion.run_id)
    with tempfile.TemporaryDirectory(prefix="cord-ops-candidate-") as tmp:
        state = json.loads(tracking.download_from_run(
            client.tracking_uri, monitor_run_id, "monitor/prior_shift.json", tmp).read_text())
    # the champion's graph only, checked against its run's digest; nothing of it executed
    base = graphs.load_graph(client, model_name, version)
    dtype = model_metadata(base).get("cord.dtype", "float32")
    repair = _repair_from_state(state)
    graph = export_prior_shift(base, repair, state["source_priors"], version)
    split = reference.load_reference_split(client, champion.run_id)

    tolerance = max(FIXED_PARITY_TOLERANCE[dtype],
                    champion_run.data.metrics.get("onnx.tolerance", 0.0))
    worst, agree, changed, rows = 0.0, 0, 0, 0
    for scores in (split.scores, batch.scores):
        before = graphs.run_graph(base, scores)
        after = graphs.run_graph(graph, scores)
        original = before["original"].astype(np.float64)
        expected = repair.transform(original, before["repaired"].astype(np.float64))
        repaired = after["repaired"].astype(np.float64)
        worst = max(worst, float(np.max(np.abs(repaired - expected))))
        agree += int(np.count_nonzero(top1(repaired) == top1(scores)))
        changed += int(np.count_nonzero(top1(repaired) != top1(original)))
        rows += len(scores)
        if scores is split.scores:
            nll = metrics.nll(repaired, split.labels)
    agreement = agree / rows
    if not (worst <= tolerance and agreement == 1.0 and changed == 0):
        raise ValueError(f"prior-shift candidate of v{version}: ONNX parity failed (max "
                         f"|onnx - cord_ops| = {worst:.3g}, tolerance {tolerance:g}; argmax "
                         f"agreement {agreement:.6f}, expected 1.0); nothing registered")
    values = {"onnx.max_abs_diff": worst, "onnx.argmax_agreement": agreement,
              "onnx.tolerance": tolerance, "cord.tpcr": changed / rows, "cord.nll": nll,
              "eta_star": float(repair.cord_.eta_), "batch.n": float(batch.n)}
    return Prepared(graph, dtype, state, split, values, champion, champion_run.data.tags)


def register_candidate(uri: str, model_name: str, version: str, monitor_run_id: str,
                       batch: records.Batch, lock_timeout: float | None = None) -> str:
    """Register the candidate of ``monitor_run_id`` as a new version; returns it. Never
    moves ``@champion`` (module docstring). A failure after the run exists leaves the run
    FAILED with ``cord.error`` and no version."""
    from flows import pyfunc_model
    from flows.promotion import operations
    from flows.store import graphs, owner, reference, tracking
    from onnx_export.export import model_metadata

    client = tracking.client(uri)
    ready = prepare(client, model_name, version, monitor_run_id, batch)
    meta = model_metadata(ready.graph)
    experiment = tracking.experiment_id(client, model_name)
    run = client.create_run(experiment, run_name=f"prior-shift-v{version}-{Path(batch.path).name}",
                            tags={"cord.kind": KIND, "cord.model_name": model_name,
                                  LABEL_FREE_TAG: "true", SOURCE_VERSION_TAG: version,
                                  MONITOR_RUN_TAG: monitor_run_id, "cord.dtype": ready.dtype,
                                  "cord.calibrator": ready.champion_run_tags.get(
                                      "cord.calibrator", "unknown"),
                                  "data.path": batch.path, "data.sha256": batch.sha256,
                                  records.SCORES_DIGEST_TAG: batch.scores_sha256,
                                  **owner.Owner.current().record()})
    run_id, created = run.info.run_id, None
    checkpoints.checkpoint("start_run")
    try:
        tracking.log_values(client, run_id, metrics=ready.values,
                            params={"prior_shift.eta_star": repr(ready.values["eta_star"]),
                                    "prior_shift.source_version": version,
                                    "prior_shift.priors_sha256":
                                        meta["cord.prior_shift.priors_sha256"]})
        checkpoints.checkpoint("log_params")
        with tempfile.TemporaryDirectory(prefix="cord-ops-candidate-") as tmp:
            path = Path(tmp) / "prior_shift.json"
            path.write_text(json.dumps(ready.state, indent=1))
            client.log_artifact(run_id, str(path), "state")
            written = {"state/prior_shift.json": graphs.sha256_file(path)}
        written[f"{reference.ARTIFACT_DIR}/{reference.ARTIFACT_NAME}"] = \
            reference.log_reference_split(client, run_id, ready.reference)
        checkpoints.checkpoint("log_artifacts")
        example = np.asarray(ready.reference.scores[:5], dtype=ready.dtype)
        info = pyfunc_model.log_model(client, run_id, experiment, ready.graph, example,
                                      name="model")
        checkpoints.checkpoint("log_model")
        # the logged file is the graph whose parity was checked, and its digest is recorded
        # for every later load (flows.store.graphs)
        with tempfile.TemporaryDirectory(prefix="cord-ops-verify-") as tmp:
            graphs.record_digests(client, uri, run_id, info.model_uri, ready.graph, written,
                                  Path(tmp))
        with operations.registry_section(client, uri, model_name, lock_timeout):
            checkpoints.checkpoint("lock_acquired")
            registry.clean_up(client, model_name, experiment)
            holder = registry.champion_version(client, model_name)
            previous = None if holder is None else str(holder.version)
            with tracking.registry_lookups(client):
                mv = registry.register_version(
                    client, model_name, run_id, info.model_uri, info.model_id,
                    tags={LABEL_FREE_TAG: "true", SOURCE_VERSION_TAG: version,
                          MONITOR_RUN_TAG: monitor_run_id,
                          "cord.eta_star": ready.champion.tags.get("cord.eta_star", ""),
                          "cord.prior_shift.eta_star": repr(ready.values["eta_star"]),
                          "cord.calibrator": ready.champion.tags.get("cord.calibrator", ""),
                          registry.INPUT_KIND_TAG: ready.champion.tags.get(
                              registry.INPUT_KIND_TAG, ""),
                          registry.N_CLASSES_TAG: ready.champion.tags.get(
                              registry.N_CLASSES_TAG, ""),
                          "data.sha256": batch.sha256},
                    previous_champion=previous)
            created = str(mv.version)
            checkpoints.checkpoint("registered")
            reason = (f"label-free prior-shift candidate of v{version} (monitoring run "
                      f"{monitor_run_id}); not gated: no labels yet")
            client.set_model_version_tag(model_name, created, registry.DECISION_TAG,
                                         "label-free")
            client.set_model_version_tag(model_name, created, registry.REASON_TAG, reason)
            # @champion never moves here, so there is no "alias_moved" step
            checkpoints.checkpoint("gate_recorded")
            client.set_terminated(run_id, "FINISHED")
            checkpoints.checkpoint("run_finished")
            registry.complete_version(client, model_name, created)
    except BaseException as exc:
        if created is not None:
            registry.withdraw_version(client, model_name, created, None)
        client.set_tag(run_id, registry.ERROR_TAG,
                       redact(f"{type(exc).__name__}: {exc}")[:5000])
        client.set_terminated(run_id, "FAILED")
        raise
    client.set_tag(monitor_run_id, VERSION_TAG, created)
    client.set_tag(monitor_run_id, records.PRIOR_SHIFT_TAG,
                   f"registered as v{created} (label-free)")
    return created

