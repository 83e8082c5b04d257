"""``cord-ops serve --workers 2``: two worker processes on one port over a real store, each
following the alias."""

from __future__ import annotations

import os
import signal
import socket
import time

import httpx
import numpy as np
import pytest
from scipy.special import softmax
from servers import free_port, running, wait_until_ready

from cord_ops import CORD
from cord_ops.calibrators import make_calibrator
from flows import pyfunc_model
from flows.serve.app import VERSION_HEADER
from flows.store import graphs, registry
from onnx_export import export_onnx

pytestmark = pytest.mark.slow

MODEL = "workers"


def _register(client, experiment: str, digits, calibrator: str, scratch) -> str:
    """A version registered by hand, with the digest record serve checks its graph by."""
    fitted = make_calibrator(calibrator).fit(digits.scores, digits.labels)
    cord = CORD().fit(softmax(digits.scores, axis=1), fitted.predict_proba(digits.scores))
    graph = export_onnx(fitted, cord, 10, input_kind="logits", dtype="float32")
    run_id = client.create_run(experiment).info.run_id
    info = pyfunc_model.log_model(client, run_id, experiment, graph,
                                  digits.scores[:5].astype(np.float32))
    scratch.mkdir()
    graphs.record_digests(client, client.tracking_uri, run_id, info.model_uri, graph, {},
                          scratch)
    registry.ensure_registered_model(client, MODEL)
    return str(client.create_model_version(MODEL, source=info.model_uri, run_id=run_id,
                                           model_id=info.model_id).version)


def _versions(url: str, rows, n: int = 24) -> set[str]:
    """The versions of ``n`` answers, each on a new connection (any worker may take it)."""
    seen = set()
    for _ in range(n):
        answer = httpx.post(f"{url}/invocations", json={"inputs": rows}, timeout=30.0)
        assert answer.status_code == 200, answer.text
        seen.add(answer.headers[VERSION_HEADER])
    return seen


def test_two_workers_share_one_port_and_follow_the_alias(store, digits, tmp_path,
                                                         cord_ops_command):
    from mlflow import MlflowClient

    client = MlflowClient()
    experiment = client.create_experiment(MODEL)
    first = _register(client, experiment, digits, "ts", tmp_path / "record-1")
    client.set_registered_model_alias(MODEL, registry.CHAMPION, first)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "serve.log"
    rows = digits.scores[:3].tolist()
    with running([*cord_ops_command, "serve", "--model-name", MODEL, "--port", str(port),
                  "--poll-interval", "0.5", "--workers", "2"], log) as server:
        wait_until_ready(f"{url}/health", server, log, timeout=90)
        # both workers answer on the one port: each scrape names the worker that took it
        workers, deadline = set(), time.monotonic() + 60
        while len(workers) < 2:
            assert time.monotonic() < deadline, (workers, log.read_text())
            text = httpx.get(f"{url}/metrics", timeout=30.0).text
            workers |= {w for w in ("0", "1") if f'cord_serve_worker{{worker="{w}"}} 1.0'
                        in text}
            if httpx.get(f"{url}/health", timeout=30.0).status_code != 200:
                time.sleep(0.2)  # the other worker is still loading
        assert _versions(url, rows) == {first}

        # a swap and a rollback reach every worker
        second = _register(client, experiment, digits, "ts", tmp_path / "record-2")
        for target in (second, first):
            client.set_registered_model_alias(MODEL, registry.CHAMPION, target)
            deadline = time.monotonic() + 30
            while _versions(url, rows, 8) != {target}:
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.3)
            assert _versions(url, rows) == {target}

        os.kill(server.pid, signal.SIGTERM)
        server.wait(15)
    assert server.returncode == 0, log.read_text()
    assert "stopped serving" in log.read_text()
    with socket.socket() as sock:  # no worker was left holding the port
        sock.bind(("127.0.0.1", port))
