"""The champion gate's rule, crash clean-up and rollback on a real (sqlite) registry, and
which store errors count as transient. No flow runs here: these are the pieces the flow
tests rely on, checked directly."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flows import registry
from flows.retries import is_transient

nll = st.floats(min_value=0.0, max_value=10.0, allow_nan=False)


@given(candidate=nll, champion=st.one_of(st.none(), nll),
       tpcr=st.sampled_from([0.0, 0.001, 0.5]), parity=st.booleans(), promote=st.booleans())
def test_gate_promotes_exactly_when_every_condition_holds(candidate, champion, tpcr, parity,
                                                           promote):
    score = None if champion is None else registry.ChampionScore("3", champion)
    decision = registry.decide(candidate, tpcr, parity, score, promote=promote)
    wins = tpcr == 0.0 and parity and (champion is None or candidate <= champion)
    assert decision.promote == (wins and promote)
    assert decision.candidate_nll == candidate
    assert decision.champion_nll == champion
    assert decision.label == ("promoted" if decision.promote else "rejected")


def test_gate_reasons_name_the_failed_condition():
    champ = registry.ChampionScore("2", 0.30)
    assert "TPCR" in registry.decide(0.1, 0.01, True, champ).reason
    assert "parity" in registry.decide(0.1, 0.0, False, champ).reason
    worse = registry.decide(0.31, 0.0, True, champ)
    assert not worse.promote and "worse than champion v2" in worse.reason
    broken = registry.decide(0.1, 0.0, True, registry.ChampionScore("2", None, "K mismatch"))
    assert not broken.promote and "K mismatch" in broken.reason
    assert registry.decide(0.30, 0.0, True, champ).promote  # a tie is "no worse"


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
