"""The two Prefect task presets every flow of the project uses, and Prefect's records of
the task runs a flow made with them.

- :data:`compute_task`: pure computation. Results stay in memory: arrays are not hashed
  for a cache key (``NO_CACHE``) and nothing is pickled to result storage.
- :data:`store_task`: talks to the tracking store. Same result handling, plus up to three
  retries, but only for a passing store outage
  (:func:`flows.store.retries.transient_store_error`), so a bad argument or a missing model
  fails at once.

Apply them as decorators (``@compute_task``) or derive from them
(``compute_task.with_options(timeout_seconds=...)``).

A flow that wants to know which task is running (to name the step that failed) and how
long each ran opens :func:`task_runs`: every task of either preset started inside it is
kept as Prefect's own ``TaskRun`` record, which Prefect updates to the run's end (state,
``total_run_time``). Nothing is timed here.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from prefect import task
from prefect.cache_policies import NO_CACHE

from flows.store.retries import transient_store_error

STORE_RETRY_DELAYS = (0.5, 1.0, 2.0)


class TaskRuns:
    """The task runs of one flow run in the order they started, as Prefect records them,
    between the stretches of the flow that are no task (:meth:`mark`)."""

    def __init__(self):
        self._entries: list[tuple[str, object | None]] = []

    def started(self, name: str, task_run) -> None:
        # A retry enters Running again: the same record, already kept.
        if all(run is None or run.id != task_run.id for _, run in self._entries):
            self._entries.append((name, task_run))

    def mark(self, name: str) -> None:
        """Name a stretch of the flow that is not a task (waiting for a lock)."""
        self._entries.append((name, None))

    @property
    def current(self) -> str:
        """The task running or last run (or the stretch marked since); ``start`` before
        any."""
        return self._entries[-1][0] if self._entries else "start"

    def seconds(self) -> dict[str, float]:
        """Seconds each task spent running (Prefect's ``total_run_time``, retries included),
        summed over the task's runs, by task name."""
        out: dict[str, float] = {}
        for name, run in self._entries:
            if run is not None:
                out[name] = out.get(name, 0.0) + run.total_run_time.total_seconds()
        return out


_recording: ContextVar[TaskRuns | None] = ContextVar("cord_ops_task_runs", default=None)


@contextmanager
def task_runs() -> Iterator[TaskRuns]:
    """Keep Prefect's record of every task of the presets started inside this block."""
    runs = TaskRuns()
    token = _recording.set(runs)
    try:
        yield runs
    finally:
        _recording.reset(token)


def keep_task_run(task, task_run, state) -> None:
    """The presets' ``on_running`` hook: hands Prefect's record of the task run to the
    :func:`task_runs` block around it, if any."""
    runs = _recording.get()
    if runs is not None:
        runs.started(task.name, task_run)


class _QuietKeeping(logging.Filter):
    """Prefect logs every hook it runs at INFO, two lines a task; keeping a record is
    bookkeeping, so those lines of :func:`keep_task_run` are dropped (its errors are not)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno > logging.INFO or \
            f"hook {keep_task_run.__name__!r}" not in record.getMessage().lower()


logging.getLogger("prefect.task_runs").addFilter(_QuietKeeping())

compute_task = task(cache_policy=NO_CACHE, persist_result=False, on_running=[keep_task_run])
store_task = task(cache_policy=NO_CACHE, persist_result=False, retries=len(STORE_RETRY_DELAYS),
                  retry_delay_seconds=list(STORE_RETRY_DELAYS),
                  retry_condition_fn=transient_store_error, on_running=[keep_task_run])
