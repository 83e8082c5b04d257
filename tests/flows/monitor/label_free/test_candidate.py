"""The label-free prior-shift candidate registered as a version (``cord-ops monitor --data
BATCH --register-candidate``) against a real MLflow store: the registered graph keeps every
top-1 and is the numpy candidate, ``@champion`` stays, bad input is refused with one line
before anything is written, ``promote`` refuses the unjudged version without
``--allow-label-free``, and labels settling the batch write the verdict on the version."""

from __future__ import annotations

import numpy as np
import pytest

from cord_ops import data
from cord_ops.prior_shift import PriorShiftRepair
from flows.cli.main import main
from flows.monitor.label_free import candidate, records
from flows.promotion import rollout_record
from flows.recalibrate.flow import recalibrate
from flows.store import registry

pytestmark = pytest.mark.usefixtures("prefect_harness")


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_register_candidate_serves_the_moved_graph_and_promotion_waits_for_labels(
        store, tmp_path, digits, capsys):
    from mlflow import MlflowClient

    client = MlflowClient()
    first = recalibrate(data=str(data.save_npz(tmp_path / "d.npz", digits.scores,
                                               digits.labels, "logits")), model_name="m")
    rows = np.flatnonzero(digits.labels <= 2)  # classes 0-2 only: a label shift
    batch = tmp_path / "shifted.npz"
    np.savez(batch, logits=digits.scores[rows])
    labelled = data.save_npz(tmp_path / "shifted-labelled.npz", digits.scores[rows],
                             digits.labels[rows], "logits")

    # -------- bad input: one error line, no run, no version
    capsys.readouterr()
    assert main(["monitor", "--data", str(labelled), "--model-name", "m",
                 "--register-candidate"]) == 1
    assert "--register-candidate: " in _one_error_line(capsys)
    labels_only = tmp_path / "labels.npz"
    np.savez(labels_only, labels=digits.labels[rows], row_id=np.arange(len(rows)))
    assert main(["monitor", "--data", str(batch), "--labels", str(labels_only),
                 "--model-name", "m", "--register-candidate"]) == 1
    assert "--register-candidate: " in _one_error_line(capsys)
    assert client.get_experiment_by_name(records.monitoring_experiment("m")) is None
    assert [str(v.version) for v in client.search_model_versions("name = 'm'")] == [first.version]

    # -------- registered: a new version, label-free, @champion unchanged
    assert main(["monitor", "--data", str(batch), "--model-name", "m",
                 "--register-candidate"]) == 3  # the prior shift is an alert
    out = capsys.readouterr().out
    versions = {str(v.version): v for v in client.search_model_versions("name = 'm'")}
    assert set(versions) == {first.version, str(int(first.version) + 1)}
    created = str(int(first.version) + 1)
    assert f"prior-shift candidate: registered as v{created}" in out
    assert str(registry.champion_version(client, "m").version) == first.version
    mv = versions[created]
    assert mv.tags[registry.LABEL_FREE_TAG] == "true"
    assert mv.tags[candidate.SOURCE_VERSION_TAG] == first.version
    assert mv.tags[registry.REGISTRATION_TAG] == registry.COMPLETE
    assert registry.LABEL_FREE_VERDICT_TAG not in mv.tags
    monitoring = client.get_run(mv.tags[candidate.MONITOR_RUN_TAG]).data.tags
    assert monitoring[candidate.VERSION_TAG] == created
    assert client.get_run(mv.run_id).info.status == "FINISHED"

    # the served graph is the numpy candidate on the batch, and keeps every top-1
    champion_out = registry.run_registered_model(client, f"models:/m/{first.version}",
                                                 digits.scores[rows])
    original = champion_out["original"].astype(np.float64)
    repaired = champion_out["repaired"].astype(np.float64)
    original /= original.sum(1, keepdims=True)
    repaired /= repaired.sum(1, keepdims=True)
    got = registry.run_registered_model(client, f"models:/m/{created}", digits.scores[rows])
    assert np.array_equal(got["label"], digits.scores[rows].argmax(1))
    assert np.array_equal(got["repaired"].argmax(1), digits.scores[rows].argmax(1))
    run = client.get_run(mv.tags[candidate.MONITOR_RUN_TAG])
    priors = np.array([run.data.metrics[f"prior.estimated.{k}"] for k in range(10)])
    source = np.array([run.data.metrics[f"prior.reference.{k}"] for k in range(10)])
    expected = PriorShiftRepair().fit(original, repaired, source / source.sum(),
                                      priors / priors.sum()).transform(original, repaired)
    assert np.abs(got["repaired"] - expected).max() < 1e-4
    # moved toward the batch's classes: more mass on 0-2 than the champion gives
    assert got["repaired"][:, :3].sum(1).mean() > repaired[:, :3].sum(1).mean() + 0.01

    # -------- promote: refused while no labels judged it; the override promotes
    assert main(["promote", "--model-name", "m", "--version", created,
                 "--reason", "priors moved"]) == 1
    line = _one_error_line(capsys)
    assert "label-free" in line and "--allow-label-free" in line
    assert str(registry.champion_version(client, "m").version) == first.version

    # -------- labels arrive: the verdict is written on the version too, and said
    capsys.readouterr()
    assert main(["monitor", "--data", str(labelled), "--model-name", "m",
                 "--no-recalibrate"]) == 0
    out = capsys.readouterr().out
    (said,) = [line.strip() for line in out.splitlines() if "prior-shift candidate:" in line]
    judged = client.get_model_version("m", created).tags
    assert said == f"prior-shift candidate: {judged[registry.LABEL_FREE_VERDICT_TAG]}"
    # status tells what the registry's tags tell: the labels' verdict stands
    assert main(["status", "--model-name", "m"]) == 0
    (row,) = [line for line in capsys.readouterr().out.splitlines()
              if line.startswith(f"v{created} ")]
    assert row.split()[3:5] == ["labels:", "better"], row
    assert f"labels: {judged[registry.LABEL_FREE_VERDICT_TAG]} | gate: label-free: " in row
    assert judged[registry.LABEL_FREE_VERDICT_TAG].startswith("better than the champion")
    assert f"registered as v{created}" in judged[registry.LABEL_FREE_VERDICT_TAG]
    assert float(judged["cord.label_free.candidate.tpcr"]) == 0.0
    # judged: promote no longer needs the override
    capsys.readouterr()
    assert main(["promote", "--model-name", "m", "--version", created,
                 "--reason", "labels agree"]) == 0
    assert str(registry.champion_version(client, "m").version) == created


