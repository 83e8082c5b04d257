"""Importing the project or running its flows changes nothing process-wide: not the
environment, not MLflow's tracking URI or active experiment, not matplotlib's backend.

Two processes can then host flows against different stores, and a library user's own
MLflow and matplotlib settings survive a call into cord-ops.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cord_ops import data

REPO = Path(__file__).resolve().parents[3]

IMPORT_ALL = """
import importlib, json, os, pkgutil, sys
# Third-party libraries first: some edit the environment on import themselves (scikit-learn
# sets KMP_DUPLICATE_LIB_OK), which is theirs to answer for, not ours.
for name in ("numpy", "scipy", "sklearn", "onnx", "onnxruntime", "matplotlib", "mlflow",
             "prefect", "pandas", "dask", "distributed", "prefect_dask"):
    importlib.import_module(name)
import matplotlib, mlflow
before = dict(os.environ)
backend = dict.__getitem__(matplotlib.rcParams, "backend")
uri = mlflow.get_tracking_uri()
for package in ("cord_ops", "onnx_export", "flows"):
    module = importlib.import_module(package)
    for info in pkgutil.walk_packages(module.__path__, package + "."):
        importlib.import_module(info.name)
print(json.dumps({
    "environ": sorted(set(os.environ.items()) ^ set(before.items())),
    "backend": [str(backend), str(dict.__getitem__(matplotlib.rcParams, "backend"))],
    "uri": [uri, mlflow.get_tracking_uri()],
}))
"""


def test_importing_every_module_changes_nothing_process_wide(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    result = subprocess.run([sys.executable, "-c", IMPORT_ALL], capture_output=True,
                            text=True, cwd=tmp_path, env={**env, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["environ"] == []
    assert seen["backend"][0] == seen["backend"][1]
    assert seen["uri"][0] == seen["uri"][1]


def _raw_backend():
    import matplotlib

    # The stored value, without resolving the automatic choice (which would itself set it).
    return dict.__getitem__(matplotlib.rcParams, "backend")


@pytest.mark.usefixtures("prefect_harness")
def test_the_demo_flow_in_process_changes_nothing_process_wide(tmp_path, monkeypatch,
                                                                mlflow_template_db, digits):
    import shutil

    import mlflow

    from flows.recalibrate.flow import recalibrate
    from flows.store import registry

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_ID", raising=False)
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    store = tmp_path / "store"
    store.mkdir()
    shutil.copyfile(mlflow_template_db, store / "mlflow.db")
    uri = f"sqlite:///{store / 'mlflow.db'}"
    path = data.save_npz(tmp_path / "digits.npz", digits.scores, digits.labels, "logits")

    environ, tracking_uri, backend = dict(os.environ), mlflow.get_tracking_uri(), _raw_backend()
    result = recalibrate(data=str(path), model_name="cord-ops-demo", tracking_uri=uri)

    assert result.tracking_uri == uri and result.decision.promote
    assert dict(os.environ) == environ
    assert mlflow.get_tracking_uri() == tracking_uri
    assert _raw_backend() == backend
    # nothing went to a default store (MLflow's sqlite:///mlflow.db or ours under ./mlruns)
    assert not (work / "mlflow.db").exists() and not (work / "mlruns" / "mlflow.db").exists()
    # ... and everything to the explicit one, the model under the run's own experiment
    client = mlflow.MlflowClient(uri)
    run = client.get_run(result.run_id)
    version = client.get_model_version("cord-ops-demo", result.version)
    # the database registry keeps the logged model's id only in the source URI
    assert version.source.startswith("models:/m-")
    model = client.get_logged_model(version.source.removeprefix("models:/"))
    assert model.experiment_id == run.info.experiment_id == result.experiment_id != "0"
    assert model.source_run_id == result.run_id
    assert str(model.status) in ("READY", "LoggedModelStatus.READY")
    served = registry.run_registered_model(client, f"models:/cord-ops-demo/{result.version}",
                                           digits.scores)
    assert served["repaired"].shape == digits.scores.shape
    assert dict(os.environ) == environ and mlflow.get_tracking_uri() == tracking_uri



LOOKUPS = """
import json, os, sys
import mlflow
from mlflow import MlflowClient
from flows.store import tracking

store, pin, env_after_pin = sys.argv[1:4]
if pin:
    mlflow.set_tracking_uri(pin)
if env_after_pin:  # the environment changed after the pin: the pin still wins
    os.environ["MLFLOW_TRACKING_URI"] = env_after_pin
before = [mlflow.get_tracking_uri(), os.environ.get("MLFLOW_TRACKING_URI")]
with tracking.registry_lookups(MlflowClient(store)):
    inside = MlflowClient().tracking_uri  # how MLflow's registry finds the logged model
after = [mlflow.get_tracking_uri(), os.environ.get("MLFLOW_TRACKING_URI")]
os.environ["MLFLOW_TRACKING_URI"] = "sqlite:///later.db"
later = mlflow.get_tracking_uri()  # a pin still answers; without one the environment does
print(json.dumps({"before": before, "inside": inside, "after": after, "later": later}))
"""


@pytest.mark.parametrize(("pin", "env_after_pin"), [
    ("", ""), ("sqlite:///pinned.db", ""), ("sqlite:///pinned.db", "sqlite:///moved.db")])
def test_registry_lookups_point_mlflow_at_the_store_and_put_everything_back(
        tmp_path, pin, env_after_pin):
    store = f"sqlite:///{tmp_path / 'store.db'}"
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    result = subprocess.run([sys.executable, "-c", LOOKUPS, store, pin, env_after_pin],
                            capture_output=True, text=True, cwd=tmp_path,
                            env={**env, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["inside"] == store
    assert seen["after"] == seen["before"]
    assert seen["before"][1] == (env_after_pin or pin or None)
    assert seen["later"] == (pin or "sqlite:///later.db")
