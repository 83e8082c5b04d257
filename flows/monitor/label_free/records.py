"""Label-free monitoring: score ``@champion`` on batches without labels, estimate its accuracy,
the batches' class priors and their drift against the champion's pinned reference split,
and alert; when the labels of a batch arrive, log what was realised beside the estimates.

The numerics are :mod:`cord_ops.label_free` (CBPE, ATC, DoC, Saerens EM priors, KS and
chi-squared drift) and :mod:`cord_ops.prior_shift`; docs/label-free.md says when they hold.

One MLflow run per batch (tag ``cord.kind=monitor-label-free``) in the model's monitoring
experiment ``<model>-monitoring``, with the estimates, the EM priors, each drift test's
statistic and p-value, the batch's size, the file's SHA-256 and the digest of its scores
(:func:`scores_digest`, the same whether the file holds labels or not, .npz or Parquet),
the thresholds as params and ``monitor.alert`` / ``monitor.alerts`` tags. A batch is an
alert when a drift test's p-value is below ``alpha``, the estimated accuracy (CBPE on the
champion) fell by more than ``max_accuracy_drop`` from its value on the reference split, or
the EM priors moved more than ``max_prior_shift`` (total variation) from the reference's
beyond what EM shows on reference-like batches of the same size.

Estimates meet labels (:func:`meet_labels`): a labelled batch whose scores digest matches
earlier label-free runs of the model is scored again with the version each run recorded;
its realised accuracy, ECE, NLL and Brier score and every estimate's signed error
(estimate - realised) are logged on those runs, tag ``monitor.labels=arrived``; a run's
prior-shift candidate is judged on the labels by the gate's rules
(:func:`settle_candidate`).
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cord_ops import data, label_free, metrics
from flows import files
from flows.redact import redact
from flows.store import tracking

KIND = "monitor-label-free"
EXPERIMENT_SUFFIX = "-monitoring"
SCORES_DIGEST_TAG = "monitor.scores_sha256"
ALERT_TAG = "monitor.alert"
ALERTS_TAG = "monitor.alerts"
LABELS_TAG = "monitor.labels"
LABELS_RUN_TAG = "monitor.labels_run"
#: Run tag: which route of the prior-corrected CBPE ``estimate.cbpe_prior`` took
#: (``reweighted``, ``confidence``, or ``cbpe`` where label shift does not explain the
#: batch; ``cord_ops.label_free``).
PRIOR_ROUTE_TAG = "estimate.cbpe_prior_route"
#: Run tag: CBPE's recipe on this run (``class-maps`` or ``one-vs-rest``: the reference
#: profile's choice, ``cord_ops.label_free``).
RECIPE_TAG = "estimate.cbpe_recipe"
#: Run tag: whether a prior-shift candidate's state was logged (``monitor/prior_shift.json``).
PRIOR_SHIFT_TAG = "monitor.prior_shift_candidate"
#: Run tag written when labels meet a run with a prior-shift candidate: the gate's NLL
#: rules applied to it on the labelled batch.
PRIOR_SHIFT_VERDICT_TAG = "monitor.prior_shift_verdict"
#: Key of :func:`meet_labels`' values that holds a prior-shift candidate's verdict (text).
VERDICT = "verdict"
#: Run tag: the version the candidate was registered as (``monitor --register-candidate``,
#: :mod:`flows.monitor.label_free.candidate`).
PRIOR_SHIFT_VERSION_TAG = "monitor.prior_shift_version"
#: Defaults of the alert thresholds (docs/label-free.md): a p-value below 0.01 in either
#: drift test, an estimated accuracy 3 points below the reference's, EM priors 0.1 (total
#: variation) away from the reference's.
DEFAULT_ALPHA = 0.01
DEFAULT_MAX_ACCURACY_DROP = 0.03
DEFAULT_MAX_PRIOR_SHIFT = 0.1
#: Estimated priors are logged as one metric per class up to this K (always in the
#: ``monitor/estimates.json`` artifact): MLflow takes at most 1,000 metrics per batch call.
MAX_PRIOR_METRICS = 100
#: Estimates a run logs (``estimate.<name>``) and whose error labels settle.
ESTIMATES = ("cbpe", "cbpe_raw", "atc", "doc", "cbpe_prior")
PRIOR_SHIFT_REASON = "class priors moved by"
SCORE_SUFFIXES = (".npz", *data.PARQUET_SUFFIXES)


def monitoring_experiment(model_name: str) -> str:
    return f"{model_name}{EXPERIMENT_SUFFIX}"


# ---------------------------------------------------------------- batches
@dataclass(frozen=True, eq=False)
class Batch:
    """A batch's float64 n x K scores, its labels when the file has them, the file's SHA-256
    and the digest of its scores."""

    path: str
    scores: np.ndarray
    labels: np.ndarray | None
    sha256: str
    scores_sha256: str

    @property
    def n(self) -> int:
        return int(self.scores.shape[0])


def scores_digest(scores: np.ndarray) -> str:
    """SHA-256 of the shape and the float64 C-order bytes of the loaded scores: a batch's
    identity across file formats and whether its labels are stored with it."""
    arr = np.ascontiguousarray(scores, dtype=np.float64)
    return hashlib.sha256(f"{arr.shape[0]}x{arr.shape[1]};".encode() + arr.tobytes()).hexdigest()


def batch_files(spec) -> list[Path]:
    """The files ``--data`` names: one file, the .npz/.parquet/.pq files of a folder
    (recursively), or a glob's; sorted. ValueError when it names none."""
    text = str(spec)
    if not files.is_glob(text) and not Path(text).is_dir():
        if Path(text).is_file():
            return [Path(text)]
        raise ValueError(f"{text}: no such file, folder or matching glob")
    found = sorted(p for p in files.files_in(text) if p.suffix.lower() in SCORE_SUFFIXES)
    if not found:
        raise ValueError(f"{text}: holds no .npz/.parquet/.pq file")
    return found


