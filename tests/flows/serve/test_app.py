"""``cord-ops serve`` as an operator runs it: a real server process over a real MLflow
store, real HTTP, and the champion moved by real recalibrations while clients keep
sending requests."""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from servers import free_port, running, wait_until_ready

from flows.serve.app import VERSION_HEADER
from flows.store import registry

pytestmark = pytest.mark.slow

MODEL = "served"
POLL = 1.0


def _post(client: httpx.Client, url: str, payload) -> httpx.Response:
    # json.dumps writes NaN as MLflow's Python clients do (httpx's json= refuses it).
    return client.post(f"{url}/invocations", content=json.dumps(payload).encode(),
                       headers={"content-type": "application/json"})


class Traffic:
    """Client threads that keep scoring the same rows and record every answer."""

    def __init__(self, url: str, rows: np.ndarray, threads: int = 4):
        self.url, self.payload = url, {"inputs": rows.tolist()}
        self.answers: list[tuple[int, str | None, str | None, dict | str]] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def _run(self) -> None:
        with httpx.Client(timeout=10.0) as client:
            while not self._stop.is_set():
                try:
                    response = _post(client, self.url, self.payload)
                    body = response.json()
                    self.answers.append((response.status_code,
                                         response.headers.get(VERSION_HEADER),
                                         body.get("model", {}).get("version"), body))
                except Exception as exc:  # a failed request is a result, not a crash
                    self.answers.append((0, None, None, repr(exc)))

    def __enter__(self):
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        for thread in self._threads:
            thread.join(15)


def _expected(version: str, rows: np.ndarray) -> dict[str, np.ndarray]:
    from mlflow import MlflowClient

    return registry.run_registered_model(MlflowClient(), f"models:/{MODEL}/{version}", rows)


def _model_file(client, version: str) -> Path:
    location = client.get_model_version_download_uri(MODEL, version)
    return Path(location.removeprefix("file://")) / "artifacts" / "model.onnx"


