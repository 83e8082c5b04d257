"""A flow run of a cord-ops deployment runs with its deployment's parameters, no others.

Why: Prefect lets whoever may create a flow run of a deployment replace any of its
parameters (``POST /deployments/{id}/create_flow_run`` with ``parameters``, the UI's custom
run). In the cord-ops flows nearly every parameter chooses what the owner's process reads,
writes or loads, or what may be promoted: ``data`` and ``eval_data`` (files read as the
owner), ``tracking_uri`` (the store written, and the champion loaded from it),
``model_name``, ``dask_address`` (a scheduler whose replies the flow deserialises), the
gate's thresholds. A deployment is what ``cord-ops schedule`` set up, so each flow calls
:func:`check` first: a run of a deployment whose parameters differ from the deployment's in
any way (a value changed, a parameter added or left out) fails before anything is read.

Changing the deployment itself needs the right to edit it: on the cord-ops managed server
that is the server's credential (:mod:`flows.platform.credential`); on a user's own server,
its access control. A run outside any deployment (``cord-ops recalibrate``, a flow called
from Python, a subflow such as ``monitor``'s recalibration) has nothing to compare and is
not checked.
"""

from __future__ import annotations

from flows.errors import CordOpsError


class OverriddenParameters(CordOpsError, PermissionError):
    """A flow run's parameters are not its deployment's."""


def differences(run: dict, deployment: dict) -> list[str]:
    """The names of the parameters in which ``run`` differs from ``deployment``, sorted:
    a value changed, or a parameter only one of them sets."""
    missing = object()
    return sorted(name for name in set(run) | set(deployment)
                  if run.get(name, missing) != deployment.get(name, missing))


def check() -> None:
    """Inside a flow: raise :class:`OverriddenParameters` when this is a run of a deployment
    whose parameters are not the deployment's (read from the Prefect API now)."""
    from prefect.client.orchestration import get_client
    from prefect.context import FlowRunContext

    context = FlowRunContext.get()
    flow_run = getattr(context, "flow_run", None)
    if flow_run is None or flow_run.deployment_id is None:
        return
    with get_client(sync_client=True) as client:
        deployment = client.read_deployment(flow_run.deployment_id)
    changed = differences(flow_run.parameters or {}, deployment.parameters or {})
    if changed:
        raise OverriddenParameters(
            f"flow run {flow_run.name!r} of deployment {deployment.name!r} sets "
            f"{', '.join(changed)} otherwise than the deployment does; a run of a cord-ops "
            "deployment takes the deployment's parameters only (refused before anything "
            "was read; change the schedule with `cord-ops schedule` instead)")
