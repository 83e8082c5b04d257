"""Fixtures of the flows tests.

Creating an MLflow sqlite store runs every schema migration (about 7 s on two cores); the
``store`` fixture instead copies a store migrated once per session into the fresh
``mlflow_uri`` location, so each test still gets an empty store of its own for ~0 s.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import sys
from pathlib import Path

import pytest

from cord_ops import data


@pytest.fixture(scope="session")
def mlflow_template_db(tmp_path_factory) -> Path:
    # benchmarks/mutation.py runs each mutant in a fresh pytest process: it migrates one
    # template for the whole run and names it here (the store fixture only copies it)
    given = os.environ.get("CORD_OPS_MLFLOW_TEMPLATE_DB")
    if given and Path(given).is_file():
        return Path(given)
    from mlflow import MlflowClient

    path = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    MlflowClient(f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture(scope="session")
def store_at(mlflow_template_db):
    """``store_at(db)``: an empty, already migrated store at the path ``db`` (a copy of the
    template, folders made); returns its URI."""
    def make(db: Path) -> str:
        db.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(mlflow_template_db, db)
        # The template's Default experiment keeps the artifact folder of the directory it
        # was created in; point it at this store so no artifact lands outside its folder.
        with sqlite3.connect(db) as connection:
            connection.execute("UPDATE experiments SET artifact_location = ? "
                               "WHERE experiment_id = 0", (str(db.parent / "0"),))
        connection.close()
        return f"sqlite:///{db}"
    return make


@pytest.fixture
def store(mlflow_uri, store_at) -> str:
    """A fresh, already migrated embedded store, named by MLFLOW_TRACKING_URI (from
    ``mlflow_uri``). Returns the URI."""
    store_at(Path(mlflow_uri.removeprefix("sqlite:///")))
    return mlflow_uri


@pytest.fixture(scope="session")
def digits() -> data.Dataset:
    """Held-out logits of the bundled digits classifier (898 x 10), built once."""
    return data.digits_dataset(0)


@pytest.fixture
def digits_file(tmp_path, digits) -> Path:
    return data.save_npz(tmp_path / "digits.npz", digits.scores, digits.labels, "logits")


@pytest.fixture
def prefect_api_url(prefect_harness) -> str:
    """The session Prefect server's URL, for subprocesses (the CLI, a served runner)."""
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value()


@pytest.fixture
def cli_env(prefect_api_url) -> dict[str, str]:
    """Environment for a ``cord-ops`` subprocess: this one's (including a test's
    MLFLOW_TRACKING_URI) plus the session Prefect server, so no temporary server starts."""
    return {**os.environ, "PREFECT_API_URL": prefect_api_url}


@pytest.fixture(scope="session")
def cord_ops_command() -> list[str]:
    """The installed ``cord-ops`` console script."""
    script = Path(sys.executable).with_name("cord-ops")
    assert script.exists(), f"{script}: console script missing; pip install -e . first"
    return [str(script)]
