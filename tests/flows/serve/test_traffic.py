"""``cord-ops serve`` watching what it answers without labels: a real server process over a
real MLflow store; its window's estimates in ``/monitor`` and ``/metrics``, the raw inputs
never kept, and a flush to MLflow as a label-free monitoring run."""

from __future__ import annotations

import stat
from pathlib import Path

import httpx
import numpy as np
import pytest
from servers import free_port, running, wait_until_ready

from flows.monitor.label_free import records

pytestmark = pytest.mark.slow


def test_serve_monitors_its_traffic_and_flushes_a_label_free_run(
        store, prefect_harness, digits_file, digits, tmp_path, cord_ops_command):
    from mlflow import MlflowClient

    from flows.recalibrate.flow import recalibrate

    first = recalibrate(data=str(digits_file), model_name="watched")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "serve.log"
    command = [*cord_ops_command, "serve", "--model-name", "watched", "--port", str(port),
               "--monitor-window", "300"]
    with running(command, log) as server, httpx.Client(timeout=30.0) as client:
        wait_until_ready(f"{url}/health", server, log, timeout=60)
        assert client.get(f"{url}/monitor").json()["rows"] == 0
        # flushing writes to the store: it takes the token serve made, owner-only in the
        # store's state folder, and never printed
        token_file = Path(store.removeprefix("sqlite:///")).parent / "prefect" / \
            f"serve-{port}.token"
        token = token_file.read_text()
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        assert token not in log.read_text() and str(token_file) in log.read_text()
        assert client.post(f"{url}/monitor/flush", json={}).status_code == 401
        auth = {"authorization": f"Bearer {token}"}
        assert client.post(f"{url}/monitor/flush", json={},
                           headers=auth).status_code == 409  # nothing yet

        # steady traffic: 300 random rows in requests of 100
        rng = np.random.default_rng(0)
        rows = rng.choice(digits.n, size=300, replace=False)
        steady = digits.scores[rows]
        for block in np.split(steady, 3):
            assert client.post(f"{url}/invocations",
                               json={"inputs": block.tolist()}).status_code == 200
        quiet = client.get(f"{url}/monitor").json()
        assert quiet["status"] == "ok" and quiet["rows"] == 300 and quiet["version"] == "1"
        assert not quiet["alert"], quiet["alerts"]
        accuracy = float(np.mean(steady.argmax(1) == digits.labels[rows]))
        assert abs(quiet["estimates"]["cbpe"] - accuracy) < 0.05

        # then only classes 0-2: the window rolls over to them and alarms
        shifted = digits.scores[digits.labels <= 2][:300]
        assert client.post(f"{url}/invocations",
                           json={"inputs": shifted.tolist()}).status_code == 200
        loud = client.get(f"{url}/monitor").json()
        assert loud["rows"] == 300 and loud["alert"]
        assert sum(loud["priors"]["estimated"][:3]) > 0.9
        # fewer than MIN_CLASS_ROWS reference rows per digit: the confidence route
        assert loud["priors"]["cbpe_prior_route"] == "confidence"
        assert loud["priors"]["label_shift_gap"] <= loud["priors"]["label_shift_tolerance"]
        assert loud["drift"]["chi2"]["p_value"] < 0.01
        gauges = client.get(f"{url}/metrics").text
        assert "cord_serve_monitor_alert 1.0" in gauges
        assert 'cord_serve_monitor_estimated_accuracy{estimate="cbpe"}' in gauges
        assert 'cord_serve_monitor_drift_p_value{test="ks"}' in gauges
        assert "cord_serve_monitor_rows 300.0" in gauges

        flushed = client.post(f"{url}/monitor/flush", json={}, headers=auth).json()
    assert not token_file.exists()  # a stopped server's token opens nothing
    run = MlflowClient().get_run(flushed["run_id"])
    assert run.data.tags["cord.kind"] == records.KIND
    assert run.data.tags["data.path"] == "serve:watched@1"
    assert run.data.tags["cord.champion_version"] == first.version
    assert run.data.tags[records.ALERT_TAG] == "true"
    assert run.data.metrics["batch.n"] == 300
    assert run.data.metrics["estimate.cbpe"] == pytest.approx(loud["estimates"]["cbpe"])
    assert run.info.status == "FINISHED"
