"""Safe promotion as an operator meets it, on the real sqlite store with real flows, through
the ``cord-ops`` parser in-process (same parser, same exit codes as the console script):
tiny and single-class files, an all-one-label monitor batch, broken and foreign champions
recovered by ``promote`` and ``rollback``, probabilities fed to a logits model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cord_ops import data, metrics
from flows.cli.main import main
from flows.promotion import champion, operations
from flows.store import reference, registry

pytestmark = pytest.mark.usefixtures("prefect_harness")


def _client():
    from mlflow import MlflowClient

    return MlflowClient()


def _last_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert err, "nothing on stderr"
    return err[-1]


def _champion(client, name="m"):
    held = registry.champion_version(client, name)
    return held and str(held.version)


def _served_nll(version: str, dataset: data.Dataset, name="m") -> float:
    from mlflow import MlflowClient

    outputs = registry.run_registered_model(MlflowClient(), f"models:/{name}/{version}",
                                            dataset.scores)
    return metrics.nll(outputs["repaired"].astype(np.float64), dataset.labels)


def test_small_and_single_class_files_never_reach_champion(store, tmp_path, digits, capsys):
    client = _client()
    # Too little to fit at all: one line, before any run exists.
    tiny = data.save_npz(tmp_path / "tiny.npz", digits.scores[:8], digits.labels[:8], "logits")
    assert main(["recalibrate", "--data", str(tiny), "--model-name", "m"]) == 1
    line = _last_error(capsys)
    assert line.startswith("error: ") and "tiny.npz" in line
    assert "4 calibration and 4 evaluation rows" in line
    assert client.get_experiment_by_name("m") is None

    # Enough to fit, not to trust (the 6-row promotion, a little larger): the
    # version is registered and rejected with the reason, and nothing holds @champion.
    right = np.flatnonzero(np.argmax(digits.scores, axis=1) == digits.labels)[:40]
    small = data.save_npz(tmp_path / "small.npz", digits.scores[right], digits.labels[right],
                          "logits")
    assert main(["recalibrate", "--data", str(small), "--model-name", "m",
                 "--calibrator", "ts"]) == 0
    out = capsys.readouterr().out
    assert "v1 rejected" in out and "not enough evidence" in out
    tags = client.get_model_version("m", "1").tags
    assert tags[registry.DECISION_TAG] == "rejected"
    assert "calibration split has 20 rows (< 100 needed for K=10)" in tags[registry.REASON_TAG]
    assert _champion(client) is None
    # 20 rows the classifier gets all right: temperature scaling runs to its cap, and the
    # operator hears about it in the summary and in the run's tags.
    run = client.get_run(client.get_model_version("m", "1").run_id)
    assert run.data.tags["cord.fit.warning_count"] != "0"
    assert "inverse temperature" in run.data.tags["cord.fit.warnings"]
    assert "warnings: " in out and "inverse temperature" in out

    # A file of one class (true labels, all class 3): even with the size minimums lowered,
    # one class holding every label is not promotable, however low its NLL.
    threes = digits.labels == 3
    single = data.save_npz(tmp_path / "threes.npz", digits.scores[threes],
                           digits.labels[threes], "logits")
    assert main(["recalibrate", "--data", str(single), "--model-name", "m",
                 "--min-calibration", "10", "--min-evaluation", "10"]) == 0
    reason = client.get_model_version("m", "2").tags[registry.REASON_TAG]
    assert "class 3 holds 100.0% of the evaluation labels" in reason
    assert "rows (<" not in reason
    assert float(client.get_model_version("m", "2").tags[registry.CANDIDATE_NLL_TAG]) < 0.1
    assert _champion(client) is None

    # Each version pinned the split it was gated on, findable from its run alone.
    pinned = reference.load_reference_split(client, client.get_model_version("m", "2").run_id)
    assert set(pinned.labels.tolist()) == {3} and pinned.n == int(threes.sum()) - round(
        0.5 * int(threes.sum()))
    (logged,) = client.get_run(client.get_model_version("m", "2").run_id).inputs.dataset_inputs
    assert logged.dataset.digest and "evaluation.npz" in logged.dataset.source


@pytest.mark.slow
def test_all_zero_labels_monitor_batch_leaves_the_champion(store, tmp_path, digits,
                                                           digits_file, capsys):
    client = _client()
    assert main(["recalibrate", "--data", str(digits_file), "--model-name", "m"]) == 0
    assert _champion(client) == "1"

    # The batch of the issue: the classifier's outputs with every label written as 0.
    zeros = data.save_npz(tmp_path / "zeros.npz", digits.scores,
                          np.zeros(digits.n, dtype=np.int64), "logits")
    assert main(["monitor", "--data", str(zeros), "--model-name", "m"]) == 0
    out = capsys.readouterr().out
    assert "drift: " in out and "drift: none" not in out  # it did see drift ...
    assert "v2 rejected" in out  # ... recalibrated on the batch, and the gate said no
    assert _champion(client) == "1"
    tags = client.get_model_version("m", "2").tags
    assert "class 0 holds 100.0% of the evaluation labels" in tags[registry.REASON_TAG]
    assert "far from the champion's reference split" in tags[registry.REASON_TAG]
    assert tags["cord.gate.reference_version"] == "1"
    ref_candidate = float(tags["cord.gate.reference_candidate_nll"])
    ref_champion = float(tags["cord.gate.reference_champion_nll"])
    assert ref_candidate > 2 * ref_champion

    # The correctly labelled data shows why: the model fitted on the zeros is far worse.
    truth = data.load_npz(digits_file)
    assert _served_nll("2", truth) > 2 * _served_nll("1", truth)

    # probs for a logits model: refused with one line naming both, nothing written.
    probs = data.save_npz(tmp_path / "probs.npz", digits.probabilities(), digits.labels,
                          "probs")
    status = main(["predict", "--model", "models:/m@champion", "--input", str(probs),
                   "--output", str(tmp_path / "out.npz"), "--provider", "cpu"])
    line = _last_error(capsys)
    assert status == 1 and "holds probs but the model reads logits" in line
    np.savez(tmp_path / "unnamed.npz", scores=digits.probabilities())
    assert main(["predict", "--model", "models:/m@champion", "--input",
                 str(tmp_path / "unnamed.npz"), "--output", str(tmp_path / "out.npz")]) == 1
    assert "probability vector" in _last_error(capsys)
    assert not (tmp_path / "out.npz").exists()


def _model_folder(client, name: str, version: str) -> Path:
    source = client.get_model_version(name, version).source  # models:/<logged model id>
    model = client.get_logged_model(source.removeprefix("models:/"))
    return Path(model.artifact_location.removeprefix("file://"))


def _register_foreign_onnx(client, name: str, digits) -> str:
    """A real ONNX classifier that is not a cord-ops pipeline (skl2onnx logistic
    regression on the logits), registered as a version of ``name``."""
    import mlflow.onnx
    from skl2onnx import to_onnx
    from sklearn.linear_model import LogisticRegression

    fitted = LogisticRegression(max_iter=200).fit(digits.scores, digits.labels)
    graph = to_onnx(fitted, digits.scores[:1].astype(np.float32), target_opset=17)
    run = client.create_run(client.get_experiment_by_name(name).experiment_id)
    info = mlflow.onnx.log_model(graph, name="model", run_id=run.info.run_id,
                                 pip_requirements=mlflow.onnx.get_default_pip_requirements())
    client.set_terminated(run.info.run_id, "FINISHED")
    mv = client.create_model_version(name, source=info.model_uri, run_id=run.info.run_id,
                                     model_id=info.model_id)
    return str(mv.version)


@pytest.mark.slow
def test_broken_and_foreign_champions_stop_the_flows_until_an_operator_recovers(
        store, tmp_path, digits, digits_file, capsys):
    client = _client()
    args = ["--data", str(digits_file), "--model-name", "m"]
    assert main(["recalibrate", *args]) == 0
    assert main(["recalibrate", *args, "--seed", "1", "--no-promote"]) == 0
    assert _champion(client) == "1"
    assert main(["promote", "--model-name", "m", "--version", "2",
                 "--reason", "seed 1 split"]) == 0
    assert _champion(client) == "2"
    tags = client.get_model_version("m", "2").tags
    assert tags[operations.PROMOTION_REASON_TAG] == "promote: seed 1 split"
    assert "@" in tags[operations.PROMOTED_BY_TAG] and tags[operations.PROMOTED_AT_TAG]

    # The champion's graph is truncated on disk.
    (onnx_file,) = sorted(_model_folder(client, "m", "2").rglob("*.onnx"))
    onnx_file.write_bytes(onnx_file.read_bytes()[:200])
    capsys.readouterr()
    assert main(["recalibrate", *args, "--seed", "2"]) == 1
    line = _last_error(capsys)
    assert line.startswith("error: champion v2 of 'm' cannot be scored")
    assert "candidate v3 registered as rejected" in line
    health = client.get_registered_model("m").tags[champion.HEALTH_TAG]
    assert health.startswith("v2 cannot be scored")
    assert client.get_model_version("m", "3").tags[registry.DECISION_TAG] == "rejected"
    assert main(["monitor", *args]) == 1
    assert _last_error(capsys).startswith("error: champion v2 of 'm' cannot be scored")
    assert main(["promote", "--model-name", "m", "--version", "2", "--reason", "x"]) == 1
    assert "already holds @champion" in _last_error(capsys)

    assert main(["status", "--model-name", "m"]) == 0
    table = capsys.readouterr().out
    assert "champion: v2" in table and "health:   v2 cannot be scored" in table
    assert "history:  v1 -> v2 (promote)" in table
    # The operator's move is the decision that stands; the gate's follows in the reason.
    (row,) = [line for line in table.splitlines() if line.startswith("v2 ")]
    assert row.split()[:4] == ["v2", "champion", "complete", "operator"]
    assert "promote: seed 1 split (by " in row and "| gate: rejected: " in row
    assert "v3      -         complete  rejected" in table

    assert main(["rollback", "--model-name", "m"]) == 0
    logged = client.get_run(client.get_model_version("m", "1").run_id).data.metrics["cord.nll"]
    assert capsys.readouterr().out.strip().splitlines() == [
        "m@champion: v2 -> v1 (rollback)",
        f"NLL:      {logged:.6g} on v1's reference split (the served graph's outputs)"]
    assert _champion(client) == "1"
    assert client.get_registered_model("m").tags[champion.HEALTH_TAG] == champion.HEALTHY
    # Append-only: the rollback is a row, and the next rollback finds v2 (still broken,
    # so it is refused with the reason) instead of "no earlier champion recorded".
    assert [(h["version"], h["how"]) for h in champion.read_history(client, "m")] == [
        ("1", "gate"), ("2", "promote"), ("1", "rollback")]
    assert main(["rollback", "--model-name", "m", "--reason", "try v2 again"]) == 1
    assert _last_error(capsys).startswith("error: cannot roll back to v2: ")

    # A foreign model (a plain ONNX classifier) set as champion by hand.
    foreign = _register_foreign_onnx(client, "m", digits)
    client.set_registered_model_alias("m", registry.CHAMPION, foreign)
    assert main(["recalibrate", *args, "--seed", "3"]) == 1
    assert _last_error(capsys).startswith(f"error: champion v{foreign} of 'm' cannot be scored")
    assert client.get_registered_model("m").tags[champion.HEALTH_TAG].startswith(
        f"v{foreign} cannot be scored")
    # The operator promotes the good version the broken champion kept out.
    assert main(["promote", "--model-name", "m", "--version", "3",
                 "--reason", "rejected only because v2 was broken"]) == 0
    assert _champion(client) == "3"
    assert client.get_registered_model("m").tags[champion.HEALTH_TAG] == champion.HEALTHY
    # Rolling back would return to the foreign model: refused, champion kept.
    assert main(["rollback", "--model-name", "m"]) == 1
    assert f"cannot roll back to v{foreign}: v{foreign} has not finished registration" in (
        _last_error(capsys))
    assert _champion(client) == "3"
    # The next recalibration is gated against a healthy champion again.
    assert main(["recalibrate", *args, "--seed", "4"]) == 0
    assert "could not be scored" not in client.get_model_version("m", "6").tags[
        registry.REASON_TAG]


HOLD_LOCK = """
import sys, time
from pathlib import Path
from flows.store import lock
with lock.registry_lock("file", "m", 5, None, {"run_id": "holder-run"},
                        store_folder=Path(sys.argv[1])):
    print("held", flush=True)
    time.sleep(60)
