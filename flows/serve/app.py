"""``cord-ops serve``: an HTTP scoring server that follows a registry alias.

It serves the ONNX graph of ``models:/NAME@ALIAS`` with one onnxruntime session (CUDA when
onnxruntime-gpu and a GPU are present, else CPU) on uvicorn + Starlette, and moves to a new
version without a restart:

- a :class:`RegistryFollower` thread polls the alias every ``poll_interval`` seconds; when it
  points at a version that is not the one served, the thread downloads that version's
  graph, opens a session and verifies it (:func:`verify`): every repaired row keeps its
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
- concurrent requests are micro-batched (:class:`MicroBatcher`): one session run scores every
  request waiting for it, up to ``batch_max_rows`` rows, and waits at most
  ``batch_window`` seconds for requests still being read; a lone request never waits.
- ``GET /health`` (200 only with a verified model), ``GET /version``, ``GET /metrics``
  (Prometheus text: requests, errors by reason, latency, batch sizes, current version,
  swaps and failed swaps).
- SIGTERM (or Ctrl-C) stops accepting connections, answers the requests in flight and
  exits within ``SHUTDOWN_GRACE`` seconds.

Nothing is process-wide: the tracking store is addressed through ``MlflowClient(uri)`` and
the metrics live in the server's own registry.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from flows.errors import CordOpsError
from flows.redact import redact
from flows.serve.access import Access
from flows.serve.contract import (
    REASONS,
    InputContract,
    ScoringInputError,
    from_payload,
    score_matrix,
)

DEFAULT_PORT = 5005
DEFAULT_POLL_INTERVAL = 10.0
DEFAULT_BATCH_WINDOW = 0.002
DEFAULT_BATCH_MAX_ROWS = 4096
#: uvicorn's limit for finishing in-flight requests after SIGTERM; start-up to exit stays
#: under 5 s.
SHUTDOWN_GRACE = 3.0
VERSION_HEADER = "X-Model-Version"
OUTPUTS = ("repaired", "label", "confidence")
#: Rows of the synthetic probe batch every new version is verified on.
PROBE_ROWS = 256
#: The micro-batching lane of the served (champion) version's requests.
MAIN_LANE = "main"
ERROR_REASONS = (*REASONS, "bad_json", "unsupported_media_type", "no_model", "internal",
                 "bad_host", "unauthorized", "overloaded", "too_large", "slow_body",
                 "too_many_rows", "not_found", "method_not_allowed", "http")
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
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class VersionRejected(CordOpsError, RuntimeError):
    """A version that must not be served (unreadable graph, failed verification)."""


@dataclass(frozen=True, eq=False)
class ServedModel:
    """One verified version and its session; immutable once built."""

    name: str
    version: str
    run_id: str | None
    contract: InputContract
    eta_star: str | None
    calibrator: str | None
    session: object
    providers: tuple[str, ...]
    verification: dict
    loaded_at: float = field(default_factory=time.time)

    def describe(self) -> dict:
        return {"name": self.name, "version": self.version, "run_id": self.run_id,
                "input_kind": self.contract.input_kind, "n_classes": self.contract.n_classes,
                "input_widths": list(self.contract.widths),
                "dtype": str(self.contract.dtype), "eta_star": self.eta_star,
                "calibrator": self.calibrator, "providers": list(self.providers),
                "verification": self.verification, "loaded_at": self.loaded_at}


# ---------------------------------------------------------------- loading and verification
def _probe_scores(contract: InputContract, seed: int = 0) -> np.ndarray:
    """A seeded batch spanning confident, flat and tied rows, in the graph's input kind."""
    from scipy.special import softmax

    rng = np.random.default_rng(seed)
    k = contract.n_classes
    logits = rng.normal(0.0, 1.0, (PROBE_ROWS, k)) * rng.choice([0.1, 1.0, 4.0, 12.0],
                                                                 (PROBE_ROWS, 1))
    logits[:4] = 0.0  # all-tied rows: the tie rule picks class 0
    if contract.input_kind == "probs":
        return softmax(logits, axis=1)
    return logits


