"""Where runs and models are recorded: the embedded default MLflow store, or the one
MLFLOW_TRACKING_URI names.

The embedded default is ``sqlite:///<cwd>/mlruns/mlflow.db`` with artifacts under
``<cwd>/mlruns/`` (MLflow 3 keeps the plain file store in maintenance mode, so the
registry needs a database). Telemetry is switched off before MLflow or Prefect are
imported anywhere in the process.
"""

from __future__ import annotations

import os
from pathlib import Path

STORE_DIR = "mlruns"
DB_NAME = "mlflow.db"

#: Environment that keeps MLflow and Prefect from phoning home; set with setdefault so
#: a user's explicit choice wins.
QUIET_ENVIRONMENT = {
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "DO_NOT_TRACK": "1",
}


def disable_telemetry() -> None:
    """Switch off MLflow and Prefect telemetry for this process and its children."""
    for key, value in QUIET_ENVIRONMENT.items():
        os.environ.setdefault(key, value)


def embedded_store_uri(cwd: str | os.PathLike | None = None) -> str:
    """The embedded default tracking URI for ``cwd`` (default: the working directory)."""
    root = Path(cwd or os.getcwd()).resolve() / STORE_DIR
    return f"sqlite:///{root / DB_NAME}"


def tracking_uri() -> str:
    """MLFLOW_TRACKING_URI when set, else the embedded default of the working directory."""
    return os.environ.get("MLFLOW_TRACKING_URI") or embedded_store_uri()


def is_embedded(uri: str) -> bool:
    """True for a local sqlite store (artifacts then live beside it, under ./mlruns)."""
    return uri.startswith("sqlite:///")


def configure_tracking(uri: str | None = None) -> str:
    """Point MLflow at :func:`tracking_uri` and return the URI; the registry follows it.

    For a local sqlite store the folder is created first so the first run needs no setup.
    """
    disable_telemetry()
    import mlflow

    uri = uri or tracking_uri()
    if is_embedded(uri):
        Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    mlflow.set_tracking_uri(uri)
    return uri


def experiment_id(name: str) -> str:
    """The id of experiment ``name``, created on first use.

    In the embedded store MLflow places a new experiment's artifacts under ``./mlruns/<id>``.
    """
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    client = MlflowClient()
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    try:
        return client.create_experiment(name)
    except MlflowException:
        # Another process created it between the lookup and the create.
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id
