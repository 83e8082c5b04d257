"""``cord-ops ui``: MLflow's UI over the tracking store, on 127.0.0.1, with MLflow's basic
authentication (:mod:`flows.platform.mlflow_ui`): its API writes the registry, so no other
local account may use it."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from flows import inputs
from flows.cli.context import Invocation
from flows.redact import redact
from flows.store import owner, tracking

UI_PORT = 5000


@dataclass(frozen=True)
class Request:
    invocation: Invocation
    port: int


def add_parser(sub) -> None:
    """``ui``: the MLflow UI."""
    p = sub.add_parser("ui", help="MLflow UI on 127.0.0.1 over the tracking store")
    p.add_argument("--port", type=int, default=UI_PORT, help=f"port (default: {UI_PORT})")


def validate(args: argparse.Namespace, invocation: Invocation) -> Request:
    inputs.listen_port(args.port)
    return Request(invocation, args.port)


def run(request: Request) -> int:
    from flows.platform import mlflow_ui

    uri, port = request.invocation.tracking_uri, request.port
    command = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri,
               "--host", "127.0.0.1", "--port", str(port), "--app-name", "basic-auth"]
    if tracking.is_embedded(uri):
        Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        command += ["--default-artifact-root", str(Path.cwd() / tracking.STORE_DIR)]
    folder = mlflow_ui.state_folder(uri)
    auth = mlflow_ui.prepare(folder)
    print(f"MLflow UI on http://127.0.0.1:{port} ({redact(uri)}); sign in as "
          f"{mlflow_ui.USER} with the password in {folder / mlflow_ui.PASSWORD_FILE}; "
          "Ctrl-C stops it", flush=True)
    # Become the server (no parent left behind), so a signal to this PID stops the UI.
    # Without the owner marker: the UI is this command, not something it leaves behind.
    os.execve(sys.executable, command, {**tracking.QUIET_ENVIRONMENT,
                                        **owner.detached_environment(os.environ), **auth})