def _logged_state(client, run_id: str | None, folder: Path):
    """(calibrator, CORD) rebuilt from the run's ``state/`` JSON, or None without them."""
    from mlflow.exceptions import MlflowException

    from cord_ops import CORD
    from cord_ops.calibrators import calibrator_from_dict

    if not run_id:
        return None
    try:
        state = Path(client.download_artifacts(run_id, "state", str(folder)))
    except (MlflowException, OSError):
        return None
    paths = state / "calibrator.json", state / "cord.json"
    if not all(p.is_file() for p in paths):
        return None
    return (calibrator_from_dict(json.loads(paths[0].read_text())),
            CORD.from_dict(json.loads(paths[1].read_text())))


def verify(session, contract: InputContract, state=None) -> dict:
    """Check a session before it serves: on the probe batch every ``repaired`` row is
    finite, sums to 1 and keeps the input's top-1 (== ``label``); with the logged
    ``state`` (calibrator, CORD), ``repaired`` matches cord_ops within the export's parity
    tolerance. Returns what was checked; raises VersionRejected naming the failure."""
    from cord_ops.threshold import decisions
    from onnx_export.export import THRESHOLD_KEY
    from onnx_export.parity import FIXED_PARITY_TOLERANCE, parity_tolerance

    # The graph's own input, upcast: parity is defined against cord_ops on the same inputs.
    probe = _probe_scores(contract).astype(contract.dtype).astype(np.float64)
    try:
        repaired, label = session.run(["repaired", "label"],
                                      {session.get_inputs()[0].name: probe.astype(contract.dtype)})
    except Exception as exc:  # any runtime failure on valid input disqualifies the graph
        raise VersionRejected(f"the graph failed on the probe batch ({exc})") from exc
    repaired = repaired.astype(np.float64)
    # a binary graph fitted to keep a decision threshold keeps the decisions at it
    t = session.get_modelmeta().custom_metadata_map.get(THRESHOLD_KEY)
    t = None if t is None or float(t) == 0.5 else float(t)
    expected_top1 = (decisions(probe, None) if t is None else
                     decisions(probe if contract.input_kind == "probs" else _softmax(probe), t))
    tolerance = FIXED_PARITY_TOLERANCE[str(contract.dtype)]
    if repaired.shape != probe.shape or not np.isfinite(repaired).all():
        raise VersionRejected("repaired output is not a finite [N, K] array")
    if not np.array_equal(label, expected_top1) or not np.array_equal(decisions(repaired, t),
                                                                      expected_top1):
        raise VersionRejected("repaired output changes a top-1 decision on the probe batch")
    if np.max(np.abs(repaired.sum(axis=1) - 1.0)) > max(tolerance, 1e-6) * contract.n_classes:
        raise VersionRejected("repaired rows do not sum to 1 on the probe batch")
    report = {"probe_rows": int(probe.shape[0]), "top1_kept": True, "reference": None,
              "decision_threshold": t}
    if state is not None:
        calibrator, cord = state
        tolerance = parity_tolerance(calibrator, cord, probe, str(contract.dtype))
        reference = cord.transform(
            probe if contract.input_kind == "probs" else _softmax(probe),
            calibrator.predict_proba(probe))
        diff = float(np.max(np.abs(repaired - reference)))
        if not diff <= tolerance:
            raise VersionRejected(f"max |onnx - cord_ops| = {diff:.3g} on the probe batch "
                                  f"exceeds the parity tolerance {tolerance:g}")
        report.update(reference="cord_ops from the run's logged state", max_abs_diff=diff,
                      tolerance=tolerance)
    return report


def _softmax(x: np.ndarray) -> np.ndarray:
    from scipy.special import softmax

    return softmax(x, axis=1)


