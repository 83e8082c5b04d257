"""The recalibration flow end to end on the embedded sqlite store, under the session's
Prefect server: what it logs, what it registers, the champion gate, and its failure paths
(bad data, a failing task, a kill -9 in the middle of registration)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cord_ops import CORD, data, metrics
from cord_ops.calibrators import calibrator_from_dict
from flows.promotion.champion import HEALTH_TAG, ChampionUnhealthyError
from flows.recalibrate.flow import RecalibrationError, recalibrate
from flows.store import registry

pytestmark = pytest.mark.usefixtures("prefect_harness")

SPEC_PARAMS = {"calibrator", "n_classes", "n_calibration", "n_evaluation", "seed",
               "input_kind", "eps_num", "delta_stab", "eta_star"}
SPEC_METRICS = ({"eta_star", "base.c_plus", "base.c_minus", "base.c_zero",
                 "onnx.max_abs_diff", "onnx.argmax_agreement"}
                | {f"{r}.{m}" for r in ("uncal", "base", "cord")
                   for m in ("ece", "ece_em", "smece", "nll", "brier", "accuracy", "tpcr")})
ARTIFACTS = {"plots/reliability_uncal.png", "plots/reliability_base.png",
             "plots/reliability_cord.png", "report/metrics.md", "report/metrics.json",
             "state/calibrator.json", "state/cord.json"}


def _client():
    from mlflow import MlflowClient

    return MlflowClient()


def _artifact_paths(client, run_id, path=None) -> set[str]:
    found = set()
    for item in client.list_artifacts(run_id, path):
        found |= _artifact_paths(client, run_id, item.path) if item.is_dir else {item.path}
    return found


def _versions(client, name) -> list[str]:
    return sorted(str(mv.version) for mv in client.search_model_versions(f"name = '{name}'"))


def _champion(client, name):
    held = registry.champion_version(client, name)
    return held and str(held.version)


def test_flow_logs_the_contract_registers_and_serves(store, digits_file, digits):
    import mlflow.pyfunc

    result = recalibrate(data=digits_file, model_name="m")  # a Path is accepted too

    client = _client()
    run = client.get_run(result.run_id)
    params, logged = run.data.params, run.data.metrics
    assert run.info.status == "FINISHED"
    assert set(params) == SPEC_PARAMS
    assert SPEC_METRICS <= set(logged)
    cal_rows, eval_rows = data.split_indices(digits.n, 0)
    assert (params["n_classes"], params["n_calibration"], params["n_evaluation"]) == (
        "10", str(cal_rows.size), str(eval_rows.size))
    assert float(params["eta_star"]) == logged["eta_star"] == result.eta_star
    assert logged["cord.tpcr"] == 0.0 and logged["cord.accuracy"] == logged["uncal.accuracy"]
    assert logged["onnx.argmax_agreement"] == 1.0 and logged["onnx.max_abs_diff"] <= 1e-5
    assert run.data.tags["data.sha256"] == hashlib.sha256(digits_file.read_bytes()).hexdigest()
    assert run.data.tags["data.shape"] == f"{digits.n}x10"

    assert ARTIFACTS <= _artifact_paths(client, result.run_id)
    local = Path(client.download_artifacts(result.run_id, ""))
    for report in ("uncal", "base", "cord"):
        assert (local / f"plots/reliability_{report}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = json.loads((local / "report/metrics.json").read_text())
    assert table["reports"]["cord"]["nll"] == logged["cord.nll"]
    assert "| cord |" in (local / "report/metrics.md").read_text()

    # The logged state alone reproduces what the registered graph serves (to the float32
    # graph's rounding), and the logged cord.nll is the served graph's own figure.
    calibrator = calibrator_from_dict(json.loads((local / "state/calibrator.json").read_text()))
    repair = CORD.from_dict(json.loads((local / "state/cord.json").read_text()))
    evaluation = data.split(data.load_npz(digits_file), 0, 0.5)[1]
    expected = repair.transform(evaluation.probabilities(),
                                calibrator.predict_proba(evaluation.scores))
    assert metrics.nll(expected, evaluation.labels) == pytest.approx(logged["cord.nll"], rel=1e-6)
    served_repaired = registry.run_registered_model(client, "models:/m/1", evaluation.scores)[
        "repaired"]
    assert metrics.nll(served_repaired.astype(np.float64), evaluation.labels) == \
        logged["cord.nll"]

    version = client.get_model_version_by_alias("m", registry.CHAMPION)
    assert (str(version.version), version.run_id) == ("1", result.run_id)
    assert version.tags[registry.DECISION_TAG] == "promoted"
    assert version.tags[registry.REGISTRATION_TAG] == registry.COMPLETE
    assert version.tags[registry.CHAMPION_NLL_TAG] == "None"

    served = mlflow.pyfunc.load_model("models:/m@champion")
    # The pyfunc flavour validates its own input (no MLflow input schema), and the graph
    # stays available to onnxruntime users as the onnx flavour.
    assert served.metadata.get_input_schema() is None
    assert served.metadata.metadata["cord.n_classes"] == "10"
    assert {"python_function", "onnx"} <= set(served.metadata.flavors)
    assert served.metadata.saved_input_example_info is not None
    out = served.predict({"scores": evaluation.scores.astype(np.float32)})
    assert np.max(np.abs(out["repaired"] - expected)) <= 1e-5
    assert np.array_equal(np.argmax(out["repaired"], axis=1),
                          np.argmax(evaluation.scores, axis=1))

    # The schedule's next run on the unchanged file: recorded as skipped, nothing fitted,
    # no new version, @champion where it was.
    again = recalibrate(data=str(digits_file), model_name="m")
    assert again.version is None and again.decision is None
    assert again.skipped.startswith("unchanged: data sha256 ") and "champion v1's" in again.skipped
    skipped = client.get_run(again.run_id)
    assert skipped.info.status == "FINISHED" and skipped.data.tags["cord.skipped"] == again.skipped
    assert "cord.nll" not in skipped.data.metrics
    assert _versions(client, "m") == ["1"] and _champion(client, "m") == "1"


def test_gate_keeps_the_champion_against_a_loser_and_a_failed_run(store, tmp_path, digits):
    cal_rows, eval_rows = data.split_indices(digits.n, 0)
    cal_labels = digits.labels[cal_rows]
    good = data.save_npz(tmp_path / "cal.npz", digits.scores[cal_rows], cal_labels, "logits")
    held_out = data.save_npz(tmp_path / "eval.npz", digits.scores[eval_rows],
                             digits.labels[eval_rows], "logits")
    # A calibrator fitted to shuffled labels is a real, much worse model of the same split.
    shuffled = data.save_npz(tmp_path / "shuffled.npz", digits.scores[cal_rows],
                             np.random.default_rng(1).permutation(cal_labels), "logits")
    client = _client()

    first = recalibrate(data=str(good), eval_data=str(held_out), model_name="m")
    assert first.decision.promote and _champion(client, "m") == "1"

    loser = recalibrate(data=str(shuffled), eval_data=str(held_out), model_name="m")
    assert not loser.decision.promote
    assert _versions(client, "m") == ["1", "2"] and _champion(client, "m") == "1"
    tags = client.get_model_version("m", "2").tags
    assert tags[registry.DECISION_TAG] == "rejected"
    assert float(tags[registry.CANDIDATE_NLL_TAG]) > float(tags[registry.CHAMPION_NLL_TAG])
    assert float(tags[registry.CHAMPION_NLL_TAG]) == pytest.approx(
        client.get_run(first.run_id).data.metrics["cord.nll"], rel=1e-4)

    # The same classifier's outputs as probabilities: the logits champion cannot be scored
    # on them, which is a reason to keep it, never a free win for the candidate.
    as_probs = {name: data.save_npz(tmp_path / f"{name}_probs.npz", d.probabilities(),
                                    d.labels, "probs")
                for name, d in (("cal", data.load_npz(good)), ("eval", data.load_npz(held_out)))}
    with pytest.raises(ChampionUnhealthyError, match="champion v1 .* reads logits"):
        recalibrate(data=str(as_probs["cal"]), eval_data=str(as_probs["eval"]), model_name="m")
    assert client.get_model_version("m", "3").tags[registry.DECISION_TAG] == "rejected"
    assert "reads logits" in client.get_registered_model("m").tags[HEALTH_TAG]
    assert _champion(client, "m") == "1"

    # A task that raises: the experiment's artifact folder is blocked by a plain file.
    experiment = client.get_experiment_by_name("m")
    folder = Path(experiment.artifact_location.removeprefix("file://"))
    for item in sorted(folder.rglob("*"), reverse=True):
        item.rmdir() if item.is_dir() else item.unlink()
    folder.rmdir()
    folder.write_text("not a folder")
    with pytest.raises(RecalibrationError, match="log_report_artifacts"):  # seed 1: not
        # the champion's options, so it is not skipped as unchanged
        recalibrate(data=str(good), eval_data=str(held_out), model_name="m", seed=1)
    failed = client.search_runs([experiment.experiment_id], order_by=["start_time DESC"])[0]
    assert failed.info.status == "FAILED"
    assert "cord.error" in failed.data.tags
    assert _versions(client, "m") == ["1", "2", "3"] and _champion(client, "m") == "1"


def test_bad_data_fails_before_any_run_exists(store, tmp_path, digits):
    scores = np.array(digits.scores)
    scores[5, 3] = np.nan
    bad = tmp_path / "bad.npz"
    np.savez(bad, logits=scores, labels=digits.labels)

    with pytest.raises(RecalibrationError, match=r"load_dataset.*bad\.npz.*row 5"):
        recalibrate(data=str(bad), model_name="m")
    with pytest.raises(RecalibrationError, match=r"missing\.npz: no such file"):
        recalibrate(data=str(tmp_path / "missing.npz"), model_name="m")
    good = data.save_npz(tmp_path / "good.npz", digits.scores, digits.labels, "logits")
    with pytest.raises(RecalibrationError, match="check_options.*no-such-calibrator"):
        recalibrate(data=str(good), calibrator="no-such-calibrator", model_name="m")
    with pytest.raises(RecalibrationError, match="check_options.*seed"):
        recalibrate(data=str(good), seed=-1, model_name="m")

    client = _client()
    assert client.get_experiment_by_name("m") is None
    assert client.search_runs([e.experiment_id for e in client.search_experiments()]) == []


CRASH_MID_REGISTRATION = """
import os, signal, sys
from flows.store import registry
from flows.recalibrate.flow import recalibrate

def killed(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)

registry.record_decision = killed  # the version exists; the gate never finishes
recalibrate(data=sys.argv[1], model_name="m")
"""


def test_rerun_after_kill_9_leaves_no_orphaned_version(store, digits_file, tmp_path, cli_env):
    crashed = subprocess.run([sys.executable, "-c", CRASH_MID_REGISTRATION, str(digits_file)],
                             env=cli_env, cwd=tmp_path, capture_output=True, timeout=120)
    assert crashed.returncode == -9, crashed.stderr.decode()[-2000:]
    client = _client()
    (orphan,) = client.search_model_versions("name = 'm'")
    assert orphan.tags[registry.REGISTRATION_TAG] == registry.PENDING
    assert client.get_run(orphan.run_id).info.status == "RUNNING"

    rerun = recalibrate(data=str(digits_file), model_name="m")

    assert _versions(client, "m") == [rerun.version] and _champion(client, "m") == rerun.version
    assert client.get_run(orphan.run_id).info.status == "FAILED"