def has_labels(path) -> bool:
    """Whether the file stores labels (an .npz array or a Parquet column ``labels``)."""
    if data.is_parquet(path):
        import pyarrow.parquet as pq

        try:
            return data.LABEL_COLUMN in pq.read_schema(path).names
        except Exception as exc:  # pyarrow's errors vary; the message says what is wrong
            raise ValueError(f"{path}: not a readable Parquet file ({exc})") from None
    try:
        with np.load(path, allow_pickle=False) as archive:
            return "labels" in archive.files
    except (OSError, ValueError, AttributeError) as exc:
        raise ValueError(f"{path}: not a readable .npz archive ({exc})") from None


def batch_kind(n_classes: int, input_kind: str) -> str:
    """How :func:`read_batch` read a file, as :func:`flows.files.preloaded` keys it."""
    return f"label-free batch of {n_classes} {input_kind}"


def read_batch(path, n_classes: int, input_kind: str) -> Batch:
    """The validated batch of ``path`` for a model of ``n_classes`` reading ``input_kind``:
    the load rule of ``cord-ops predict`` (:mod:`cord_ops.scoring_files`; Parquet columns
    as :func:`cord_ops.data.table_scores` reads them, other columns ignored), and when the
    file has labels, those of :func:`cord_ops.data.load` (integers in [0, K), one per
    row). Raises ValueError/TypeError naming the file, array and row. A batch the command
    line read already (:func:`flows.files.preloaded`) is not read again."""
    return files.read_once(path, batch_kind(n_classes, input_kind),
                           lambda: _read_batch(path, n_classes, input_kind))


def _read_batch(path, n_classes: int, input_kind: str) -> Batch:
    from cord_ops.scoring_files import read_input

    if data.is_parquet(path):
        stored, _ = data.table_scores(data.read_parquet_table(path), str(path), input_kind)
        if stored.scores.shape[1] != n_classes:
            held = "one score column (a binary model's)" if stored.width == 1 else \
                f"{stored.width} classes"
            raise ValueError(f"{path}: {input_kind} has {held}; the model expects {n_classes}")
    else:
        stored = read_input(path, n_classes, input_kind, np.dtype(np.float64))
    scores = np.asarray(stored.scores, dtype=np.float64)
    labels = None
    if has_labels(path):
        labels = np.asarray(data.load(path, input_kind=input_kind).labels)
    raw = Path(path).read_bytes()
    return Batch(str(path), scores, labels, hashlib.sha256(raw).hexdigest(),
                 scores_digest(scores))