def load_version(client, tracking_uri: str, name: str, version: str,
                 provider: str = "auto") -> ServedModel:
    """Download, open and verify ``name`` v``version``. Raises VersionRejected for a graph
    that must not be served; store errors propagate unchanged."""
    from flows.store import graphs
    from onnx_export.export import load_model, model_metadata
    from onnx_export.runtime import open_session

    mv = client.get_model_version(name, version)
    with tempfile.TemporaryDirectory(prefix="cord-ops-serve-") as tmp:
        folder = Path(tmp)
        try:  # the graph alone, checked against its run's digest (no stored code runs)
            path = graphs.fetch_graph(client, tracking_uri, name, version, folder)
        except graphs.GraphRejected as exc:
            raise VersionRejected(str(exc)) from exc
        try:
            graph = load_model(path)
            meta = model_metadata(graph)
            contract = InputContract.from_metadata(meta)
            # Two versions share the cores in a rollout; spinning intra-op threads of one
            # take the CPU the other's working threads need.
            session = open_session(graph, provider=provider, spin=False)
        except (ValueError, RuntimeError) as exc:
            raise VersionRejected(f"v{version}: cannot load its graph ({exc})") from exc
        state = _logged_state(client, mv.run_id, folder / "state")
    try:
        report = verify(session, contract, state)
    except VersionRejected as exc:
        raise VersionRejected(f"v{version}: {exc}") from exc
    return ServedModel(name=name, version=str(version), run_id=mv.run_id, contract=contract,
                       eta_star=meta.get("cord.eta_star"), calibrator=meta.get("cord.calibrator"),
                       session=session, providers=tuple(session.get_providers()),
                       verification=report)


