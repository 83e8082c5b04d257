"""The flow against a real ``mlflow server`` (sqlite backend, proxied artifacts) started on
127.0.0.1 by the test, checked through MlflowClient and stopped by PID."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest

from flows.recalibrate.flow import recalibrate
from flows.store import registry

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_healthy(url: str, process: subprocess.Popen, log, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            log.seek(0)
            pytest.fail(f"mlflow server exited with {process.returncode}:\n{log.read()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    pytest.fail(f"mlflow server at {url} not healthy after {timeout} s")


@pytest.fixture
def mlflow_server(tmp_path, mlflow_template_db, monkeypatch):
    """URL of a fresh ``mlflow server``; MLFLOW_TRACKING_URI points at it for the test."""
    db = tmp_path / "server.db"
    shutil.copyfile(mlflow_template_db, db)  # already migrated: the server starts faster
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    with open(tmp_path / "server.log", "w+") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{db}",
             "--artifacts-destination", str(tmp_path / "artifacts"), "--host", "127.0.0.1",
             "--port", str(port), "--workers", "1"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            # No background job runner: cord-ops needs none, and it halves the start-up.
            env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true",
                 "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
        try:
            _wait_healthy(url, process, log)
            work = tmp_path / "work"
            work.mkdir()
            monkeypatch.chdir(work)
            monkeypatch.setenv("MLFLOW_TRACKING_URI", url)
            yield url
        finally:
            os.killpg(process.pid, signal.SIGTERM)  # the server and its workers, by PID
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def test_flow_against_a_real_tracking_server(mlflow_server, digits_file, digits):
    import mlflow.pyfunc
    from mlflow import MlflowClient

    result = recalibrate(data=str(digits_file), model_name="served")

    assert result.tracking_uri == mlflow_server
    client = MlflowClient(mlflow_server)
    run = client.get_run(result.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.metrics["cord.tpcr"] == 0.0
    assert {a.path for a in client.list_artifacts(result.run_id, "plots")} == {
        f"plots/reliability_{r}.png" for r in ("uncal", "base", "cord")}
    champion = client.get_model_version_by_alias("served", registry.CHAMPION)
    assert (str(champion.version), champion.run_id) == ("1", result.run_id)
    assert champion.tags[registry.DECISION_TAG] == "promoted"
    served = mlflow.pyfunc.load_model("models:/served@champion")
    out = served.predict({"scores": digits.scores.astype(np.float32)})
    assert np.array_equal(out["label"], np.argmax(digits.scores, axis=1))
    assert not os.path.exists("mlruns")  # nothing fell back to the embedded store