# ---------------------------------------------------------------- thresholds and alerts
@dataclass(frozen=True)
class Thresholds:
    alpha: float = DEFAULT_ALPHA
    max_accuracy_drop: float = DEFAULT_MAX_ACCURACY_DROP
    max_prior_shift: float = DEFAULT_MAX_PRIOR_SHIFT

    def check(self) -> Thresholds:
        if not 0 < self.alpha < 1:
            raise ValueError(f"--alpha: expected a p-value threshold in (0, 1), got {self.alpha}")
        if not self.max_accuracy_drop >= 0:
            raise ValueError(f"--max-accuracy-drop: expected a non-negative number, got "
                             f"{self.max_accuracy_drop}")
        if not 0 <= self.max_prior_shift <= 1:
            raise ValueError(f"--max-prior-shift: expected a total-variation distance in "
                             f"[0, 1], got {self.max_prior_shift}")
        return self

    def as_params(self) -> dict[str, str]:
        return {f"threshold.{k}": repr(v) for k, v in vars(self).items()}


def alert_reasons(est: label_free.Estimates, profile: label_free.ReferenceProfile,
                  thresholds: Thresholds) -> list[str]:
    """Why the batch is an alert, in words ([] for none).

    The accuracy drop is CBPE on the reference split minus CBPE on the batch, both through
    the reference split's isotonic map (so the reference's CBPE is its accuracy): a
    champion whose mean confidence is off by a few points everywhere does not alarm on
    steady traffic. The prior shift counts beyond the
    99th percentile of what EM shows on reference-like batches of this size
    (:meth:`cord_ops.label_free.ReferenceProfile.prior_noise`), so a small batch or a
    large K does not alarm on noise alone."""
    reasons = [f"{test.test} drift: p = {test.p_value:.3g} < {thresholds.alpha:g} "
               f"(statistic {test.statistic:.4g})"
               for test in est.drift if test.p_value < thresholds.alpha]
    drop = profile.cbpe_ - est.cbpe
    if drop > thresholds.max_accuracy_drop:
        reasons.append(f"estimated accuracy fell by {drop:.4f} (CBPE {est.cbpe:.4f} on the "
                       f"batch, {profile.cbpe_:.4f} on the reference split; "
                       f"> {thresholds.max_accuracy_drop:g})")
    allowed = thresholds.max_prior_shift + profile.prior_noise(est.n)
    if est.prior_shift > allowed:
        reasons.append(f"{PRIOR_SHIFT_REASON} {est.prior_shift:.4f} (total variation, "
                       f"> {allowed:.4f})")
    return reasons


# ---------------------------------------------------------------- champion side
@dataclass
class Scored:
    """A version's ``repaired`` and ``original`` outputs on some rows."""

    repaired: np.ndarray
    original: np.ndarray


def score_version(client, model_name: str, version: str, blocks: list[np.ndarray]) -> list[Scored]:
    """Run version ``version`` once (one download, one predict) on the stacked ``blocks``;
    its outputs, split back per block."""
    from flows.store import registry

    outputs = registry.run_registered_model(client, f"models:/{model_name}/{version}",
                                            np.concatenate(blocks))
    repaired = np.asarray(outputs["repaired"], dtype=np.float64)
    original = np.asarray(outputs["original"], dtype=np.float64)
    total = sum(len(b) for b in blocks)
    if repaired.shape != (total, blocks[0].shape[1]) or original.shape != repaired.shape:
        raise ValueError(f"'repaired' has shape {repaired.shape}, expected "
                         f"{(total, blocks[0].shape[1])}")
    # the graph computes in its own dtype; rows are renormalised here so float32 rounding
    # does not fail the estimators' probability check
    repaired /= repaired.sum(axis=1, keepdims=True)
    original /= original.sum(axis=1, keepdims=True)
    edges = np.cumsum([0, *(len(b) for b in blocks)])
    return [Scored(repaired[a:b], original[a:b]) for a, b in zip(edges[:-1], edges[1:],
                                                                  strict=True)]