def test_allow_label_free_promotes_an_unjudged_candidate(store, tmp_path, digits, capsys,
                                                         monkeypatch):
    """``--allow-label-free`` on promote, rollout start (kept for the rollout's promotion)
    and rollback; each refuses the unjudged version without it. A registration failing
    after its version exists leaves no version and a FAILED run naming the error."""
    from mlflow import MlflowClient

    from flows.promotion.rollout_steps import Budget, Plan

    client = MlflowClient()
    first = recalibrate(data=str(data.save_npz(tmp_path / "d.npz", digits.scores,
                                               digits.labels, "logits")), model_name="m")
    batch = tmp_path / "shifted.npz"
    np.savez(batch, logits=digits.scores[digits.labels <= 2])
    assert main(["monitor", "--data", str(batch), "--model-name", "m",
                 "--register-candidate"]) == 3
    created = str(int(first.version) + 1)
    capsys.readouterr()

    # -------- a registration that fails once its version exists withdraws that version
    def fails(*args, **kwargs):
        raise RuntimeError("injected: the store went away before complete")

    with monkeypatch.context() as patch:
        patch.setattr(registry, "complete_version", fails)
        assert main(["monitor", "--data", str(batch), "--model-name", "m",
                     "--register-candidate"]) == 1
    # MLflow's own INFO lines (logging the model) come before it: one error line, last.
    err = capsys.readouterr().err.strip().splitlines()
    assert [line for line in err if line.startswith("error: ")] == [err[-1]]
    assert "injected: the store went away" in err[-1]
    assert sorted(str(v.version) for v in client.search_model_versions("name = 'm'")) == \
        [first.version, created]
    failed = client.search_runs(
        [client.get_experiment_by_name("m").experiment_id],
        "tags.`cord.kind` = 'prior-shift-candidate' and attributes.status = 'FAILED'")
    assert len(failed) == 1
    assert "injected: the store went away" in failed[0].data.tags[registry.ERROR_TAG]
    assert str(registry.champion_version(client, "m").version) == first.version

    # -------- a rollout record without the override (written before the field existed,
    # or the version became label-free after start): its promotion is refused
    uri = client.tracking_uri
    stale = rollout_record.new_record("m", created, first.version,
                                      Plan.build("canary", (0.5,), 1, 0.0), Budget(), "test",
                                      "test")
    del stale["label_free_override"]
    rollout_record.write(client, "m", stale)
    ended = rollout_record.transition(client, uri, "m", stale["id"], stale["revision"], "promote",
                                      "within budget", "test")
    assert ended["state"] == rollout_record.ROLLED_BACK
    assert "promotion refused" in ended["outcome"] and "label-free" in ended["outcome"]
    assert str(registry.champion_version(client, "m").version) == first.version

    # -------- a rollout of the unjudged candidate: refused without the override
    assert main(["rollout", "start", "--model-name", "m", "--version", created,
                 "--mode", "canary", "--reason", "priors moved"]) == 1
    line = _one_error_line(capsys)
    assert f"cannot roll out v{created}" in line and "--allow-label-free" in line
    assert rollout_record.read(client, "m")["id"] == stale["id"]  # nothing new written
    assert main(["rollout", "start", "--model-name", "m", "--version", created,
                 "--mode", "canary", "--reason", "priors moved", "--allow-label-free"]) == 0
    record = rollout_record.read(client, "m")
    assert record["label_free_override"] is True and record["state"] == rollout_record.ACTIVE
    # the servers' promotion at the end applies the override the operator gave at start
    done = rollout_record.transition(client, uri, "m", record["id"], record["revision"], "promote",
                                     "every step within budget", "test")
    assert done["state"] == rollout_record.PROMOTED, done["outcome"]
    assert str(registry.champion_version(client, "m").version) == created

    # -------- rollback to an unjudged candidate: refused without the override
    capsys.readouterr()
    assert main(["promote", "--model-name", "m", "--version", first.version,
                 "--reason", "back to the labelled fit"]) == 0
    assert main(["rollback", "--model-name", "m"]) == 1
    line = _one_error_line(capsys)
    assert f"cannot roll back to v{created}" in line and "--allow-label-free" in line
    assert str(registry.champion_version(client, "m").version) == first.version
    assert main(["rollback", "--model-name", "m", "--allow-label-free"]) == 0
    assert str(registry.champion_version(client, "m").version) == created

