"""Crash clean-up and withdrawal on a real (sqlite) registry, and which store errors count
as transient (the gate's rules: test_gate.py). No flow runs here: these are the pieces
the flow tests rely on, checked directly."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from flows import registry
from flows.retries import is_transient


def test_transient_errors_are_store_outages_only():
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import RESOURCE_DOES_NOT_EXIST, TEMPORARILY_UNAVAILABLE
    from sqlalchemy.exc import OperationalError

    locked = OperationalError("INSERT ...", {}, sqlite3.OperationalError("database is locked"))
    assert is_transient(locked)
    assert is_transient(MlflowException("busy", error_code=TEMPORARILY_UNAVAILABLE))
    try:
        try:
            raise ConnectionRefusedError(111, "Connection refused")
        except ConnectionRefusedError as inner:
            raise MlflowException("API request failed") from inner
    except MlflowException as wrapped:
        assert is_transient(wrapped)
    assert not is_transient(ValueError("labels: row 3 is out of range"))
    assert not is_transient(MlflowException("no such model", error_code=RESOURCE_DOES_NOT_EXIST))


@pytest.fixture
def client(store):
    from mlflow import MlflowClient

    return MlflowClient()


def _version(client, name, run_status="RUNNING", pending=True):
    experiment = client.get_experiment_by_name("registry")
    run = client.create_run(experiment.experiment_id if experiment
                            else client.create_experiment("registry"))
    if run_status != "RUNNING":
        client.set_terminated(run.info.run_id, run_status)
    registry.ensure_registered_model(client, name)
    tags = {registry.REGISTRATION_TAG: registry.PENDING} if pending else {}
    return client.create_model_version(name, source=str(Path.cwd()), tags=tags,
                                       run_id=run.info.run_id)


def test_orphans_of_crashed_runs_are_discarded_but_champions_kept(client):
    champion = _version(client, "m", run_status="FINISHED", pending=False)
    client.set_registered_model_alias("m", registry.CHAMPION, champion.version)
    orphan = _version(client, "m")  # crashed between register and gate
    pending_champion = _version(client, "m")  # crashed after the alias moved
    client.set_registered_model_alias("m", registry.CHAMPION, pending_champion.version)
    current = _version(client, "m")

    deleted = registry.discard_orphans(client, "m", current.run_id)

    assert deleted == [str(orphan.version)]
    left = {mv.version for mv in client.search_model_versions("name = 'm'")}
    assert left == {champion.version, pending_champion.version, current.version}
    assert client.get_run(orphan.run_id).info.status == "FAILED"
    assert client.get_run(current.run_id).info.status == "RUNNING"


def test_register_version_is_idempotent_per_run(client):
    first = _version(client, "m")
    again = registry.register_version(client, "m", first.run_id, str(Path.cwd()), None,
                                      tags={})
    assert str(again.version) == str(first.version)
    assert len(client.search_model_versions("name = 'm'")) == 1


@pytest.mark.parametrize("had_champion", [True, False])
def test_withdraw_restores_the_alias_and_deletes_the_version(client, had_champion):
    previous = None
    if had_champion:
        previous = _version(client, "m", run_status="FINISHED", pending=False).version
        client.set_registered_model_alias("m", registry.CHAMPION, previous)
    failed = _version(client, "m")
    client.set_registered_model_alias("m", registry.CHAMPION, failed.version)

    registry.withdraw_version(client, "m", str(failed.version), previous and str(previous))

    assert [str(mv.version) for mv in client.search_model_versions("name = 'm'")] == (
        [str(previous)] if had_champion else [])
    holder = registry.champion_version(client, "m")
    assert (holder and str(holder.version)) == (previous and str(previous))


@pytest.mark.usefixtures("prefect_harness")
def test_store_tasks_retry_transient_errors_and_only_those():
    from sqlalchemy.exc import OperationalError

    from flows.recalibrate import store_task

    calls = []

    @store_task
    def locked_once():
        calls.append("locked_once")
        if calls.count("locked_once") == 1:
            raise OperationalError("INSERT", {}, sqlite3.OperationalError("database is locked"))
        return "written"

    @store_task
    def bad_argument():
        calls.append("bad_argument")
        raise ValueError("experiment name must be a string")

    assert locked_once() == "written"
    with pytest.raises(ValueError, match="experiment name"):
        bad_argument()
    assert calls == ["locked_once", "locked_once", "bad_argument"]
