"""The product's checkpoints do nothing by themselves; a process started with the test fault
site on its PYTHONPATH obeys ``CORD_OPS_TEST_*`` at the step named (the mechanism the slow
registry-integrity tests rely on, checked here in a second)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from fault_site import cord_faults

from flows.platform import checkpoints

REPO = Path(__file__).resolve().parents[3]
PASS_EVERY_STEP = ("from flows.platform import checkpoints\n"
                   "for step in checkpoints.STEPS:\n"
                   "    checkpoints.checkpoint(step)\n"
                   "    print(step, flush=True)\n")


def _run(site: bool, **env) -> subprocess.CompletedProcess:
    path = [str(cord_faults.SITE)] if site else []
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CORD_OPS_TEST_")}
    return subprocess.run([sys.executable, "-c", PASS_EVERY_STEP], capture_output=True,
                          text=True, cwd=REPO,
                          env={**clean, **env, "PYTHONPATH": os.pathsep.join([*path, str(REPO)])})


def test_without_the_fault_site_the_variables_do_nothing():
    done = _run(False, **{cord_faults.KILL_AT: "registered"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == list(checkpoints.STEPS)


@pytest.mark.parametrize("step", ["start_run", "registered", "run_finished"])
def test_the_fault_site_kills_at_the_step_named(step):
    done = _run(True, **{cord_faults.KILL_AT: step})
    assert done.returncode == -9, done.stderr[-2000:]
    steps = list(checkpoints.STEPS)
    assert done.stdout.split() == steps[:steps.index(step)]


def test_the_fault_site_truncates_at_the_step_named(tmp_path):
    target = tmp_path / "artifact.json"
    target.write_text("{}")
    done = _run(True, **{cord_faults.FAULT: f"log_model=truncate:{tmp_path}/*.json"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "test fault injected: truncate:" in done.stderr
    assert target.read_bytes() == b""


def test_an_installed_hook_sees_every_step_and_can_be_removed():
    seen = []
    previous = checkpoints.install(seen.append)
    try:
        for step in checkpoints.STEPS:
            checkpoints.checkpoint(step)
    finally:
        assert checkpoints.install(previous) == seen.append
    checkpoints.checkpoint("start_run")
    assert seen == list(checkpoints.STEPS)


def _called(*names: str) -> list[str]:
    """The steps the modules ``names`` (paths under flows/) pass, in source order."""
    import re

    source = "\n".join((REPO / "flows" / name).read_text() for name in names)
    return re.findall(r'checkpoints\.checkpoint\("([a-z_]+)"\)', source)


def test_the_flow_passes_every_named_step_and_no_other():
    # The flow and its store tasks pass them, in this order; the label-free registration
    # passes all but the alias move (it never moves @champion); no other module passes any.
    assert _called("recalibrate/flow.py", "recalibrate/store_steps.py") == list(checkpoints.STEPS)
    assert _called("monitor/label_free/candidate.py") == [
        s for s in checkpoints.STEPS if s != "alias_moved"]
    others = sorted(str(p.relative_to(REPO / "flows")) for p in (REPO / "flows").rglob("*.py")
                    if str(p.relative_to(REPO / "flows")) not in (
                        "recalibrate/flow.py", "recalibrate/store_steps.py",
                        "monitor/label_free/candidate.py", "platform/checkpoints.py"))
    assert _called(*others) == []
