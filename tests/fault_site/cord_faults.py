"""Test-only fault injection, installed as the hook of :mod:`flows.platform.checkpoints`:
kill this process with SIGKILL at a named step, or break its environment there.

A process gets it through ``sitecustomize.py`` beside this file, which Python runs at
start-up when this folder is on ``PYTHONPATH`` (the registry-integrity tests put it there
for every process they start); a test in the pytest process installs :func:`hook` itself.
The hook reads the environment at each step, so a process forked before its child's
environment is set (``launcher.py``) still obeys the child's.

When ``CORD_OPS_TEST_KILL_AT`` names the step, the process kills itself there, exactly as
``kill -9`` would (no clean-up, no atexit). ``CORD_OPS_TEST_FAULT=STEP=ACTION`` breaks the
environment instead, at that step, and the flow carries on into the broken world:

- ``killpg:PGID``: SIGKILL a process group (the tracking server dies mid-run);
- ``fill:PATH``: write PATH until the file system is full (the disk fills mid-run);
- ``truncate:GLOB``: cut every file matching GLOB to zero bytes (a partial artifact).

Neither set, a checkpoint does nothing.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from flows.platform import checkpoints

KILL_AT = "CORD_OPS_TEST_KILL_AT"
FAULT = "CORD_OPS_TEST_FAULT"
#: The folder to put on a process's PYTHONPATH so that it starts with :func:`hook` installed.
SITE = Path(__file__).resolve().parent
STEPS = checkpoints.STEPS


def hook(step: str) -> None:
    """SIGKILL this process when ``CORD_OPS_TEST_KILL_AT`` is ``step``; inject the fault
    of ``CORD_OPS_TEST_FAULT`` when it names ``step``."""
    if os.environ.get(KILL_AT) == step:
        os.kill(os.getpid(), signal.SIGKILL)
    at, _, action = os.environ.get(FAULT, "").partition("=")
    if at == step:
        _inject(action)


def install() -> None:
    checkpoints.install(hook)


def _inject(action: str) -> None:
    import sys
    import time

    # The tests time the failure from here.
    print(f"test fault injected: {action} at {time.time()!r}", file=sys.stderr, flush=True)
    kind, _, argument = action.partition(":")
    if kind == "killpg":
        os.killpg(int(argument), signal.SIGKILL)
    elif kind == "fill":
        chunk = b"\0" * (1 << 16)
        with open(argument, "wb", buffering=0) as handle:
            try:
                while True:
                    handle.write(chunk)
            except OSError:
                pass
        # The file system is full now; whatever the flow writes next fails.
    elif kind == "truncate":
        import glob

        for path in glob.glob(argument, recursive=True):
            os.truncate(path, 0)
    else:
        raise ValueError(f"{FAULT}: unknown action {action!r}")
