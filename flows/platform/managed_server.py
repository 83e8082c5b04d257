"""A local Prefect server that cord-ops manages: ``cord-ops server start|stop|status``.

Why it exists: without ``PREFECT_API_URL`` every Prefect command starts a temporary
server of its own. That start costs seconds on every command (docs/performance.md,
"Command start-up") and runs none of Prefect's services, so
cron deployments never get a scheduled run and deployment concurrency slots are never
renewed. The managed server is a plain ``prefect server start`` (scheduler and the other
services on, UI off, analytics off) bound to 127.0.0.1 on a free port, started detached
so it outlives the command that started it, and stopped by ``cord-ops server stop``.

Its state lives next to the MLflow store it serves (:func:`state_folder`), so one working
folder holds everything a user has to find or delete::

    <store folder>/prefect/    0700: no other account lists or opens anything in it
        api-auth       the server's credential (0600), new at each start
        home/          PREFECT_HOME of the server (its prefect.db)
        server.json    pid, process start time and port of the running server (0600)
        server.log     the server's output
        server.lock    held while a server is started or stopped

The server requires the credential (:mod:`flows.platform.credential`): any other local
account reaches its port but gets 401 for everything except its health check, so it can
neither read the deployments nor create, change or delete anything. The server gets the
credential as ``PREFECT_SERVER_API_AUTH_STRING`` in its own environment; a cord-ops command
reads it from ``api-auth`` (:attr:`RunningServer.auth`) and hands it to Prefect with the
API URL. A server without a credential (started by an older cord-ops) is not used, and
``start`` replaces it.

Nothing here changes this process's environment: the server gets its settings in its own
environment, and callers point Prefect at :attr:`RunningServer.api_url` explicitly.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from flows.errors import CordOpsError
from flows.platform import credential
from flows.store import owner

STATE_DIR = "prefect"
START_TIMEOUT_S = 120.0  # the first start runs Prefect's database migrations
STOP_TIMEOUT_S = 10.0
HEALTH_TIMEOUT_S = 5.0  # a busy server answers late; a dead port refuses at once


class ServerError(CordOpsError, RuntimeError):
    """The managed server could not be started or stopped; the message says where to look."""


def state_folder(tracking_uri: str, cwd: str | os.PathLike | None = None) -> Path:
    """Where the managed server of the MLflow store ``tracking_uri`` keeps its state.

    A local store keeps it in its own folder (:func:`flows.store.tracking.local_store_folder`,
    e.g. ``DIR/prefect`` for ``sqlite:///DIR/mlflow.db``); a remote store (``http://...``,
    a database server) has no folder here, so the state goes to ``<cwd>/mlruns/prefect``.
    """
    from flows.store import tracking

    folder = tracking.local_store_folder(tracking_uri)
    if folder is None:
        folder = Path(cwd or os.getcwd()) / tracking.STORE_DIR
    return folder.resolve() / STATE_DIR


@dataclass(frozen=True)
class RunningServer:
    """A live managed server: its process, where its API answers, where its state is and
    the credential its API requires (never printed: not in the repr)."""

    pid: int
    port: int
    folder: Path
    auth: str = field(default="", repr=False)

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    @property
    def log(self) -> Path:
        return self.folder / "server.log"

    def describe(self) -> str:
        return (f"Prefect server {self.api_url} (pid {self.pid}, managed by cord-ops; "
                f"state {self.folder}, log {self.log})")


def _state_file(folder: Path) -> Path:
    return folder / "server.json"


def healthy(api_url: str, timeout: float = HEALTH_TIMEOUT_S, auth: str | None = None) -> bool:
    """Whether the Prefect API at ``api_url`` answers its health check within ``timeout``
    (with ``auth``, the credential a Prefect client would send, for a server behind a proxy
    that wants it on every path; Prefect's own server answers /health without it)."""
    headers = credential.authorization(auth) if auth else {}
    try:
        request = urllib.request.Request(f"{api_url}/health", headers=headers)
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status == 200
    except (OSError, urllib.error.URLError, ValueError):
        return False


def _recorded(folder: Path) -> dict | None:
    """The state file; None when missing, damaged or not this user's to read."""
    try:
        return json.loads(_state_file(folder).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _alive(record: dict) -> bool:
    """The recorded process still exists and is the one that was started (same start
    stamp), so a recycled pid is never taken for the server."""
    return owner.same_process(int(record["pid"]), record.get("stamp"),
                              record.get("create_time"), tolerance=1.0)


def running(folder: Path) -> RunningServer | None:
    """The managed server of ``folder`` if its process is alive, it requires a credential
    that this user holds, and its API answers."""
    record = _recorded(folder)
    auth = credential.load(folder)
    if record is None or auth is None or not record.get("auth") or not _alive(record):
        return None
    server = RunningServer(int(record["pid"]), int(record["port"]), folder, auth)
    return server if healthy(server.api_url) else None


@contextlib.contextmanager
def _locked(folder: Path):
    """An exclusive OS lock on ``folder/server.lock``: one start or stop at a time, across
    processes (released by the OS if the holder dies). The folder is made owner-only
    first (:func:`flows.platform.credential.private_folder`)."""
    credential.private_folder(folder)
    with credential.open_private(folder / "server.lock", "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _server_environment(home: Path, auth: str) -> dict[str, str]:
    """The server's own settings, its credential among them; this process's environment is
    copied, never changed."""
    env = {k: v for k, v in owner.detached_environment(os.environ).items()
           if k != "PREFECT_API_URL"}
    env.update({
        credential.SERVER_SETTING: auth,
        "PREFECT_HOME": str(home),
        "PREFECT_API_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{home / 'prefect.db'}",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_SERVICES_SCHEDULER_ENABLED": "true",
        "DO_NOT_TRACK": "1",
    })
    return env


def _spawn(folder: Path, port: int, auth: str) -> subprocess.Popen:
    home = folder / "home"
    home.mkdir(mode=0o700, exist_ok=True)
    command = [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
               "--port", str(port), "--no-ui", "--analytics-off", "--scheduler", "--late-runs"]
    with credential.open_private(folder / "server.log", "ab") as log:
        log.write(f"\n--- {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(command)}\n".encode())
        log.flush()
        # A session of its own: the server outlives this command and a signal to this
        # command's process group (Ctrl-C, SIGTERM) does not reach it.
        return subprocess.Popen(command, env=_server_environment(home, auth),
                                stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                close_fds=True)


def start(folder: Path, timeout: float = START_TIMEOUT_S) -> tuple[RunningServer, bool]:
    """Start the managed server of ``folder`` unless it is running; returns it and whether
    this call started it.

    The state file is written as soon as the process exists, so a command interrupted
    while the server comes up leaves a server that ``stop`` finds, and a second ``start``
    waits for the one coming up instead of starting another. Raises :class:`ServerError`
    naming the log when the server does not answer within ``timeout`` seconds (the
    half-started process is then stopped).

    Each start makes a new credential (kept before the server exists, so nothing runs
    without one). A live server that requires none, or whose credential is gone, was not
    started by this code: it is stopped and replaced.
    """
    with _locked(folder):
        record = _recorded(folder)
        auth = credential.load(folder)
        if record is not None and _alive(record) and (auth is None or not record.get("auth")):
            owner.terminate_group(int(record["pid"]), STOP_TIMEOUT_S)
            record = None
        started = record is None or not _alive(record)
        if started:
            auth = credential.new()
            credential.save(folder, auth)
            port = _free_port()
            process = _spawn(folder, port, auth)
            record = {"pid": process.pid, "port": port,
                      "create_time": owner.process_start_time(process.pid),
                      "stamp": owner.process_stamp(process.pid),
                      "started_at": time.time(), "auth": credential.AUTH_FILE}
            credential.write_private(_state_file(folder), json.dumps(record, indent=2) + "\n")
        server = RunningServer(int(record["pid"]), int(record["port"]), folder, auth)
        deadline = time.monotonic() + timeout
        while not healthy(server.api_url, timeout=1.0):
            if not _alive(record) or (started and process.poll() is not None):
                _state_file(folder).unlink(missing_ok=True)
                raise ServerError(f"the Prefect server exited while starting; see {server.log}")
            if time.monotonic() > deadline:
                owner.terminate_group(server.pid, STOP_TIMEOUT_S)
                _state_file(folder).unlink(missing_ok=True)
                raise ServerError(f"the Prefect server did not answer on {server.api_url} "
                                  f"within {timeout:.0f} s; see {server.log}")
            time.sleep(0.2)
        return server, started


def start_runner(folder: Path) -> int | None:
    """Start the warm runner of ``folder`` (:mod:`flows.platform.warm`) unless one from the same
    sources and settings is running; returns the pid of the one that runs, or None."""
    from flows.platform import warm

    with _locked(folder):
        record = warm.running(folder)
        if record is not None and record.get("fingerprint") == warm.fingerprint(folder):
            return int(record["pid"])
        return warm.spawn(folder)


def stop(folder: Path, timeout: float = STOP_TIMEOUT_S) -> int | None:
    """Stop the managed server of ``folder``; returns its pid, or None if none was running.
    A stale state file (dead or recycled pid) is removed either way."""
    from flows.platform import warm

    with _locked(folder):
        warm.stop(folder, timeout)
        record = _recorded(folder)
        pid = None
        if record is not None and _alive(record):
            pid = int(record["pid"])
            owner.terminate_group(pid, timeout)
        _state_file(folder).unlink(missing_ok=True)
        credential.auth_file(folder).unlink(missing_ok=True)
        return pid
