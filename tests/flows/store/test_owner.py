"""Unit tests of owner liveness (flows/store/owner.py) and of the run-level reading of it that
clean-up decides by (``flows.store.registry._owner_alive``): a live or dead process on this host,
a remote owner with a fresh or stale heartbeat, a record without an owner, and a run's
start time (milliseconds) standing in for a missing heartbeat.

Processes are real (this one, and children that exit); a run is the two fields of it
that are read; the clock is a parameter (``now``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import psutil
import pytest

from flows.store import owner, registry

NOW = 1_800_000_000.0
STALE = owner.STALE_AFTER
HERE = owner.Owner.current().host
ELSEWHERE = HERE + "-elsewhere"


@pytest.fixture(scope="module")
def exited() -> owner.Owner:
    """An owner on this host whose process ran and has exited (and was reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    started = psutil.Process(child.pid).create_time()
    child.wait()
    return owner.Owner(HERE, child.pid, started)


def _zombie() -> subprocess.Popen:
    """A child that has exited and is not reaped yet (a zombie)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 30
    while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return child


def _remote(beat: float | None = None) -> dict:
    record = owner.Owner(ELSEWHERE, 12345, NOW - 1000.0).record()
    if beat is None:
        del record[owner.HEARTBEAT_TAG]
    else:
        record[owner.HEARTBEAT_TAG] = repr(beat)
    return record


def test_this_process_is_alive_and_its_record_round_trips():
    me = owner.Owner.current()
    assert (me.host, me.pid) == (HERE, os.getpid())
    assert me.is_local() and me.process_alive()
    record = me.record()
    assert owner.Owner.from_record(record) == me
    assert abs(float(record[owner.HEARTBEAT_TAG]) - time.time()) < 60
    # A local owner is decided by its process, whatever the heartbeat or the clock says.
    assert owner.alive({**record, owner.HEARTBEAT_TAG: repr(NOW - 10 * STALE)}, now=NOW)


def test_describe_names_pid_host_and_local_start_time(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    try:
        text = owner.Owner("box", 42, NOW + 0.75).describe()  # 2027-01-15 08:00:00.75 UTC
    finally:
        monkeypatch.undo()
        time.tzset()
    assert text == "pid 42 on box, process started 08:00:00"


def test_a_live_child_is_alive_by_its_own_start_time():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        started = psutil.Process(child.pid).create_time()
        assert owner.Owner(HERE, child.pid, started).process_alive()
        assert owner.alive(owner.Owner(HERE, child.pid, started).record())
        assert owner.process_start_time(child.pid) == started
    finally:
        child.kill()
        child.wait()


def test_an_exited_local_owner_is_dead_even_with_a_fresh_heartbeat(exited):
    assert exited.is_local() and not exited.process_alive()
    record = {**exited.record(), owner.HEARTBEAT_TAG: repr(NOW)}
    assert not owner.alive(record, last_activity=NOW, now=NOW)
    assert owner.process_start_time(exited.pid) is None


@pytest.mark.parametrize("offset, same", [(0.004, True), (-0.004, True), (0.02, False),
                                          (-0.02, False), (5.0, False)])
def test_a_reused_pid_is_told_by_its_start_time(offset, same):
    """The record's start time must match the live process's to 10 ms."""
    started = psutil.Process().create_time()
    record = owner.Owner(HERE, os.getpid(), started + offset).record()
    assert owner.alive(record) is same


def test_the_start_stamp_is_the_boot_and_the_start_tick_of_that_one_process():
    children = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
                for _ in range(2)]
    try:
        stamps = [owner.process_stamp(c.pid) for c in children]
        assert stamps == [owner.process_stamp(c.pid) for c in children]  # fixed for its life
        boot = open("/proc/sys/kernel/random/boot_id").read().strip()
        for child, stamp in zip(children, stamps, strict=True):
            head, ticks = stamp.rsplit(":", 1)
            assert head == boot
            since_boot = int(ticks) / os.sysconf("SC_CLK_TCK")
            process = psutil.Process(child.pid)
            assert abs(since_boot - (process.create_time() - psutil.boot_time())) < 0.05
    finally:
        for child in children:
            child.kill()
            child.wait()
    assert [owner.process_stamp(c.pid) for c in children] == [None, None]


def test_the_stamp_reads_past_a_command_name_with_parentheses_and_spaces():
    # /proc/<pid>/stat's field 2 is "(comm)", and comm may hold ") " itself
    child = subprocess.Popen([sys.executable, "-c", "open('/proc/self/comm', 'w').write("
                              "'x) 1 2 (3'); print('ready', flush=True); import time; "
                              "time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        assert psutil.Process(child.pid).name() == "x) 1 2 (3"
        ticks = int(owner.process_stamp(child.pid).rsplit(":", 1)[1])
        process = psutil.Process(child.pid)
        since_boot = process.create_time() - psutil.boot_time()
        assert abs(ticks / os.sysconf("SC_CLK_TCK") - since_boot) < 0.05
    finally:
        child.kill()
        child.wait()
        child.stdout.close()


def test_a_zombie_has_no_stamp_and_without_procfs_the_stamp_is_the_start_time(tmp_path):
    child = _zombie()
    assert owner.process_stamp(child.pid) is None
    child.wait()
    # no readable procfs (another OS, a locked-down container): psutil's start time of
    # that process (a child, so not this process's own)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        started = psutil.Process(other.pid).create_time()
        assert owner.process_stamp(other.pid, proc=tmp_path) == f"epoch:{started!r}"
    finally:
        other.kill()
        other.wait()
    assert owner.process_stamp(child.pid, proc=tmp_path) is None


def test_same_process_without_a_stamp_compares_that_pid_to_10_ms_by_default():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        started = psutil.Process(child.pid).create_time()
        assert owner.same_process(child.pid, None, started)
        assert owner.same_process(child.pid, None, started + 0.005)
        assert not owner.same_process(child.pid, None, started + 0.5)
    finally:
        child.kill()
        child.wait()


def test_a_wall_clock_step_does_not_make_a_live_process_look_dead():
    """psutil's start time moves with the boot time the wall clock gives: a second's step
    made the managed server and run owners compare as dead (CI, stop 35). The stamp decides
    when a record has one; a stamp of another process is dead whatever the start time."""
    started = psutil.Process().create_time()
    stamp = owner.process_stamp(os.getpid())
    for step in (1.0, -1.0, 3600.0):
        assert owner.Owner(HERE, os.getpid(), started + step, stamp).process_alive()
        assert owner.same_process(os.getpid(), stamp, started + step, tolerance=1.0)
    assert owner.alive(owner.Owner(HERE, os.getpid(), started + 1.0, stamp).record())
    other = subprocess.Popen([sys.executable, "-c", "pass"])
    foreign = owner.process_stamp(other.pid)
    other.wait()
    assert foreign is not None and foreign != stamp
    assert not owner.Owner(HERE, os.getpid(), started, foreign).process_alive()
    assert not owner.same_process(os.getpid(), foreign, started)
    # records written before stamps: the start time, to the tolerance given
    assert owner.same_process(os.getpid(), None, started + 0.5, tolerance=1.0)
    assert not owner.same_process(os.getpid(), None, started + 1.0, tolerance=1.0)
    assert not owner.same_process(os.getpid(), None, None)
    assert owner.Owner.current().stamp == stamp
    assert owner.Owner.from_record(owner.Owner.current().record()).stamp == stamp


def test_a_remote_owner_is_alive_while_its_heartbeat_is_fresh():
    assert owner.alive(_remote(NOW - 1.0), now=NOW)
    assert owner.alive(_remote(NOW - STALE + 0.5), now=NOW)  # just inside
    assert not owner.alive(_remote(NOW - STALE), now=NOW)  # exactly stale: dead
    assert not owner.alive(_remote(NOW - STALE - 0.5), now=NOW)  # just outside
    assert not owner.alive(_remote(NOW - 10 * STALE), last_activity=NOW, now=NOW)
    assert owner.alive(_remote(NOW - 20.0), stale_after=30.0, now=NOW)
    assert not owner.alive(_remote(NOW - 40.0), stale_after=30.0, now=NOW)


def test_a_remote_owner_without_a_heartbeat_falls_back_to_its_last_activity():
    assert owner.alive(_remote(), last_activity=NOW - 10.0, now=NOW)
    assert not owner.alive(_remote(), last_activity=NOW - STALE - 1.0, now=NOW)
    assert not owner.alive(_remote(), now=NOW)  # nothing to go by: dead
    garbled = {**_remote(), owner.HEARTBEAT_TAG: "not-a-time"}
    assert owner.alive(garbled, last_activity=NOW - 10.0, now=NOW)
    assert not owner.alive(garbled, now=NOW)


def test_a_record_without_an_owner_counts_as_alive_until_stale():
    assert owner.Owner.from_record({}) is None
    assert owner.Owner.from_record({owner.HOST_TAG: HERE, owner.PID_TAG: "x",
                                    owner.STARTED_TAG: "1.0"}) is None
    assert owner.Owner.from_record({owner.HOST_TAG: HERE, owner.PID_TAG: "1"}) is None
    assert owner.alive({}, last_activity=NOW - 10.0, now=NOW)
    assert not owner.alive({}, last_activity=NOW - STALE - 1.0, now=NOW)
    assert not owner.alive({}, now=NOW)
    assert owner.alive({owner.HEARTBEAT_TAG: repr(NOW - 1.0)}, now=NOW)
    assert not owner.alive({owner.HEARTBEAT_TAG: repr(NOW - STALE - 1.0)},
                           last_activity=NOW, now=NOW)
    # Without ``now`` the wall clock decides.
    assert owner.alive({}, last_activity=time.time())
    assert not owner.alive({}, last_activity=time.time() - STALE - 60.0)


def _run(tags: dict, started_s: float):
    """A run as ``MlflowClient.get_run`` returns it, reduced to the fields read (building
    mlflow.entities would import MLflow: seconds per test session)."""
    return SimpleNamespace(info=SimpleNamespace(start_time=int(started_s * 1000)),
                           data=SimpleNamespace(tags=tags))


def test_a_run_without_heartbeat_is_judged_by_its_start_time_in_milliseconds():
    """MLflow's start_time is in ms; read as seconds it would be far in the future and a
    stale run would look alive forever."""
    now = time.time()
    assert registry._owner_alive(_run({}, now - 10.0))
    assert not registry._owner_alive(_run({}, now - STALE - 60.0))
    assert registry._owner_alive(_run(_remote(now - 10.0), now - 10 * STALE))
    assert not registry._owner_alive(_run(_remote(), now - STALE - 60.0))
    assert not registry._owner_alive(None)


def test_process_start_time_of_live_gone_and_zombie_processes():
    assert abs(owner.process_start_time(os.getpid()) - psutil.Process().create_time()) < 1e-6
    child = _zombie()
    assert owner.process_start_time(child.pid) is None
    owner.reap(child.pid)
    assert not psutil.pid_exists(child.pid) or owner.process_start_time(child.pid) is None
    owner.reap(child.pid)  # reaping twice (no such child any more) is harmless


def test_terminate_group_ends_a_group_that_ignores_sigterm():
    child = subprocess.Popen(
        [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
         "signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"],
        start_new_session=True, stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    started = time.monotonic()
    owner.terminate_group(child.pid, timeout=0.3)
    assert time.monotonic() - started >= 0.3  # waited the timeout for SIGTERM first
    # SIGKILL was sent (SIGTERM is ignored): the child exits within moments.
    deadline = time.monotonic() + 10
    while owner.process_start_time(child.pid) is not None:
        assert time.monotonic() < deadline, "the group was not killed"
        time.sleep(0.01)
    child.wait(timeout=10)
    child.stdout.close()


def test_terminate_group_returns_once_sigterm_ended_it():
    child = subprocess.Popen([sys.executable, "-c", "import time; print('ready', flush=True);"
                              " time.sleep(60)"], start_new_session=True,
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    started = time.monotonic()
    owner.terminate_group(child.pid, timeout=30)
    assert time.monotonic() - started < 20
    assert owner.process_start_time(child.pid) is None
    child.stdout.close()
    owner.terminate_group(child.pid, timeout=0.1)  # already gone: no error


class _Tags:
    """The one MLflow client call the heartbeat makes, recorded (or failing)."""

    def __init__(self, fail: bool = False):
        self.calls, self.fail, self.beat = [], fail, threading.Event()

    def set_tag(self, run_id, key, value):
        self.calls.append((run_id, key, float(value)))
        self.beat.set()
        if self.fail:
            raise ConnectionError("store down")


@pytest.mark.parametrize("fail", [False, True])
def test_heartbeat_refreshes_the_tag_until_the_block_ends(fail):
    tags = _Tags(fail)
    before = time.time()
    with owner.Heartbeat(tags, "run-1", every=0.02) as beat:
        # A daemon thread, named: a hung store cannot keep the process from exiting.
        (thread,) = [t for t in threading.enumerate() if t.name == "cord-ops-heartbeat"]
        assert thread.daemon
        assert tags.beat.wait(10)
        while len(tags.calls) < 2:  # a failed beat does not stop the next one
            time.sleep(0.01)
    assert not beat._thread.is_alive()
    count = len(tags.calls)
    time.sleep(0.1)
    assert len(tags.calls) == count  # stopped
    assert {(r, k) for r, k, _ in tags.calls} == {("run-1", owner.HEARTBEAT_TAG)}
    assert all(before <= v <= time.time() for _, _, v in tags.calls)


def test_heartbeat_waits_one_period_before_the_first_beat():
    tags = _Tags()
    with owner.Heartbeat(tags, "run-1", every=30.0):
        time.sleep(0.1)
    assert tags.calls == []
    assert owner.HEARTBEAT_EVERY == owner.STALE_AFTER / 5


# ---------------------------------------------------------------- the command's marker
def test_mark_command_marks_this_process_unless_told_to_keep_a_given_marker(monkeypatch):
    mine = str(os.getpid())
    monkeypatch.setenv(owner.OWNER_ENV, "4242")
    assert owner.mark_command() == mine and os.environ[owner.OWNER_ENV] == mine
    monkeypatch.setenv(owner.OWNER_ENV, "4242")
    assert owner.mark_command(keep=True) == "4242" and os.environ[owner.OWNER_ENV] == "4242"
    monkeypatch.delenv(owner.OWNER_ENV)
    assert owner.mark_command(keep=True) == mine and os.environ[owner.OWNER_ENV] == mine


def test_a_detached_environment_drops_only_the_marker():
    environ = {owner.OWNER_ENV: "4242", "PATH": "/bin", "HOME": "/root"}
    assert owner.detached_environment(environ) == {"PATH": "/bin", "HOME": "/root"}
    assert environ[owner.OWNER_ENV] == "4242"  # the argument is left as it was
    assert owner.detached_environment({"PATH": "/bin"}) == {"PATH": "/bin"}


def test_the_watchdog_kills_what_carries_the_marker_once_the_command_ends(tmp_path,
                                                                         monkeypatch):
    """In-process (so the watchdog started is this module's): the write end returned is
    "the command"; closing it is its end. A sleeper carrying the marker must die, a
    PYTHONPATH that would break the watchdog's imports must not reach it (``-I``), and it
    must hold none of the command's output pipes, carry no marker itself and run in a
    session of its own (a SIGKILL to the command's group must not take it along)."""
    broken = tmp_path / "shadow"
    broken.mkdir()
    (broken / "psutil.py").write_text("raise ImportError('shadowed psutil')\n")
    monkeypatch.setenv("PYTHONPATH", str(broken))
    marker = f"test-watchdog-{os.getpid()}-{time.monotonic_ns()}"
    monkeypatch.setenv(owner.OWNER_ENV, marker)  # as mark_command leaves it
    before = {p.pid for p in psutil.Process().children()}
    write_end = owner.watch_command(marker)
    (watchdog,) = [p for p in psutil.Process().children() if p.pid not in before]
    sleeper = None
    try:
        assert os.readlink(f"/proc/{watchdog.pid}/fd/1") == "/dev/null"
        assert os.readlink(f"/proc/{watchdog.pid}/fd/2") == "/dev/null"
        assert os.getsid(watchdog.pid) == watchdog.pid
        assert owner.OWNER_ENV not in watchdog.environ()
        # started well after the watchdog: one that saw end of file at once (the wrong
        # stdin) has looked and gone by then
        time.sleep(1.5)
        sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                   env={**os.environ, owner.OWNER_ENV: marker,
                                        "PYTHONPATH": ""})
        time.sleep(0.3)
        assert sleeper.poll() is None  # nothing is killed while the command runs
        os.close(write_end)
        assert sleeper.wait(timeout=5) == -9
        watchdog.wait(timeout=5)
    finally:
        if sleeper is not None and sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait()
        if watchdog.is_running():
            watchdog.kill()


def test_the_managed_server_and_warm_runner_records_survive_a_clock_step(tmp_path):
    """A server.json / runner.json whose start time a clock step moved by a second still
    names its live process; one written before stamps (no "stamp") is judged by the time."""
    from flows.platform import managed_server, warm

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                             start_new_session=True)
    try:
        started = psutil.Process(child.pid).create_time()
        stepped = {"pid": child.pid, "port": 1, "create_time": started + 1.0,
                   "stamp": owner.process_stamp(child.pid)}
        folder = tmp_path / "prefect"
        folder.mkdir()
        (folder / "runner.json").write_text(json.dumps(stepped))
        assert warm.running(folder) == stepped
        (folder / "runner.json").write_text(json.dumps({**stepped, "stamp": None}))
        assert warm.running(folder) is None
        (folder / "server.json").write_text(json.dumps({**stepped, "stamp": None}))
        assert managed_server.stop(folder, timeout=5) is None  # taken as dead: not signalled
        assert child.poll() is None
        (folder / "server.json").write_text(json.dumps(stepped))
        assert managed_server.stop(folder, timeout=5) == child.pid  # found and stopped
        assert child.wait(timeout=10) is not None
    finally:
        child.kill()
        child.wait()
