"""The ``cord-ops`` console script in subprocesses: the no-argument demo on the embedded
default store, predict from the registry, the error exit, and where the default store is."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from cord_ops import data
from flows import pyfunc_model
from flows.cli.main import main
from flows.store import tracking


def test_embedded_default_store_is_under_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    assert tracking.tracking_uri() == f"sqlite:///{tmp_path.resolve()}/mlruns/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5999")
    assert tracking.tracking_uri() == "http://127.0.0.1:5999"


@pytest.mark.slow
def test_demo_registers_and_predict_serves_the_champion(tmp_path, cli_env, cord_ops_command,
                                                         mlflow_template_db, monkeypatch):
    from mlflow import MlflowClient

    env = {**cli_env}
    env.pop("MLFLOW_TRACKING_URI", None)  # the embedded default: ./mlruns/mlflow.db
    (tmp_path / "mlruns").mkdir()
    shutil.copyfile(mlflow_template_db, tmp_path / "mlruns" / "mlflow.db")  # skip migrations

    template = (tmp_path / "mlruns" / "mlflow.db", tmp_path / "mlruns")  # made by the test
    # under the usual umask 022: what cord-ops creates is owner-only all the same
    demo = subprocess.run([*cord_ops_command, "demo"], cwd=tmp_path, env=env, umask=0o022,
                          capture_output=True, text=True, timeout=300)
    assert demo.returncode == 0, demo.stderr[-3000:]
    created = [p for p in (tmp_path / "mlruns").rglob("*") if p not in template]
    assert any(p.name == "evaluation.npz" for p in created)  # the pinned reference split
    assert any(p.suffix == ".onnx" for p in created)
    assert [(str(p), oct(p.stat().st_mode)) for p in created
            if p.stat().st_mode & 0o077] == []
    for row in ("uncal", "base", "cord", "eta* = ", "cord-ops-demo@champion", "cord-ops ui"):
        assert row in demo.stdout
    client = MlflowClient(f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    champion = client.get_model_version_by_alias("cord-ops-demo", "champion")
    cord_nll = client.get_run(champion.run_id).data.metrics["cord.nll"]
    assert f"{cord_nll:.5f}" in demo.stdout

    batch = data.load_npz(tmp_path / "mlruns" / "demo" / "digits_seed0.npz")
    predict = subprocess.run(
        [*cord_ops_command, "predict", "--model", "models:/cord-ops-demo@champion",
         "--input", str(batch.path), "--output", "out.npz", "--batch-size", "100"],
        cwd=tmp_path, env=env, umask=0o022, capture_output=True, text=True, timeout=300)
    assert predict.returncode == 0, predict.stderr[-3000:]
    assert (tmp_path / "out.npz").stat().st_mode & 0o777 == 0o600
    with np.load(tmp_path / "out.npz", allow_pickle=False) as out:
        repaired, label = out["repaired"], out["label"]
    assert repaired.shape == (batch.n, batch.n_classes)
    assert np.array_equal(label, np.argmax(batch.scores, axis=1))
    assert np.array_equal(np.argmax(repaired, axis=1), label)

    # The same graph from a local file (in-process: same parser, no second interpreter).
    import mlflow.artifacts

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    local = Path(mlflow.artifacts.download_artifacts(
        artifact_uri="models:/cord-ops-demo@champion", dst_path=str(tmp_path / "dl")))
    graph = local / pyfunc_model.ONNX_PATH_IN_MODEL
    assert main(["predict", "--model", str(graph), "--input", str(batch.path),
                 "--output", str(tmp_path / "local.npz"), "--provider", "cpu"]) == 0
    with np.load(tmp_path / "local.npz", allow_pickle=False) as out:
        assert np.array_equal(out["repaired"], repaired)


@pytest.mark.usefixtures("prefect_harness")
def test_bad_data_exits_non_zero_naming_the_cause(mlflow_uri, tmp_path, digits, capsys):
    scores = np.array(digits.scores)
    scores[7] = np.inf
    np.savez(tmp_path / "bad.npz", logits=scores, labels=digits.labels)

    status = main(["recalibrate", "--data", "bad.npz"])  # in-process: same parser and exit

    assert status == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("error: ") and "bad.npz" in last and "row 7" in last
    assert not (tmp_path / "mlruns" / "mlflow.db").exists()  # no store, no run
