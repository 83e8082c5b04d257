"""``cord-ops serve``: an HTTP scoring server that follows a registry alias.

It serves the ONNX graph of ``models:/NAME@ALIAS`` with one onnxruntime session (CUDA when
onnxruntime-gpu and a GPU are present, else CPU) on uvicorn + Starlette, and moves to a new
version without a restart:

- a :class:`flows.serve.follower.RegistryFollower` thread polls the alias every
  ``poll_interval`` seconds; when it points at a version that is not the one served, the
  thread downloads that version's graph, opens a session and verifies it
  (:func:`flows.serve.served_model.verify`): every repaired row keeps its
  input's top-1, is finite and sums to 1, and agrees with cord_ops run from the version's
  logged state within the export's parity tolerance. Only then is the served model
  replaced, by one reference assignment, so a request is answered wholly by the version it
  was validated against. A version that fails to load or verify is never served, is
  remembered (``/version``, ``/metrics``) and is not retried until the alias moves again;
  a store that cannot be reached is retried at the next poll.
- ``POST /invocations`` takes MLflow's scoring payloads (:func:`flows.serve.contract.
  from_payload`), refuses bad input with HTTP 400 and a one-line ``error`` (the rules of
  :mod:`flows.serve.contract`, shared with the registered model's pyfunc flavour), and
  answers ``{"predictions": {"repaired", "label", "confidence"}, "model": {"name",
  "version"}}`` with the version also in the ``X-Model-Version`` header.
- concurrent requests are micro-batched (:class:`flows.serve.batcher.MicroBatcher`): one
  session run scores every request waiting for it, up to ``batch_max_rows`` rows, and waits at most
  ``batch_window`` seconds for requests still being read; a lone request never waits.
- ``GET /health`` (200 only with a verified model), ``GET /version``, ``GET /metrics``
  (Prometheus text: requests, errors by reason, latency, batch sizes, current version,
  swaps and failed swaps).
- SIGTERM (or Ctrl-C) stops accepting connections, answers the requests in flight and
  exits within ``SHUTDOWN_GRACE`` seconds.

Nothing is process-wide: the tracking store is addressed through a client bound to its URI
(:func:`flows.store.tracking.client`) and the metrics live in the server's own registry.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time

from flows import inputs
from flows.redact import redact
from flows.serve.access import Access
from flows.serve.batcher import MicroBatcher
from flows.serve.contract import (
    ScoringInputError,
    from_payload,
    score_matrix,
)
from flows.serve.follower import RegistryFollower, say
from flows.serve.metrics import Metrics

DEFAULT_PORT = 5005
DEFAULT_POLL_INTERVAL = 10.0
DEFAULT_BATCH_WINDOW = 0.002
DEFAULT_BATCH_MAX_ROWS = 4096
#: uvicorn's limit for finishing in-flight requests after SIGTERM; start-up to exit stays
#: under 5 s.
SHUTDOWN_GRACE = 3.0
VERSION_HEADER = "X-Model-Version"
#: Scoring requests admitted at once (read, queued or being scored); more get 503 at once.
DEFAULT_MAX_INFLIGHT = 128
#: Largest request body; a bigger one is refused (413) before it is read whole.
DEFAULT_MAX_BODY_BYTES = 64 * 2**20
#: Most rows in one request, counted in the decoded JSON before any row is converted or
#: checked.
DEFAULT_MAX_ROWS = 65536
#: Longest wait for a request's body once its headers arrived: a client sending it byte by
#: byte would hold its admission slot for ever.
BODY_TIMEOUT = 10.0
#: What an overloaded server tells a client to wait before trying again (seconds).
RETRY_AFTER = 1


# ---------------------------------------------------------------- HTTP
def _decode(body: bytes):
    import orjson

    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        # Python's json (and so MLflow's clients) writes NaN/Infinity, which strict JSON
        # parsers refuse; read them so such rows get their row-naming 400.
        return json.loads(body)


def _row_count(batch) -> int:
    """Rows of a :func:`flows.serve.contract.from_payload` batch: a list of rows, or a
    one-input dict of them (what is not a list counts as one row; the contract judges it)."""
    if isinstance(batch, dict):
        batch = next(iter(batch.values()))
    return len(batch) if isinstance(batch, list) else 1


def build_app(follower: RegistryFollower, metrics: Metrics, batch_window: float,
              batch_max_rows: int, traffic=None, rollout=None, access: Access | None = None,
              max_inflight: int = DEFAULT_MAX_INFLIGHT,
              max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, max_rows: int = DEFAULT_MAX_ROWS):
    """The ASGI application; the follower (and ``rollout``, a
    :class:`flows.serve.rollout.RolloutController`, when given) is started and stopped with
    it. ``traffic`` (a :class:`flows.serve.traffic.TrafficMonitor`) watches the answers
    without labels. ``access`` (:mod:`flows.serve.access`; default: local host names and a
    token nobody knows) says which Host names are answered and guards every POST.
    At most ``max_inflight`` scoring requests are admitted at once (more: 503 with
    Retry-After, not a queue whose wait grows without bound), each body at most
    ``max_body_bytes`` (413, judged from Content-Length before reading, else while
    reading) and read within :data:`BODY_TIMEOUT` (408), with at most ``max_rows`` rows
    (413, counted before the rows are converted)."""
    import contextlib

    import orjson
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    state: dict[str, MicroBatcher] = {}

    def json_response(payload, status: int = 200, headers=None) -> Response:
        return Response(orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY),
                        status_code=status, media_type="application/json", headers=headers)

    def refuse(status: int, reason: str, message: str, headers=None) -> Response:
        metrics.errors.labels(reason).inc()
        metrics.requests.labels(str(status)).inc()
        return json_response({"error": message, "reason": reason}, status, headers)

    admitted = {"now": 0}

    async def read_body(request: Request) -> bytes | Response:
        """The body, or the refusal of one too large (413) or too slow (408)."""
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > max_body_bytes):
            return refuse(413, "too_large", f"request body of {length} bytes: at most "
                                            f"{max_body_bytes} (--max-body-bytes)")

        async def read() -> bytes | None:
            body = bytearray()
            async for chunk in request.stream():
                body += chunk
                if len(body) > max_body_bytes:
                    return None
            return bytes(body)

        try:
            body = await asyncio.wait_for(read(), BODY_TIMEOUT)
        except TimeoutError:
            return refuse(408, "slow_body", f"request body not received within "
                                            f"{BODY_TIMEOUT:g} s")
        if body is None:
            return refuse(413, "too_large", f"request body over {max_body_bytes} bytes "
                                            f"(--max-body-bytes)")
        return body

    if access is None:
        access = Access.local()

    def guarded(endpoint):
        """``endpoint`` (a POST that changes state) behind the token and JSON checks."""
        async def checked(request: Request) -> Response:
            refusal = access.post_refusal(request.headers)
            return refuse(*refusal) if refusal is not None else await endpoint(request)
        return checked

    async def invocations(request: Request) -> Response:
        if admitted["now"] >= max_inflight:
            return refuse(503, "overloaded", f"{max_inflight} requests in flight "
                                             f"(--max-inflight); retry after {RETRY_AFTER} s",
                          {"Retry-After": str(RETRY_AFTER)})
        admitted["now"] += 1
        batcher = state["batcher"]
        started = time.perf_counter()
        batcher.arriving += 1
        arrived = True
        try:
            refusal = access.post_refusal(request.headers, token=access.require_token)
            if refusal is not None:
                return refuse(*refusal)
            model = follower.current
            if model is None:
                return refuse(503, "no_model", f"no verified version of {follower.name}@"
                                               f"{follower.alias} is loaded yet")
            body = await read_body(request)
            if isinstance(body, Response):
                return body
            try:
                payload = _decode(body)
            except ValueError as exc:
                return refuse(400, "bad_json", f"request body is not JSON ({exc})")
            try:
                batch = from_payload(payload)
                rows = _row_count(batch)
                if rows > max_rows:
                    return refuse(413, "too_many_rows", f"{rows} rows in one request: at most "
                                                        f"{max_rows} (--max-rows)")
                scores = score_matrix(batch, model.contract)
            except ScoringInputError as exc:
                return refuse(400, exc.reason, str(exc))
            batcher.arriving -= 1
            arrived = False
            try:
                if rollout is None:
                    outputs = await batcher.score(model, scores)
                else:  # a staged rollout may answer with the candidate (flows.serve.rollout)
                    outputs, model = await rollout.score(batcher, model, scores,
                                                         rollout.key(request))
            except Exception as exc:
                return refuse(500, "internal", f"scoring failed: {type(exc).__name__}: {exc}")
            metrics.rows.inc(scores.shape[0])
            metrics.requests.labels("200").inc()
            if traffic is not None:
                traffic.record(model, outputs["repaired"])
            return json_response({"predictions": outputs,
                                  "model": {"name": model.name, "version": model.version}},
                                 headers={VERSION_HEADER: model.version})
        finally:
            admitted["now"] -= 1
            if arrived:
                batcher.arriving -= 1
            metrics.latency.observe(time.perf_counter() - started)

    async def health(request: Request) -> Response:
        model = follower.current
        if model is None:
            return json_response({"status": "not ready", "model": follower.name,
                                  "alias": follower.alias,
                                  "reason": follower.last_error or "loading the first version"},
                                 503)
        return json_response({"status": "ready", "version": model.version},
                             headers={VERSION_HEADER: model.version})

    async def version(request: Request) -> Response:
        model = follower.current
        body = {"name": follower.name, "alias": follower.alias,
                "version": None if model is None else model.version,
                "rejected": follower.rejected, "last_poll": follower.last_poll,
                "last_error": follower.last_error, "poll_interval": follower.interval}
        if model is not None:
            body.update(model.describe())
        return json_response(body)

    async def prometheus(request: Request) -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST

        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    async def rollout_state(request: Request) -> Response:
        if rollout is None:
            return json_response({"record": None, "summary": "rollouts not followed"})
        return json_response(rollout.describe())

    @contextlib.asynccontextmanager
    async def lifespan(app):
        state["batcher"] = MicroBatcher(batch_window, batch_max_rows, metrics)
        state["batcher"].start()
        follower.start()
        if rollout is not None:
            rollout.start()
        try:
            yield
        finally:
            if rollout is not None:
                rollout.stop()
            follower.stop()
            await state["batcher"].stop()

    extra = []
    if traffic is not None:
        metrics.registry.register(traffic.collector(lambda: follower.current))
        extra = traffic.routes(lambda: follower.current, json_response)
    # Every POST but scoring changes state: each one needs the token.
    extra = [Route(r.path, guarded(r.endpoint), methods=sorted(r.methods))
             if "POST" in (r.methods or ()) else r for r in extra]

    async def http_refusal(request: Request, exc: HTTPException) -> Response:
        reason = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http")
        return refuse(exc.status_code, reason,
                      f"{request.method} {request.url.path}: {exc.detail}", exc.headers)

    app = Starlette(exception_handlers={HTTPException: http_refusal},
                    routes=[Route("/invocations", invocations, methods=["POST"]),
                            Route("/health", health), Route("/ping", health),
                            Route("/version", version), Route("/metrics", prometheus),
                            Route("/rollout", rollout_state), *extra],
                    lifespan=lifespan)

    async def host_checked(scope, receive, send):
        # Before routing, so no endpoint answers a host it does not serve (DNS rebinding).
        if scope["type"] == "http":
            refusal = access.host_refusal(scope["headers"])
            if refusal is not None:
                await refuse(*refusal)(scope, receive, send)
                return
        await app(scope, receive, send)

    return host_checked


def check_options(port: int, poll_interval: float, batch_window: float,
                  batch_max_rows: int, max_inflight: int = DEFAULT_MAX_INFLIGHT,
                  max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                  max_rows: int = DEFAULT_MAX_ROWS) -> None:
    """Raise ValueError naming the first bad option."""
    inputs.listen_port(port)
    if not poll_interval > 0:
        raise ValueError(f"--poll-interval: expected seconds > 0, got {poll_interval}")
    if not 0 <= batch_window <= 1:
        raise ValueError(f"--batch-window-ms: expected 0..1000, got {batch_window * 1e3:g}")
    if batch_max_rows < 1:
        raise ValueError(f"--batch-max-rows: expected a positive integer, got {batch_max_rows}")
    if max_inflight < 1:
        raise ValueError(f"--max-inflight: expected a positive integer, got {max_inflight}")
    if max_body_bytes < 1:
        raise ValueError(f"--max-body-bytes: expected a positive integer, got {max_body_bytes}")
    if max_rows < 1:
        raise ValueError(f"--max-rows: expected a positive integer, got {max_rows}")


def bind(host: str, port: int):
    """A listening-ready socket bound to ``host:port`` (as uvicorn binds: SO_REUSEADDR, so
    only a live listener makes the port taken); raises ``OSError`` when it is taken."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto must say TCP: asyncio sets TCP_NODELAY on accepted connections only when the
    # listening socket's proto is IPPROTO_TCP (0 does not count). Without it uvicorn's
    # response, written as headers then body, meets Nagle: every small answer on a
    # keep-alive connection waits for the client's delayed ACK (docs/serving.md,
    # `cord-ops serve`).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def serve(tracking_uri: str, name: str, alias: str = "champion", host: str = "127.0.0.1",
          port: int = DEFAULT_PORT, poll_interval: float = DEFAULT_POLL_INTERVAL,
          batch_window: float = DEFAULT_BATCH_WINDOW,
          batch_max_rows: int = DEFAULT_BATCH_MAX_ROWS, provider: str = "auto",
          monitor_window: int = 0, shadow_queue: int | None = None,
          token_file: str | None = None, allowed_hosts: tuple[str, ...] = (),
          require_token: bool = False, max_inflight: int = DEFAULT_MAX_INFLIGHT,
          max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, workers: int = 1,
          max_rows: int = DEFAULT_MAX_ROWS) -> None:
    """Run the server until SIGTERM/SIGINT, then return (after "stopped serving"), as
    ``cord-ops schedule`` does: a stop asked for is a clean exit. Raises before binding
    when the options are bad, before loading anything when the port is taken, and before
    serving when the store cannot be reached or registered model ``name`` does not exist.
    ``monitor_window`` > 0 keeps that many answered rows for label-free monitoring
    (:mod:`flows.serve.traffic`: ``/monitor``, gauges in ``/metrics``).
    A staged rollout of the model (:mod:`flows.promotion.rollout_record`) is followed, with a
    shadow queue of ``shadow_queue`` request copies (default
    :data:`flows.serve.rollout.DEFAULT_SHADOW_QUEUE`; 0: rollouts are not followed).
    ``token_file``, ``allowed_hosts`` and ``require_token``: :func:`flows.serve.access.
    resolve`. ``workers`` > 1 runs that many worker processes on the one listening socket
    (:func:`_supervise`); each limit (``max_inflight``) is per worker."""
    check_options(port, poll_interval, batch_window, batch_max_rows, max_inflight,
                  max_body_bytes, max_rows)
    if shadow_queue is not None and shadow_queue < 0:
        raise ValueError(f"--shadow-queue: expected an integer >= 0, got {shadow_queue}")
    if provider not in ("auto", "cpu", "cuda"):
        raise ValueError(f"--provider: expected auto, cpu or cuda, got {provider!r}")
    if workers < 1:
        raise ValueError(f"--workers: expected a positive integer, got {workers}")
    sock = bind(host, port)  # held from here on: nothing can take the port meanwhile
    access = None
    try:
        from flows.serve import access as serve_access
        from flows.store import tracking

        tracking.client(tracking_uri).get_registered_model(name)  # a typo fails here, not later
        access = serve_access.resolve(tracking_uri, sock.getsockname()[1], host, token_file,
                                      tuple(allowed_hosts), require_token)
        settings = {"tracking_uri": tracking_uri, "name": name, "alias": alias, "host": host,
                    "port": port, "poll_interval": poll_interval,
                    "batch_window": batch_window, "batch_max_rows": batch_max_rows,
                    "provider": provider, "monitor_window": monitor_window,
                    "shadow_queue": shadow_queue, "max_inflight": max_inflight,
                    "max_body_bytes": max_body_bytes, "max_rows": max_rows,
                    "hosts": sorted(access.hosts),
                    "require_token": require_token}
        say(f"{name}@{alias} on http://{host}:{port} (tracking "
            f"{redact(tracking_uri)}, polling every {poll_interval:g} s"
            f"{f', {workers} workers' if workers > 1 else ''})")
        say(f"token for POST /monitor/flush"
            f"{' and /invocations' if require_token else ''}: {access.source}")
        if workers == 1:
            _serve_on(sock, settings, access)
        else:
            _supervise(sock, settings, access, workers)
        say("stopped serving")
    finally:
        if access is not None:
            access.forget()
        sock.close()


