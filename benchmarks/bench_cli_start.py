"""End-to-end time of ``cord-ops recalibrate`` on the digits demo data, cold and with the
managed Prefect server warm, and where the time goes.

In a fresh temporary folder (no PREFECT_API_URL, no MLFLOW_TRACKING_URI):

1. cold: ``cord-ops recalibrate`` as a new user runs it first: Prefect's temporary server,
   a new MLflow store (schema migrations);
2. ``cord-ops server start`` (timed: what a user pays once);
3. warm: ``cord-ops recalibrate`` again, several times, against the managed server and
   the existing store. Target: at most 5 s end to end, and at most 2x the flow's own task
   time (the ``time:`` line the command prints);
4. the same warm run instrumented in one interpreter, to split the wall time into
   imports, Prefect client set-up, MLflow store opening, the flow's tasks and the
   engine's own overhead;
5. ``cord-ops server stop``.

Prints figures only; nothing is asserted.

    python benchmarks/bench_cli_start.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TIME_LINE = re.compile(r"time:\s+([\d.]+) s total, ([\d.]+) s in flow tasks")

INSTRUMENTED = r"""
import json, sys, time
t0 = time.perf_counter()
import numpy, scipy.special, sklearn.base                     # numerics
t1 = time.perf_counter()
import prefect.flows, prefect.settings                        # Prefect
t2 = time.perf_counter()
import mlflow                                                 # MLflow
t3 = time.perf_counter()
import onnx, onnxruntime                                      # ONNX
t4 = time.perf_counter()
from flows.recalibrate import recalibrate                     # the rest of cord-ops
t5 = time.perf_counter()
from prefect.client.orchestration import get_client
from prefect.settings import PREFECT_API_URL, temporary_settings
with temporary_settings(updates={PREFECT_API_URL: sys.argv[2]}):
    with get_client(sync_client=True) as client:
        client.api_healthcheck()
    t6 = time.perf_counter()
    from mlflow import MlflowClient
    MlflowClient(sys.argv[3]).search_experiments(max_results=1)
    t7 = time.perf_counter()
    result = recalibrate(data=sys.argv[1], model_name="bench-instrumented",
                         tracking_uri=sys.argv[3])
    t8 = time.perf_counter()
print("BENCH " + json.dumps({
    "import numerics": t1 - t0, "import prefect": t2 - t1, "import mlflow": t3 - t2,
    "import onnx": t4 - t3, "import cord-ops flows": t5 - t4,
    "prefect client + health check": t6 - t5, "mlflow store open": t7 - t6,
    "flow wall": t8 - t7, "flow tasks": sum(result.timings.values()),
    "steps": result.timings}))
"""


def _environment(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI")}
    env.update(MLFLOW_DISABLE_TELEMETRY="true", PREFECT_SERVER_ANALYTICS_ENABLED="false",
               PREFECT_HOME=str(home))
    return env


def _run(command: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return wall, done.stdout


def _task_seconds(stdout: str) -> float:
    found = TIME_LINE.search(stdout)
    if found is None:
        sys.exit(f"no 'time:' line in the output:\n{stdout[-2000:]}")
    return float(found.group(2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="warm runs (default 3)")
    args = parser.parse_args()
    cli = str(Path(sys.executable).with_name("cord-ops"))

    from cord_ops import data

    with tempfile.TemporaryDirectory(prefix="cord-ops-bench-start-") as tmp:
        cwd = Path(tmp) / "work"
        cwd.mkdir()
        env = _environment(Path(tmp) / "prefect-home")
        digits = data.digits_dataset(0)
        path = data.save_npz(cwd / "digits.npz", digits.scores, digits.labels, "logits")
        recal = [cli, "recalibrate", "--data", str(path)]

        cold_wall, out = _run(recal, cwd, env)
        cold_tasks = _task_seconds(out)
        start_wall, out = _run([cli, "server", "start"], cwd, env)
        api_url = re.search(r"(http://127\.0\.0\.1:\d+/api)", out).group(1)
        try:
            warm = [_run(recal, cwd, env) for _ in range(args.repeats)]
            warm_walls = [wall for wall, _ in warm]
            warm_tasks = [_task_seconds(out) for _, out in warm]
            uri = f"sqlite:///{cwd / 'mlruns' / 'mlflow.db'}"
            _, out = _run([sys.executable, "-c", INSTRUMENTED, str(path), api_url, uri],
                          cwd, env)
        finally:
            _run([cli, "server", "stop"], cwd, env)

    import json

    parts = json.loads(next(line for line in out.splitlines()
                            if line.startswith("BENCH "))[len("BENCH "):])
    wall = statistics.median(warm_walls)
    tasks = statistics.median(warm_tasks)
    print(f"digits demo data ({digits.n} x {digits.n_classes}), calibrator vs, "
          f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    print(f"cold  cord-ops recalibrate (temporary Prefect server, new store): {cold_wall:6.2f} s "
          f"(flow tasks {cold_tasks:.2f} s)")
    print(f"      cord-ops server start (once):                              {start_wall:6.2f} s")
    print(f"warm  cord-ops recalibrate, median of {len(warm_walls)} "
          f"({', '.join(f'{w:.2f}' for w in warm_walls)}): {wall:6.2f} s "
          f"(flow tasks {tasks:.2f} s)")
    print(f"      target <= 5 s: {'met' if wall <= 5 else 'NOT met'}; "
          f"target <= 2x tasks ({2 * tasks:.2f} s): {'met' if wall <= 2 * tasks else 'NOT met'}"
          f" (ratio {wall / tasks:.2f})")
    print("where a warm run's time goes (one instrumented interpreter):")
    for key, value in parts.items():
        if key != "steps":
            print(f"  {key:<32} {value:6.2f} s")
    print("  engine overhead (flow wall - tasks) "
          f"{parts['flow wall'] - parts['flow tasks']:6.2f} s")
    print("  per task: " + ", ".join(f"{k} {v:.2f}" for k, v in parts["steps"].items()))


if __name__ == "__main__":
    main()