# ---------------------------------------------------------------- metrics
class Metrics:
    """The server's Prometheus metrics, in a registry of its own."""

    def __init__(self):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("cord_serve_requests", "Scoring requests by HTTP status",
                                ["status"], registry=r)
        self.errors = Counter("cord_serve_errors", "Refused or failed scoring requests",
                              ["reason"], registry=r)
        for reason in ERROR_REASONS:
            self.errors.labels(reason)
        self.latency = Histogram("cord_serve_request_duration_seconds",
                                 "Time from reading a scoring request to its answer",
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.rows = Counter("cord_serve_rows", "Rows scored", registry=r)
        self.batch_rows = Histogram("cord_serve_batch_rows", "Rows per onnxruntime run",
                                    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096),
                                    registry=r)
        self.version = Gauge("cord_serve_model_version", "Registry version being served "
                             "(0: none yet)", registry=r)
        self.info = Gauge("cord_serve_model_info", "The served model (value 1)",
                          ["name", "version", "run_id"], registry=r)
        self.swaps = Counter("cord_serve_swaps", "Versions swapped in after verification",
                             registry=r)
        self.swap_failures = Counter("cord_serve_swap_failures",
                                     "Versions that failed to load or verify", registry=r)
        self.worker = Gauge("cord_serve_worker", "The worker process answering this "
                            "scrape under --workers (value 1)", ["worker"], registry=r)
        self.poll_errors = Counter("cord_serve_poll_errors",
                                   "Registry polls that could not reach the store", registry=r)
        self._info_labels: tuple[str, ...] | None = None

    def served(self, model: ServedModel) -> None:
        if self._info_labels is not None:
            self.info.remove(*self._info_labels)
        self._info_labels = (model.name, model.version, model.run_id or "")
        self.info.labels(*self._info_labels).set(1)
        self.version.set(float(model.version) if model.version.isdigit() else math.nan)

    def render(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


# ---------------------------------------------------------------- following the alias
class RegistryFollower:
    """Keeps ``current`` at the verified version the alias points to.

    Runs in a daemon thread (a hung store call cannot hold up shutdown). ``current`` is
    replaced by assignment only, so readers always see one whole ServedModel.
    """

    def __init__(self, tracking_uri: str, name: str, alias: str, interval: float,
                 metrics: Metrics, provider: str = "auto"):
        from mlflow import MlflowClient

        self.client = MlflowClient(tracking_uri)
        self.tracking_uri, self.name, self.alias = tracking_uri, name, alias
        self.interval, self.metrics, self.provider = interval, metrics, provider
        self.current: ServedModel | None = None
        self.rejected: dict[str, str] = {}
        self.last_error: str | None = None
        self.last_poll: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="registry-follower",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.poll_once()
            self._stop.wait(self.interval)

    def poll_once(self) -> None:
        """One poll: resolve the alias and swap in its version if new and verified."""
        try:
            target = str(self.client.get_model_version_by_alias(self.name, self.alias).version)
        except Exception as exc:  # store down, or the alias is not set (yet)
            self._poll_failed(exc, unset=_alias_unset(exc))
            return
        self.last_poll = time.time()
        served = self.current
        if (served is not None and served.version == target) or target in self.rejected:
            self.last_error = None
            return
        try:
            model = load_version(self.client, self.tracking_uri, self.name, target,
                                 self.provider)
        except VersionRejected as exc:
            self.rejected[target] = str(exc)
            self.metrics.swap_failures.inc()
            self._log(f"not serving {self.name} v{target}: {exc}")
            return
        except Exception as exc:  # the store failed mid-download: try again next poll
            self._poll_failed(exc, unset=False)
            return
        self.current = model
        self.last_error = None
        self.metrics.served(model)
        if served is not None:
            self.metrics.swaps.inc()
        self._log(f"serving {self.name} v{model.version} ({model.contract.input_kind}, "
                  f"K={model.contract.n_classes}, {model.providers[0]})")

    def _poll_failed(self, exc: BaseException, unset: bool) -> None:
        """Say once why no version is followed, then poll quietly until that changes; an
        unset alias is the model's state (no outage counted), with the next step named."""
        from flows.errors import in_words

        if unset:
            message = (f"{self.name} has no @{self.alias} yet; serving starts when one is "
                       f"set (`cord-ops status --model-name {self.name}` says why; "
                       f"`cord-ops promote --model-name {self.name} --version N --reason "
                       "TEXT` sets it)")
        else:
            message = "registry poll failed: " + in_words(exc).splitlines()[0][:500]
        if message != self.last_error:
            self._log(message)
        self.last_error = message
        if not unset:
            self.metrics.poll_errors.inc()

    @staticmethod
    def _log(message: str) -> None:
        import sys

        print(f"cord-ops serve: {message}", file=sys.stderr, flush=True)


def _alias_unset(exc: BaseException) -> bool:
    """The store answered that the alias (or the model) does not exist: not an outage."""
    from mlflow.exceptions import MlflowException

    return isinstance(exc, MlflowException) and exc.error_code in (
        "RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE") and "not found" in exc.message


# ---------------------------------------------------------------- micro-batching
@dataclass(eq=False)
class _Pending:
    model: ServedModel
    scores: np.ndarray
    future: asyncio.Future


class _Lane:
    """One batching loop with its own worker thread (see :class:`MicroBatcher`)."""

    def __init__(self, name: str):
        self.queue: asyncio.Queue[_Pending] = asyncio.Queue()
        self.executor = ThreadPoolExecutor(max_workers=1,
                                           thread_name_prefix=f"onnxruntime-{name}")
        self.task: asyncio.Task | None = None


class MicroBatcher:
    """Scores queued requests together: one onnxruntime run per version per batch.

    The batch loop takes every request already queued; while requests are still being
    read (``arriving``) and the batch is under ``max_rows``, it waits up to ``window``
    seconds for them. Runs happen on a worker thread (onnxruntime releases the GIL and
    uses its own intra-op threads), so the event loop keeps reading requests meanwhile.

    Each *lane* (``score(..., lane=)``) has its own queue, loop and worker thread. The
    champion's requests use :data:`MAIN_LANE`; a rollout's candidate uses another, so a
    candidate whose runs are slow delays only the requests it answers: on one shared
    thread every champion request queued behind a slow candidate run would wait for it,
    the champion's latency would rise with the candidate's and the rollout's p99 ratio
    (candidate over champion) could not see the slowness.
    """

    def __init__(self, window: float, max_rows: int, metrics: Metrics):
        self.window, self.max_rows, self.metrics = window, max_rows, metrics
        self.arriving = 0
        self._lanes: dict[str, _Lane] = {}

    def start(self) -> None:
        self._lane(MAIN_LANE)

    def _lane(self, name: str) -> _Lane:
        lane = self._lanes.get(name)
        if lane is None:
            lane = self._lanes[name] = _Lane(name)
            lane.task = asyncio.get_running_loop().create_task(self._loop(lane))
        return lane

    async def stop(self) -> None:
        for lane in self._lanes.values():
            if lane.task is not None:
                lane.task.cancel()
            lane.executor.shutdown(wait=False, cancel_futures=True)

    async def score(self, model: ServedModel, scores: np.ndarray,
                    lane: str = MAIN_LANE) -> dict[str, np.ndarray]:
        future = asyncio.get_running_loop().create_future()
        self._lane(lane).queue.put_nowait(_Pending(model, scores, future))
        return await future

    async def _collect(self, lane: _Lane) -> list[_Pending]:
        batch = [await lane.queue.get()]
        rows = batch[0].scores.shape[0]
        deadline = asyncio.get_running_loop().time() + self.window
        while rows < self.max_rows:
            if lane.queue.empty():
                remaining = deadline - asyncio.get_running_loop().time()
                if self.arriving <= 0 or remaining <= 0:
                    break
                try:
                    item = await asyncio.wait_for(lane.queue.get(), remaining)
                except TimeoutError:
                    break
            else:
                item = lane.queue.get_nowait()
            batch.append(item)
            rows += item.scores.shape[0]
        return batch

    async def _loop(self, lane: _Lane) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._collect(lane)
            groups: dict[int, list[_Pending]] = {}
            for item in batch:  # one run per version: a request never mixes versions
                groups.setdefault(id(item.model), []).append(item)
            for items in groups.values():
                try:
                    outputs = await loop.run_in_executor(lane.executor, _run_group, items)
                except Exception as exc:
                    for item in items:
                        if not item.future.done():
                            item.future.set_exception(exc)
                    continue
                self.metrics.batch_rows.observe(sum(i.scores.shape[0] for i in items))
                for item, result in zip(items, outputs, strict=True):
                    if not item.future.done():
                        item.future.set_result(result)


def _run_group(items: list[_Pending]) -> list[dict[str, np.ndarray]]:
    from onnx_export.runtime import run_host

    session = items[0].model.session
    scores = items[0].scores if len(items) == 1 else np.concatenate([i.scores for i in items])
    # On a CUDA session (--provider cuda) run_host binds the input on the GPU and the
    # outputs to host memory.
    values = run_host(session, scores, list(OUTPUTS))
    results, start = [], 0
    for item in items:
        stop = start + item.scores.shape[0]
        results.append({name: value[start:stop] for name, value in zip(OUTPUTS, values,
                                                                         strict=True)})
        start = stop
    return results


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
    if not 0 <= port <= 65535:
        raise ValueError(f"--port: expected 0..65535, got {port}")
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
    # response, written as headers then body, met Nagle and the client's delayed ACK: every
    # small answer on a keep-alive connection waited ~40 ms (docs/serving.md, issue 43).
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
        from mlflow import MlflowClient

        from flows.serve import access as serve_access

        MlflowClient(tracking_uri).get_registered_model(name)  # a typo fails here, not later
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
        RegistryFollower._log(f"{name}@{alias} on http://{host}:{port} (tracking "
                              f"{redact(tracking_uri)}, polling every {poll_interval:g} s"
                              f"{f', {workers} workers' if workers > 1 else ''})")
        RegistryFollower._log(f"token for POST /monitor/flush"
                              f"{' and /invocations' if require_token else ''}: {access.source}")
        if workers == 1:
            _serve_on(sock, settings, access)
        else:
            _supervise(sock, settings, access, workers)
        RegistryFollower._log("stopped serving")
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
    controller = RolloutController(follower, metrics, load_version, VersionRejected,
                                   OUTPUTS, queue_size) if queue_size else None
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
                    RegistryFollower._log(f"worker {index} exited with {process.returncode}; "
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
