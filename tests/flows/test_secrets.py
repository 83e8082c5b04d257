"""A password in the tracking URI is never printed or stored: real
``cord-ops`` runs against MLflow's own basic-auth tracking server, then every output line,
MLflow param and tag, Prefect flow-run and deployment parameter and Prefect log of them is
searched for it. (The error line of a command whose store is down: test_redact.py.)
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys

import pytest
from servers import free_port, running, wait_until_ready

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]

USER = "alice"
#: MLflow's auth app refuses an admin password under 12 characters.
PASSWORD = "S3cretPass4Alice"
CREDENTIAL_ENV = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_URI")


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory, mlflow_template_db):
    """``host:port`` of ``mlflow server --app-name basic-auth`` whose only user is
    USER/PASSWORD; every API call needs the credential (/health does not)."""
    folder = tmp_path_factory.mktemp("auth-mlflow")
    (folder / "auth.ini").write_text(
        "[mlflow]\ndefault_permission = READ\n"
        f"database_uri = sqlite:///{folder / 'auth.db'}\nadmin_username = {USER}\n"
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n")
    shutil.copyfile(mlflow_template_db, folder / "backend.db")  # migrated: starts faster
    port = free_port()
    env = {**os.environ, "MLFLOW_AUTH_CONFIG_PATH": str(folder / "auth.ini"),
           "MLFLOW_AUTH_ADMIN_PASSWORD": PASSWORD,
           "MLFLOW_FLASK_SERVER_SECRET_KEY": secrets.token_hex(16),
           "MLFLOW_DISABLE_TELEMETRY": "true", "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    for key in CREDENTIAL_ENV:
        env.pop(key, None)
    log = folder / "server.log"
    with running([sys.executable, "-m", "mlflow", "server", "--app-name", "basic-auth",
                  "--backend-store-uri", f"sqlite:///{folder / 'backend.db'}",
                  "--artifacts-destination", str(folder / "artifacts"), "--host", "127.0.0.1",
                  "--port", str(port), "--workers", "1"], log, env=env, cwd=folder) as process:
        wait_until_ready(f"http://127.0.0.1:{port}/health", process, log, timeout=180)
        yield f"127.0.0.1:{port}"


def _cli(command, argv, cwd, env) -> subprocess.CompletedProcess:
    return subprocess.run([*command, *argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


def test_a_password_in_the_tracking_uri_is_never_printed_or_stored(
        auth_server, tmp_path, digits_file, cli_env, cord_ops_command, monkeypatch):
    from mlflow import MlflowClient
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    uri = f"http://{USER}:{PASSWORD}@{auth_server}"
    env = {k: v for k, v in cli_env.items() if k not in CREDENTIAL_ENV}
    printed = []

    recalibrate = _cli(cord_ops_command, ["--tracking-uri", uri, "recalibrate", "--data",
                                          str(digits_file), "--model-name", "guarded"],
                       tmp_path, env)
    printed.append(recalibrate.stdout + recalibrate.stderr)
    assert PASSWORD not in printed[-1]
    assert recalibrate.returncode == 0, recalibrate.stderr[-3000:]
    # the summary names the store, without the credential (which did reach the server:
    # the run above wrote through basic auth)
    assert f"tracking: http://{auth_server} (run " in recalibrate.stdout

    pool = f"guarded-{secrets.token_hex(3)}"
    with get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name=pool, type="process"))
    schedule = _cli(cord_ops_command, ["--tracking-uri", uri, "schedule", "--data",
                                       str(digits_file), "--model-name", "guarded",
                                       "--cron", "0 3 * * *", "--work-pool", pool],
                    tmp_path, env)
    printed.append(schedule.stdout + schedule.stderr)
    assert schedule.returncode == 0, schedule.stderr[-3000:]
    assert "MLFLOW_TRACKING_PASSWORD set in the worker's environment" in schedule.stdout

    for text in printed:
        assert PASSWORD not in text

    # MLflow: params and tags of every run, logged model and model version
    for key, value in {"MLFLOW_TRACKING_USERNAME": USER,
                       "MLFLOW_TRACKING_PASSWORD": PASSWORD}.items():
        monkeypatch.setenv(key, value)
    client = MlflowClient(f"http://{auth_server}", f"http://{auth_server}")
    experiments = [e.experiment_id for e in client.search_experiments()]
    stored = []
    for run in client.search_runs(experiments):
        stored += [run.data.params, run.data.tags, run.info.artifact_uri]
    for model in client.search_logged_models(experiments):
        stored += [model.params, model.tags]
    for version in client.search_model_versions("name = 'guarded'"):
        stored += [version.tags, version.source]
    assert len(stored) >= 6
    assert PASSWORD not in json.dumps(stored, default=str)

    # Prefect: the flow run's parameters, the deployments' parameters, every log line
    with get_client(sync_client=True) as prefect:
        runs = [r for r in prefect.read_flow_runs(limit=200)
                if auth_server in json.dumps(r.parameters, default=str)]
        deployments = [d for d in prefect.read_deployments() if d.work_pool_name == pool]
        logs = []
        for offset in range(0, 10_000, 200):
            page = prefect.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(
                any_=[r.id for r in runs])), limit=200, offset=offset)
            logs += page
            if len(page) < 200:
                break
    assert runs and deployments and logs
    assert {d.parameters["tracking_uri"] for d in deployments} == {f"http://{auth_server}"}
    for kept in ([r.parameters for r in runs], [r.state.message for r in runs if r.state],
                 [d.parameters for d in deployments], [log.message for log in logs]):
        assert PASSWORD not in json.dumps(kept, default=str)
