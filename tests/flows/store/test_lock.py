"""``flows.store.lock`` in the test process: the kind chosen per store, the
holder in words, the lock file names, the lease rule, the wait's log lines and timeout
error, and each kind's hold: the file lock on real files (a rival lock object in this
process stands in for another process), the Prefect slot against a stand-in server, the
lease against a stand-in tag store, with a clock whose sleeps cost nothing. The processes
that contend for a lock (a kill -9 included) are in test_registry.py; those cannot kill a
mutant, since the child processes import the installed package."""

from __future__ import annotations

import json
import re
import socket
import sqlite3
import threading
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import filelock
import prefect.client.orchestration as prefect_orchestration
import prefect.concurrency.sync as prefect_sync
import psutil
import pytest
from filelock import FileLock, Timeout
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

from flows.store import lock, owner


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


# ---------------------------------------------------------------- stand-ins
class Clock:
    """``lock``'s clock (``lock.time``): ``sleep`` advances it at once and is recorded, so
    waits of seconds take none and their lengths can be asserted; ``on_sleep`` lets a test
    act while the code sleeps (a rival's write). A hundred sleeps mean an endless wait."""

    strftime = staticmethod(time.strftime)
    localtime = staticmethod(time.localtime)
    EPOCH = 1_000_000.0

    def __init__(self):
        self.elapsed = 0.0
        self.sleeps: list[float] = []
        self.on_sleep = None

    def monotonic(self):
        return self.elapsed

    def time(self):
        return self.EPOCH + self.elapsed

    def sleep(self, seconds):
        if len(self.sleeps) >= 100:
            raise AssertionError("endless wait: 100 sleeps")
        self.sleeps.append(seconds)
        self.elapsed += seconds
        if self.on_sleep is not None:
            self.on_sleep(seconds)


