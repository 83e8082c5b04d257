"""Run ``cord-ops`` command lines as concurrent processes, forked from one interpreter
that has imported MLflow, Prefect, onnxruntime and cord-ops once.

A ``cord-ops`` process spends seconds importing before it does anything; on the two
cores of CI, a dozen of them would spend most of the registry tests' time there. Forked
children are ordinary separate processes (own pid, own sqlite connections, own Prefect
client, killed by SIGKILL like any other) that skip the imports. Nothing that opens a
connection or starts a thread runs before the fork.

Usage: ``python launcher.py PHASES.json`` where the file holds a list of phases; each phase
is a list of ``{"argv": [...], "cwd": ..., "log": ..., "env": {...}, "finalize_kill":
bool}``. The phases run one after another, the processes of a phase concurrently. Prints
``[[[exit code, ended], ...], ...]`` as JSON: a signal is a negative code, as
``subprocess`` has it; ``ended`` is the wall-clock time the process was reaped.
``finalize_kill`` kills the child the moment MLflow would mark its logged model READY:
the one window of the flow inside MLflow, which ``CORD_OPS_TEST_KILL_AT`` cannot reach.
``survivors`` (a path): the processes whose environment holds the child's owner marker
(``CORD_OPS_OWNER`` = its pid: what the command started) are listed every half second
while it runs (``seen``) and ``settle`` seconds (default 3) after it was reaped (``left``),
and written there as JSON ``{"seen": [...], "left": [...]}`` of ``{"pid", "cmdline"}``.
"""

import json
import os
import signal
import sys
import time

import mlflow  # noqa: F401 - imported before the fork, on purpose
import mlflow.onnx  # noqa: F401
import onnxruntime  # noqa: F401
import prefect  # noqa: F401
import psutil

import flows.cli.main
import flows.recalibration.flow  # noqa: F401


def _child(spec: dict) -> None:
    os.chdir(spec["cwd"])
    fd = os.open(spec["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.environ.update(spec.get("env", {}))
    if spec.get("finalize_kill"):
        # flows.registry.tracking.log_model marks the model READY through the client it was given;
        # dying there leaves the logged model PENDING with its run still RUNNING.
        finalize = mlflow.MlflowClient.finalize_logged_model

        def killed(self, model_id, status, *args, **kwargs):
            from mlflow.entities import LoggedModelStatus

            if status in (LoggedModelStatus.READY, "READY"):
                os.kill(os.getpid(), signal.SIGKILL)
            return finalize(self, model_id, status, *args, **kwargs)
        mlflow.MlflowClient.finalize_logged_model = killed
    code = 1
    try:
        code = flows.cli.main.main(spec["argv"], owns_process=True)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _marked(owner: str) -> list[dict]:
    """Live processes whose environment carries the owner marker ``owner``."""
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        try:
            if (process.info["status"] != psutil.STATUS_ZOMBIE
                    and process.environ().get("CORD_OPS_OWNER") == owner):
                found.append({"pid": process.pid, "cmdline": process.info["cmdline"]})
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def _run_phase(phase: list[dict]) -> list:
    children = {}
    for index, spec in enumerate(phase):
        pid = os.fork()
        if pid == 0:
            _child(spec)
        children[pid] = index
    pids = {index: pid for pid, index in children.items()}
    codes = [None] * len(phase)
    watched = [i for i, spec in enumerate(phase) if spec.get("survivors")]
    seen = {index: {} for index in watched}
    checks = []  # (due, index): survivor listings still to take
    next_look = 0.0
    while None in codes or checks:
        pid, status = os.waitpid(-1, os.WNOHANG) if None in codes else (0, 0)
        if pid:
            index = children[pid]
            codes[index] = [os.waitstatus_to_exitcode(status), time.time()]
            if index in seen:
                checks.append((time.monotonic() + phase[index].get("settle", 3.0), index))
            continue
        now = time.monotonic()
        if now >= next_look:
            next_look = now + 0.5
            for index in (i for i in watched if codes[i] is None):
                seen[index].update({p["pid"]: p for p in _marked(str(pids[index]))})
        for due, index in [c for c in checks if c[0] <= now]:
            checks.remove((due, index))
            with open(phase[index]["survivors"], "w") as handle:
                json.dump({"seen": list(seen[index].values()),
                           "left": _marked(str(pids[index]))}, handle)
        time.sleep(0.05)
    return codes


def main() -> None:
    with open(sys.argv[1]) as handle:
        phases = json.load(handle)
    print(json.dumps([_run_phase(phase) for phase in phases]))


if __name__ == "__main__":
    main()
