"""Cron deployments of the recalibration and monitoring flows.

``serve`` runs them from this process (Prefect's embedded server, or the server
PREFECT_API_URL names); ``deploy_to_work_pool`` registers them with a work pool of a real
``prefect server`` instead, for a ``prefect worker`` on this host to run.
"""

from __future__ import annotations

from pathlib import Path

from prefect.deployments.runner import EntrypointType

from flows.inputs import InputError, monitor_cron_for
from flows.monitor import monitor
from flows.recalibrate import recalibrate

RECALIBRATE_DEPLOYMENT = "cord-ops-recalibrate"
MONITOR_DEPLOYMENT = "cord-ops-monitor"
REPO_ROOT = Path(__file__).resolve().parents[1]


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
                      monitor_parameters: dict | None = None, monitor_cron: str | None = None):
    """The runner deployments: recalibration on ``cron``; monitoring on ``monitor_cron``
    (default: ``cron`` shifted by :func:`flows.inputs.monitor_cron_for`, so the two never
    start together) when ``monitor_parameters`` are given.

    Entrypoints are module paths (``flows.recalibrate.recalibrate``), so the run process
    imports the installed package whatever its working directory. Each deployment runs
    one flow at a time (the registry's crash clean-up relies on it).
    """
    deployments = [recalibrate.to_deployment(
        name=RECALIBRATE_DEPLOYMENT, cron=prefect_cron(cron), parameters=recalibrate_parameters,
        entrypoint_type=EntrypointType.MODULE_PATH, tags=["cord-ops"], concurrency_limit=1)]
    if monitor_parameters is not None:
        deployments.append(monitor.to_deployment(
            name=MONITOR_DEPLOYMENT, cron=prefect_cron(monitor_cron or monitor_cron_for(cron)),
            parameters=monitor_parameters, entrypoint_type=EntrypointType.MODULE_PATH,
            tags=["cord-ops"], concurrency_limit=1))
    return deployments


def serve_deployments(deployments, limit: int | None = None) -> None:
    """Serve ``deployments`` until interrupted (blocks); ``limit`` caps concurrent runs."""
    from prefect import serve

    serve(*deployments, limit=limit)


def deploy_to_work_pool(work_pool: str, cron: str, recalibrate_parameters: dict,
                        monitor_parameters: dict | None = None,
                        monitor_cron: str | None = None) -> list[str]:
    """Register the deployments with ``work_pool`` on the server PREFECT_API_URL names.

    The flow code is pulled from this checkout (``REPO_ROOT``), so a process worker on
    this host can run them. Returns the deployment ids.
    """
    from prefect import Flow

    specs = [("flows/recalibrate.py:recalibrate", RECALIBRATE_DEPLOYMENT, cron,
              recalibrate_parameters)]
    if monitor_parameters is not None:
        specs.append(("flows/monitor.py:monitor", MONITOR_DEPLOYMENT,
                      monitor_cron or monitor_cron_for(cron),
                      monitor_parameters))
    ids = []
    for entrypoint, name, when, parameters in specs:
        remote = Flow.from_source(source=str(REPO_ROOT), entrypoint=entrypoint)
        ids.append(str(remote.deploy(name=name, work_pool_name=work_pool, cron=prefect_cron(when),
                                     parameters=parameters, tags=["cord-ops"],
                                     concurrency_limit=1,
                                     print_next_steps=False, ignore_warnings=True)))
    return ids
