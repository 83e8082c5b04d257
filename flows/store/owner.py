"""Who is running a recalibration, and whether that process is still alive.

Clean-up after a crash must decide by liveness, never by appearance: a pending version of
a run that is still fitting in another process looks exactly like the leftover of a run
that was killed. Every run therefore records its owner as run tags (host, pid and the
process's start time, which tells a live process from a later one that reused the pid)
plus, for stores other machines can reach, a heartbeat the owner refreshes while it runs.

An owner is alive when

- it runs on this host: its pid exists and that process is the one recorded, told by its
  start stamp (:func:`process_stamp`: the boot and the clock tick since boot it started
  at, which no change of the wall clock moves); the answer is certain;
- it runs on another host: its last heartbeat is younger than ``stale_after`` seconds
  (:data:`STALE_AFTER`); a heartbeat cannot tell a hung owner from a slow one, so a
  heartbeat older than that is taken as dead.

A run with no owner record (logged by an older cord-ops) counts as alive until its last
activity is ``stale_after`` seconds old.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

HOST_TAG = "cord.owner.host"
PID_TAG = "cord.owner.pid"
STARTED_TAG = "cord.owner.started"
STAMP_TAG = "cord.owner.process"
HEARTBEAT_TAG = "cord.owner.heartbeat"
#: Seconds without a heartbeat after which an owner on another host is taken as dead.
STALE_AFTER = 300.0
#: Seconds between two heartbeats (a fifth of STALE_AFTER: four may be lost).
HEARTBEAT_EVERY = STALE_AFTER / 5
#: Environment variable of every process a cord-ops command starts, however indirectly
#: (temporary Prefect server, Dask workers and nannies, helpers a library spawns): the pid
#: of the command. What a command left alive is exactly the processes whose environment
#: holds its pid. The detached services meant to outlive a command (managed Prefect
#: server, warm runner, ``cord-ops ui``) are started without it.
OWNER_ENV = "CORD_OPS_OWNER"
#: The watchdog of :func:`watch_command`: waits for end of file on stdin (the command's
#: end, however it ends), then SIGKILLs every process carrying the marker ``argv[1]``
#: except the command itself (``argv[2]``) and repeats once for children started while
#: the first ones died. Signals to the command's group (Ctrl-C) must not end it first.
_WATCHDOG = """
import os, signal, sys
import psutil
for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(signum, signal.SIG_IGN)
marker, command = sys.argv[1], int(sys.argv[2])
sys.stdin.buffer.read()
for _ in range(2):
    left = []
    for process in psutil.process_iter():
        try:
            if (process.pid not in (os.getpid(), command)
                    and process.environ().get(OWNER_ENV) == marker):
                process.kill()
                left.append(process)
        except psutil.Error:
            pass
    psutil.wait_procs(left, timeout=2)