def test_serve_follows_the_champion_without_failing_a_request(
        store, prefect_harness, digits_file, digits, tmp_path, cord_ops_command):
    from mlflow import MlflowClient

    from flows.recalibrate.flow import recalibrate

    first = recalibrate(data=str(digits_file), calibrator="vs", model_name=MODEL)
    assert first.decision.promote
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [*cord_ops_command, "serve", "--model-name", MODEL, "--port", str(port),
               "--poll-interval", str(POLL)]
    rows = digits.scores[:300]
    log = tmp_path / "serve.log"
    with running(command, log) as server:
        wait_until_ready(f"{url}/health", server, log, timeout=60)

        # A batch: every row keeps its input's top-1, and the answer names v1.
        with httpx.Client(timeout=10.0) as client:
            response = _post(client, url, {"inputs": rows.tolist()})
            assert response.status_code == 200, response.text
            body = response.json()
            assert response.headers[VERSION_HEADER] == body["model"]["version"] == first.version
            repaired = np.asarray(body["predictions"]["repaired"])
            np.testing.assert_array_equal(body["predictions"]["label"], np.argmax(rows, axis=1))
            np.testing.assert_array_equal(np.argmax(repaired, axis=1), np.argmax(rows, axis=1))
            np.testing.assert_allclose(repaired, _expected(first.version, rows)["repaired"],
                                       rtol=0, atol=1e-6)
            split = _post(client, url, {"dataframe_split": {
                "columns": [f"c{j}" for j in range(rows.shape[1])], "data": rows[:5].tolist()}})
            assert split.status_code == 200, split.text
            np.testing.assert_allclose(split.json()["predictions"]["repaired"], repaired[:5],
                                       rtol=0, atol=1e-7)

            # Bad payloads: 400 and a one-line reason naming the row.
            nan_rows = rows[:4].copy()
            nan_rows[2, 5] = np.nan
            refused = {
                "non_finite": {"inputs": nan_rows.tolist()},
                "wrong_width": {"inputs": rows[:3, :7].tolist()},
                "bad_payload": {"rows": rows[:3].tolist()},
                "bad_shape": {"inputs": [[1.0, 2.0], [3.0]]},
            }
            for reason, payload in refused.items():
                bad = _post(client, url, payload)
                assert bad.status_code == 400, (reason, bad.text)
                assert bad.json()["reason"] == reason
                assert "\n" not in bad.json()["error"]
            assert "row 2" in _post(client, url, refused["non_finite"]).json()["error"]
            garbled = client.post(f"{url}/invocations", content=b'{"inputs": [[1, 2',
                                  headers={"content-type": "application/json"})
            assert garbled.status_code == 400 and garbled.json()["reason"] == "bad_json"

        # A better calibrator takes @champion while four clients keep scoring.
        sample = rows[:8]
        with Traffic(url, sample) as traffic:
            time.sleep(1.0)
            second = recalibrate(data=str(digits_file), calibrator="ts", model_name=MODEL)
            promoted_at = time.monotonic()
            assert second.decision.promote, second.decision.reason
            while time.monotonic() - promoted_at < 2 * POLL + 5:
                if httpx.get(f"{url}/version").json()["version"] == second.version:
                    break
                time.sleep(0.05)
            switched_after = time.monotonic() - promoted_at
            time.sleep(1.0)
        assert switched_after <= 2 * POLL, f"/version moved {switched_after:.2f} s after promotion"

        expected = {v: _expected(v, sample)["repaired"] for v in (first.version, second.version)}
        assert not np.allclose(expected[first.version], expected[second.version], atol=1e-3)
        failed = [a for a in traffic.answers if a[0] != 200]
        assert not failed, failed[:3]
        seen = []
        for _, header, named, body in traffic.answers:
            assert header == named and named in expected
            # Each answer is exactly the named version's output: no batch mixes versions.
            np.testing.assert_allclose(body["predictions"]["repaired"], expected[named],
                                       rtol=0, atol=1e-6)
            seen.append(named)
        assert {first.version, second.version} <= set(seen)

        # A broken new champion (truncated graph) is not swapped in; v2 keeps answering.
        client = MlflowClient()
        third = recalibrate(data=str(digits_file), calibrator="ts", model_name=MODEL,
                            promote=False)
        graph = _model_file(client, third.version)
        graph.write_bytes(graph.read_bytes()[: graph.stat().st_size // 2])
        client.set_registered_model_alias(MODEL, registry.CHAMPION, third.version)
        deadline = time.monotonic() + 2 * POLL + 10
        while third.version not in httpx.get(f"{url}/version").json()["rejected"]:
            assert time.monotonic() < deadline, httpx.get(f"{url}/version").text
            time.sleep(0.1)
        status = httpx.get(f"{url}/version").json()
        assert status["version"] == second.version
        # refused by its digest before onnx parses it
        assert "is not the file its run recorded at log time" in status["rejected"][
            third.version]
        answer = httpx.post(f"{url}/invocations", json={"inputs": sample.tolist()})
        assert answer.status_code == 200 and answer.headers[VERSION_HEADER] == second.version
        assert httpx.get(f"{url}/health").status_code == 200
        metrics = httpx.get(f"{url}/metrics").text
        assert "cord_serve_swaps_total 1.0" in metrics
        assert "cord_serve_swap_failures_total 1.0" in metrics
        assert f'cord_serve_model_info{{name="{MODEL}",run_id="{second.run_id}",' \
               f'version="{second.version}"}} 1.0' in metrics
        assert 'cord_serve_errors_total{reason="non_finite"} 2.0' in metrics

        # The store hangs (an exclusive lock on the sqlite file blocks every poll): serving
        # goes on with v2; once the store is back the follower moves with the alias again.
        with Traffic(url, sample, threads=2) as traffic:
            locker = sqlite3.connect(store.removeprefix("sqlite:///"), timeout=30)
            locker.execute("BEGIN EXCLUSIVE")
            try:
                time.sleep(2 * POLL + 1)
                assert httpx.get(f"{url}/health").status_code == 200
                with pytest.raises(sqlite3.OperationalError, match="locked"):
                    sqlite3.connect(store.removeprefix("sqlite:///"), timeout=0.1) \
                        .execute("SELECT 1 FROM registered_models").fetchall()
            finally:
                locker.rollback()
                locker.close()
        assert traffic.answers and all(a[0] == 200 and a[2] == second.version
                                       for a in traffic.answers)
        client.set_registered_model_alias(MODEL, registry.CHAMPION, first.version)
        deadline = time.monotonic() + 2 * POLL + 20  # a poll blocked by the lock may finish
        while httpx.get(f"{url}/version").json()["version"] != first.version:
            assert time.monotonic() < deadline, httpx.get(f"{url}/version").text
            time.sleep(0.1)

        # SIGTERM with requests in flight: they are answered and the process exits in 5 s.
        with Traffic(url, rows[:50], threads=2) as traffic:
            time.sleep(0.5)
            sent = time.monotonic()
            os.kill(server.pid, signal.SIGTERM)
            server.wait(10)
            exited_after = time.monotonic() - sent
        assert exited_after < 5.0, exited_after
        # A stop asked for is a clean exit, the same as `schedule`'s.
        assert server.returncode == 0, log.read_text()
        assert "stopped serving" in log.read_text()
        answered = [a for a in traffic.answers if a[0] == 200]
        assert answered and all(a[0] in (0, 200) for a in traffic.answers)


def test_serve_refuses_an_unknown_model_before_binding(store, capsys):
    from mlflow import MlflowClient

    from flows.cli.main import main

    MlflowClient().search_experiments()  # the store exists; the model does not
    port = free_port()
    assert main(["serve", "--model-name", "nope", "--port", str(port)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "nope" in err[0]
    with socket.socket() as sock:  # nothing was left listening
        sock.bind(("127.0.0.1", port))
    assert main(["serve", "--model-name", "nope", "--poll-interval", "0"]) == 1
    assert "--poll-interval" in capsys.readouterr().err


def test_serve_is_not_ready_until_the_alias_exists(store, tmp_path, cord_ops_command, digits):
    """Registered model without @champion: /health is 503 and /invocations answers 503 with
    the reason, until a verified version appears."""
    from mlflow import MlflowClient

    MlflowClient().create_registered_model(MODEL)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "serve.log"
    with running([*cord_ops_command, "serve", "--model-name", MODEL, "--port", str(port),
                  "--poll-interval", "0.5"], log) as server:
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None, log.read_text()
            try:
                health = httpx.get(f"{url}/health")
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
        assert health.status_code == 503
        answer = httpx.post(f"{url}/invocations", json={"inputs": digits.scores[:2].tolist()})
        assert answer.status_code == 503 and answer.json()["reason"] == "no_model"

