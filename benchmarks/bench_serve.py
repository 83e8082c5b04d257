"""HTTP scoring throughput and latency: ``cord-ops serve`` next to ``mlflow models serve``
on the same registered model (VS + CORD, K = 100, float32), both on this machine.

    python benchmarks/bench_serve.py [--seconds 4] [--clients 1 8 64] [--rows 1 100]

Builds a throw-away MLflow store in a temp folder, registers one model with the pyfunc
flavour of ``flows.pyfunc_model`` (the registered model of a recalibration), starts both
servers as subprocesses on free ports of 127.0.0.1, and for every (clients, rows per
request) cell keeps that many concurrent aiohttp clients posting the same ``inputs``
payload for ``--seconds`` after a short warm-up. Prints requests/s, rows/s, p50 and p99
latency and errors per cell, and the cord-ops / MLflow throughput ratio. The load
generator shares the machine with the server under test (the same for both servers).
Target: cord-ops serve >= 2x MLflow's requests/s at 8+ clients, with a lower p99.
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


def register_model(uri: str, artifacts: Path) -> np.ndarray:
    """Fit VS + CORD on synthetic K = 100 logits, log and register it as @champion;
    returns rows to send."""
    from mlflow import MlflowClient
    from scipy.special import softmax

    from cord_ops import CORD
    from cord_ops.calibrators import make_calibrator
    from flows import pyfunc_model
    from flows.registry import versions as registry
    from onnx_export import export_onnx

    rng = np.random.default_rng(0)
    labels = rng.integers(0, K, 3000)
    logits = rng.normal(0.0, 2.0, (3000, K))
    logits[np.arange(3000), labels] += rng.uniform(2.0, 9.0, 3000)
    calibrator = make_calibrator("vs", max_iter=100).fit(logits, labels)
    cord = CORD().fit(softmax(logits, axis=1), calibrator.predict_proba(logits))
    graph = export_onnx(calibrator, cord, K, input_kind="logits", dtype="float32")
    client = MlflowClient(uri)
    # An explicit artifact folder: a fresh sqlite store would put them under ./mlruns.
    experiment = client.create_experiment(MODEL, artifact_location=artifacts.as_uri())
    run_id = client.create_run(experiment).info.run_id
    client.log_dict(run_id, calibrator.to_dict(), "state/calibrator.json")
    client.log_dict(run_id, cord.to_dict(), "state/cord.json")
    info = pyfunc_model.log_model(client, run_id, experiment, graph,
                                  logits[:5].astype(np.float32))
    registry.ensure_registered_model(client, MODEL)
    version = client.create_model_version(MODEL, source=info.model_uri, run_id=run_id,
                                          model_id=info.model_id)
    client.set_registered_model_alias(MODEL, registry.CHAMPION, version.version)
    return logits[:100]


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
               keyed: bool = False):
    """(latencies of requests completed in the measured window, errors, window seconds).
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
                ok = response.status == 200
            done = time.perf_counter()
            if sent >= measure_from:
                if ok:
                    latencies.append(done - sent)
                else:
                    errors += 1

    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(client(session) for _ in range(clients)))
    return latencies, errors, seconds


def measure(url: str, rows: np.ndarray, clients: int, seconds: float,
            keyed: bool = False) -> dict:
    body = json.dumps({"inputs": rows.tolist()}).encode()
    latencies, errors, window = asyncio.run(load(url, body, clients, seconds,
                                                 warmup=min(1.0, seconds / 4), keyed=keyed))
    lat = np.asarray(latencies) * 1e3
    return {"rps": len(lat) / window, "rows_s": len(lat) * rows.shape[0] / window,
            "p50": float(np.percentile(lat, 50)) if lat.size else float("nan"),
            "p99": float(np.percentile(lat, 99)) if lat.size else float("nan"),
            "errors": errors}


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.0, help="measured seconds per cell")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 100])
    args = parser.parse_args()

    bin_dir = Path(sys.executable).parent
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        uri = f"sqlite:///{tmp}/mlflow.db"
        env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "MLFLOW_DISABLE_TELEMETRY": "true",
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                           os.environ.get("PYTHONPATH")]))}
        os.environ.update({"MLFLOW_TRACKING_URI": uri, "MLFLOW_DISABLE_TELEMETRY": "true"})
        pool = register_model(uri, Path(tmp) / "artifacts")
        ports = {"cord-ops serve": free_port(), "mlflow models serve": free_port()}
        commands = {
            "cord-ops serve": [str(bin_dir / "cord-ops"), "serve", "--model-name", MODEL,
                               "--port", str(ports["cord-ops serve"])],
            "mlflow models serve": [str(bin_dir / "mlflow"), "models", "serve", "-m",
                                    f"models:/{MODEL}@champion", "--env-manager", "local",
                                    "--host", "127.0.0.1", "--port",
                                    str(ports["mlflow models serve"])],
        }
        ready = {"cord-ops serve": "/health", "mlflow models serve": "/ping"}
        results: dict[tuple[str, int, int], dict] = {}
        for name, command in commands.items():
            process = start(command, env, Path(tmp) / f"{name.split()[0]}.log")
            try:
                base = f"http://127.0.0.1:{ports[name]}"
                wait_ready(base + ready[name], process)
                for rows in args.rows:
                    for clients in args.clients:
                        results[name, clients, rows] = measure(
                            f"{base}/invocations", pool[:rows], clients, args.seconds)
            finally:
                stop(process)

    print(f"HTTP scoring, K = {K}, VS + CORD float32, {os.cpu_count()} CPUs, "
          f"{args.seconds:g} s per cell")
    header = (f"{'server':<20}{'rows/req':>9}{'clients':>8}{'req/s':>9}{'rows/s':>10}"
              f"{'p50 ms':>9}{'p99 ms':>9}{'errors':>7}")
    print(header)
    print("-" * len(header))
    for (name, clients, rows), r in sorted(results.items(), key=lambda x: (x[0][2], x[0][1],
                                                                         x[0][0])):
        print(f"{name:<20}{rows:>9}{clients:>8}{r['rps']:>9.0f}{r['rows_s']:>10.0f}"
              f"{r['p50']:>9.2f}{r['p99']:>9.2f}{r['errors']:>7}")
    print()
    print(f"{'rows/req':>9}{'clients':>8}{'throughput ratio':>18}{'p99 ratio':>11}")
    for rows in args.rows:
        for clients in args.clients:
            ours, theirs = results["cord-ops serve", clients, rows], \
                results["mlflow models serve", clients, rows]
            print(f"{rows:>9}{clients:>8}{ours['rps'] / max(theirs['rps'], 1e-9):>17.2f}x"
                  f"{ours['p99'] / theirs['p99']:>10.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
