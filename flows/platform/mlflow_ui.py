"""``cord-ops ui``: MLflow's UI behind MLflow's own basic authentication.

Why: ``mlflow ui`` on 127.0.0.1 answers every local account, and the REST API behind the UI
writes as well as reads: any account could create runs, delete versions or move
``@champion`` to a version of its choosing while the operator looks at the UI. MLflow's
answer is its ``basic-auth`` app: every request but ``/health`` needs a user and password,
kept in an auth database of its own.

cord-ops gives the UI one user, :data:`USER`, whose password is 192 random bits made on
first use and kept owner-only in ``<store folder>/ui/password`` (0600, in a 0700 folder,
beside the auth database): the banner names the file, never the password. The server
gets the password and a fresh session-signing key through its environment, which only
this user can read; neither is ever in a command line.
"""

from __future__ import annotations

import secrets
from pathlib import Path

from flows.platform import credential

#: The UI's only user (MLflow's admin): every right over the store, as the operator has.
USER = "cord-ops"
#: The UI's state, in the MLflow store's folder (beside the managed server's ``prefect``).
STATE_DIR = "ui"
PASSWORD_FILE = "password"
AUTH_DB = "auth.db"
CONFIG_FILE = "auth.ini"


def state_folder(tracking_uri: str) -> Path:
    """Where the UI of ``tracking_uri`` keeps its state: beside the managed Prefect
    server's (:func:`flows.platform.managed_server.state_folder`)."""
    from flows.platform.managed_server import state_folder as server_state

    return server_state(tracking_uri).parent / STATE_DIR


def prepare(folder: Path) -> dict[str, str]:
    """Make ``folder`` (0700) hold the UI's password and MLflow's auth configuration;
    returns the environment ``mlflow server --app-name basic-auth`` needs.

    The password is made once and kept; the auth database remembers the user with the
    password it was created with, so a database without its password file (the file
    removed by hand) is made anew rather than left asking for a password nobody has.
    """
    folder = credential.private_folder(folder)
    password_file = folder / PASSWORD_FILE
    auth_db = folder / AUTH_DB
    try:
        password = password_file.read_text().strip()
    except FileNotFoundError:
        password = ""
    if not password:
        auth_db.unlink(missing_ok=True)
        password = secrets.token_urlsafe(24)
        credential.write_private(password_file, password + "\n")
    config = credential.write_private(folder / CONFIG_FILE, (
        "[mlflow]\n"
        "default_permission = READ\n"
        f"database_uri = sqlite:///{auth_db}\n"
        f"admin_username = {USER}\n"
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"))
    return {"MLFLOW_AUTH_CONFIG_PATH": str(config),
            "MLFLOW_AUTH_ADMIN_PASSWORD": password,
            "MLFLOW_FLASK_SERVER_SECRET_KEY": secrets.token_hex(32)}