def prior_shift_candidate(scored: Scored, profile: label_free.ReferenceProfile,
                          est: label_free.Estimates) -> dict:
    """The state of the champion moved to the batch's EM priors and CORD-repaired against
    the original classifier (:class:`cord_ops.prior_shift.PriorShiftRepair`), as JSON, with
    the number of rows whose top-1 it kept (all of them, by construction; counted on the
    batch so the record says so) and whether label shift explains the batch (the
    reweighting's premise; ``cord_ops.label_free``, label shift rejected). Label-free: no
    label has checked it."""
    from cord_ops.prior_shift import PriorShiftRepair
    from cord_ops.validation import top1

    repair = PriorShiftRepair().fit(scored.original, scored.repaired, profile.priors_,
                                    est.priors)
    moved = repair.transform(scored.original, scored.repaired)
    kept = int(np.count_nonzero(top1(moved) == top1(scored.original)))
    return {"label_free": True, "source_priors": profile.priors_.tolist(),
            "target_priors": repair.priors_.tolist(), "weights": repair.weights_.tolist(),
            "cord": repair.cord_.to_dict(), "rows": int(len(moved)), "top1_kept": kept,
            "mean_top1_probability": float(moved.max(axis=1).mean()),
            "label_shift": {"gap": est.label_shift_gap, "tolerance": est.label_shift_tolerance,
                            "explains_batch": est.prior_method != "cbpe"}}


# ---------------------------------------------------------------- records
@dataclass
class BatchReport:
    """One batch's label-free run."""

    path: str
    run_id: str
    n: int
    scores_sha256: str
    estimates: label_free.Estimates
    cbpe_raw: float
    reasons: list[str]
    realised: dict[str, float] | None = None
    #: The version the batch's prior-shift candidate was registered as (``--register-candidate``).
    candidate_version: str | None = None

    @property
    def alert(self) -> bool:
        return bool(self.reasons)


@dataclass
class LabelFreeResult:
    champion_version: str
    reference_accuracy: float
    reference_rows: int
    reports: list[BatchReport] = field(default_factory=list)

    @property
    def alert(self) -> bool:
        return any(r.alert for r in self.reports)


def estimate_values(est: label_free.Estimates, cbpe_raw: float,
                    profile: label_free.ReferenceProfile) -> dict[str, float]:
    reference_accuracy, reference_priors = profile.accuracy_, profile.priors_
    values = {"batch.n": est.n, "estimate.cbpe": est.cbpe, "estimate.cbpe_raw": cbpe_raw,
              "estimate.cbpe_class_map_share": est.class_map_share,
              "estimate.atc": est.atc, "estimate.doc": est.doc,
              "estimate.cbpe_prior": est.prior_corrected,
              "estimate.cbpe_prior_reweighted": est.prior_reweighted,
              "estimate.cbpe_prior_confidence": est.prior_confidence,
              "estimate.label_shift_gap": est.label_shift_gap,
              "estimate.label_shift_tolerance": est.label_shift_tolerance,
              "estimate.mean_confidence": est.mean_confidence,
              "estimate.accuracy_drop": profile.cbpe_ - est.cbpe,
              "reference.accuracy": reference_accuracy,
              "reference.cbpe": profile.cbpe_,
              "reference.mean_confidence": profile.mean_confidence_,
              "em.iterations": est.em_iterations, "em.converged": float(est.em_converged),
              "prior.shift_tv": est.prior_shift}
    for test in est.drift:
        values[f"drift.{test.test}.statistic"] = test.statistic
        values[f"drift.{test.test}.p_value"] = test.p_value
    if len(est.priors) <= MAX_PRIOR_METRICS:
        values.update({f"prior.estimated.{k}": float(v) for k, v in enumerate(est.priors)})
        values.update({f"prior.reference.{k}": float(v) for k, v in enumerate(reference_priors)})
    return values


