"""Crash clean-up by liveness and rollback on a real (sqlite) registry, the registry lock
across real processes, and which store errors count as transient (the gate's rules:
test_gate.py). No flow runs here: these are the pieces the flow tests rely on, checked
directly."""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

import psutil
import pytest

from flows.store import registry
from flows.store.retries import is_transient


def test_only_a_locked_sqlite_database_is_retried():
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import RESOURCE_DOES_NOT_EXIST
    from sqlalchemy.exc import OperationalError

    from flows.store.retries import is_store_outage

    def sql(message):
        return OperationalError("INSERT ...", {}, sqlite3.OperationalError(message))

    assert is_transient(sql("database is locked"))
    for permanent in ("attempt to write a readonly database", "database or disk is full",
                      "unable to open database file", "no such table: experiments"):
        assert not is_transient(sql(permanent)), permanent
        assert not is_store_outage(sql(permanent)), permanent
    try:
        try:
            raise ConnectionRefusedError(111, "Connection refused")
        except ConnectionRefusedError as inner:
            raise MlflowException("API request failed") from inner
    except MlflowException as wrapped:
        # MLflow's HTTP layer already retried it: an outage, not retried again.
        assert is_store_outage(wrapped) and not is_transient(wrapped)
    assert not is_transient(ValueError("labels: row 3 is out of range"))
    assert not is_transient(MlflowException("no such model", error_code=RESOURCE_DOES_NOT_EXIST))


@pytest.fixture
def client(store):
    from mlflow import MlflowClient

    return MlflowClient()


@pytest.fixture(scope="module")
def dead_owner() -> dict:
    """The owner record of a process that really ran on this host and has exited."""
    import subprocess

    from flows.store import owner

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.2)"])
    record = owner.Owner(owner.Owner.current().host, child.pid,
                         psutil.Process(child.pid).create_time()).record()
    child.wait()
    return record


def _version(client, name, owner_tags, run_status="RUNNING", pending=True, previous=None):
    experiment = client.get_experiment_by_name(name)
    run = client.create_run(experiment.experiment_id if experiment
                            else client.create_experiment(name), tags=owner_tags)
    if run_status != "RUNNING":
        client.set_terminated(run.info.run_id, run_status)
    registry.ensure_registered_model(client, name)
    tags = {registry.REGISTRATION_TAG: registry.PENDING} if pending else {}
    if previous is not None:
        tags[registry.PREVIOUS_CHAMPION_TAG] = str(previous)
    return client.create_model_version(name, source=str(Path.cwd()), tags=tags,
                                       run_id=run.info.run_id)


def test_clean_up_undoes_dead_owners_only(client, dead_owner):
    from mlflow.entities import LoggedModelStatus

    from flows.store import owner

    live = owner.Owner.current().record()
    champion = _version(client, "m", live, run_status="FINISHED", pending=False)
    client.set_registered_model_alias("m", registry.CHAMPION, champion.version)
    orphan = _version(client, "m", dead_owner)  # killed between register and gate
    live_pending = _version(client, "m", live)  # a concurrent run inside its window
    # Killed after the alias moved: the alias must go back to the recorded champion.
    pending_champion = _version(client, "m", dead_owner, previous=champion.version)
    client.set_registered_model_alias("m", registry.CHAMPION, pending_champion.version)
    experiment = client.get_experiment_by_name("m").experiment_id
    dead_run = client.create_run(experiment, tags=dead_owner)  # killed before registering
    live_run = client.create_run(experiment, tags=live)
    dead_model = client.create_logged_model(experiment, source_run_id=dead_run.info.run_id)
    live_model = client.create_logged_model(experiment, source_run_id=live_run.info.run_id)

    done = registry.clean_up(client, "m", experiment)

    assert done, "clean-up reported nothing"
    left = {str(mv.version) for mv in client.search_model_versions("name = 'm'")}
    assert left == {str(champion.version), str(live_pending.version)}
    assert str(registry.champion_version(client, "m").version) == str(champion.version)
    for run_id in (orphan.run_id, pending_champion.run_id, dead_run.info.run_id):
        run = client.get_run(run_id)
        assert run.info.status == "FAILED"
        assert run.data.tags[registry.ERROR_TAG].startswith("abandoned")
    for run_id in (live_pending.run_id, live_run.info.run_id):
        assert client.get_run(run_id).info.status == "RUNNING"
    assert client.get_logged_model(dead_model.model_id).status == LoggedModelStatus.FAILED
    assert client.get_logged_model(live_model.model_id).status == LoggedModelStatus.PENDING


def test_register_version_is_idempotent_per_run(client, dead_owner):
    first = _version(client, "m", dead_owner)
    again = registry.register_version(client, "m", first.run_id, str(Path.cwd()), None,
                                      tags={}, previous_champion=None)
    assert str(again.version) == str(first.version)
    assert len(client.search_model_versions("name = 'm'")) == 1


