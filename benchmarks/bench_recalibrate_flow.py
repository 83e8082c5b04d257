"""Cold-start cost of one recalibration, and where it goes.

Runs, each in a fresh temporary folder (new embedded MLflow store, Prefect's temporary
server, no PREFECT_API_URL / MLFLOW_TRACKING_URI):

1. ``cord-ops recalibrate --data FILE --calibrator NAME`` as a user would, timing the
   process from start to exit (target: under 60 s for CIFAR-100, 10,000 x 100, VS);
2. the same flow from Python with each task timed, to split the wall time into numeric
   compute, MLflow tracking/registry work, and orchestration (interpreter and imports,
   the Prefect server and engine, store creation).

Prints figures only; nothing is asserted. The process wall is taken by
``flows.reproduce.timing.once`` (a cold start is a single call, no warm-up), the protocol
``cord-ops bench`` uses for its in-process end-to-end flow row.

    python benchmarks/bench_recalibrate_flow.py [--data ../shared/data/cifar100_resnet56.npz]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from flows.reproduce.timing import once

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "cifar100_resnet56.npz"
COMPUTE_STEPS = ("load_dataset", "check_options", "split_dataset", "fit_calibrator", "fit_cord",
                 "evaluate_reports", "export_model", "verify_parity")

INSTRUMENTED = """
import json, sys, time
started = time.perf_counter()
from flows.recalibrate.flow import recalibrate
imported = time.perf_counter()
result = recalibrate(data=sys.argv[1], calibrator=sys.argv[2])
finished = time.perf_counter()
print("BENCH " + json.dumps({"import_s": imported - started, "flow_s": finished - imported,
                             "steps": result.timings}))
"""


def _cold_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI")}
    env.update(MLFLOW_DISABLE_TELEMETRY="true", PREFECT_SERVER_ANALYTICS_ENABLED="false")
    return env


def _timed(command: list[str]) -> tuple[float, str]:
    with tempfile.TemporaryDirectory(prefix="cord-ops-bench-") as cwd:
        env = {**_cold_env(), "PREFECT_HOME": str(Path(cwd) / "prefect-home")}
        timing = once(lambda: subprocess.run(command, cwd=cwd, env=env, capture_output=True,
                                             text=True))
        run, wall = timing.result, timing.best
    if run.returncode != 0:
        sys.exit(f"{command[0]} failed ({run.returncode}):\n{run.stderr[-3000:]}")
    return wall, run.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--calibrator", default="vs")
    args = parser.parse_args()
    data = str(args.data.resolve())

    cli = Path(sys.executable).with_name("cord-ops")
    cli_wall, _ = _timed([str(cli), "recalibrate", "--data", data, "--calibrator",
                          args.calibrator])
    wall, out = _timed([sys.executable, "-c", INSTRUMENTED, data, args.calibrator])
    bench = json.loads(next(line for line in out.splitlines()
                            if line.startswith("BENCH "))[len("BENCH "):])
    steps = bench["steps"]
    compute = sum(steps[s] for s in COMPUTE_STEPS if s in steps)
    tracking = sum(v for s, v in steps.items() if s not in COMPUTE_STEPS)
    orchestration = wall - compute - tracking

    print(f"data: {args.data.name}, calibrator: {args.calibrator}, cores: {os.cpu_count()}")
    print(f"cord-ops recalibrate, cold, process wall: {cli_wall:6.2f} s (target < 60 s)")
    print(f"instrumented run, process wall:          {wall:6.2f} s")
    print(f"  numeric compute (8 tasks):             {compute:6.2f} s")
    print(f"  MLflow tracking + registry (7 tasks):  {tracking:6.2f} s")
    print(f"  orchestration (rest):                  {orchestration:6.2f} s")
    print(f"    of which imports:                    {bench['import_s']:6.2f} s")
    print(f"    flow wall minus its tasks:           "
          f"{bench['flow_s'] - compute - tracking:6.2f} s (Prefect server start, engine)")
    print("per task (s): " + ", ".join(f"{k} {v:.2f}" for k, v in steps.items()))


if __name__ == "__main__":
    main()
