"""Registry integrity figures: what the registry lock costs, how fast a dead store fails a
command, and what serialising the registry section costs 4 concurrent recalibrations.

    python benchmarks/bench_registry.py            # all three (a few minutes on 2 cores)
    python benchmarks/bench_registry.py --quick    # lock overhead and dead store only

Prints:

- lock overhead: acquire + publish holder + release of the registry lock, uncontended,
  per kind (``file`` always; ``prefect`` against a temporary Prefect server; ``lease``
  is not measured here, it needs a tracking server, and costs at least its settle delay
  of ``flows.store.lock.LEASE_SETTLE`` seconds by design);
- time to fail: wall time of ``cord-ops recalibrate`` against a tracking URI nobody
  listens on (the bound is ``--store-timeout``, default 60 s);
- 4 concurrent vs 4 serial: wall time of four ``cord-ops recalibrate`` processes (ts, vs,
  ms, svs on the digits logits, one model) started together on a fresh embedded store,
  against the same four one after another on another fresh store.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CALIBRATORS = ("ts", "vs", "ms", "svs")


def _env(**extra) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    env.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    return {**env, **extra}


def lock_overhead(kind: str, repeats: int, folder: Path) -> list[float]:
    from flows.store import lock, owner

    log = logging.getLogger("bench")
    holder = {"run_id": "bench", **owner.Owner.current().record()}
    client = None
    if kind == "prefect":
        from mlflow import MlflowClient

        from flows.store import registry

        client = MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
        registry.ensure_registered_model(client, "bench")
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        with lock.registry_lock(kind, "bench", 30, log, holder, client=client,
                                store_folder=folder):
            pass
        times.append(time.perf_counter() - start)
    return times[1:]  # the first pays the imports


def _cli(args: list[str], cwd: Path, env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "flows.cli.main", *args], cwd=cwd, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def time_to_fail(data: Path, folder: Path) -> tuple[float, int, str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = _env(MLFLOW_TRACKING_URI=f"http://127.0.0.1:{port}")
    start = time.perf_counter()
    process = _cli(["recalibrate", "--data", str(data), "--calibrator", "ts"], folder, env)
    _, err = process.communicate(timeout=600)
    lines = [x for x in err.splitlines() if x.startswith("error:")]
    return time.perf_counter() - start, process.returncode, lines[-1] if lines else ""


def four_runs(data: Path, folder: Path, concurrent: bool, env: dict) -> tuple[float, list[int]]:
    folder.mkdir()
    start = time.perf_counter()
    codes = []
    if concurrent:
        processes = [_cli(["recalibrate", "--data", str(data), "--calibrator", c,
                           "--model-name", "bench"], folder, env) for c in CALIBRATORS]
        for process in processes:
            process.communicate(timeout=900)
            codes.append(process.returncode)
    else:
        for c in CALIBRATORS:
            process = _cli(["recalibrate", "--data", str(data), "--calibrator", c,
                            "--model-name", "bench"], folder, env)
            process.communicate(timeout=900)
            codes.append(process.returncode)
    return time.perf_counter() - start, codes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="skip the 4-vs-4 comparison")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

    from cord_ops import data as cord_data
    from flows.platform import temporary_server
    with tempfile.TemporaryDirectory(prefix="bench-registry-") as tmp:
        root = Path(tmp)
        digits = cord_data.digits_dataset(0)
        data = cord_data.save_npz(root / "digits.npz", digits.scores, digits.labels, "logits")

        with temporary_server.temporary_api() as configured:
            from prefect.settings import PREFECT_API_URL

            api = configured or PREFECT_API_URL.value()
            for kind in ("file", "prefect"):
                folder = root / f"lock-{kind}"
                folder.mkdir()
                times = lock_overhead(kind, args.repeats, folder)
                print(f"lock overhead ({kind:7s}): median {statistics.median(times) * 1e3:7.1f} ms,"
                      f" max {max(times) * 1e3:7.1f} ms over {len(times)} uncontended "
                      "acquire/release (target < 100 ms)", flush=True)

            seconds, code, line = time_to_fail(data, root)
            print(f"time to fail, dead store: {seconds:.1f} s (exit {code}; target < 60 s): {line}",
                  flush=True)

            if not args.quick:
                env = _env(PREFECT_API_URL=api)
                serial, serial_codes = four_runs(data, root / "serial", False, env)
                parallel, parallel_codes = four_runs(data, root / "concurrent", True, env)
                print(f"4 recalibrations, one model: serial {serial:.1f} s {serial_codes}, "
                      f"concurrent {parallel:.1f} s {parallel_codes} "
                      f"(concurrent / serial = {parallel / serial:.2f}; {os.cpu_count()} cores)",
                      flush=True)


if __name__ == "__main__":
    main()