@pytest.mark.parametrize("had_champion", [True, False])
def test_withdraw_restores_the_alias_and_deletes_the_version(client, had_champion, dead_owner):
    previous = None
    if had_champion:
        previous = _version(client, "m", dead_owner, run_status="FINISHED",
                            pending=False).version
        client.set_registered_model_alias("m", registry.CHAMPION, previous)
    failed = _version(client, "m", dead_owner)
    client.set_registered_model_alias("m", registry.CHAMPION, failed.version)

    registry.withdraw_version(client, "m", str(failed.version), previous and str(previous))

    assert [str(mv.version) for mv in client.search_model_versions("name = 'm'")] == (
        [str(previous)] if had_champion else [])
    holder = registry.champion_version(client, "m")
    assert (holder and str(holder.version)) == (previous and str(previous))


@pytest.mark.usefixtures("prefect_harness")
def test_store_tasks_retry_transient_errors_and_only_those():
    from sqlalchemy.exc import OperationalError

    from flows.platform.task_presets import store_task

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


HOLD_LOCK = """
import logging, sys, time
from pathlib import Path
from flows.store import lock
from flows.store import owner
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(message)s")
folder, timeout, run_id = Path(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
hold, kind = float(sys.argv[4]), sys.argv[5]
client = None
if kind == "lease":
    from mlflow import MlflowClient
    from flows.store import registry
    client = MlflowClient(sys.argv[6])
    registry.ensure_registered_model(client, "m")
holder = {"run_id": run_id, **owner.Owner.current().record()}
try:
    with lock.registry_lock(kind, "m", timeout, logging.getLogger(), holder, client=client,
                            store_folder=folder):
        print("acquired", repr(time.time()), flush=True)
        time.sleep(hold)
        print("released", repr(time.time()), flush=True)
except lock.LockTimeout as exc:
    print("timeout:", exc, flush=True)
    sys.exit(3)
"""


def _holder(folder, timeout, run_id, hold, kind="file", uri=""):
    import os
    import subprocess

    # The checkout under test only: this process's sys.path may have picked up folders
    # (e.g. a model-from-code's) whose modules would shadow the standard library.
    env = {**os.environ, "PYTHONPATH": _checkout_root()}
    return subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(folder), str(timeout),
                             run_id, str(hold), kind, uri], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def _stamp(out: str, word: str) -> float:
    return float(next(x for x in out.splitlines() if x.startswith(word)).split()[1])


def test_file_lock_serialises_processes_names_the_holder_and_survives_a_kill_9(tmp_path):
    import signal
    import time

    first = _holder(tmp_path, 5, "run-A", 120)
    try:
        assert first.stdout.readline().startswith("acquired")
        waiter = _holder(tmp_path, 60, "run-B", 0)
        impatient = _holder(tmp_path, 0.5, "run-C", 0)
        out, _ = impatient.communicate(timeout=60)
        assert impatient.returncode == 3
        assert "still held by run run-A" in out and f"pid {first.pid}" in out
        line = waiter.stdout.readline()
        assert "held by run run-A" in line and "waiting up to 60 s" in line, line
        killed_at = time.time()
        first.send_signal(signal.SIGKILL)  # the kernel releases a dead holder's lock
        out, _ = waiter.communicate(timeout=60)
        assert waiter.returncode == 0, out
        assert _stamp(out, "acquired") >= killed_at
        assert "acquired after" in out
    finally:
        first.kill()
        first.wait()


@pytest.mark.slow
def test_lease_lock_serialises_processes_and_a_dead_local_holder_is_taken_over(store,
                                                                               tmp_path):
    """The fallback lock (a lease tag on the registered model, write-then-verify) across
    real processes on one store: no two holders overlap, and a holder killed on this host
    does not block the next one until its lease expires."""
    import signal
    import time

    from flows.store import lock

    holders = [_holder(tmp_path, 120, f"run-{i}", 1.5, "lease", store) for i in range(3)]
    ends = [h.communicate(timeout=180) for h in holders]
    outs = [out for out, _ in ends]
    assert [h.returncode for h in holders] == [0, 0, 0], ends
    spans = sorted((_stamp(o, "acquired"), _stamp(o, "released")) for o in outs)
    for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
        assert start >= end, spans  # one holder at a time
    assert any("is held by run run-" in o for o in outs)  # someone waited, naming the holder

    victim = _holder(tmp_path, 60, "victim", 120, "lease", store)
    try:
        assert victim.stdout.readline().startswith("acquired")
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        started = time.time()
        heir = _holder(tmp_path, 60, "heir", 0, "lease", store)
        out = heir.communicate(timeout=120)[0]
        assert heir.returncode == 0, out
        assert _stamp(out, "acquired") - started < lock.LEASE_TTL  # not after the expiry
    finally:
        victim.kill()
        victim.wait()


