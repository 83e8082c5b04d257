"""``cord-ops server start | stop | status``: the local Prefect server cord-ops manages
(:mod:`flows.platform.managed_server`) and the warm runner beside it
(:mod:`flows.platform.warm`)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from flows.cli.context import Invocation
from flows.platform import managed_server, warm

#: Exit status of ``server status`` when no managed server runs (as ``systemctl status``).
NOT_RUNNING = 3


@dataclass(frozen=True)
class Request:
    invocation: Invocation
    action: str


def add_parser(sub) -> None:
    """``server``: the managed Prefect server."""
    p = sub.add_parser(
        "server", help="the local Prefect server cord-ops manages (start | stop | status)",
        description="A Prefect server on 127.0.0.1 with its scheduler, state kept next to the "
                    "MLflow store (<store folder>/prefect). While it runs, every cord-ops "
                    "command uses it instead of starting a temporary one.")
    p.add_argument("action", choices=("start", "stop", "status"))


def validate(args: argparse.Namespace, invocation: Invocation) -> Request:
    """Nothing to check beyond the parser's choices."""
    return Request(invocation, args.action)


def run(request: Request) -> int:
    folder = managed_server.state_folder(request.invocation.tracking_uri)
    hint = request.invocation.server_hint()
    if request.action == "start":
        managed, started = managed_server.start(folder)
        print(f"{'started' if started else 'already running:'} {managed.describe()}")
        runner = managed_server.start_runner(folder)
        print(warm.status(folder) if runner is not None and warm.wait_ready(folder, runner)
              else f"warm runner did not start; see {warm.log_file(folder)} (commands start "
                   "in-process)")
        print(f"stop it with: {hint}")
        return 0
    if request.action == "stop":
        runner = warm.running(folder)  # managed_server.stop stops it first
        pid = managed_server.stop(folder)
        stopped = ([f"the Prefect server (pid {pid})"] if pid is not None else []) + (
            [f"the warm runner (pid {runner['pid']})"] if runner is not None else [])
        print(f"stopped {' and '.join(stopped)} of {folder}" if stopped
              else f"no managed Prefect server or warm runner running for {folder}")
        return 0
    managed = managed_server.running(folder)
    if managed is None:
        print(f"not running (state folder {folder}); start it with: cord-ops server start")
        return NOT_RUNNING
    print(f"running: {managed.describe()}")
    print(warm.status(folder))
    return 0


