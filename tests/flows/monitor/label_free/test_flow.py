"""Label-free monitoring against a real MLflow store: one run per batch with the estimates,
EM priors and drift tests against the champion's pinned reference split; alerts (tag,
summary line, exit status 3); bad input refused with one line before anything is written;
and the labels of a batch meeting its earlier estimates."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cord_ops import data
from flows.cli import label_free as label_free_cli
from flows.cli.main import main
from flows.monitor.label_free import records
from flows.monitor.label_free.flow import monitor_label_free
from flows.monitor.labelled import monitor
from flows.recalibrate.flow import recalibrate
from flows.serve import traffic as traffic_monitor

pytestmark = pytest.mark.usefixtures("prefect_harness")


def _runs(client, name="m"):
    found = client.get_experiment_by_name(records.monitoring_experiment(name))
    return [] if found is None else client.search_runs([found.experiment_id])


def test_label_free_monitor_estimates_alerts_refuses_and_meets_labels(store, tmp_path, digits,
                                                                       capsys):
    from mlflow import MlflowClient

    client = MlflowClient()
    first = recalibrate(data=str(data.save_npz(tmp_path / "d.npz", digits.scores,
                                               digits.labels, "logits")), model_name="m")
    rng = np.random.default_rng(0)
    steady_rows = rng.choice(digits.n, size=400, replace=False)
    shifted_rows = np.flatnonzero(digits.labels <= 2)  # classes 0-2 only: a label shift
    batches = tmp_path / "batches"
    batches.mkdir()
    np.savez(batches / "a-steady.npz", logits=digits.scores[steady_rows])
    pq.write_table(pa.table({"logits": list(digits.scores[shifted_rows])}),
                   batches / "b-shifted.parquet")

    # -------- bad input: one error line, nothing written (not even the good file's run)
    bad = tmp_path / "bad"
    bad.mkdir()
    np.savez(bad / "a-good.npz", logits=digits.scores[:50])
    np.savez(bad / "b-labels.npz", logits=digits.scores[:5], labels=np.array([0, 1, 2, 3, 10]))
    np.savez(tmp_path / "probs.npz", probs=digits.probabilities()[:5])
    np.savez(tmp_path / "empty.npz", logits=np.empty((0, 10)))
    refusals = {str(bad): ("b-labels.npz", "labels"),
                str(tmp_path / "probs.npz"): ("probs.npz", "the model reads logits"),
                str(tmp_path / "empty.npz"): ("empty.npz", "at least one row")}
    capsys.readouterr()
    for spec, expected in refusals.items():
        assert main(["monitor", "--data", spec, "--model-name", "m"]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: "), err
        assert all(text in err[0] for text in expected), err[0]
    assert main(["monitor", "--data", str(batches), "--model-name", "m", "--alpha", "2"]) == 1
    assert "--alpha: expected a p-value threshold in (0, 1)" in capsys.readouterr().err
    assert _runs(client) == []

    # -------- the flow on a folder: one run per batch, the shifted one an alert
    result = monitor_label_free(data=str(batches), model_name="m")
    assert result.champion_version == first.version and result.reference_rows == 449
    steady, shifted = result.reports
    assert not steady.alert and shifted.alert
    assert any(r.startswith("chi2 drift: p = ") for r in shifted.reasons)
    assert any(r.startswith("class priors moved by ") for r in shifted.reasons)
    # the EM priors put (nearly) all mass on the three classes present
    assert shifted.estimates.priors[:3].sum() > 0.9
    logged = client.get_run(shifted.run_id).data
    assert logged.tags["cord.kind"] == records.KIND
    assert logged.tags[records.ALERT_TAG] == "true"
    assert logged.tags[records.ALERTS_TAG] == "; ".join(shifted.reasons)
    assert logged.tags[records.LABELS_TAG] == "pending"
    assert logged.tags["cord.champion_version"] == first.version
    assert logged.metrics["batch.n"] == len(shifted_rows)
    assert logged.metrics["drift.chi2.p_value"] < 0.01
    assert logged.metrics["estimate.cbpe"] == shifted.estimates.cbpe
    # about 45 reference rows per predicted digit: every class shares the pooled map
    assert logged.metrics["estimate.cbpe_class_map_share"] == 0.0
    # both routes of the prior correction are logged; the digits reference has fewer than
    # MIN_CLASS_ROWS rows per class, so the confidence route is the one used
    assert logged.metrics["estimate.cbpe_prior_reweighted"] == \
        shifted.estimates.prior_reweighted
    assert logged.metrics["estimate.cbpe_prior"] == \
        logged.metrics["estimate.cbpe_prior_confidence"] == shifted.estimates.prior_confidence
    assert logged.tags[records.PRIOR_ROUTE_TAG] == "confidence"
    # CBPE's recipe, as the reference profile chose it from the classifier's own rows
    assert logged.tags[records.RECIPE_TAG] == shifted.estimates.recipe
    assert shifted.estimates.recipe in ("class-maps", "one-vs-rest")
    assert logged.metrics["estimate.label_shift_gap"] == shifted.estimates.label_shift_gap \
        <= logged.metrics["estimate.label_shift_tolerance"]
    assert logged.params["threshold.alpha"] == "0.01"
    assert {f"prior.estimated.{k}" for k in range(10)} <= set(logged.metrics)
    # the prior-shift candidate: logged label-free, its top-1 the classifier's on every row
    assert logged.tags[records.PRIOR_SHIFT_TAG].startswith("logged (label-free")
    with tempfile.TemporaryDirectory() as tmp:
        candidate = json.loads(Path(client.download_artifacts(
            shifted.run_id, "monitor/prior_shift.json", tmp)).read_text())
    assert candidate["label_free"] is True
    assert candidate["label_shift"] == {"gap": shifted.estimates.label_shift_gap,
                                        "tolerance": shifted.estimates.label_shift_tolerance,
                                        "explains_batch": True}
    assert candidate["rows"] == candidate["top1_kept"] == len(shifted_rows)
    assert candidate["target_priors"] == pytest.approx(list(shifted.estimates.priors))
    quiet = client.get_run(steady.run_id).data
    assert quiet.tags[records.PRIOR_SHIFT_TAG] == "none"
    assert quiet.tags[records.ALERT_TAG] == "false"
    assert quiet.tags[records.ALERTS_TAG] == "none"
    assert quiet.metrics["drift.ks.p_value"] >= 0.01
    assert quiet.metrics["drift.chi2.p_value"] >= 0.01
    # CBPE on the calibrated champion: within 3 points of the accuracy it will turn out to
    # have (the digits classifier is overconfident; its raw CBPE is further off)
    accuracy = float(np.mean(digits.scores[steady_rows].argmax(1) == digits.labels[steady_rows]))
    assert abs(steady.estimates.cbpe - accuracy) < 0.03
    assert abs(steady.estimates.cbpe - accuracy) < abs(steady.cbpe_raw - accuracy)
    assert client.get_run(steady.run_id).info.status == "FINISHED"

    # -------- the labels of the shifted batch arrive (as an .npz: the digest is the scores')
    labelled = data.save_npz(tmp_path / "shifted-labelled.npz", digits.scores[shifted_rows],
                             digits.labels[shifted_rows], "logits")
    met = monitor(data=str(labelled), model_name="m", recalibrate_on_drift=False)
    assert list(met.settled) == [shifted.run_id]
    truth = float(np.mean(digits.scores[shifted_rows].argmax(1) == digits.labels[shifted_rows]))
    settled = client.get_run(shifted.run_id).data
    assert settled.metrics["realised.accuracy"] == pytest.approx(truth, abs=1e-12)
    assert settled.metrics["error.cbpe"] == pytest.approx(shifted.estimates.cbpe - truth,
                                                          abs=1e-12)
    assert settled.metrics["error.cbpe_prior"] == pytest.approx(
        shifted.estimates.prior_corrected - truth, abs=1e-12)
    assert settled.metrics["error.priors_tv"] < 0.1
    assert settled.tags[records.LABELS_TAG] == "arrived"
    # the candidate meets the labels: the batch is a pure label shift (classes 0-2 of the
    # same classifier's outputs), so moving to the new priors beats the champion's NLL
    assert settled.metrics["candidate.tpcr"] == 0.0
    assert settled.metrics["candidate.nll"] < settled.metrics["candidate.champion_nll"]
    assert settled.tags[records.PRIOR_SHIFT_VERDICT_TAG].startswith("better than the ")
    assert client.get_run(steady.run_id).data.tags[records.LABELS_TAG] == "pending"

    # -------- the command: exit 3 on an alert with the summary, 0 without
    capsys.readouterr()
    assert main(["monitor", "--data", str(batches / "b-shifted.parquet"), "--model-name", "m",
                 "--emit-event"]) == label_free_cli.ALERT_STATUS
    out = capsys.readouterr().out
    assert "alert: ks drift: p = " in out and "; chi2 drift: p = " in out
    assert "estimated accuracy: CBPE " in out
    assert main(["monitor", "--data", str(batches / "a-steady.npz"), "--model-name", "m",
                 "--max-prior-shift", "0.5"]) == 0
    assert "alert: none" in capsys.readouterr().out
    assert len(_runs(client)) == 4


def test_parser_defaults_are_the_modules():
    assert label_free_cli.DEFAULT_ALPHA == records.DEFAULT_ALPHA
    assert label_free_cli.DEFAULT_MAX_ACCURACY_DROP == records.DEFAULT_MAX_ACCURACY_DROP
    assert label_free_cli.DEFAULT_MAX_PRIOR_SHIFT == records.DEFAULT_MAX_PRIOR_SHIFT
    assert label_free_cli.DEFAULT_MONITOR_WINDOW == traffic_monitor.DEFAULT_WINDOW_ROWS
    assert label_free_cli.MIN_MONITOR_WINDOW == traffic_monitor.MIN_ROWS


def test_scores_digest_is_the_same_for_npz_and_parquet_with_or_without_labels(tmp_path, digits):
    scores = digits.scores[:20]
    np.savez(tmp_path / "a.npz", logits=scores)
    data.save_npz(tmp_path / "b.npz", scores, digits.labels[:20], "logits")
    # an id column and one named like an output of `predict`: both ignored here
    pq.write_table(pa.table({"logits": list(scores), "id": np.arange(20),
                             "label": np.zeros(20)}), tmp_path / "c.parquet")
    read = [records.read_batch(tmp_path / name, 10, "logits")
            for name in ("a.npz", "b.npz", "c.parquet")]
    assert len({b.scores_sha256 for b in read}) == 1 and len({b.sha256 for b in read}) == 3
    assert read[0].labels is None and np.array_equal(read[1].labels, digits.labels[:20])
    assert records.scores_digest(scores[:19]) != read[0].scores_sha256
    pq.write_table(pa.table({"logits": list(scores[:, :9])}), tmp_path / "d.parquet")
    with pytest.raises(ValueError, match="d.parquet: logits has 9 classes; the model expects 10"):
        records.read_batch(tmp_path / "d.parquet", 10, "logits")


def test_binary_votes_in_one_score_column(store, tmp_path):
    """A binary k-NN's float32 vote shares (exact 0 and 1, rows a float32 rounding off 1),
    monitored without labels as the one positive-class column a pipeline writes: read as
    two columns, estimated, logged. (Ties at the top: the unit properties.)"""
    import corpus
    from mlflow import MlflowClient

    e = corpus.entry("breast_cancer-knn-probs-float32")
    assert e.has("exact_zero", "exact_one", "off_simplex", "binary")
    np.savez(tmp_path / "cal.npz", **e.npz_arrays("cal"))
    np.savez(tmp_path / "eval.npz", **e.npz_arrays("eval"))
    fitted = recalibrate(data=str(tmp_path / "cal.npz"), eval_data=str(tmp_path / "eval.npz"),
                         calibrator="ts", model_name="knn")
    assert fitted.decision.promote, fitted.decision.reason
    np.savez(tmp_path / "one-column.npz", probs=e.eval_scores[:, 1:2])
    result = monitor_label_free(data=str(tmp_path / "one-column.npz"), model_name="knn")
    (report,) = result.reports
    assert report.n == len(e.eval_labels) and not report.alert  # its own reference split
    assert report.estimates.priors.sum() == pytest.approx(1.0)
    # exact 0/1 votes and float32 rows: on its own reference the label shift is not rejected
    assert report.estimates.label_shift_gap <= 1e-9 < report.estimates.label_shift_tolerance
    assert report.estimates.prior_method == "reweighted"
    # the batch is the reference split itself: DoC returns its accuracy exactly
    accuracy = float(np.mean(e.eval_probs.argmax(1) == e.eval_labels))
    assert report.estimates.doc == pytest.approx(accuracy, abs=1e-6)
    assert result.reference_accuracy == pytest.approx(accuracy, abs=1e-12)
    logged = MlflowClient().get_run(report.run_id).data
    assert logged.tags["data.shape"] == f"{report.n}x2"
    assert logged.metrics["drift.chi2.p_value"] == pytest.approx(1.0)