@pytest.mark.parametrize("what", ["text", "foreign-sqlite", "directory"])
def test_a_foreign_or_unreadable_store_file_gives_one_error_line(tmp_path, monkeypatch,
                                                                 digits_file, capsys, what):
    from flows.cli import main as cli

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    db = tmp_path / "mlruns" / "mlflow.db"
    db.parent.mkdir()
    if what == "text":
        db.write_text("name,score\nbob,3\n")
    elif what == "foreign-sqlite":
        with sqlite3.connect(db) as connection:
            connection.execute("CREATE TABLE invoices (id INTEGER)")
        connection.close()
    else:
        db.mkdir()
    before = sorted(p.name for p in db.parent.iterdir())

    code = cli.main(["recalibrate", "--data", str(digits_file), "--model-name", "m"])

    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.strip()]
    assert code == 1 and len(lines) == 1 and lines[0].startswith("error: "), err
    assert str(db) in lines[0]
    expected = {"text": "not an SQLite database", "foreign-sqlite": "not an MLflow store",
                "directory": "cannot read"}[what]
    assert expected in lines[0]
    # Nothing was created beside it but the (empty) lock folder of the store check.
    assert sorted(p.name for p in db.parent.iterdir() if p.name != ".cord-locks") == before


def _checkout_root() -> str:
    from pathlib import Path

    import cord_ops

    return str(Path(cord_ops.__file__).resolve().parents[1])


def test_versions_are_found_for_a_name_holding_quotes(client):
    """MLflow's filter grammar has no escape inside a literal, so a name with a quote (or
    both kinds) must still select exactly its own versions; the decoys differ from ``both``
    only where its LIKE pattern has wildcards, or by the case of a letter."""
    from flows.promotion import operations

    both = "it's \"ok\""
    names = ["o'brien", 'say "hi"', both, "it_s \"ok\"", "It's \"ok\"", "plain"]
    for count, name in enumerate(names, start=1):
        client.create_registered_model(name)
        for _ in range(count):
            client.create_model_version(name, source=str(Path.cwd()))

    for count, name in enumerate(names, start=1):
        found = registry.model_versions(client, name)
        assert sorted(int(mv.version) for mv in found) == list(range(1, count + 1)), name
        assert {mv.name for mv in found} == {name}
        assert len(operations.status(client, name).rows) == count, name
    assert registry.model_versions(client, "nobody's") == []


def test_the_command_line_lists_the_versions_of_a_quoted_name(client, store):
    from types import SimpleNamespace

    from flows.cli.operator import check_move, model_state
    from flows.inputs import InputError

    client.create_registered_model("o'brien")
    client.create_model_version("o'brien", source=str(Path.cwd()))
    overrides = SimpleNamespace(allow_harm=False, allow_label_free=False)
    with pytest.raises(InputError, match=r"has no version 9 .*\(versions: 1\)"):
        check_move(store, "o'brien", model_state(store, "o'brien"), "9", overrides, "promote")


def test_store_reads_read_an_embedded_store_and_never_write_one(client, store, tmp_path):
    from flows.store import reads
    experiment = client.create_experiment("e")
    run = client.create_run(experiment)
    client.log_param(run.info.run_id, "n_classes", "7")
    client.log_param(run.info.run_id, "input_kind", "probs")
    for name in ("b", "a"):
        client.create_registered_model(name)
    client.create_model_version("a", source=str(Path.cwd()))
    client.create_model_version("a", source=str(Path.cwd()), run_id=run.info.run_id,
                                tags={"k": "v"})
    client.set_registered_model_alias("a", registry.CHAMPION, "2")

    assert reads.registered_names(store, "a", registry.CHAMPION) == (["a", "b"], True)
    assert reads.registered_names(store, "b", registry.CHAMPION) == (["a", "b"], False)
    assert reads.registered_names(store, "c", None) == (["a", "b"], False)
    expected = {"version": "2", "n_classes": "7", "input_kind": "probs", "tags": {"k": "v"}}
    assert reads.version_reads(store, "a", registry.CHAMPION, None) == expected
    assert reads.version_reads(store, "a", None, "2") == expected
    assert reads.version_reads(store, "a", None, "3") is None

    # a sqlite file that is not an MLflow store is reported, not given MLflow's tables
    foreign = tmp_path / "foreign.db"
    with sqlite3.connect(foreign) as connection:
        connection.execute("CREATE TABLE t (x)")
    connection.close()
    before = foreign.read_bytes()
    with pytest.raises(sqlite3.DatabaseError):
        reads.registered_names(f"sqlite:///{foreign}", "a", None)
    assert foreign.read_bytes() == before
