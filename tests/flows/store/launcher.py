"""Run ``cord-ops`` command lines as concurrent processes, forked from one interpreter
that has imported MLflow, Prefect, onnxruntime and cord-ops once.

A ``cord-ops`` process spends seconds importing before it does anything; on the two
cores of CI, a dozen of them would spend most of the registry tests' time there. Forked
children are ordinary separate processes (own pid, own sqlite connections, own Prefect
client, killed by SIGKILL like any other) that skip the imports. Nothing that opens a
connection or starts a thread runs before the fork.

Usage: ``python launcher.py PHASES.json`` where the file holds a list of phases; each phase
is a list of ``{"argv": [...], "cwd": ..., "log": ..., "env": {...}, "finalize_kill":
bool}``. The phases run one after another, the processes of a phase concurrently. A phase
may instead be ``{"processes": [...], "after": PATH, "done": PATH}``: it starts once the
file ``after`` exists and creates ``done`` when it has ended, so phases of two launchers
started at once (each with its own environment: Prefect reads its settings when imported,
before the fork, so a child's ``env`` cannot change its Prefect server) can be ordered
against each other. Prints
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
import flows.recalibrate.flow  # noqa: F401


def _child(spec: dict) -> None:
    os.chdir(spec["cwd"])
    fd = os.open(spec["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.environ.update(spec.get("env", {}))
    if spec.get("finalize_kill"):
        # flows.store.tracking.log_model marks the model READY through the client it was given;
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


def _marked(owners: set[str]) -> dict[str, list[dict]]:
    """Live processes whose environment carries one of the owner markers ``owners``, by
    marker: one pass over ``/proc`` per tick for every watched child together (ten killed
    children watched at once would otherwise be ten passes), matching each environment's
    raw entries rather than building a dict of it per process."""
    found: dict[str, list[dict]] = {owner: [] for owner in owners}
    if not owners:
        return found
    wanted = {f"CORD_OPS_OWNER={owner}".encode(): owner for owner in owners}
    for pid in psutil.pids():
        try:
            with open(f"/proc/{pid}/environ", "rb") as handle:
                entries = handle.read().split(b"\0")
        except OSError:  # gone, or not ours to read
            continue
        hits = [wanted[e] for e in entries if e in wanted]
        if not hits:
            continue
        try:
            process = psutil.Process(pid)
            if process.status() == psutil.STATUS_ZOMBIE:
                continue
            cmdline = process.cmdline()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        found[hits[0]].append({"pid": pid, "cmdline": cmdline})
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
        looking = now >= next_look
        running = [i for i in watched if codes[i] is None] if looking else []
        due = [c for c in checks if c[0] <= now]
        if running or due:
            if looking:
                next_look = now + 0.5
            marked = _marked({str(pids[i]) for i in running} | {str(pids[i]) for _, i in due})
            for index in running:
                seen[index].update({p["pid"]: p for p in marked[str(pids[index])]})
            for check in due:
                checks.remove(check)
                index = check[1]
                with open(phase[index]["survivors"], "w") as handle:
                    json.dump({"seen": list(seen[index].values()),
                               "left": marked[str(pids[index])]}, handle)
        time.sleep(0.05)
    return codes


def _ordered_phase(phase) -> list:
    if isinstance(phase, list):
        return _run_phase(phase)
    while phase.get("after") and not os.path.exists(phase["after"]):
        time.sleep(0.1)
    codes = _run_phase(phase["processes"])
    if phase.get("done"):
        with open(phase["done"], "w"):
            pass
    return codes


def main() -> None:
    with open(sys.argv[1]) as handle:
        phases = json.load(handle)
    print(json.dumps([_ordered_phase(phase) for phase in phases]))


if __name__ == "__main__":
    main()
