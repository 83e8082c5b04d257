"""HTTP scoring throughput and latency: ``cord-ops serve`` against the floor of its own stack.

    nice python benchmarks/bench_serve.py [--seconds 4] [--clients 1 10] [--rows 1 100]
                                          [--rounds 2] [--mlflow]

Builds a throw-away MLflow store in a temp folder, registers one model (VS + CORD, K = 100,
float32 graph, the pyfunc flavour of ``flows.pyfunc_model``) and saves the same graph to a
file. Starts, as subprocesses on free ports of 127.0.0.1:

- ``cord-ops serve`` following ``@champion``;
- the *minimal scorer*: this file run with ``--minimal-scorer``, about 30 lines of
  starlette + uvicorn + orjson + onnxruntime on the same graph file with no validation, no
  batching, no metrics: the floor this stack reaches on this machine;
- with ``--mlflow``, ``mlflow models serve`` on the registered model as well.

For every (rows per request, clients) cell it keeps that many concurrent aiohttp clients
(one keep-alive connection each) posting the same ``inputs`` payload, in ``--rounds``
rounds that alternate the servers (so a change of machine load hits both alike), each
round ``--seconds / --rounds`` after a short warm-up. Prints per server and cell requests/s,
rows/s, p50 and p99 latency, errors and the load average at the end of the cell, then
cord-ops serve's ratios to the minimal scorer taken in the same run: requests/s (target
>= 0.7x), p50 and p99 (target <= 1.5x). The load generator shares the machine with the
servers (alike for all).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

K = 100
MODEL = "bench-serve"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def register_model(uri: str, artifacts: Path, graph_file: Path | None = None) -> np.ndarray:
    """Fit VS + CORD on synthetic K = 100 logits, log and register it as @champion (and
    save its graph to ``graph_file``); returns rows to send."""
    from mlflow import MlflowClient
    from scipy.special import softmax

    from cord_ops import CORD
    from cord_ops.calibrators import make_calibrator
    from flows import pyfunc_model
    from flows.store import graphs, registry
    from onnx_export import export_onnx

    rng = np.random.default_rng(0)
    labels = rng.integers(0, K, 3000)
    logits = rng.normal(0.0, 2.0, (3000, K))
    logits[np.arange(3000), labels] += rng.uniform(2.0, 9.0, 3000)
    calibrator = make_calibrator("vs", max_iter=100).fit(logits, labels)
    cord = CORD().fit(softmax(logits, axis=1), calibrator.predict_proba(logits))
    graph = export_onnx(calibrator, cord, K, input_kind="logits", dtype="float32")
    if graph_file is not None:
        graph_file.write_bytes(graph.SerializeToString())
    client = MlflowClient(uri)
    # An explicit artifact folder: a fresh sqlite store would put them under ./mlruns.
    experiment = client.create_experiment(MODEL, artifact_location=artifacts.as_uri())
    run_id = client.create_run(experiment).info.run_id
    client.log_dict(run_id, calibrator.to_dict(), "state/calibrator.json")
    client.log_dict(run_id, cord.to_dict(), "state/cord.json")
    info = pyfunc_model.log_model(client, run_id, experiment, graph,
                                  logits[:5].astype(np.float32))
    # the digest manifest a recalibration records: serve checks the graph against it
    with tempfile.TemporaryDirectory() as scratch:
        graphs.record_digests(client, uri, run_id, info.model_uri, graph, {},
                              Path(scratch))
    registry.ensure_registered_model(client, MODEL)
    version = client.create_model_version(MODEL, source=info.model_uri, run_id=run_id,
                                          model_id=info.model_id)
    client.set_registered_model_alias(MODEL, registry.CHAMPION, version.version)
    return logits[:100]


def minimal_scorer(graph: str, port: int) -> None:
    """The floor: one onnxruntime session on ``graph``, orjson in and out, nothing else."""
    import onnxruntime as ort
    import orjson
    import uvicorn
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route

    session = ort.InferenceSession(graph, providers=["CPUExecutionProvider"])
    name, dtype = session.get_inputs()[0].name, np.float32
    outputs = ["repaired", "label", "confidence"]

    async def invocations(request):
        scores = np.asarray(orjson.loads(await request.body())["inputs"], dtype=dtype)
        values = session.run(outputs, {name: scores})
        return Response(orjson.dumps({"predictions": dict(zip(outputs, values, strict=True))},
                                     option=orjson.OPT_SERIALIZE_NUMPY),
                        media_type="application/json")

    async def health(request):
        return Response(b"ok")

    app = Starlette(routes=[Route("/invocations", invocations, methods=["POST"]),
                            Route("/health", health)])
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


def wait_ready(url: str, process: subprocess.Popen, timeout: float = 180.0) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{url}: server exited with {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{url}: not ready after {timeout} s")


async def load(url: str, body: bytes, clients: int, seconds: float, warmup: float,
               keyed: bool = False, refused: list | None = None):
    """(latencies of requests completed in the measured window, errors, window seconds).
    ``refused``: a list that gets one entry per 503 answer in the window (not an error:
    an overloaded server's refusal), which is then not waited on again at once.
    ``keyed``: every request carries its own ``X-Rollout-Key`` (benchmarks/bench_rollout.py),
    so a canary answers its share of requests rather than of clients."""
    import aiohttp

    latencies: list[float] = []
    errors = 0
    start = time.perf_counter()
    measure_from, stop_at = start + warmup, start + warmup + seconds

    sent_count = 0

    async def client(session) -> None:
        nonlocal errors, sent_count
        while True:
            sent = time.perf_counter()
            if sent >= stop_at:
                return
            headers = {"content-type": "application/json"}
            if keyed:
                sent_count += 1
                headers["X-Rollout-Key"] = f"request-{sent_count}"
            async with session.post(url, data=body, headers=headers) as response:
                await response.read()
                status = response.status
            done = time.perf_counter()
            if sent >= measure_from:
                if status == 200:
                    latencies.append(done - sent)
                elif status == 503 and refused is not None:
                    refused.append(done - sent)
                else:
                    errors += 1
            if status == 503 and refused is not None:
                await asyncio.sleep(0.001)  # a real client backs off; 1 ms keeps the pressure

    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(client(session) for _ in range(clients)))
    return latencies, errors, seconds


def summarise(latencies: list[float], errors: int, window: float, rows: int) -> dict:
    lat = np.asarray(latencies) * 1e3
    return {"rps": len(lat) / window, "rows_s": len(lat) * rows / window,
            "p50": float(np.percentile(lat, 50)) if lat.size else float("nan"),
            "p99": float(np.percentile(lat, 99)) if lat.size else float("nan"),
            "errors": errors, "load": os.getloadavg()[0]}


def measure(url: str, rows: np.ndarray, clients: int, seconds: float,
            keyed: bool = False) -> dict:
    body = json.dumps({"inputs": rows.tolist()}).encode()
    latencies, errors, window = asyncio.run(load(url, body, clients, seconds,
                                                 warmup=min(1.0, seconds / 4), keyed=keyed))
    return summarise(latencies, errors, window, rows.shape[0])


def measure_alternating(urls: dict[str, str], rows: np.ndarray, clients: int, seconds: float,
                        rounds: int) -> dict[str, dict]:
    """``measure`` per server, in ``rounds`` rounds whose order alternates; latencies of all
    rounds pooled."""
    body = json.dumps({"inputs": rows.tolist()}).encode()
    pooled = {name: ([], 0, 0.0) for name in urls}
    names = list(urls)
    for round_ in range(rounds):
        for name in names if round_ % 2 == 0 else names[::-1]:
            latencies, errors, window = asyncio.run(load(
                urls[name], body, clients, seconds / rounds,
                warmup=min(0.5, seconds / rounds / 4)))
            kept, failed, span = pooled[name]
            pooled[name] = (kept + latencies, failed + errors, span + window)
    return {name: summarise(lat, errors, window, rows.shape[0])
            for name, (lat, errors, window) in pooled.items()}


def start(command: list[str], env: dict, log: Path) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(15)


SERVE, FLOOR, MLFLOW = "cord-ops serve", "minimal scorer", "mlflow models serve"


def peak_rss_mib(pid: int) -> float:
    """The process's peak resident set (VmHWM), MiB; nan where /proc has no such field."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def overload(url: str, rows: np.ndarray, clients: int, seconds: float, pid: int) -> dict:
    """``clients`` one-row clients against serve's admission limit: admitted requests/s and
    p99, the share answered 503, timeouts/errors, serve's peak RSS before and after."""
    body = json.dumps({"inputs": rows.tolist()}).encode()
    rss_before = peak_rss_mib(pid)
    refused: list[float] = []
    latencies, errors, window = asyncio.run(load(url, body, clients, seconds, warmup=1.0,
                                                 refused=refused))
    figures = summarise(latencies, errors, window, rows.shape[0])
    answered = len(latencies) + len(refused)
    figures.update(refused_share=len(refused) / max(answered, 1),
                   refused_p99=float(np.percentile(np.asarray(refused) * 1e3, 99))
                   if refused else float("nan"),
                   rss_before=rss_before, rss_after=peak_rss_mib(pid))
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.0, help="measured seconds per cell "
                        "and server, over all rounds")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 10])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 100])
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds per cell")
    parser.add_argument("--mlflow", action="store_true", help="also mlflow models serve")
    parser.add_argument("--overload", type=int, default=256, metavar="CLIENTS",
                        help="one-row clients of the overload cell (0: none)")
    parser.add_argument("--serve-args", nargs=argparse.REMAINDER, default=[],
                        help="further options of cord-ops serve (last on the line)")
    parser.add_argument("--minimal-scorer", metavar="GRAPH", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.minimal_scorer:
        minimal_scorer(args.minimal_scorer, args.port)
        return 0

    bin_dir = Path(sys.executable).parent
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        uri = f"sqlite:///{tmp}/mlflow.db"
        env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "MLFLOW_DISABLE_TELEMETRY": "true",
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                           os.environ.get("PYTHONPATH")]))}
        os.environ.update({"MLFLOW_TRACKING_URI": uri, "MLFLOW_DISABLE_TELEMETRY": "true"})
        graph = Path(tmp) / "graph.onnx"
        pool = register_model(uri, Path(tmp) / "artifacts", graph)
        servers = [SERVE, FLOOR] + ([MLFLOW] if args.mlflow else [])
        ports = {name: free_port() for name in servers}
        commands = {
            SERVE: [str(bin_dir / "cord-ops"), "serve", "--model-name", MODEL,
                    "--port", str(ports[SERVE]), *args.serve_args],
            FLOOR: [sys.executable, __file__, "--minimal-scorer", str(graph),
                    "--port", str(ports[FLOOR])],
            MLFLOW: [str(bin_dir / "mlflow"), "models", "serve", "-m",
                     f"models:/{MODEL}@champion", "--env-manager", "local",
                     "--host", "127.0.0.1", "--port", str(ports.get(MLFLOW, 0))],
        }
        ready = {SERVE: "/health", FLOOR: "/health", MLFLOW: "/ping"}
        processes = {}
        results: dict[tuple[str, int, int], dict] = {}
        try:
            for name in servers:
                processes[name] = start(commands[name], env,
                                        Path(tmp) / f"{name.split()[0]}.log")
            urls = {name: f"http://127.0.0.1:{ports[name]}" for name in servers}
            for name in servers:
                wait_ready(urls[name] + ready[name], processes[name])
            for rows in args.rows:
                for clients in args.clients:
                    cell = measure_alternating({n: u + "/invocations" for n, u in urls.items()},
                                               pool[:rows], clients, args.seconds, args.rounds)
                    for name, figures in cell.items():
                        results[name, clients, rows] = figures
            crowd = overload(urls[SERVE] + "/invocations", pool[:1], args.overload,
                             args.seconds, processes[SERVE].pid) if args.overload else None
        finally:
            for process in processes.values():
                stop(process)

    print(f"HTTP scoring, K = {K}, VS + CORD float32, {os.cpu_count()} CPUs, "
          f"{args.seconds:g} s per cell and server in {args.rounds} alternating rounds; "
          f"serve options: {' '.join(args.serve_args) or 'defaults'}")
    header = (f"{'server':<20}{'rows/req':>9}{'clients':>8}{'req/s':>9}{'rows/s':>10}"
              f"{'p50 ms':>9}{'p99 ms':>9}{'errors':>7}{'load':>6}")
    print(header)
    print("-" * len(header))
    for (name, clients, rows), r in sorted(results.items(),
                                           key=lambda x: (x[0][2], x[0][1], x[0][0])):
        print(f"{name:<20}{rows:>9}{clients:>8}{r['rps']:>9.0f}{r['rows_s']:>10.0f}"
              f"{r['p50']:>9.2f}{r['p99']:>9.2f}{r['errors']:>7}{r['load']:>6.1f}")
    print()
    print("cord-ops serve / minimal scorer (targets: req/s >= 0.7x, p50 and p99 <= 1.5x)")
    print(f"{'rows/req':>9}{'clients':>8}{'req/s':>8}{'p50':>8}{'p99':>8}{'load':>6}")
    for rows in args.rows:
        for clients in args.clients:
            ours, floor = results[SERVE, clients, rows], results[FLOOR, clients, rows]
            print(f"{rows:>9}{clients:>8}{ours['rps'] / max(floor['rps'], 1e-9):>7.2f}x"
                  f"{ours['p50'] / floor['p50']:>7.2f}x{ours['p99'] / floor['p99']:>7.2f}x"
                  f"{ours['load']:>6.1f}")
    if crowd is not None:
        print()
        print(f"overload: {args.overload} one-row clients on cord-ops serve for "
              f"{args.seconds:g} s: admitted {crowd['rps']:.0f} req/s, p50 "
              f"{crowd['p50']:.2f} ms, p99 {crowd['p99']:.2f} ms; 503 share "
              f"{crowd['refused_share']:.1%} (p99 {crowd['refused_p99']:.2f} ms); other "
              f"errors {crowd['errors']}; serve peak RSS {crowd['rss_before']:.0f} -> "
              f"{crowd['rss_after']:.0f} MiB; load {crowd['load']:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
