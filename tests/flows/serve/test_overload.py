"""``cord-ops serve``'s application under overload and hostile clients, over real HTTP
(uvicorn in a thread on serve's own socket) and a real onnxruntime session: a bounded
number of requests in flight, then an immediate 503; a body size limit judged before the
body is read; a slow client that holds no one else up."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time

import httpx
import numpy as np
import pytest
from scipy.special import softmax

from cord_ops import CORD
from cord_ops.calibrators import make_calibrator
from flows.serve import app as serve
from flows.serve.access import Access
from flows.serve.contract import InputContract
from flows.serve.metrics import Metrics
from flows.serve.served_model import ServedModel
from onnx_export import export_onnx, open_session

WAIT = 20.0  # seconds: far above any answer here; reached only when something is stuck


class _Gated:
    """A real session whose runs wait for ``release``."""

    def __init__(self, session):
        self.session, self.release = session, threading.Event()
        self.runs = 0

    def run(self, outputs, feeds):
        self.runs += 1
        if not self.release.wait(WAIT):
            raise TimeoutError("the test never released the gated session")
        return self.session.run(outputs, feeds)

    def __getattr__(self, name):
        return getattr(self.session, name)


class _Follower:
    """The follower's surface the app reads, serving one fixed model (not under test)."""

    name, alias, last_error, rejected, last_poll, interval = "m", "champion", None, {}, None, 1

    def __init__(self, model):
        self.current = model

    def start(self):
        pass

    def stop(self):
        pass


@pytest.fixture(scope="module")
def session(digits):
    calibrator = make_calibrator("ts").fit(digits.scores, digits.labels)
    cord = CORD().fit(softmax(digits.scores, axis=1), calibrator.predict_proba(digits.scores))
    return open_session(export_onnx(calibrator, cord, 10, input_kind="logits",
                                    dtype="float32"), provider="cpu")


