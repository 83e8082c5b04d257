"""Cron deployments of the recalibration and monitoring flows.

``serve`` runs them from this process (Prefect's embedded server, or the server
PREFECT_API_URL names); ``deploy_to_work_pool`` registers them with a work pool of a real
``prefect server`` instead, for a ``prefect worker`` on this host to run.
"""

from __future__ import annotations

from pathlib import Path

from prefect.deployments.runner import EntrypointType

from flows.monitor import monitor
from flows.recalibrate import recalibrate

RECALIBRATE_DEPLOYMENT = "cord-ops-recalibrate"
MONITOR_DEPLOYMENT = "cord-ops-monitor"
REPO_ROOT = Path(__file__).resolve().parents[1]


def _cron(cron: str) -> str:
    from prefect.client.schemas.schedules import CronSchedule

    # Validate here so a typo fails before anything is registered with the server.
    return CronSchedule(cron=cron).cron


def build_deployments(cron: str, recalibrate_parameters: dict,
                      monitor_parameters: dict | None = None, monitor_cron: str | None = None):
    """The runner deployments: recalibration on ``cron``; monitoring on ``monitor_cron``
    (default: the same cron) when ``monitor_parameters`` are given.

    Entrypoints are module paths (``flows.recalibrate.recalibrate``), so the run process
    imports the installed package whatever its working directory. Each deployment runs
    one flow at a time (the registry's crash clean-up relies on it).
    """
    deployments = [recalibrate.to_deployment(
        name=RECALIBRATE_DEPLOYMENT, cron=_cron(cron), parameters=recalibrate_parameters,
        entrypoint_type=EntrypointType.MODULE_PATH, tags=["cord-ops"], concurrency_limit=1)]
    if monitor_parameters is not None:
        deployments.append(monitor.to_deployment(
            name=MONITOR_DEPLOYMENT, cron=_cron(monitor_cron or cron),
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
        specs.append(("flows/monitor.py:monitor", MONITOR_DEPLOYMENT, monitor_cron or cron,
                      monitor_parameters))
    ids = []
    for entrypoint, name, when, parameters in specs:
        remote = Flow.from_source(source=str(REPO_ROOT), entrypoint=entrypoint)
        ids.append(str(remote.deploy(name=name, work_pool_name=work_pool, cron=_cron(when),
                                     parameters=parameters, tags=["cord-ops"],
                                     concurrency_limit=1,
                                     print_next_steps=False, ignore_warnings=True)))
    return ids
