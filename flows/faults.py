"""Test-only fault injection: kill this process with SIGKILL at a named step.

The crash tests must reach narrow windows (between registering a version and moving the
alias, between moving the alias and completing the version, ...) deterministically;
timing a ``kill -9`` from outside misses them. The flow calls :func:`checkpoint` at each
named step; when the environment variable ``CORD_OPS_TEST_KILL_AT`` names that step, the
process kills itself there, exactly as ``kill -9`` would (no clean-up, no atexit). Unset
(always, outside the tests), a checkpoint does nothing.
"""

from __future__ import annotations

import os
import signal

KILL_AT = "CORD_OPS_TEST_KILL_AT"

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
    """SIGKILL this process when ``CORD_OPS_TEST_KILL_AT`` is ``step``."""
    if os.environ.get(KILL_AT) == step:
        os.kill(os.getpid(), signal.SIGKILL)
