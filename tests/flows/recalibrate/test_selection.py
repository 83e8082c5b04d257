"""``--calibrator auto`` through the flow and the real CLI: the family chosen by
cross-validation on the calibration split and recorded (metrics, table artifact, tags,
summary, ``status``), identity served when the chosen family does harm on the evaluation
split, an unchanged ``auto`` run skipped, and ``auto`` refused on shards in one line."""

from __future__ import annotations

import json
import subprocess

import corpus
import numpy as np
import pytest

from flows.cli.main import main
from flows.recalibrate.flow import recalibrate

pytestmark = pytest.mark.usefixtures("prefect_harness")


def test_auto_falls_back_to_identity_when_its_choice_does_harm_and_skips_when_unchanged(
        store, tmp_path):
    from mlflow import MlflowClient

    # Calibration split: a temperature-distorted copy (TS wins its CV by far); evaluation
    # split: the same classifier undistorted, where TS's shrunken logits do harm.
    z, y = corpus.calibrated_logits(4, 1500, seed=0, scale=3.0)
    np.savez(tmp_path / "cal.npz", logits=z, labels=y)
    z, y = corpus.calibrated_logits(4, 1500, seed=1, scale=1.0)
    np.savez(tmp_path / "eval.npz", logits=z, labels=y)
    args = {"data": str(tmp_path / "cal.npz"), "eval_data": str(tmp_path / "eval.npz"),
            "model_name": "fallback", "calibrator": "auto"}
    result = recalibrate(**args)
    selection = result.choice.selection
    assert selection.chosen != "identity"
    assert selection.candidate(selection.chosen).nll < selection.candidate("identity").nll
    assert result.choice.family == "identity"
    assert result.choice.how.startswith(f"auto: chose {selection.chosen}, which does harm")
    assert result.decision.promote and not result.decision.harms
    client = MlflowClient(store)
    version = client.get_model_version("fallback", result.version)
    assert version.tags["cord.calibrator"] == "identity"
    assert version.tags["cord.select.how"] == result.choice.how
    run = client.get_run(result.run_id)
    assert run.data.params["calibrator"] == "auto"
    assert run.data.tags["cord.select.family"] == "identity"
    assert set(run.data.metrics) >= {f"select.{name}.{figure}" for name in ("identity", "ts")
                                     for figure in ("nll", "nll_se", "ece", "tpcr",
                                                    "fit_seconds")}
    assert run.data.metrics["select.ts.nll"] == selection.candidate("ts").nll
    with open(client.download_artifacts(result.run_id, "select/selection.json",
                                        str(tmp_path))) as f:
        record = json.load(f)
    assert record["family"] == "identity" and record["chosen"] == selection.chosen
    # the served model is the classifier's own probabilities
    state = json.loads(open(client.download_artifacts(
        result.run_id, "state/calibrator.json", str(tmp_path))).read())
    assert state["name"] == "identity" and state["params"] == {}

    again = recalibrate(**args)
    assert again.skipped is not None and again.skipped.startswith("unchanged")


def test_auto_is_refused_on_shards_in_one_line(tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = tmp_path / "shards"
    folder.mkdir()
    z, y = corpus.calibrated_logits(3, 400, seed=0, scale=1.0)
    pq.write_table(pa.table({"logits": list(z), "labels": y}), folder / "part-0.parquet")
    assert main(["recalibrate", "--data", str(folder), "--calibrator", "auto"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [err[0]] and err[0].startswith("error: --calibrator auto (the default): not "
                                                 "supported on shards")


@pytest.mark.slow
def test_real_cli_auto_on_a_one_column_binary_file_and_probabilities_with_exact_zeros(
        store, cli_env, cord_ops_command, tmp_path, capsys):
    def cli(*args):
        done = subprocess.run([*cord_ops_command, *args], cwd=tmp_path, env=cli_env,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
        return done.stdout

    for name in ("breast_cancer-logreg-logits-float32-1col", "digits-rf-probs-float32"):
        e = corpus.entry(name)
        assert (e.columns == 1) if name.endswith("1col") else e.has("exact_zero")
        np.savez(tmp_path / "cal.npz", **e.npz_arrays("cal"))
        np.savez(tmp_path / "eval.npz", **e.npz_arrays("eval"))
        out = cli("recalibrate", "--data", "cal.npz", "--eval-data", "eval.npz",
                  "--calibrator", "auto", "--model-name", e.model)
        lines = out.splitlines()
        [family] = [line for line in lines if line.startswith("family:   ")]
        chosen = family.split()[1]
        table = lines[lines.index(family) + 2:]
        rows = [line.split() for line in table[:table.index("")] if "skipped:" not in line]
        marked = [row[1] for row in rows if row[0] == "*"]
        assert marked == [chosen]
        nlls = [float(row[-5 if e.n_classes > 2 else -6]) for row in rows]
        assert nlls == sorted(nlls) and len(rows) >= 8
        assert "gate:     v1 promoted" in out
        assert main(["status", "--model-name", e.model]) == 0
        status = capsys.readouterr().out
        assert f"family:   {chosen} (auto: " in status
