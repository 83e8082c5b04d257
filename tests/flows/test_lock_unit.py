"""``flows.lock``'s pure parts, in-process and without a store (issue 25): the kind chosen
per store, the holder in words, the lock file names, the lease rule and the wait's two
log lines and its timeout error. The processes that contend for a lock are in
test_registry.py."""

from __future__ import annotations

import json
import socket
import time
import uuid
from pathlib import Path

import psutil
import pytest

from flows.registry import lock, owner


def test_the_kind_follows_the_store():
    assert lock.choose(Path("/srv/mlruns"), None) == "file"
    assert lock.choose(Path("/srv/mlruns"), "http://prefect:4200/api") == "file"
    assert lock.choose(None, "http://prefect:4200/api") == "prefect"
    assert lock.choose(None, None) == "lease"
    assert lock.choose(None, "") == "lease"


def test_a_holder_in_words(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    try:
        assert lock.describe(None) == "an unknown holder"
        assert lock.describe({}) == "an unknown holder"
        assert lock.describe({"run_id": "r1"}) == "run r1"
        assert lock.describe({"acquired": "3600.5"}) == "a run since 01:00:00"
        record = {owner.HOST_TAG: "node-7", owner.PID_TAG: "42", owner.STARTED_TAG: "7200.0"}
        assert (lock.describe({**record, "run_id": "r2", "acquired": "3661"})
                == "run r2 (pid 42 on node-7, process started 02:00:00) since 01:01:01")
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


def test_lock_files_are_escaped_and_told_apart_by_a_digest(tmp_path):
    lock_file, holder = lock.lock_paths(tmp_path, "team/model v1")
    digest = uuid.uuid5(uuid.NAMESPACE_URL, "team/model v1").hex[:8]
    assert lock_file == tmp_path / ".cord-locks" / f"team_model_v1-{digest}.lock"
    assert holder == tmp_path / ".cord-locks" / f"team_model_v1-{digest}.holder.json"
    # Two names that escape alike still get two locks.
    assert lock.lock_paths(tmp_path, "team_model v1")[0] != lock_file
    # Letters, digits, dot, underscore and dash are kept as they are.
    assert lock.lock_paths(tmp_path, "A.b_c-9")[0].name.startswith("A.b_c-9-")


def test_read_json_gives_none_for_a_missing_or_broken_file(tmp_path):
    path = tmp_path / "holder.json"
    assert lock._read_json(path) is None
    path.write_text("{not json")
    assert lock._read_json(path) is None
    path.write_text(json.dumps({"run_id": "r"}))
    assert lock._read_json(path) == {"run_id": "r"}


def test_prefect_limit_name():
    assert lock.prefect_limit_name("digits") == "cord-ops-registry-digits"


def _me() -> dict:
    return {owner.HOST_TAG: socket.gethostname(), owner.PID_TAG: str(psutil.Process().pid),
            owner.STARTED_TAG: repr(psutil.Process().create_time())}


def test_lease_rule():
    now = 1000.0
    assert lock._lease_free(None, "t", now)
    assert lock._lease_free({}, "t", now)
    assert lock._lease_free({"token": "t", "expires": "2000"}, "t", now)  # our own
    assert lock._lease_free({"token": "u", "expires": "1000"}, "t", now)  # expired at now
    assert lock._lease_free({"token": "u"}, "t", now)  # no expiry: expired
    assert not lock._lease_free({"token": "u", "expires": "1000.5"}, "t", now)
    # Unexpired and held by a live local process (this one), or by a remote host: held.
    assert not lock._lease_free({"token": "u", "expires": "2000", **_me()}, "t", now)
    remote = {**_me(), owner.HOST_TAG: "elsewhere.invalid"}
    assert not lock._lease_free({"token": "u", "expires": "2000", **remote}, "t", now)
    # Unexpired but its local owner process is gone (a start time no process has): free.
    gone = {**_me(), owner.STARTED_TAG: "1.0"}
    assert lock._lease_free({"token": "u", "expires": "2000", **gone}, "t", now)


class Log:
    def __init__(self):
        self.lines: list[str] = []

    def info(self, message, *args):
        self.lines.append(message % args)


def test_wait_acquires_at_once_without_logging():
    log, asked = Log(), []
    waited = lock._wait(lambda s: asked.append(s) or True, lambda: {"run_id": "x"}, "m", 5.0,
                        log)
    assert waited == 0.0 and asked == [0.0] and log.lines == []


def test_wait_logs_the_holder_then_the_wait():
    log, asked = Log(), []

    def try_acquire(seconds):
        asked.append(seconds)
        return seconds > 0

    waited = lock._wait(try_acquire, lambda: {"run_id": "r9"}, "digits", 30.0, log)
    assert asked == [0.0, 30.0]
    assert 0.0 <= waited < 5.0
    assert log.lines[0] == ("registry lock of model 'digits' is held by run r9; waiting up "
                            "to 30 s")
    assert log.lines[1].startswith("registry lock of model 'digits' acquired after ")
    assert len(log.lines) == 2


def test_wait_times_out_naming_the_latest_holder():
    holders = iter([{"run_id": "first"}, {"run_id": "second"}])
    with pytest.raises(lock.LockTimeout) as raised:
        lock._wait(lambda s: False, lambda: next(holders), "digits", 2.5, Log())
    assert str(raised.value) == ("registry lock of model 'digits' still held by run second "
                                 "after 2.5 s (raise --lock-timeout to wait longer)")


def test_wait_times_out_naming_the_first_holder_when_the_record_is_gone():
    holders = iter([{"run_id": "first"}, None])
    with pytest.raises(lock.LockTimeout, match="still held by run first after 1 s"):
        lock._wait(lambda s: False, lambda: next(holders), "m", 1.0, Log())


def test_an_unknown_kind_is_refused_before_anything_is_held(tmp_path):
    with pytest.raises(ValueError, match=r"lock kind: expected one of \('file', 'prefect', "
                                         r"'lease'\), got 'nfs'"):
        with lock.registry_lock("nfs", "m", 1.0, Log(), {}, store_folder=tmp_path):
            pass
    assert not (tmp_path / ".cord-locks").exists()


class TagStore:
    """A registered model's tags in memory, standing in for the store the lease lock writes
    to; ``failures`` are raised by the next tag writes, one each."""

    def __init__(self, failures=()):
        self.tags: dict[str, str] = {}
        self.failures = list(failures)
        self.writes = 0

    def get_registered_model(self, name):
        return type("Model", (), {"tags": dict(self.tags)})()

    def set_registered_model_tag(self, name, key, value):
        self.writes += 1
        if self.failures:
            raise self.failures.pop(0)
        self.tags[key] = value

    def delete_registered_model_tag(self, name, key):
        self.tags.pop(key, None)


def test_a_lease_write_that_meets_a_locked_database_tries_again():
    from mlflow.exceptions import MlflowException

    store = TagStore([MlflowException("(sqlite3.OperationalError) database is locked")])
    with lock.registry_lock("lease", "m", 10.0, Log(), {"run_id": "r"}, client=store):
        held = json.loads(store.tags[lock.LEASE_TAG])
        assert held["run_id"] == "r"
    assert store.writes >= 2 and lock.LEASE_TAG not in store.tags


def test_a_lease_write_that_fails_for_good_fails_at_once():
    from mlflow.exceptions import MlflowException

    store = TagStore([MlflowException("attempt to write a readonly database")])
    started = time.monotonic()
    with pytest.raises(MlflowException, match="readonly"):
        with lock.registry_lock("lease", "m", 10.0, Log(), {"run_id": "r"}, client=store):
            pass
    assert time.monotonic() - started < 5.0 and store.writes == 1