@pytest.fixture
def clock(monkeypatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(lock, "time", clock)
    return clock


class Renewals:
    """The lease renewer's stop event (``lock.threading.Event``): each ``wait`` records its
    timeout and returns when the test calls :meth:`tick` (one renewal) or the lock sets it
    (release), so renewals happen when the test says, not every 20 s."""

    def __init__(self):
        self._cond = threading.Condition()
        self._stopped = False
        self._ticks = self._consumed = 0
        self.waits: list[float] = []

    def __call__(self):  # stands in for the class: the lock builds one event
        return self

    def set(self):
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    def wait(self, timeout):
        with self._cond:
            self.waits.append(timeout)
            self._cond.notify_all()
            self._cond.wait_for(lambda: self._stopped or self._ticks, timeout=10)
            if self._ticks and not self._stopped:
                self._ticks -= 1
                self._consumed += 1
            return self._stopped

    def tick(self) -> bool:
        """One renewal; True when the renewer went round and waits again."""
        with self._cond:
            if not self._cond.wait_for(lambda: len(self.waits) > self._consumed, timeout=2):
                return False
            waiting = len(self.waits)
            self._ticks += 1
            self._cond.notify_all()
            return self._cond.wait_for(lambda: len(self.waits) > waiting, timeout=2)


@pytest.fixture
def renewals(monkeypatch) -> Renewals:
    event = Renewals()
    monkeypatch.setattr(lock, "threading", SimpleNamespace(Event=event, Thread=threading.Thread))
    return event


class TagStore:
    """One registered model's tags in memory, standing in for the MlflowClient the prefect
    and lease locks write to (another model name is unknown to it, as to a store);
    ``failures`` are raised by the next tag writes, one each; ``unreadable`` makes reads
    fail like an unreachable server, ``fail_reads`` the next that many reads."""

    def __init__(self, model="m", failures=()):
        self.model = model
        self.tags: dict[str, str] = {}
        self.failures = list(failures)
        self.writes = 0
        self.unreadable = False
        self.fail_reads = 0

    def _known(self, name):
        if name != self.model:
            raise LookupError(f"registered model {name!r} not found")

    def get_registered_model(self, name):
        self._known(name)
        if self.unreadable or self.fail_reads:
            self.fail_reads = max(0, self.fail_reads - 1)
            raise ConnectionError("tracking server unreachable")
        return SimpleNamespace(tags=dict(self.tags))

    def set_registered_model_tag(self, name, key, value):
        self._known(name)
        self.writes += 1
        if self.failures:
            raise self.failures.pop(0)
        self.tags[key] = value

    def delete_registered_model_tag(self, name, key):
        self._known(name)
        del self.tags[key]


class PrefectServer:
    """Global concurrency limits in memory, standing in for the Prefect server behind
    ``get_client`` and ``concurrency``. ``rival_creates``: a limit another run creates
    between our read and our create; ``frees_on_wait``: the holder of a taken slot gives it
    back while a run waits for it."""

    def __init__(self):
        self.limits: dict[str, SimpleNamespace] = {}
        self.upserts: list[tuple[str, int]] = []
        self.acquisitions: list[dict] = []
        self.rival_creates: SimpleNamespace | None = None
        self.frees_on_wait = False

    def get_client(self, sync_client=False):
        # Prefect's asynchronous client works only with "async with"
        return self if sync_client else object()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def read_global_concurrency_limit_by_name(self, name):
        if name not in self.limits:
            raise ObjectNotFound(http_exc=None)
        return SimpleNamespace(**vars(self.limits[name]))  # a snapshot, as a response is

    def upsert_global_concurrency_limit_by_name(self, name, limit):
        self.upserts.append((name, limit))
        if self.rival_creates is not None:
            self.limits[name], self.rival_creates = self.rival_creates, None
            raise ObjectAlreadyExists(http_exc=None)
        active = self.limits[name].active_slots if name in self.limits else 0
        self.limits[name] = SimpleNamespace(limit=limit, active_slots=active)

    @contextmanager
    def concurrency(self, names, occupy=1, timeout_seconds=None, max_retries=None,
                    lease_duration=300, strict=False, holder=None):
        self.acquisitions.append({"names": names, "occupy": occupy, "strict": strict,
                                  "timeout_seconds": timeout_seconds,
                                  "lease_duration": lease_duration})
        slot = self.limits[names]
        if slot.active_slots + occupy > slot.limit:
            if not (self.frees_on_wait and timeout_seconds):
                raise TimeoutError(f"no slot of {names} within {timeout_seconds} s")
            slot.active_slots = 0
        slot.active_slots += occupy
        try:
            yield
        finally:
            slot.active_slots -= occupy


@pytest.fixture
def slots(monkeypatch) -> PrefectServer:
    server = PrefectServer()
    monkeypatch.setattr(prefect_orchestration, "get_client", server.get_client)
    monkeypatch.setattr(prefect_sync, "concurrency", server.concurrency)
    return server


TIMEOUT_TAIL = "(raise --lock-timeout to wait longer)"


# ---------------------------------------------------------------- file
def _held(lock_file: Path) -> bool:
    """Whether the OS lock is held: a second lock object (as another process would have)
    asks without waiting."""
    other = FileLock(lock_file, thread_local=False)
    try:
        other.acquire(timeout=0)
    except Timeout:
        return True
    other.release()
    return False


def _rival_file_lock(store: Path, record: dict) -> FileLock:
    lock_file, holder_file = lock.lock_paths(store, "m")
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    rival = FileLock(lock_file, thread_local=False)
    rival.acquire()
    holder_file.write_text(json.dumps(record))
    return rival


def test_a_free_file_lock_is_taken_at_once_published_and_given_back(tmp_path, clock):
    store = tmp_path / "new" / "store"  # not there yet: created with its parents
    lock_file, holder_file = lock.lock_paths(store, "m")
    log = Log()
    with lock.registry_lock("file", "m", 30.0, log, {"run_id": "r"},
                            store_folder=store) as waited:
        assert waited == 0.0 and log.lines == []
        assert _held(lock_file)
        assert json.loads(holder_file.read_text()) == {"run_id": "r", "acquired": "1000000.0"}
    assert not holder_file.exists() and not _held(lock_file)
    # The folder and lock file left behind serve the next holder.
    with lock.registry_lock("file", "m", 30.0, log, {"run_id": "r2"}, store_folder=store):
        assert json.loads(holder_file.read_text())["run_id"] == "r2"
    assert log.lines == []


def test_the_record_of_a_killed_file_lock_holder_is_overwritten(tmp_path, clock):
    # the kernel released its lock; only its record is left
    lock_file, holder_file = lock.lock_paths(tmp_path, "m")
    holder_file.parent.mkdir()
    holder_file.write_text(json.dumps({"run_id": "killed"}))
    log = Log()
    with lock.registry_lock("file", "m", 30.0, log, {"run_id": "r"},
                            store_folder=tmp_path) as waited:
        assert waited == 0.0 and log.lines == []
        assert json.loads(holder_file.read_text())["run_id"] == "r"
    assert not holder_file.exists()


def test_a_held_file_lock_times_out_naming_the_holder_of_its_record(tmp_path):
    rival = _rival_file_lock(tmp_path, {"run_id": "rival"})
    log = Log()
    try:
        with pytest.raises(lock.LockTimeout) as raised:
            with lock.registry_lock("file", "m", 0.2, log, {"run_id": "r"},
                                    store_folder=tmp_path):
                pytest.fail("a held lock was acquired")
        assert _held(lock.lock_paths(tmp_path, "m")[0])
    finally:
        rival.release()
    assert str(raised.value) == ("registry lock of model 'm' still held by run rival after "
                                 f"0.2 s {TIMEOUT_TAIL}")
    assert log.lines == ["registry lock of model 'm' is held by run rival; waiting up to 0 s"]
    assert json.loads(lock.lock_paths(tmp_path, "m")[1].read_text()) == {"run_id": "rival"}


def test_a_file_lock_given_back_during_the_wait_is_taken(tmp_path):
    rival = _rival_file_lock(tmp_path, {"run_id": "rival"})
    releaser = threading.Timer(0.3, rival.release)
    releaser.start()
    log = Log()
    with lock.registry_lock("file", "m", 30.0, log, {"run_id": "r"},
                            store_folder=tmp_path) as waited:
        assert 0.25 <= waited < 20.0
        assert json.loads(lock.lock_paths(tmp_path, "m")[1].read_text())["run_id"] == "r"
    releaser.join()
    assert log.lines[0] == "registry lock of model 'm' is held by run rival; waiting up to 30 s"
    assert re.fullmatch(r"registry lock of model 'm' acquired after \d+\.\d s", log.lines[1])
    assert len(log.lines) == 2


def test_a_file_lock_taken_on_one_thread_is_given_back_on_another(tmp_path, monkeypatch):
    # A flow's tasks may run on other threads than the one that took the lock. The lock
    # objects are kept alive here: the section's release must free the lock, not the
    # collection of an object whose release on another thread did nothing.
    made = []

    class Kept(FileLock):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(filelock, "FileLock", Kept)
    section = lock.registry_lock("file", "m", 5.0, Log(), {"run_id": "r"},
                                 store_folder=tmp_path)
    section.__enter__()
    leave = threading.Thread(target=section.__exit__, args=(None, None, None))
    leave.start()
    leave.join()
    lock_file, holder_file = lock.lock_paths(tmp_path, "m")
    assert len(made) == 1 and not holder_file.exists() and not _held(lock_file)


def test_a_holder_record_removed_during_the_section_is_no_error(tmp_path):
    with lock.registry_lock("file", "m", 5.0, Log(), {"run_id": "r"}, store_folder=tmp_path):
        lock.lock_paths(tmp_path, "m")[1].unlink()
    assert not _held(lock.lock_paths(tmp_path, "m")[0])


# ---------------------------------------------------------------- prefect
SLOT = "cord-ops-registry-m"


def test_a_free_prefect_slot_is_created_taken_published_and_given_back(slots, clock):
    store, log = TagStore(), Log()
    with lock.registry_lock("prefect", "m", 30.0, log, {"run_id": "r"},
                            client=store) as waited:
        assert waited == 0.0 and log.lines == []
        assert slots.limits[SLOT].active_slots == 1
        assert json.loads(store.tags[lock.HOLDER_TAG]) == {"run_id": "r",
                                                           "acquired": "1000000.0"}
    # The one-slot limit is created on first use; the free slot is taken with the whole
    # timeout (a short one would expire on a slow round trip), a renewed lease, strictly.
    assert slots.upserts == [(SLOT, 1)]
    assert slots.acquisitions == [{"names": SLOT, "occupy": 1, "timeout_seconds": 30.0,
                                   "lease_duration": 60.0, "strict": True}]
    assert slots.limits[SLOT].active_slots == 0 and store.tags == {}


def test_a_prefect_limit_changed_by_hand_is_put_back_to_one_slot(slots):
    slots.limits[SLOT] = SimpleNamespace(limit=3, active_slots=0)
    with lock.registry_lock("prefect", "m", 30.0, Log(), {"run_id": "r"}, client=TagStore()):
        assert slots.limits[SLOT].limit == 1
    assert slots.upserts == [(SLOT, 1)]
    # A one-slot limit is left as it is.
    with lock.registry_lock("prefect", "m", 30.0, Log(), {"run_id": "r"}, client=TagStore()):
        pass
    assert slots.upserts == [(SLOT, 1)] and len(slots.acquisitions) == 2


def test_a_held_prefect_slot_times_out_naming_the_holder_tag(slots, clock):
    slots.limits[SLOT] = SimpleNamespace(limit=1, active_slots=1)
    store, log = TagStore(), Log()
    store.tags[lock.HOLDER_TAG] = json.dumps({"run_id": "rival"})
    with pytest.raises(lock.LockTimeout) as raised:
        with lock.registry_lock("prefect", "m", 3.0, log, {"run_id": "r"}, client=store):
            pytest.fail("a held slot was acquired")
    assert str(raised.value) == ("registry lock of model 'm' still held by run rival after "
                                 f"3 s {TIMEOUT_TAIL}")
    assert log.lines == ["registry lock of model 'm' is held by run rival; waiting up to 3 s"]
    # "Acquire if free" asked the server instead of trying with a zero timeout.
    assert [a["timeout_seconds"] for a in slots.acquisitions] == [3.0]
    assert json.loads(store.tags[lock.HOLDER_TAG]) == {"run_id": "rival"}
    assert slots.limits[SLOT].active_slots == 1 and slots.upserts == []


def test_a_prefect_slot_created_and_held_by_a_rival_is_taken_when_it_frees(slots, clock):
    slots.rival_creates = SimpleNamespace(limit=1, active_slots=1)
    slots.frees_on_wait = True
    store, log = TagStore(), Log()
    store.tags[lock.HOLDER_TAG] = json.dumps({"run_id": "rival"})
    with lock.registry_lock("prefect", "m", 30.0, log, {"run_id": "r"}, client=store):
        assert json.loads(store.tags[lock.HOLDER_TAG])["run_id"] == "r"
        assert slots.limits[SLOT].active_slots == 1
    assert log.lines == ["registry lock of model 'm' is held by run rival; waiting up to 30 s",
                         "registry lock of model 'm' acquired after 0.0 s"]
    assert [a["timeout_seconds"] for a in slots.acquisitions] == [30.0]
    assert store.tags == {} and slots.limits[SLOT].active_slots == 0


def test_the_prefect_holder_record_is_removed_only_while_it_is_ours(slots):
    store = TagStore()
    with lock.registry_lock("prefect", "m", 30.0, Log(), {"run_id": "r"}, client=store):
        # e.g. a run that took the slot after this one's lease ran out
        store.tags[lock.HOLDER_TAG] = json.dumps({"run_id": "later"})
    assert json.loads(store.tags[lock.HOLDER_TAG]) == {"run_id": "later"}
    # An unreachable store at the end costs the record, not the slot.
    with lock.registry_lock("prefect", "m", 30.0, Log(), {"run_id": "r"}, client=store):
        store.unreadable = True
    assert slots.limits[SLOT].active_slots == 0


# ---------------------------------------------------------------- lease
def _lease(store: TagStore) -> dict:
    return json.loads(store.tags[lock.LEASE_TAG])


RIVAL = {"token": "rival", "expires": repr(Clock.EPOCH + 3600), "run_id": "rival"}


def test_a_free_lease_is_written_verified_renewed_and_released(clock, renewals):
    store, log = TagStore(), Log()
    with lock.registry_lock("lease", "m", 30.0, log, {"run_id": "r"}, client=store) as waited:
        assert waited == 0.0 and log.lines == [] and clock.sleeps == [0.5]
        lease = _lease(store)
        assert re.fullmatch(r"[0-9a-f]{32}", lease.pop("token"))
        assert lease == {"run_id": "r", "acquired": "1000000.0", "expires": "1000060.0"}
        renewer = [t for t in threading.enumerate() if t.name == "cord-ops-lease"]
        assert len(renewer) == 1 and renewer[0].daemon
        clock.elapsed = 15.0
        assert renewals.tick()
        assert _lease(store)["expires"] == "1000075.0"
        # A renewal that cannot read the store is skipped; the next one gets through.
        store.unreadable = True
        clock.elapsed = 30.0
        assert renewals.tick()
        store.unreadable = False
        assert _lease(store)["expires"] == "1000075.0"
        assert renewals.tick()
        assert _lease(store)["expires"] == "1000090.0"
        assert store.writes == 3
    assert lock.LEASE_TAG not in store.tags and not renewer[0].is_alive()
    assert renewals.waits == [20.0] * 4  # a third of LEASE_TTL


def test_a_lease_taken_over_is_neither_renewed_nor_released(clock, renewals):
    store = TagStore()
    with lock.registry_lock("lease", "m", 30.0, Log(), {"run_id": "r"}, client=store):
        store.tags[lock.LEASE_TAG] = json.dumps(RIVAL)  # ours had expired meanwhile
        assert renewals.tick()
    assert _lease(store) == RIVAL and store.writes == 1


def test_a_lease_release_that_cannot_reach_the_store_is_no_error(clock):
    store = TagStore()
    with lock.registry_lock("lease", "m", 30.0, Log(), {"run_id": "r"}, client=store):
        store.unreadable = True
    assert _lease(store)["run_id"] == "r"  # it expires LEASE_TTL after the last renewal


@pytest.mark.parametrize("left", [
    {**RIVAL, "expires": repr(Clock.EPOCH - 1)},  # expired
    "{not json",  # unreadable: no lease
    "",
], ids=["expired", "broken", "empty"])
def test_a_lease_that_is_no_lease_is_taken_at_once(clock, left):
    store, log = TagStore(), Log()
    store.tags[lock.LEASE_TAG] = left if isinstance(left, str) else json.dumps(left)
    with lock.registry_lock("lease", "m", 30.0, log, {"run_id": "r"}, client=store) as waited:
        assert waited == 0.0 and log.lines == [] and _lease(store)["run_id"] == "r"


def test_the_lease_of_a_dead_local_process_is_taken_at_once(clock):
    store, log = TagStore(), Log()
    gone = {**_me(), owner.STARTED_TAG: "1.0"}  # a start time no process has
    store.tags[lock.LEASE_TAG] = json.dumps({**RIVAL, **gone})
    with lock.registry_lock("lease", "m", 30.0, log, {"run_id": "r"}, client=store) as waited:
        assert waited == 0.0 and log.lines == [] and _lease(store)["run_id"] == "r"


def test_a_held_lease_times_out_naming_its_holder(clock):
    store, log = TagStore(), Log()
    store.tags[lock.LEASE_TAG] = json.dumps(RIVAL)
    with pytest.raises(lock.LockTimeout) as raised:
        with lock.registry_lock("lease", "m", 2.5, log, {"run_id": "r"}, client=store):
            pytest.fail("a held lease was acquired")
    assert str(raised.value) == ("registry lock of model 'm' still held by run rival after "
                                 f"2.5 s {TIMEOUT_TAIL}")
    assert log.lines == ["registry lock of model 'm' is held by run rival; waiting up to 2 s"]
    # Asked again every second, the last wait cut to the deadline.
    assert clock.sleeps == [1.0, 1.0, 0.5]
    assert _lease(store) == RIVAL and store.writes == 0


def test_a_lease_that_expires_during_the_wait_is_taken(clock):
    store, log = TagStore(), Log()
    store.tags[lock.LEASE_TAG] = json.dumps({**RIVAL, "expires": repr(Clock.EPOCH + 2.5)})
    with lock.registry_lock("lease", "m", 10.0, log, {"run_id": "r"}, client=store) as waited:
        assert waited == 3.5 and clock.sleeps == [1.0, 1.0, 1.0, 0.5]
        assert _lease(store)["expires"] == "1000063.0"
    assert log.lines == ["registry lock of model 'm' is held by run rival; waiting up to 10 s",
                         "registry lock of model 'm' acquired after 3.5 s"]


def test_a_lease_overwritten_before_the_read_back_is_not_held(clock):
    # the write-then-verify: a rival that wrote after us holds it
    store, log = TagStore(), Log()
    clock.on_sleep = lambda seconds: store.tags.update({lock.LEASE_TAG: json.dumps(RIVAL)})
    with pytest.raises(lock.LockTimeout, match="still held by run rival after 1 s"):
        with lock.registry_lock("lease", "m", 1.0, log, {"run_id": "r"}, client=store):
            pytest.fail("an overwritten lease was taken as held")
    assert _lease(store) == RIVAL and store.writes == 1


def test_a_lease_gone_before_the_read_back_is_written_again(clock):
    store, log = TagStore(), Log()

    def delete_first(seconds):
        clock.on_sleep = None
        del store.tags[lock.LEASE_TAG]

    clock.on_sleep = delete_first
    with lock.registry_lock("lease", "m", 10.0, log, {"run_id": "r"}, client=store) as waited:
        assert waited == 1.0 and store.writes == 2 and _lease(store)["run_id"] == "r"
    assert log.lines[0] == ("registry lock of model 'm' is held by an unknown holder; "
                            "waiting up to 10 s")


def test_our_own_lease_left_by_a_failed_read_back_is_ours_to_take(clock):
    # The write got through but reading it back failed: the next attempt finds our own
    # token, unexpired and held by this live process, and takes it rather than waiting
    # for it to expire.
    store, log = TagStore(), Log()

    def fail_the_read_back(seconds):
        clock.on_sleep = None
        store.fail_reads = 1

    clock.on_sleep = fail_the_read_back
    holder = {"run_id": "r", **_me()}
    with lock.registry_lock("lease", "m", 10.0, log, holder, client=store) as waited:
        assert waited == 1.0 and clock.sleeps == [0.5, 0.5] and store.writes == 2
    assert len(log.lines) == 2 and lock.LEASE_TAG not in store.tags


def test_a_lease_write_that_meets_a_locked_database_tries_again(clock):
    # sqlite's error as the embedded store raises it (MLflow wraps it; the words count)
    store, log = TagStore(failures=[sqlite3.OperationalError("database is locked")]), Log()
    with lock.registry_lock("lease", "m", 10.0, log, {"run_id": "r"}, client=store):
        assert _lease(store)["run_id"] == "r"
    assert store.writes == 2 and lock.LEASE_TAG not in store.tags
    assert log.lines == ["registry lock of model 'm' is held by an unknown holder; waiting up "
                         "to 10 s", "registry lock of model 'm' acquired after 0.5 s"]


def test_a_lease_write_that_fails_for_good_fails_at_once(clock):
    store = TagStore(failures=[sqlite3.OperationalError("attempt to write a readonly database")])
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        with lock.registry_lock("lease", "m", 10.0, Log(), {"run_id": "r"}, client=store):
            pass
    assert store.writes == 1 and clock.sleeps == []
