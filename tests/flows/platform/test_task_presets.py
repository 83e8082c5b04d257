"""Prefect's own records of a flow's task runs (flows.platform.task_presets.task_runs): which
task is running, so a failure names its step, and how long each ran, from Prefect's
``total_run_time``; the hook that keeps them adds no line to the run's log."""

from __future__ import annotations

import logging
import time

import pytest
from prefect import flow

from flows.platform.task_presets import compute_task, task_runs

SLEEP_S = 0.3


@compute_task
def napping() -> int:
    time.sleep(SLEEP_S)
    return 1


@compute_task
def failing() -> int:
    raise ValueError("no")


@flow(persist_result=False)
def steps_flow():
    with task_runs() as runs:
        napping()
        napping()
        runs.mark("waiting")
        waited = runs.current
        try:
            failing()
        except ValueError:
            pass
    return runs, waited


@pytest.mark.slow
def test_the_records_name_the_step_and_time_each_task(prefect_harness):
    class Kept(logging.Handler):
        def __init__(self):
            super().__init__(logging.INFO)
            self.messages = []

        def emit(self, record):
            self.messages.append(record.getMessage())

    kept, logger = Kept(), logging.getLogger("prefect.task_runs")
    logger.addHandler(kept)
    try:
        runs, waited = steps_flow()
    finally:
        logger.removeHandler(kept)
    assert waited == "waiting"
    assert runs.current == "failing"
    seconds = runs.seconds()
    assert set(seconds) == {"napping", "failing"}
    assert 2 * SLEEP_S <= seconds["napping"] < 2 * SLEEP_S + 5.0  # two runs, summed
    assert seconds["failing"] < 5.0
    assert any("Finished in state Completed" in m for m in kept.messages)  # it is the log
    assert not [m for m in kept.messages if "keep_task_run" in m]


def test_outside_a_flow_nothing_is_kept_and_the_step_is_start():
    with task_runs() as runs:
        runs.mark("registry_lock")
        assert runs.current == "registry_lock"
    assert runs.seconds() == {}
    with task_runs() as empty:
        assert empty.current == "start"