def log_batch_run(client, model_name: str, version: str, batch: Batch, report_values: dict,
                  reasons: list[str], thresholds: Thresholds, est: label_free.Estimates,
                  reference_priors: np.ndarray, candidate: dict | None = None) -> str:
    """One finished run for one batch (with ``candidate``, the prior-shift candidate's
    state as ``monitor/prior_shift.json``); a failure while logging leaves it FAILED."""
    run = client.create_run(
        tracking.experiment_id(client, monitoring_experiment(model_name)),
        run_name=f"label-free-v{version}-{Path(batch.path).name}",
        tags={"cord.kind": KIND, "cord.model_name": model_name,
              "cord.champion_version": version, "data.path": batch.path,
              "data.sha256": batch.sha256, SCORES_DIGEST_TAG: batch.scores_sha256,
              "data.shape": f"{batch.n}x{batch.scores.shape[1]}",
              ALERT_TAG: str(bool(reasons)).lower(), ALERTS_TAG: "; ".join(reasons) or "none",
              LABELS_TAG: "pending", PRIOR_ROUTE_TAG: est.prior_method,
              RECIPE_TAG: est.recipe,
              PRIOR_SHIFT_TAG: "logged (label-free, not registered)" if candidate else "none",
              "drift.ks.test": "scipy.stats.ks_2samp on the top-1 confidence",
              "drift.chi2.test": "scipy.stats.chi2_contingency on predicted-class counts"})
    run_id = run.info.run_id
    try:
        tracking.log_values(client, run_id, metrics=report_values, params=thresholds.as_params())
        summary = {"estimates": {k: report_values[f"estimate.{k}"] for k in ESTIMATES},
                   "cbpe_prior_route": est.prior_method,
                   "cbpe_recipe": est.recipe,
                   "cbpe_map_routes": list(est.map_routes),
                   "priors": {"estimated": est.priors.tolist(),
                              "reference": np.asarray(reference_priors).tolist()},
                   "predicted_counts": est.predicted_counts.tolist(),
                   "drift": [t._asdict() for t in est.drift], "alerts": reasons}
        with tempfile.TemporaryDirectory(prefix="cord-ops-monitor-") as tmp:
            path = Path(tmp) / "estimates.json"
            path.write_text(json.dumps(summary, indent=1))
            client.log_artifact(run_id, str(path), "monitor")
            if candidate is not None:
                path = Path(tmp) / "prior_shift.json"
                path.write_text(json.dumps(candidate, indent=1))
                client.log_artifact(run_id, str(path), "monitor")
    except BaseException as exc:
        client.set_tag(run_id, "cord.error", redact(f"{type(exc).__name__}: {exc}")[:5000])
        client.set_terminated(run_id, "FAILED")
        raise
    client.set_terminated(run_id, "FINISHED")
    return run_id


def settle_candidate(client, run_id: str, scored: Scored,
                     labels: np.ndarray) -> tuple[dict[str, float], str]:
    """The run's prior-shift candidate rebuilt from ``monitor/prior_shift.json`` and judged
    on the labelled batch by the gate's rules (:class:`flows.promotion.rules.Policy`: every
    top-1 kept, NLL strictly below the champion's beyond the tolerance, and no worse than
    the uncalibrated classifier's); (metrics ``candidate.*``, verdict in words)."""
    from cord_ops import CORD
    from flows.promotion import rules

    with tempfile.TemporaryDirectory(prefix="cord-ops-monitor-") as tmp:
        state = json.loads(tracking.download_from_run(
            client.tracking_uri, run_id, "monitor/prior_shift.json", tmp).read_text())
    weights = np.asarray(state["weights"], dtype=np.float64)
    moved = CORD.from_dict(state["cord"]).transform(
        scored.original, label_free.reweighted(scored.repaired, weights))
    nll = metrics.nll(moved, labels)
    champion = metrics.nll(scored.repaired, labels)
    uncalibrated = metrics.nll(scored.original, labels)
    tpcr = metrics.tpcr(scored.original, moved)
    policy = rules.Policy.for_classes(scored.repaired.shape[1])
    failed = []
    if tpcr != 0:
        failed.append(f"changes {tpcr:.2%} of the top-1s")
    if not nll < policy.nll_to_beat(champion):
        failed.append(f"NLL {nll:.6g} is not below the champion's {champion:.6g}")
    if not nll <= policy.allowed_nll(uncalibrated):
        failed.append(f"does harm: NLL {nll:.6g} is worse than the uncalibrated model's "
                      f"{uncalibrated:.6g}")
    verdict = ("better than the champion on the labelled batch "
               f"(NLL {nll:.6g} < {champion:.6g}); not registered" if not failed
               else "not better: " + "; ".join(failed))
    return ({"candidate.nll": nll, "candidate.tpcr": tpcr,
             "candidate.accuracy": metrics.accuracy(moved, labels),
             "candidate.champion_nll": champion}, verdict)


