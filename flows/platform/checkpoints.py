"""Named steps of a recalibration, and a hook told each time the flow passes one.

The product installs no hook, so :func:`checkpoint` does nothing. The crash tests need to
act at narrow windows (between registering a version and moving the alias, between moving
the alias and completing the version, ...) deterministically, which timing a ``kill -9``
from outside misses; they install a hook (``tests/fault_site``) that kills the process or
breaks its environment at the step they name.
"""

from __future__ import annotations

from collections.abc import Callable

#: The named steps, in the order a recalibration passes them (the label-free candidate
#: registration, flows/monitor/label_free/candidate.py, passes all but "alias_moved").
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

_hook: Callable[[str], None] | None = None


def install(hook: Callable[[str], None] | None) -> Callable[[str], None] | None:
    """Make ``hook(step)`` run at every checkpoint (None: nothing runs); returns the hook it
    replaces, so a caller can put that back."""
    global _hook
    if hook is not None and not callable(hook):
        raise TypeError(f"checkpoint hook must be callable, got {hook!r}")
    previous, _hook = _hook, hook
    return previous


def checkpoint(step: str) -> None:
    """The flow has reached ``step`` (one of :data:`STEPS`): run the installed hook, if any."""
    if _hook is not None:
        _hook(step)
