"""End-to-end time of ``cord-ops recalibrate`` on the digits demo data, cold and with the
managed Prefect server warm, and where the time goes.

In a fresh temporary folder (no PREFECT_API_URL, no MLFLOW_TRACKING_URI):

1. cold: ``cord-ops recalibrate`` as a new user runs it first: Prefect's temporary server,
   a new MLflow store (schema migrations);
2. ``cord-ops server start`` (timed: what a user pays once; it includes the warm runner
   importing everything, ``flows/platform/warm.py``);
3. warm: ``cord-ops recalibrate`` again, several times: the command checks its inputs and
   hands itself to the warm runner, which forks the work against the managed server and
   the existing store. Target: at most 5 s end to end, and at most 2x the flow's own task
   time (the ``time:`` line the command prints). The CPU figure of a warm run is the
   command process's only: the forked child is the runner's, not the command's;
4. a run instrumented in one interpreter that has not imported anything yet, to show
   what the runner saves: imports, Prefect client set-up, MLflow store opening, the
   flow's tasks and the engine's own overhead;
5. ``cord-ops server stop``.

Prints figures only; nothing is asserted.

    python benchmarks/bench_cli_start.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TIME_LINE = re.compile(r"time:\s+([\d.]+) s total, ([\d.]+) s in flow tasks")

INSTRUMENTED = r"""
import json, sys, time
marks = [("start", time.perf_counter(), time.process_time())]
def mark(name):
    marks.append((name, time.perf_counter(), time.process_time()))
import numpy, scipy.special, sklearn.base
mark("import numerics (numpy, scipy, sklearn)")
import prefect.flows, prefect.settings
mark("import prefect")
import mlflow
mark("import mlflow")
import onnx, onnxruntime
mark("import onnx, onnxruntime")
from flows.recalibrate.flow import recalibrate
mark("import the rest of cord-ops flows")
from prefect.client.orchestration import get_client
from prefect.settings import PREFECT_API_URL, temporary_settings
with temporary_settings(updates={PREFECT_API_URL: sys.argv[2]}):
    with get_client(sync_client=True) as client:
        client.api_healthcheck()
    mark("prefect client + health check")
    from mlflow import MlflowClient
    MlflowClient(sys.argv[3]).search_experiments(max_results=1)
    mark("mlflow store open (sqlalchemy engine)")
    result = recalibrate(data=sys.argv[1], model_name="bench-instrumented",
                         tracking_uri=sys.argv[3])
    mark("flow run")
rows = [(name, wall - marks[i][1], cpu - marks[i][2])
        for i, (name, wall, cpu) in enumerate(marks[1:])]
print("BENCH " + json.dumps({"rows": rows, "tasks": sum(result.timings.values()),
                             "steps": result.timings}))
"""


def _environment(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI")}
    env.update(MLFLOW_DISABLE_TELEMETRY="true", PREFECT_SERVER_ANALYTICS_ENABLED="false",
               PREFECT_HOME=str(home))
    return env


def _run(command: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float, str]:
    """Run ``command``; (wall seconds, CPU seconds of it and its children, stdout)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done.stdout


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

        cold_wall, cold_cpu, out = _run(recal, cwd, env)
        cold_tasks = _task_seconds(out)
        start_wall, _, out = _run([cli, "server", "start"], cwd, env)
        api_url = re.search(r"(http://127\.0\.0\.1:\d+/api)", out).group(1)
        try:
            warm = [_run(recal, cwd, env) for _ in range(args.repeats)]
            uri = f"sqlite:///{cwd / 'mlruns' / 'mlflow.db'}"
            _, _, out = _run([sys.executable, "-c", INSTRUMENTED, str(path), api_url, uri],
                             cwd, env)
        finally:
            _run([cli, "server", "stop"], cwd, env)

    parts = json.loads(next(line for line in out.splitlines()
                            if line.startswith("BENCH "))[len("BENCH "):])
    walls = [wall for wall, _, _ in warm]
    cpus = [cpu for _, cpu, _ in warm]
    tasks = [_task_seconds(text) for _, _, text in warm]
    wall, cpu, task = (statistics.median(v) for v in (walls, cpus, tasks))
    print(f"digits demo data ({digits.n} x {digits.n_classes}), calibrator vs, "
          f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} "
          "(wall times grow with the load; CPU times much less)")
    print(f"cold  recalibrate (temporary Prefect server, new store): wall {cold_wall:6.2f} s, "
          f"CPU {cold_cpu:6.2f} s, flow tasks {cold_tasks:.2f} s")
    print(f"      cord-ops server start (once):                      wall {start_wall:6.2f} s")
    print(f"warm  recalibrate via the warm runner, median of {len(walls)}: wall {wall:6.2f} s, "
          f"command CPU {cpu:5.2f} s, flow tasks {task:.2f} s")
    print(f"      all warm walls: {', '.join(f'{w:.2f}' for w in walls)} s")
    print(f"      target wall <= 5 s: {'met' if wall <= 5 else 'NOT met'}; "
          f"target wall <= 2x tasks ({2 * task:.2f} s): "
          f"{'met' if wall <= 2 * task else 'NOT met'} (ratio {wall / task:.2f})")
    print("where an in-process run's time goes (one instrumented interpreter, wall / CPU;"
          " the warm runner has paid the imports and the store modules already):")
    for name, part_wall, part_cpu in parts["rows"]:
        print(f"  {name:<40} {part_wall:6.2f} s / {part_cpu:6.2f} s")
    print(f"  {'of the flow run: its tasks':<40} {parts['tasks']:6.2f} s")
    print("  per task: " + ", ".join(f"{k} {v:.2f}" for k, v in parts["steps"].items()))


if __name__ == "__main__":
    main()
