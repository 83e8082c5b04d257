"""An embedded store one schema revision behind this MLflow is upgraded once, under the store
lock, while several processes ask for it at the same time; all of them then use it."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

PREPARE = """
import sys
from flows.store import tracking
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

    from flows.store import tracking

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
    # MLflow migrated it while opening it (the old schema lacks a table); the copy taken
    # first is kept, at the old revision
    assert _revision(db.with_name("mlflow.db.before-upgrade")) == old
    with sqlite3.connect(db) as connection:
        assert connection.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    client = MlflowClient(uri)
    assert client.get_experiment_by_name("kept") is not None  # the data survived the upgrade
    client.create_registered_model("after-upgrade")
    assert client.get_registered_model("after-upgrade").name == "after-upgrade"


def _downgraded_store(tmp_path: Path) -> tuple[Path, str, str]:
    """(database, its revision, the latest): an embedded store one migration behind, made
    in a child process so that this process has never opened it (MLflow caches an opened
    store by URI and would not look at the schema again)."""
    import os

    db = tmp_path / "mlruns" / "mlflow.db"
    make = """
import sys, sqlalchemy
from alembic import command
from mlflow import MlflowClient
from mlflow.store.db.utils import _get_alembic_config
from flows.store import tracking
tracking.prepare_store(sys.argv[1])
MlflowClient(sys.argv[1]).create_experiment("kept")
config = _get_alembic_config(sys.argv[1])
engine = sqlalchemy.create_engine(sys.argv[1])
with engine.begin() as connection:
    config.attributes["connection"] = connection
    command.downgrade(config, "-1")
engine.dispose()
"""
    env = {**os.environ, "PYTHONPATH": _checkout_root()}
    done = subprocess.run([sys.executable, "-c", make, f"sqlite:///{db}"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    from mlflow.store.db.utils import _get_latest_schema_revision

    return db, _revision(db), _get_latest_schema_revision()


def test_a_store_mlflow_refuses_as_out_of_date_is_kept_then_upgraded_by_mlflow_db_upgrade(
        tmp_path, monkeypatch):
    """The route for an old store that has every table (MLflow then refuses to open it):
    the refusal is played by the first open, the rest is real: the copy, ``mlflow db
    upgrade`` in a child process, the second open."""
    from mlflow import MlflowClient

    from flows.store import tracking

    db, old, latest = _downgraded_store(tmp_path)
    assert old != latest
    opened = []
    real_open = tracking._open_store

    def refuse_first(uri):
        opened.append(uri)
        return False if len(opened) == 1 else real_open(uri)

    monkeypatch.setattr(tracking, "_open_store", refuse_first)
    tracking.prepare_store(f"sqlite:///{db}")

    assert len(opened) == 2
    assert _revision(db.with_name("mlflow.db.before-upgrade")) == old
    assert _revision(db) == latest
    assert MlflowClient(f"sqlite:///{db}").get_experiment_by_name("kept") is not None


def test_mlflow_refuses_an_old_schema_with_the_message_the_store_check_reads(tmp_path):
    """A store with every table but an older revision recorded: opening it with the public
    client raises MLflow's out-of-date error, which :func:`_open_store` reads as False,
    and nothing is written."""
    from flows.store import tracking

    _, old, _ = _downgraded_store(tmp_path)
    # every table back (as a store of an MLflow whose newest migration only altered one)
    fresh = tmp_path / "fresh" / "mlflow.db"
    tracking.prepare_store(f"sqlite:///{fresh}")
    with sqlite3.connect(fresh) as connection:
        connection.execute("UPDATE alembic_version SET version_num = ?", (old,))
    connection.close()
    copy = tmp_path / "refused" / "mlflow.db"
    copy.parent.mkdir()
    copy.write_bytes(fresh.read_bytes())
    before = copy.read_bytes()

    assert tracking._open_store(f"sqlite:///{copy}") is False
    assert copy.read_bytes() == before