""".replace("OWNER_ENV", repr(OWNER_ENV))


def mark_command(keep: bool = False) -> str:
    """Give this command's process (and so everything it starts) the owner marker, its
    pid; ``keep``: keep the marker it was given (the warm runner's child, which stands in
    for the command that forwarded itself). Returns the marker."""
    if not keep or OWNER_ENV not in os.environ:
        os.environ[OWNER_ENV] = str(os.getpid())
    return os.environ[OWNER_ENV]


def detached_environment(environ) -> dict[str, str]:
    """``environ`` without the owner marker, for a process meant to outlive the command."""
    return {key: value for key, value in environ.items() if key != OWNER_ENV}


def watch_command(marker: str) -> int:
    """Start the watchdog that kills what this command leaves behind when it ends, by
    ``kill -9`` included (no hook of this process runs then). Its stdin is the read end of
    a pipe whose write end only this process holds (close-on-exec, so no child inherits
    it) until it ends: end of file means this process is gone. Returns that write end,
    which is never closed; nothing waits for the watchdog, it exits seconds after the
    command."""
    import subprocess
    import sys

    read_end, write_end = os.pipe()
    try:
        subprocess.Popen([sys.executable, "-I", "-c", _WATCHDOG, marker, str(os.getpid())],
                         stdin=read_end, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         env=detached_environment(os.environ), start_new_session=True)
    finally:
        os.close(read_end)
    return write_end


def process_start_time(pid: int) -> float | None:
    """When process ``pid`` on this host started (seconds since the epoch); None when there
    is no such live process (an exited one nobody has reaped yet, a zombie, counts as
    gone). A recorded pid is that process only while this stays what was recorded."""
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return None
        return process.create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


def process_stamp(pid: int, proc: str | os.PathLike = "/proc") -> str | None:
    """Which process ``pid`` is: a string that names this one start of it on this host and
    that no change of the wall clock alters; None when there is no such live process.

    Why not the start time: psutil's ``create_time`` is the boot time from
    ``/proc/stat`` (whole seconds of the wall clock, re-read at every call) plus the start
    since boot, so an NTP step or slew across a second boundary moves every process's
    start time by a second, and a live server or run owner would compare as dead. On
    Linux the stamp is the boot id and the start in clock ticks since boot (field 22 of
    ``/proc/<pid>/stat``, fixed for the life of the process); where ``proc`` (the procfs
    root) cannot be read it is psutil's start time.
    """
    if process_start_time(pid) is None:  # gone, or a zombie
        return None
    try:
        boot = (Path(proc) / "sys" / "kernel" / "random" / "boot_id").read_text().strip()
        stat = (Path(proc) / str(pid) / "stat").read_text()
    except OSError:
        started = process_start_time(pid)
        return None if started is None else f"epoch:{started!r}"
    # the command name (field 2) may hold spaces and parentheses: fields resume after the
    # last ")", at field 3
    ticks = stat[stat.rindex(")") + 2:].split()[22 - 3]
    return f"{boot}:{ticks}"


def same_process(pid: int, stamp: str | None, started: float | None = None,
                 tolerance: float = 0.01) -> bool:
    """Whether ``pid`` is still the process a record names: by its ``stamp`` when the
    record has one, else (a record written before stamps) by its start time ``started``
    to ``tolerance`` seconds."""
    if stamp:
        return process_stamp(pid) == stamp
    now = process_start_time(pid)
    return now is not None and started is not None and abs(now - float(started)) < tolerance


def reap(pid: int) -> None:
    """Collect ``pid``'s exit status if it is this process's child (started here), so an
    exited child does not linger as a zombie that looks alive."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def terminate_group(pid: int, timeout: float) -> None:
    """SIGTERM the process group led by ``pid`` (a process started in a session of its
    own), then SIGKILL what is left after ``timeout`` seconds."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        reap(pid)
        if process_start_time(pid) is None:
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    reap(pid)


@dataclass(frozen=True)
class Owner:
    """A process: host name, pid, start time (seconds since the epoch, as psutil has it)
    and start stamp (:func:`process_stamp`; None in records of older cord-ops)."""

    host: str
    pid: int
    started: float
    stamp: str | None = None

    @classmethod
    def current(cls) -> Owner:
        return cls(socket.gethostname(), os.getpid(), psutil.Process().create_time(),
                   process_stamp(os.getpid()))

    @classmethod
    def from_record(cls, record: dict) -> Owner | None:
        """The owner in a tag (or lock holder) dict, or None when it holds no owner."""
        try:
            return cls(str(record[HOST_TAG]), int(record[PID_TAG]), float(record[STARTED_TAG]),
                       record.get(STAMP_TAG) or None)
        except (KeyError, TypeError, ValueError):
            return None

    def record(self) -> dict[str, str]:
        tags = {HOST_TAG: self.host, PID_TAG: str(self.pid), STARTED_TAG: repr(self.started),
                HEARTBEAT_TAG: repr(time.time())}
        if self.stamp:
            tags[STAMP_TAG] = self.stamp
        return tags

    def describe(self) -> str:
        since = time.strftime("%H:%M:%S", time.localtime(self.started))
        return f"pid {self.pid} on {self.host}, process started {since}"

    def is_local(self) -> bool:
        return self.host == socket.gethostname()

    def process_alive(self) -> bool:
        """For an owner on this host: its process still runs (not a reused pid)."""
        if self.stamp:
            return process_stamp(self.pid) == self.stamp
        try:
            return abs(psutil.Process(self.pid).create_time() - self.started) < 0.01
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            return False
        except psutil.AccessDenied:  # exists, owned by someone else: assume alive
            return True


def alive(record: dict, last_activity: float | None = None,
          stale_after: float = STALE_AFTER, now: float | None = None) -> bool:
    """Whether the owner ``record`` (run tags, or a lock holder record) names is alive.

    ``last_activity`` (seconds since the epoch) stands in for the heartbeat of a record
    without one, e.g. a run's start time.
    """
    now = time.time() if now is None else now
    owner = Owner.from_record(record)
    if owner is not None and owner.is_local():
        return owner.process_alive()
    try:
        beat = float(record[HEARTBEAT_TAG])
    except (KeyError, TypeError, ValueError):
        beat = last_activity
    return beat is not None and now - beat < stale_after


class Heartbeat:
    """Refresh a run's heartbeat tag every ``every`` seconds from a daemon thread.

    Only stores that other hosts can reach need one (an owner on this host is checked by
    pid); a failed beat is ignored: the next one may get through, and a store that stays
    down fails the run anyway.
    """

    def __init__(self, client, run_id: str, every: float = HEARTBEAT_EVERY):
        self._client, self._run_id, self._every = client, run_id, every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="cord-ops-heartbeat",
                                        daemon=True)

    def _beat(self) -> None:
        while not self._stop.wait(self._every):
            try:
                self._client.set_tag(self._run_id, HEARTBEAT_TAG, repr(time.time()))
            except Exception:  # noqa: BLE001 - see the class docstring
                pass

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
