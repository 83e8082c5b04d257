"""Test-only fault injection: kill this process with SIGKILL at a named step.

The crash tests must reach narrow windows (between registering a version and moving the
alias, between moving the alias and completing the version, ...) deterministically;
timing a ``kill -9`` from outside misses them. The flow calls :func:`checkpoint` at each
named step; when the environment variable ``CORD_OPS_TEST_KILL_AT`` names that step, the
process kills itself there, exactly as ``kill -9`` would (no clean-up, no atexit).

``CORD_OPS_TEST_FAULT=STEP=ACTION`` breaks the environment instead, at that step, and the
flow carries on into the broken world:

- ``killpg:PGID``: SIGKILL a process group (the tracking server dies mid-run);
- ``fill:PATH``: write PATH until the file system is full (the disk fills mid-run);
- ``truncate:GLOB``: cut every file matching GLOB to zero bytes (a partial artifact).

Unset (always, outside the tests), a checkpoint does nothing.
"""

from __future__ import annotations

import os
import signal

KILL_AT = "CORD_OPS_TEST_KILL_AT"
FAULT = "CORD_OPS_TEST_FAULT"

#: The named steps, in the order a recalibration passes them.
STEPS = (
    "start_run",             # run RUNNING, nothing logged
    "log_params",            # params and metrics logged
    "log_artifacts",         # reports and state logged, no model yet
    "log_model",             # logged model READY, digests not yet verified
    "lock_acquired",         # holds the registry lock, nothing registered
    "registered",            # pending version exists
    "gate_recorded",         # decision tags on the pending version, alias not moved
    "alias_moved",           # a pending version holds @champion
    "run_finished",          # run FINISHED, version still pending
)


def checkpoint(step: str) -> None:
    """SIGKILL this process when ``CORD_OPS_TEST_KILL_AT`` is ``step``; inject the fault
    of ``CORD_OPS_TEST_FAULT`` when it names ``step``."""
    if os.environ.get(KILL_AT) == step:
        os.kill(os.getpid(), signal.SIGKILL)
    at, _, action = os.environ.get(FAULT, "").partition("=")
    if at == step:
        _inject(action)


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
