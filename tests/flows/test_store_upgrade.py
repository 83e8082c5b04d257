"""An embedded store one schema revision behind this MLflow is upgraded once, under the store
lock, while several processes ask for it at the same time; all of them then use it."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

PREPARE = """
import sys
from flows.registry import tracking
tracking.prepare_store(sys.argv[1])
print("ready", flush=True)
"""


def _revision(db: Path) -> str:
    with sqlite3.connect(db) as connection:
        return connection.execute("SELECT version_num FROM alembic_version").fetchone()[0]


def _checkout_root() -> str:
    import cord_ops

    return str(Path(cord_ops.__file__).resolve().parents[1])


def test_an_old_schema_is_upgraded_once_while_four_processes_wait(tmp_path):
    import os

    import sqlalchemy
    from alembic import command
    from mlflow import MlflowClient
    from mlflow.store.db.utils import _get_alembic_config, _get_latest_schema_revision

    from flows.registry import tracking

    db = tmp_path / "mlruns" / "mlflow.db"
    uri = f"sqlite:///{db}"
    tracking.prepare_store(uri)
    MlflowClient(uri).create_experiment("kept")
    latest = _get_latest_schema_revision()
    assert _revision(db) == latest
    # Take the store one migration back, as a store written by the previous MLflow is.
    config = _get_alembic_config(uri)
    engine = sqlalchemy.create_engine(uri)
    try:
        with engine.begin() as connection:
            config.attributes["connection"] = connection
            command.downgrade(config, "-1")
    finally:
        engine.dispose()
    old = _revision(db)
    assert old != latest

    env = {**os.environ, "PYTHONPATH": _checkout_root()}
    processes = [subprocess.Popen([sys.executable, "-c", PREPARE, uri], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in range(4)]
    outcomes = [p.communicate(timeout=300) for p in processes]
    assert [p.returncode for p in processes] == [0] * 4, [err[-2000:] for _, err in outcomes]
    assert all(out.strip() == "ready" for out, _ in outcomes)

    assert _revision(db) == latest
    with sqlite3.connect(db) as connection:
        assert connection.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    client = MlflowClient(uri)
    assert client.get_experiment_by_name("kept") is not None  # the data survived the upgrade
    client.create_registered_model("after-upgrade")
    assert client.get_registered_model("after-upgrade").name == "after-upgrade"
