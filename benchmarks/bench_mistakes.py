"""How long an operator's mistake takes to be answered, and how long ``schedule`` takes to
stop, against what the README promises: about a second per mistake and 5 s to stop
(docs/promotion.md).

In a fresh temporary folder (no PREFECT_API_URL, no MLFLOW_TRACKING_URI), two real
recalibrations register model ``m``: v1 temperature scaling fitted on logits three times
too confident and evaluated on logits a third as confident (worse than the uncalibrated
model: the gate's harm, no champion), v2 the digits classifier itself (promoted). Then
each mistake runs as a fresh ``cord-ops`` process, ``--repeats`` times:

- ``rollout start`` without ``--reason``; ``promote --version 7`` (no such version);
  ``rollout start`` of the current champion; ``promote`` of the harmful v1 without
  ``--allow-harm``; ``rollback`` with no earlier champion; ``predict`` of a misspelt alias;
  ``monitor`` of a model without a champion.

For each: the median wall and CPU seconds (the process and its children), the ratio to
``cord-ops --version`` (the interpreter's and the parser's own start-up, measured in the
same run), whether the answer is one ``error:`` line, and whether MLflow, Prefect or onnx
was imported before it (``python -X importtime``). Then ``schedule`` is started (its
managed Prefect server comes up on demand), SIGTERM is sent once it serves, and the time
to its exit is printed (README: within 5 s); the server is stopped after.

Prints figures only; nothing is asserted.

    python benchmarks/bench_mistakes.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STACK = {"mlflow", "prefect", "onnx", "onnxruntime", "skl2onnx", "sqlalchemy"}


def _environment(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI")}
    env.update(MLFLOW_DISABLE_TELEMETRY="true", PREFECT_SERVER_ANALYTICS_ENABLED="false",
               PREFECT_HOME=str(home))
    return env


def _run(argv: list[str], cwd: Path, env: dict[str, str], importtime: bool = False
         ) -> tuple[float, float, int, str, set[str]]:
    """(wall s, CPU s, exit status, stderr without import lines, modules imported)."""
    command = [sys.executable, *(["-X", "importtime"] if importtime else []), "-m",
               "flows.cli.main", *argv]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    imported = {row.rsplit("|", 1)[-1].strip().split(".")[0]
                for row in done.stderr.splitlines() if row.startswith("import time:")}
    err = "\n".join(row for row in done.stderr.splitlines()
                    if not row.startswith("import time:"))
    return wall, cpu, done.returncode, err, imported


def _recalibrate(argv: list[str], cwd: Path, env: dict[str, str]) -> None:
    done = subprocess.run([sys.executable, "-m", "flows.cli.main", "recalibrate", *argv],
                          cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"recalibrate {argv} failed:\n{done.stderr[-3000:]}")


def _build(work: Path, env: dict[str, str]) -> None:
    from cord_ops import data

    digits = data.digits_dataset(0)
    over = data.save_npz(work / "over.npz", digits.scores * 3.0, digits.labels, "logits")
    under = data.save_npz(work / "under.npz", digits.scores * 0.3, digits.labels, "logits")
    good = data.save_npz(work / "digits.npz", digits.scores, digits.labels, "logits")
    _recalibrate(["--data", str(over), "--eval-data", str(under), "--calibrator", "ts",
                  "--model-name", "m"], work, env)
    _recalibrate(["--data", str(over), "--eval-data", str(under), "--calibrator", "ts",
                  "--model-name", "nochamp"], work, env)
    _recalibrate(["--data", str(good), "--model-name", "m"], work, env)


MISTAKES = (
    ("rollout start without --reason", ["rollout", "start", "--model-name", "m",
                                        "--version", "1"]),
    ("promote --version 7 (no such version)", ["promote", "--model-name", "m", "--version",
                                               "7", "--reason", "typo"]),
    ("rollout start of the champion", ["rollout", "start", "--model-name", "m", "--version",
                                       "2", "--reason", "again"]),
    ("promote a harmful version", ["promote", "--model-name", "m", "--version", "1",
                                   "--reason", "try"]),
    ("rollback, no earlier champion", ["rollback", "--model-name", "m"]),
    ("predict of a misspelt alias", ["predict", "--model", "models:/m@champoin", "--input",
                                     "digits.npz", "--output", "out.npz"]),
    ("monitor without a champion", ["monitor", "--model-name", "nochamp", "--data",
                                    "digits.npz"]),
)


def _schedule_stop(work: Path, env: dict[str, str]) -> float:
    """Seconds from SIGTERM to the exit of a serving ``cord-ops schedule``."""
    log = work / "schedule.log"
    with open(log, "w") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "flows.cli.main", "schedule", "--cron", "0 3 1 1 *",
             "--data", "digits.npz", "--model-name", "sched"], cwd=work, env=env,
            stdout=sink, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while "serving until" not in log.read_text():
            if process.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"schedule did not serve:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
        time.sleep(3.0)  # the runner's loop is up
        process.send_signal(signal.SIGTERM)
        signalled = time.perf_counter()
        process.wait(60)
        return time.perf_counter() - signalled
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        subprocess.run([sys.executable, "-m", "flows.cli.main", "server", "stop"], cwd=work,
                       env=env, capture_output=True, text=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-mistakes-") as tmp:
        work = Path(tmp) / "work"
        work.mkdir()
        env = _environment(Path(tmp) / "home")
        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; building the "
              "store (3 recalibrations)...", flush=True)
        _build(work, env)
        reference = statistics.median(_run(["--version"], work, env)[0]
                                      for _ in range(args.repeats))
        print(f"\nreference: cord-ops --version {reference:.2f} s wall (median of "
              f"{args.repeats})\n")
        print(f"{'mistake':<40}{'wall s':>8}{'cpu s':>8}{'x ref':>7}  one error line, "
              "stack imported first")
        for title, argv in MISTAKES:
            runs = [_run(argv, work, env) for _ in range(args.repeats)]
            wall = statistics.median(r[0] for r in runs)
            cpu = statistics.median(r[1] for r in runs)
            _, _, code, err, imported = _run(argv, work, env, importtime=True)
            lines = err.strip().splitlines()
            one = code == 1 and lines and lines[-1].startswith("error: ") and sum(
                line.startswith("error:") for line in lines) == 1
            print(f"{title:<40}{wall:>8.2f}{cpu:>8.2f}{wall / reference:>7.1f}  "
                  f"{'yes' if one else 'NO'}, {', '.join(sorted(imported & STACK)) or 'none'}")
            print(f"    {lines[-1] if lines else '(no output)'}"[:200])
        stop = _schedule_stop(work, env)
        print(f"\nschedule: SIGTERM to exit {stop:.2f} s (README: within 5 s)")
        print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
