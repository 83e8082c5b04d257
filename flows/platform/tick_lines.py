"""What scheduled runs print on the console of ``cord-ops schedule``: one line per tick.

A scheduled run is a Prefect flow run in a process of its own, whose console would carry
every task's state, and on a failure the exception's traceback twice (the task's, the
flow's) at every tick. Its console instead keeps, per run:

- the run's result line, which the flow logs with :func:`log_result` (a recalibration's
  gate decision, a labelled monitor's metrics and drift, a pass skipped for want of a
  champion);
- for a failed or crashed run, one line ``error: <flow> run '<name>' failed at <time>:
  <reason in words>``, without the exception's class name (a failed subflow's line is
  left to its parent's);
- warnings and errors from anything else (the runner's own), without tracebacks.

Every record still reaches the Prefect API's log of the run, tracebacks included: the
run's log in the Prefect UI is where the details are.

:func:`write_config` writes the logging configuration the run processes load (Prefect's
own, whose console handler gets :class:`TickLines` and a bare ``%(message)s`` format);
``cord-ops schedule`` names it in ``PREFECT_LOGGING_SETTINGS_PATH`` for the processes it
starts, and :func:`console` applies the same filter to its own console.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import time
from pathlib import Path

#: Attribute of a log record that is a run's result line.
TICK = "cord_tick"
_FINISHED = re.compile(r"^Finished in state (Failed|Crashed)\((.*)\)\s*$", re.S)
#: "Flow run encountered an exception: ValueError: ..." -> the words after the class name.
_PREFIXES = re.compile(r"^(?:Flow run encountered an exception|Flow run process exited "
                       r"non-zeroly|Crash detected!)[^:]*:\s*")
_CLASS = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Refused|Timeout|"
                    r"Unavailable|Interrupt|Exit)?:\s+")


def tick_extra() -> dict[str, bool]:
    """``extra=`` of a log call whose message is the run's result line."""
    return {TICK: True}


def log_result(line: str) -> None:
    """Log ``line`` as the current flow run's result line, unless the run is a subflow
    (its parent's line says what it decided)."""
    from prefect import get_run_logger
    from prefect.context import FlowRunContext

    context = FlowRunContext.get()
    if context is not None and context.flow_run is not None and \
            context.flow_run.parent_task_run_id is not None:
        return
    get_run_logger().info("%s", line, extra=tick_extra())


def failure_words(state_text: str) -> str:
    """The reason inside ``Failed('...')``/``Crashed('...')`` in words: Prefect's prefix
    and the exception's class name dropped, one line."""
    text = state_text.strip()
    if text.startswith("message="):
        text = text[len("message="):]
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        text = text[1:-1]
    text = _PREFIXES.sub("", text.replace("\\n", "\n").strip())
    text = _CLASS.sub("", text, count=1)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0] if lines else "no reason recorded (see the run's log)"


class TickLines(logging.Filter):
    """The console filter of scheduled runs (module docstring). It rewrites the records it
    lets through into their one line: the bare ``%(message)s`` formatter prints them."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, TICK, False):
            return _one_line(record, record.getMessage())
        if record.name.startswith(("prefect.flow_runs", "prefect.task_runs")):
            found = _FINISHED.match(record.getMessage())
            if record.name != "prefect.flow_runs" or found is None or _subflow(record):
                return False
            flow = getattr(record, "flow_name", None) or "scheduled"
            run = getattr(record, "flow_run_name", None) or "?"
            at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.created))
            return _one_line(record, f"error: {flow} run '{run}' failed at {at}: "
                                     f"{failure_words(found.group(2))}")
        if record.levelno < logging.WARNING:
            return False
        return _one_line(record, f"{record.levelname.lower()}: {record.getMessage()}")


def _subflow(record: logging.LogRecord) -> bool:
    """The record is about a subflow run (its parent's failure line follows: one line per
    tick): in a process Prefect started for one flow run (``PREFECT__FLOW_RUN_ID``), a
    record of any other flow run."""
    started_for = os.environ.get("PREFECT__FLOW_RUN_ID")
    logged_for = getattr(record, "flow_run_id", None)
    return bool(started_for) and logged_for is not None and str(logged_for) != started_for


def _one_line(record: logging.LogRecord, text: str) -> bool:
    record.msg, record.args = text.splitlines()[0] if text else text, None
    record.exc_info = record.exc_text = record.stack_info = None
    return True


def write_config(path: Path) -> Path:
    """Write Prefect's logging configuration with the tick console (module docstring) to
    ``path``, for ``PREFECT_LOGGING_SETTINGS_PATH``; returns ``path``."""
    import yaml
    from prefect.logging.configuration import DEFAULT_LOGGING_SETTINGS_PATH

    from cord_ops.atomic import write_bytes_atomic

    config = yaml.safe_load(DEFAULT_LOGGING_SETTINGS_PATH.read_text())
    config.setdefault("formatters", {})["tick"] = {"format": "%(message)s"}
    config.setdefault("filters", {})["ticks"] = {"()": f"{__name__}.TickLines"}
    config["handlers"]["console"] = {"level": 0, "class": "logging.StreamHandler",
                                     "formatter": "tick", "filters": ["ticks"],
                                     "stream": "ext://sys.stderr"}
    write_bytes_atomic(path, yaml.safe_dump(config, sort_keys=False).encode())
    return path


def prefect_console_handlers() -> list[logging.Handler]:
    """Every Prefect console handler of this process, once each (on the root logger and on
    Prefect's own loggers), after Prefect has set up its logging."""
    import prefect.main  # noqa: F401  (sets up Prefect's log handlers, as any flow import does)

    loggers = [logging.getLogger()] + [
        logger for name, logger in logging.Logger.manager.loggerDict.items()
        if name.startswith("prefect") and isinstance(logger, logging.Logger)]
    found: list[logging.Handler] = []
    for logger in loggers:
        for handler in logger.handlers:
            if type(handler).__name__ == "PrefectConsoleHandler" and not any(
                    handler is h for h in found):
                found.append(handler)
    return found


@contextlib.contextmanager
def console():
    """This process's Prefect console handlers print tick lines only (as the run
    processes do with :func:`write_config`'s file); restored afterwards."""
    tick = TickLines()
    changed = [(handler, handler.formatter) for handler in prefect_console_handlers()]
    for handler, _ in changed:
        handler.addFilter(tick)
        handler.setFormatter(logging.Formatter("%(message)s"))
    try:
        yield
    finally:
        for handler, formatter in changed:
            handler.removeFilter(tick)
            handler.setFormatter(formatter)