def record_verdict(client, model_name: str, version: str | None, verdict: str,
                   values: dict[str, float]) -> None:
    """Write the labelled verdict on the version a candidate was registered as (nothing
    when it was not registered, or the version is gone since): ``promote`` refuses a
    label-free version until it has one."""
    from mlflow.exceptions import MlflowException

    from flows.store import registry

    if not version:
        return
    try:
        client.set_model_version_tag(model_name, version, registry.LABEL_FREE_VERDICT_TAG,
                                     verdict[:5000])
    except MlflowException:
        return
    for key, value in values.items():
        client.set_model_version_tag(model_name, version, f"cord.label_free.{key}",
                                     repr(float(value)))


def realised_values(scored: Scored, labels: np.ndarray) -> dict[str, float]:
    found = metrics.evaluate(scored.repaired, labels, reference=scored.original)
    return {f"realised.{k}": float(found[k]) for k in ("accuracy", "ece", "nll", "brier")}


def meet_labels(client, model_name: str, batch: Batch,
                scored_by: dict[str, Scored] | None = None) -> dict[str, dict[str, float]]:
    """Log realised metrics and estimation errors on every earlier label-free run of
    ``model_name`` whose scores digest is ``batch``'s (module docstring); returns them by
    run id. ``scored_by`` holds outputs already computed, by version."""
    from flows.store import tracking

    if batch.labels is None:
        return {}
    experiment = client.get_experiment_by_name(monitoring_experiment(model_name))
    if experiment is None:
        return {}
    runs = client.search_runs([experiment.experiment_id],
                              f"tags.`{SCORES_DIGEST_TAG}` = '{batch.scores_sha256}' and "
                              f"tags.`cord.kind` = '{KIND}' and attributes.status = 'FINISHED'")
    scored_by = dict(scored_by or {})
    settled = {}
    for run in runs:
        version = run.data.tags.get("cord.champion_version", "")
        if version not in scored_by:
            scored_by[version] = score_version(client, model_name, version, [batch.scores])[0]
        values = realised_values(scored_by[version], batch.labels)
        accuracy = values["realised.accuracy"]
        logged = run.data.metrics
        for name in ESTIMATES:
            if f"estimate.{name}" in logged:
                values[f"error.{name}"] = logged[f"estimate.{name}"] - accuracy
        k = batch.scores.shape[1]
        if f"prior.estimated.{k - 1}" in logged:
            realised = np.bincount(batch.labels, minlength=k) / batch.n
            estimated = [logged[f"prior.estimated.{c}"] for c in range(k)]
            values["error.priors_tv"] = label_free.total_variation(estimated, realised)
        tags = {LABELS_TAG: "arrived", LABELS_RUN_TAG: batch.path}
        verdict = None
        if run.data.tags.get(PRIOR_SHIFT_TAG, "none") != "none":
            found, verdict = settle_candidate(client, run.info.run_id, scored_by[version],
                                              batch.labels)
            registered = run.data.tags.get(PRIOR_SHIFT_VERSION_TAG)
            if registered:
                verdict = verdict.replace("; not registered", f"; registered as v{registered}")
            tags[PRIOR_SHIFT_VERDICT_TAG] = verdict
            values.update(found)
            # the registered version carries it too, which lifts promote's refusal
            record_verdict(client, model_name, registered, verdict, found)
        tracking.log_values(client, run.info.run_id, metrics=values, tags=tags)
        # The verdict recorded, in words, for the command's summary (not a metric).
        settled[run.info.run_id] = values if verdict is None else {**values, VERDICT: verdict}
    return settled
