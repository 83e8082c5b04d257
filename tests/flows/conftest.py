"""Fixtures of the flows tests.

Creating an MLflow sqlite store runs every schema migration (about 7 s on two cores); the
``store`` fixture instead copies a store migrated once per session into the fresh
``mlflow_uri`` location, so each test still gets an empty store of its own for ~0 s.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from cord_ops import data


@pytest.fixture(scope="session")
def mlflow_template_db(tmp_path_factory) -> Path:
    from mlflow import MlflowClient

    path = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    MlflowClient(f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture
def store(mlflow_uri, mlflow_template_db) -> str:
    """A fresh, already migrated embedded store; MLflow is pointed at it. Returns the URI."""
    import mlflow

    shutil.copyfile(mlflow_template_db, mlflow_uri.removeprefix("sqlite:///"))
    mlflow.set_tracking_uri(mlflow_uri)
    mlflow.set_registry_uri(mlflow_uri)
    return mlflow_uri


@pytest.fixture(scope="session")
def digits() -> data.Dataset:
    """Held-out logits of the bundled digits classifier (898 x 10), built once."""
    return data.digits_dataset(0)


@pytest.fixture
def digits_file(tmp_path, digits) -> Path:
    return data.save_npz(tmp_path / "digits.npz", digits.scores, digits.labels, "logits")
