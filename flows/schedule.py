"""Cron deployments of the recalibration and monitoring flows.

:func:`serve_deployments` runs them from this process against the Prefect server the
caller chose (``cord-ops schedule`` uses PREFECT_API_URL's, else its managed local server,
:mod:`flows.platform.managed_server`: a server whose scheduler creates the runs);
``deploy_to_work_pool`` registers them with a work pool instead, for a ``prefect worker`` on
this host to run.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import os
import sys
import threading
import time
from pathlib import Path

from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy
from prefect.deployments.runner import EntrypointType
from prefect.runner import Runner

from flows.inputs import InputError, monitor_cron_for
from flows.monitor.label_free.schedule import LABEL_FREE_DEPLOYMENT, monitor_new_batches
from flows.monitor.labelled import monitor
from flows.recalibrate.flow import recalibrate

RECALIBRATE_DEPLOYMENT = "cord-ops-recalibrate"
MONITOR_DEPLOYMENT = "cord-ops-monitor"
REPO_ROOT = Path(__file__).resolve().parents[1]
#: A SIGTERM stops serving within this many seconds of its handler running, runs still in
#: flight killed (the signal reaches the handler late on a busy machine, and the README
#: promises the service gone within 5 s).
STOP_WITHIN_S = 2.5
#: Once serving has ended, the seconds left to this process to print its last line and
#: send the logs Prefect still queues before it exits.
EXIT_GRACE_S = 0.5
#: Each deployment runs one flow at a time (the registry section is serialised by
#: flows.store.lock whatever runs it; this only avoids piling up runs of one schedule); a
#: tick that comes while the previous run is still going is cancelled, not queued, so a
#: slow run or a stopped runner never leaves a backlog that fires all at once later.
ONE_AT_A_TIME = ConcurrencyLimitConfig(limit=1,
                                       collision_strategy=ConcurrencyLimitStrategy.CANCEL_NEW)
#: How often the runner asks the server for due runs (Prefect's default, 10 s, delays a
#: run by up to that much; a query of a local server costs milliseconds).
POLL_S = 2.0


def prefect_cron(cron: str) -> str:
    """``cron`` as Prefect's own parser accepts it; one line naming it otherwise.

    The CLI already checked the common grammar (:func:`flows.inputs.check_cron`); this is
    Prefect's word on it, still before anything is registered with the server.
    """
    from prefect.client.schemas.schedules import CronSchedule
    from pydantic import ValidationError

    try:
        return CronSchedule(cron=cron).cron
    except ValidationError as exc:
        reason = exc.errors()[0]["msg"] if exc.errors() else str(exc).splitlines()[0]
        raise InputError(f"cron {cron!r}: {reason}") from None


def build_deployments(cron: str, recalibrate_parameters: dict,
                      monitor_parameters: dict | None = None, monitor_cron: str | None = None,
                      label_free_parameters: dict | None = None,
                      label_free_cron: str | None = None):
    """The runner deployments: recalibration on ``cron``; monitoring on ``monitor_cron``
    (default: ``cron`` shifted by :func:`flows.inputs.monitor_cron_for`, so the two never
    start together) when ``monitor_parameters`` are given; the label-free monitor of new
    batches (:mod:`flows.monitor.label_free.schedule`) on ``label_free_cron``
    (default: the monitoring schedule) when ``label_free_parameters`` are given.

    Entrypoints are module paths (``flows.recalibrate.flow.recalibrate``), so the run process
    imports the installed package whatever its working directory. Each deployment runs
    one flow at a time (:data:`ONE_AT_A_TIME`).
    """
    deployments = [recalibrate.to_deployment(
        name=RECALIBRATE_DEPLOYMENT, cron=prefect_cron(cron), parameters=recalibrate_parameters,
        entrypoint_type=EntrypointType.MODULE_PATH, tags=["cord-ops"],
        concurrency_limit=ONE_AT_A_TIME)]
    if monitor_parameters is not None:
        deployments.append(monitor.to_deployment(
            name=MONITOR_DEPLOYMENT, cron=prefect_cron(monitor_cron or monitor_cron_for(cron)),
            parameters=monitor_parameters, entrypoint_type=EntrypointType.MODULE_PATH,
            tags=["cord-ops"], concurrency_limit=ONE_AT_A_TIME))
    if label_free_parameters is not None:
        deployments.append(monitor_new_batches.to_deployment(
            name=LABEL_FREE_DEPLOYMENT,
            cron=prefect_cron(label_free_cron or monitor_cron or monitor_cron_for(cron)),
            parameters=label_free_parameters, entrypoint_type=EntrypointType.MODULE_PATH,
            tags=["cord-ops", "label-free"], concurrency_limit=ONE_AT_A_TIME))
    return deployments


def serve_deployments(deployments, limit: int | None = None,
                      stop_within: float = STOP_WITHIN_S) -> None:
    """Serve ``deployments`` from this process until Ctrl-C or SIGTERM (blocks); ``limit``
    caps concurrent runs.

    Prefect's runner gives an in-flight run up to 30 s of graceful cancellation on
    SIGTERM; an operator's ``kill`` (or systemd's stop) expects the service gone in a few
    seconds. So a SIGTERM here pauses the deployments' schedules at once (nothing piles
    up for a runner that is gone), lets the runner cancel its runs gracefully, and at
    ``stop_within`` seconds kills what is still running: such a run is left RUNNING in
    MLflow for the registry's clean-up of runs whose owner died.
    """
    runner = _BoundedStopRunner(stop_within, pause_on_shutdown=True, limit=limit,
                                query_seconds=POLL_S)
    runner.deployment_ids = [runner.add_deployment(deployment) for deployment in deployments]
    try:
        asyncio.run(runner.start())
    except KeyboardInterrupt:
        pass
    finally:
        runner.served.set()


class _BoundedStopRunner(Runner):
    """Prefect's runner whose SIGTERM shutdown ends within ``stop_within`` seconds."""

    def __init__(self, stop_within: float, **kwargs):
        super().__init__(**kwargs)
        self.stop_within = stop_within
        self.deployment_ids: list = []
        self._watchdog: threading.Thread | None = None
        #: Set when serving has ended (the runner's shutdown finished): the stop need not
        #: wait for the deadline.
        self.served = threading.Event()

    def handle_sigterm(self, *args, **kwargs) -> None:
        if self._watchdog is None:
            deadline = time.monotonic() + self.stop_within
            # The thread runs in a copy of this context: it keeps the Prefect API URL
            # the command set with temporary_settings.
            context = contextvars.copy_context()
            self._watchdog = threading.Thread(target=context.run, args=(self._stop_by, deadline),
                                              name="cord-ops-stop", daemon=True)
            self._watchdog.start()
        super().handle_sigterm(*args, **kwargs)

    def _stop_by(self, deadline: float) -> None:
        from prefect.client.orchestration import get_client

        try:
            with get_client(sync_client=True) as client:
                for deployment_id in self.deployment_ids:
                    client.pause_deployment(deployment_id)
        except Exception as exc:  # the server may be gone too; stopping matters more
            self._logger.warning("could not pause the schedules: %s", exc)
        # Serving ends early when no run is in flight; the interpreter's exit (Prefect
        # flushing logs and events from atexit hooks) can then take seconds of its own, so
        # it gets a short grace, never past the deadline.
        if self.served.wait(max(0.0, deadline - time.monotonic())):
            time.sleep(max(0.0, min(EXIT_GRACE_S, deadline - time.monotonic())))
        import psutil

        from flows.store.owner import OWNER_ENV

        def started_here(process) -> bool:
            """A flow run carries this command's owner marker; the managed server and the
            command's watchdog, started without it, are left alone."""
            try:
                return process.environ().get(OWNER_ENV) == os.environ.get(OWNER_ENV)
            except psutil.Error:
                return False

        children = [c for c in psutil.Process().children(recursive=True) if started_here(c)]
        for child in children:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()
        if children:
            self._logger.warning("stopped after %.0f s: killed %d flow-run process(es) that "
                                 "were still running", self.stop_within, len(children))
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def deploy_to_work_pool(work_pool: str, cron: str, recalibrate_parameters: dict,
                        monitor_parameters: dict | None = None,
                        monitor_cron: str | None = None,
                        label_free_parameters: dict | None = None,
                        label_free_cron: str | None = None) -> list[str]:
    """Register the deployments with ``work_pool`` on the server PREFECT_API_URL names.

    The flow code is pulled from this checkout (``REPO_ROOT``), so a process worker on
    this host can run them. Returns the deployment ids.
    """
    from prefect import Flow

    specs = [("flows/recalibrate/flow.py:recalibrate", RECALIBRATE_DEPLOYMENT, cron,
              recalibrate_parameters)]
    if monitor_parameters is not None:
        specs.append(("flows/monitor/labelled.py:monitor", MONITOR_DEPLOYMENT,
                      monitor_cron or monitor_cron_for(cron),
                      monitor_parameters))
    if label_free_parameters is not None:
        specs.append(("flows/monitor/label_free/schedule.py:monitor_new_batches",
                      LABEL_FREE_DEPLOYMENT,
                      label_free_cron or monitor_cron or monitor_cron_for(cron),
                      label_free_parameters))
    ids = []
    for entrypoint, name, when, parameters in specs:
        remote = Flow.from_source(source=str(REPO_ROOT), entrypoint=entrypoint)
        ids.append(str(remote.deploy(name=name, work_pool_name=work_pool, cron=prefect_cron(when),
                                     parameters=parameters, tags=["cord-ops"],
                                     concurrency_limit=ONE_AT_A_TIME,
                                     print_next_steps=False, ignore_warnings=True)))
    return ids