"""


def test_promote_and_rollback_wait_for_the_registry_lock(store, tmp_path, capsys):
    """A recalibration of the model holds its registry lock (here: another process holding
    it): promote and rollback wait for it and give up with one line naming the holder."""
    import subprocess
    import sys

    from flows.store import tracking

    client = _client()
    client.create_registered_model("m")
    # Versions that pass the checks made before the lock (they exist, finished
    # registration, v1 is not the champion and v2 has an earlier one to roll back to);
    # the checks that need their artifacts come after it.
    run = client.create_run("0")
    for _ in range(2):
        client.create_model_version("m", f"runs:/{run.info.run_id}/model", run.info.run_id,
                                    tags={registry.REGISTRATION_TAG: registry.COMPLETE})
    client.set_registered_model_alias("m", registry.CHAMPION, "2")
    champion.write_history(client, "m", [{"version": "1", "from": None, "how": "gate"},
                                         {"version": "2", "from": "1", "how": "promote"}])
    folder = tracking.local_store_folder(store)
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(folder)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        for command in (["promote", "--version", "1", "--reason", "x"], ["rollback"]):
            assert main([*command, "--model-name", "m", "--lock-timeout", "1"]) == 1
            line = _last_error(capsys)
            assert "registry lock of model 'm' still held by run holder-run" in line
    finally:
        holder.kill()
        holder.wait()
    # Free again: the commands get past the lock to their own checks.
    assert main(["promote", "--model-name", "m", "--version", "1", "--reason", "x",
                 "--lock-timeout", "5"]) == 1
    line = _last_error(capsys)
    assert "still held" not in line and "v1" in line, line