@contextlib.contextmanager
def _serving(session, **options):
    """The app on a uvicorn server in a thread, on a socket from serve's ``bind``; yields
    (url, metrics)."""
    import uvicorn

    model = ServedModel("m", "1", None, InputContract(10, "logits", "float32"), None,
                              "ts", session, ("CPUExecutionProvider",), {})
    metrics = Metrics()
    app = serve.build_app(_Follower(model), metrics, 0.0, 4096, access=Access.local(),
                          **options)
    sock = serve.bind("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    try:
        deadline = time.monotonic() + WAIT
        while not server.started:
            assert time.monotonic() < deadline and thread.is_alive()
            time.sleep(0.02)
        yield url, metrics
    finally:
        server.should_exit = True
        thread.join(WAIT)
        sock.close()


def _post(url: str, rows: np.ndarray, timeout: float = WAIT) -> httpx.Response:
    return httpx.post(f"{url}/invocations", content=json.dumps({"inputs": rows.tolist()}),
                      headers={"content-type": "application/json"}, timeout=timeout)


def test_beyond_max_inflight_requests_get_503_at_once_and_admitted_ones_are_right(
        session, digits):
    rows = np.ascontiguousarray(digits.scores[:6], dtype=np.float32)
    expected = session.run(["repaired"], {"scores": rows})[0]
    gated = _Gated(session)
    with _serving(gated, max_inflight=2) as (url, metrics):
        answers: dict[int, httpx.Response] = {}
        threads = [threading.Thread(target=lambda i=i: answers.__setitem__(
            i, _post(url, rows[3 * i:3 * i + 3]))) for i in range(2)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + WAIT
        while gated.runs == 0:  # both admitted; at least one run holds the worker thread
            assert time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(0.2)  # the second request is read and queued (or in the same run)
        sent = time.monotonic()
        refused = _post(url, rows[:1])
        refused_after = time.monotonic() - sent
        gated.release.set()
        for thread in threads:
            thread.join(WAIT)
        after = _post(url, rows[:1])  # a slot is free again
        text = httpx.get(f"{url}/metrics").text
    assert refused.status_code == 503 and refused.json()["reason"] == "overloaded"
    assert refused.headers["retry-after"] == str(serve.RETRY_AFTER)
    assert refused_after < 2.0, refused_after  # not queued behind the held requests
    for i in range(2):
        assert answers[i].status_code == 200, answers[i].text
        np.testing.assert_allclose(answers[i].json()["predictions"]["repaired"],
                                   expected[3 * i:3 * i + 3], rtol=0, atol=1e-7)
    assert after.status_code == 200
    assert 'cord_serve_errors_total{reason="overloaded"} 1.0' in text


def _raw(url: str, head: bytes) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=WAIT)
    sock.sendall(head)
    return sock


def _status(sock: socket.socket) -> int:
    return int(sock.recv(65536).split(b" ", 2)[1])


def test_an_oversize_body_is_413_before_it_is_read(session, digits):
    with _serving(session, max_body_bytes=1000) as (url, metrics):
        # 1 GB announced, nothing of it sent: the answer comes without reading it
        sock = _raw(url, b"POST /invocations HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: "
                         b"application/json\r\ncontent-length: 1000000000\r\n\r\n")
        with sock:
            assert _status(sock) == 413
        # no length announced (chunked): refused once it passes the limit
        big = json.dumps({"inputs": digits.scores[:40].tolist()}).encode()
        assert len(big) > 1000

        def chunks():
            yield big

        chunked = httpx.post(f"{url}/invocations", content=chunks(),
                             headers={"content-type": "application/json"}, timeout=WAIT)
        assert chunked.status_code == 413 and chunked.json()["reason"] == "too_large"
        assert _post(url, digits.scores[:2]).status_code == 200  # under the limit: scored
        assert 'cord_serve_errors_total{reason="too_large"} 2.0' in \
            httpx.get(f"{url}/metrics").text


def test_a_slow_client_holds_no_one_up_and_times_out(session, digits, monkeypatch):
    monkeypatch.setattr(serve, "BODY_TIMEOUT", 3.0)
    body = json.dumps({"inputs": digits.scores[:2].tolist()}).encode()
    with _serving(session, max_inflight=4) as (url, metrics):
        slow = _raw(url, b"POST /invocations HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: "
                         b"application/json\r\ncontent-length: " + str(len(body)).encode()
                    + b"\r\n\r\n" + body[:10])
        with slow:
            sent = time.monotonic()
            assert _post(url, digits.scores[:2]).status_code == 200  # not behind the slow one
            assert time.monotonic() - sent < 2.5  # the slow body has 3 s
            assert _status(slow) == 408
        assert 'cord_serve_errors_total{reason="slow_body"} 1.0' in \
            httpx.get(f"{url}/metrics").text


def test_too_many_rows_are_refused_before_they_are_converted(session, digits):
    rows = digits.scores[:4].tolist()
    with _serving(session, max_rows=3) as (url, metrics):
        for payload in ({"inputs": rows}, {"inputs": {"scores": rows}},
                        {"dataframe_split": {"columns": [f"c{j}" for j in range(10)],
                                             "data": rows}}):
            refused = httpx.post(f"{url}/invocations", json=payload, timeout=WAIT)
            assert refused.status_code == 413, (payload.keys(), refused.text)
            assert refused.json() == {"error": "4 rows in one request: at most 3 (--max-rows)",
                                      "reason": "too_many_rows"}
        # a row the contract would refuse (NaN) is not looked at: the count refuses first
        assert httpx.post(f"{url}/invocations", json={"inputs": [[None] * 10] * 4},
                          timeout=WAIT).json()["reason"] == "too_many_rows"
        assert httpx.post(f"{url}/invocations", json={"inputs": rows[:3]},
                          timeout=WAIT).status_code == 200
        assert 'cord_serve_errors_total{reason="too_many_rows"} 4.0' in \
            httpx.get(f"{url}/metrics").text
