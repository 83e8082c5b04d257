"""``cord-ops ui``: the REST API behind MLflow's UI writes the registry
(a new version, ``@champion`` moved), and any local account reaches 127.0.0.1. The UI runs
MLflow's basic-auth app; its one user's password is made on first use and kept owner-only,
never printed."""

from __future__ import annotations

import base64
import os
import stat

import pytest
from second_user import http_request
from servers import free_port, running, wait_until_ready

pytestmark = pytest.mark.slow

CREDENTIAL_ENV = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")
CREATE = "/api/2.0/mlflow/registered-models/create"
SEARCH = "/api/2.0/mlflow/registered-models/search"


def test_the_ui_refuses_whoever_lacks_its_password(tmp_path, store_at, cord_ops_command):
    from mlflow import MlflowClient

    uri = store_at(tmp_path / "mlruns" / "mlflow.db")
    env = {k: v for k, v in os.environ.items() if k not in CREDENTIAL_ENV}
    port, log = free_port(), tmp_path / "ui.log"
    folder = tmp_path / "mlruns" / "ui"
    with running([*cord_ops_command, "--tracking-uri", uri, "ui", "--port", str(port)], log,
                 env=env, cwd=tmp_path) as process:
        wait_until_ready(f"http://127.0.0.1:{port}/health", process, log, timeout=180)
        password = (folder / "password").read_text().strip()
        banner = log.read_text()
        assert (f"sign in as cord-ops with the password in {folder / 'password'}; "
                "Ctrl-C stops it") in banner
        assert len(password) >= 24 and password not in banner
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        for name in ("password", "auth.ini"):
            assert stat.S_IMODE((folder / name).stat().st_mode) == 0o600, name

        # what any local account can send: a write and a read, both refused
        assert http_request(port, "POST", CREATE, {"name": "intruder"})[0] == 401
        assert http_request(port, "GET", SEARCH)[0] == 401
        wrong = {"Authorization": "Basic " + base64.b64encode(b"cord-ops:guess").decode()}
        assert http_request(port, "POST", CREATE, {"name": "intruder"}, wrong)[0] == 401

        signed_in = {"Authorization": "Basic " + base64.b64encode(
            f"cord-ops:{password}".encode()).decode()}
        assert http_request(port, "POST", CREATE, {"name": "owners"}, signed_in)[0] == 200
        status, body = http_request(port, "GET", SEARCH, None, signed_in)
        assert status == 200
        assert [m["name"] for m in body["registered_models"]] == ["owners"]

    assert [m.name for m in MlflowClient(uri).search_registered_models()] == ["owners"]