def _serve_on(sock, settings: dict, access: Access, worker: int | None = None) -> None:
    """Serve on the listening ``sock`` until SIGTERM/SIGINT (one process, or one worker)."""
    import signal

    import uvicorn

    tracking_uri, name = settings["tracking_uri"], settings["name"]
    metrics = Metrics()
    if worker is not None:
        metrics.worker.labels(str(worker)).set(1)
    follower = RegistryFollower(tracking_uri, name, settings["alias"],
                                settings["poll_interval"], metrics, settings["provider"])
    traffic = None
    if settings["monitor_window"]:
        from flows.serve.traffic import TrafficMonitor

        traffic = TrafficMonitor(tracking_uri, name, settings["monitor_window"])
    from flows.serve.rollout import DEFAULT_SHADOW_QUEUE, RolloutController

    shadow_queue = settings["shadow_queue"]
    queue_size = DEFAULT_SHADOW_QUEUE if shadow_queue is None else shadow_queue
    controller = RolloutController(follower, metrics, queue_size) if queue_size else None
    app = build_app(follower, metrics, settings["batch_window"], settings["batch_max_rows"],
                    traffic, controller, access, settings["max_inflight"],
                    settings["max_body_bytes"], settings["max_rows"])
    config = uvicorn.Config(app, host=settings["host"], port=settings["port"],
                            log_level="warning", access_log=False,
                            timeout_graceful_shutdown=SHUTDOWN_GRACE, lifespan="on")
    server = uvicorn.Server(config)
    # uvicorn shuts down on SIGTERM/SIGINT and then re-raises the signal to the handler
    # in place before it ran; this one only records it, so the stop ends in a return.
    stops: list[int] = []
    previous = {signum: signal.signal(signum, lambda signum, frame: stops.append(signum))
                for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        server.run(sockets=[sock])
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


#: The environment variable that hands a worker its settings (JSON, no secret in it).
WORKER_ENV = "CORD_OPS_SERVE_WORKER"
#: A worker whose supervisor is gone stops within this many seconds.
ORPHAN_CHECK_S = 1.0


def _supervise(sock, settings: dict, access: Access, workers: int) -> None:
    """Run ``workers`` worker processes on the one listening ``sock`` (the kernel hands
    each new connection to one of the processes waiting on it) until SIGTERM/SIGINT;
    a worker that dies is started again.

    A worker is a fresh interpreter (:func:`worker_main`), not a fork: this process has
    talked to the store, and a forked copy of its open connections is not safe to use.
    The token goes to the workers in their environment (readable by this user only), the
    settings in :data:`WORKER_ENV`."""
    import json as json_module
    import signal
    import subprocess
    import sys

    from flows.serve.access import TOKEN_ENV

    stops: list[int] = []
    previous = {signum: signal.signal(signum, lambda signum, frame: stops.append(signum))
                for signum in (signal.SIGTERM, signal.SIGINT)}

    def start(index: int) -> subprocess.Popen:
        env = {**os.environ, TOKEN_ENV: access.token,
               WORKER_ENV: json_module.dumps({**settings, "fd": sock.fileno(),
                                              "worker": index})}
        return subprocess.Popen([sys.executable, "-c",
                                 "from flows.serve.app import worker_main; worker_main()"],
                                pass_fds=(sock.fileno(),), env=env)

    running = {index: start(index) for index in range(workers)}
    try:
        while not stops:
            for index, process in list(running.items()):
                if process.poll() is not None and not stops:
                    say(f"worker {index} exited with {process.returncode}; "
                        f"starting it again")
                    running[index] = start(index)
            time.sleep(0.2)
    finally:
        for process in running.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + SHUTDOWN_GRACE + 2.0
        for process in running.values():
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def worker_main() -> None:
    """One worker of :func:`_supervise`: serve on the inherited socket; stop when the
    supervisor is gone (killed outright, it cannot tell its workers)."""
    import signal
    import socket

    from flows.serve.access import TOKEN_ENV

    settings = json.loads(os.environ.pop(WORKER_ENV))
    token = os.environ.pop(TOKEN_ENV)
    access = Access(token=token, hosts=frozenset(settings["hosts"]),
                    require_token=settings["require_token"])
    sock = socket.socket(fileno=settings["fd"])
    supervisor = os.getppid()

    def watch() -> None:
        while os.getppid() == supervisor:
            time.sleep(ORPHAN_CHECK_S)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, daemon=True, name="supervisor-watch").start()
    _serve_on(sock, settings, access, worker=settings["worker"])
