"""The temporary Prefect server of one command, tied to the life of that command.

Without ``PREFECT_API_URL`` Prefect starts a temporary API server as a child process on
first use, and stops it from an ``atexit`` hook. A command killed with SIGKILL runs no
hook, and the server lives on as an orphan. :func:`temporary_api` starts that server
itself, from the calling (main) thread, with Linux's ``PR_SET_PDEATHSIG``: the kernel
sends the server SIGKILL the moment its parent dies, however it dies. The server is the
one Prefect would start (same module, same settings); only its lifetime differs. On other
systems the server is started the same way but without that guarantee.

First use of a ``PREFECT_HOME`` (a new machine, container or CI job): every server runs
Prefect's database migrations when it starts, and two servers migrating one new sqlite
database at once fail ("duplicate column name", "index ... already exists": uvicorn's
"Application startup failed"). So the first server of a database starts under an OS file
lock beside it (:func:`_first_use`), and once it answers, a record beside the database
says this Prefect version brought that file to its schema; later servers see the record
and start without waiting, concurrently (their migrations then only read). Starting one
server under the lock, rather than running ``prefect server database upgrade`` first,
costs nothing extra: the migrations are Prefect's own start-up path and the locked server
is the one the command then uses. The lock is taken only until the record exists, so N
commands on a new machine wait for one server start, not for N.

A server that exits or does not answer in time raises :class:`TemporaryServerError`
whose one line carries the server's own exception (the last ``Type: message`` line of its
output) and the path of its full output, kept for the operator. While the server runs its
output goes to an unlinked file, so a killed command leaves no log behind.

``PR_SET_PDEATHSIG`` fires when the *thread* that forked the child ends, which is why the
server must be started from the thread that lives as long as the command: the CLI's
main thread, never a Prefect worker thread.

The server requires a credential made for it (:func:`flows.platform.credential.new`), held
in this command's memory and in the server's environment only: its port on 127.0.0.1 is
open to every local account for as long as the command runs, and without the credential
another account could read the run's parameters and logs, or cancel, pause or delete its
flow run (nothing serves deployments on it, so no run of its own would execute). Prefect's
clients in this process, and the processes they start, send it through the settings
context.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

from flows.errors import CordOpsError
from flows.platform import credential

PR_SET_PDEATHSIG = 1
#: The API URL of the temporary server the current context runs against (None outside
#: :func:`temporary_api`): the flows must not take it for a Prefect server that other
#: processes share (a global concurrency limit on it would serialise nothing).
_TEMPORARY_URL: ContextVar[str | None] = ContextVar("cord_ops_temporary_prefect_url",
                                                    default=None)
#: Seconds to wait for the server's /health (Prefect's own default is 20; a loaded CI
#: machine needs more). Past them the wait goes on while the server makes progress (its
#: CPU time grew within the last ``STALL_SECONDS``), up to ``STARTUP_CAP`` seconds: eight
#: servers importing at once on two busy cores each take minutes, a stuck one takes none.
STARTUP_TIMEOUT = 90.0
STALL_SECONDS = 15.0
STARTUP_CAP = 600.0
#: Suffixes of the first-use lock and record beside a sqlite database (names in
#: PREFECT_HOME for a database elsewhere).
LOCK_SUFFIX = ".cord-ops-lock"
READY_SUFFIX = ".cord-ops-ready.json"
#: A Python exception's last traceback line: ``module.Type: message``.
_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|"
                             r"Interrupt|Failure|Timeout|Warning)(?::\s.*)?$")


class TemporaryServerError(CordOpsError, RuntimeError):
    """The temporary Prefect server did not come up; the message names its own exception
    and the kept log."""


def configured_api_url() -> str | None:
    """The Prefect API the user configured (environment or profile), if any; None inside
    :func:`temporary_api` when it started a server of its own."""
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value() or None
    return None if url is not None and url == _TEMPORARY_URL.get() else url


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _die_with(parent: int):
    """preexec_fn: ask the kernel for SIGKILL when ``parent`` dies; exit if it already has.
    SIGKILL, not SIGTERM: uvicorn finishes its start-up (migrations included) before it
    acts on SIGTERM, and nothing of the server's is worth a graceful stop once its command
    is gone (its sqlite database survives a kill)."""
    def preexec() -> None:
        if sys.platform.startswith("linux"):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)
    return preexec


def _command(port: int) -> list[str]:
    import prefect

    return [sys.executable, "-m", "uvicorn", "--app-dir", str(prefect.__module_path__.parent),
            "--factory", "prefect.server.api.server:create_app", "--host", "127.0.0.1",
            "--port", str(port), "--log-level", "error", "--lifespan", "on"]


def server_exception(output: str) -> str | None:
    """The server's own exception in its output: the last line that reads like the end of
    a Python traceback (``Type: message``), or None."""
    found = [line.strip() for line in output.splitlines()
             if _EXCEPTION_LINE.match(line.strip())]
    return found[-1] if found else None


def _keep_log(log, home: Path) -> Path:
    """Copy the server's (unlinked) output to a file the operator can read: in
    PREFECT_HOME, or the temporary folder where that cannot hold it."""
    log.seek(0)
    content = log.read()
    name = f"cord-ops-prefect-server-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    for folder in (home, Path(tempfile.gettempdir())):
        with contextlib.suppress(OSError):
            path = folder / name
            path.write_bytes(content)
            return path
    raise OSError(f"could not keep the Prefect server's log in {home} or "
                  f"{tempfile.gettempdir()}")


def _failure(what: str, log, home: Path) -> TemporaryServerError:
    log.seek(0)
    cause = server_exception(log.read().decode(errors="replace"))
    try:
        kept = f"full log {_keep_log(log, home)}"
    except OSError as exc:
        kept = str(exc)
    return TemporaryServerError(f"{what}: {cause or 'no exception in its output'}; {kept}")


def _wait_healthy(process: subprocess.Popen, url: str, timeout: float, log,
                  home: Path) -> None:
    import httpx
    import psutil

    started = time.monotonic()
    cpu, progressed = -1.0, started
    with httpx.Client() as client:
        while True:
            if process.poll() is not None:
                raise _failure(f"the temporary Prefect server exited with "
                               f"{process.returncode} before it was ready", log, home)
            try:
                if client.get(f"{url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            now = time.monotonic()
            with contextlib.suppress(psutil.Error):
                used = sum(psutil.Process(process.pid).cpu_times()[:2])
                if used > cpu + 0.05:
                    cpu, progressed = used, now
            waited = now - started
            if waited > timeout and (now - progressed > STALL_SECONDS or waited > STARTUP_CAP):
                raise _failure(f"the temporary Prefect server at {url} was not ready after "
                               f"{waited:.0f} s ({cpu:.0f} s of CPU)", log, home)
            time.sleep(0.1)


def _database_identity(settings) -> tuple[Path, Path, dict]:
    """(lock file, ready record, what the record must hold) of the configured database."""
    url = settings.server.database.connection_url
    url = url.get_secret_value() if hasattr(url, "get_secret_value") else str(url or "")
    import prefect

    expected = {"prefect": prefect.__version__}
    match = re.match(r"^sqlite(?:\+\w+)?:///(.+)$", url)
    if match and match.group(1) != ":memory:":
        db = Path(match.group(1).split("?")[0])
        with contextlib.suppress(OSError):
            stat = db.stat()  # a deleted and recreated file is a new database
            expected.update(device=stat.st_dev, inode=stat.st_ino)
        return (db.with_name(db.name + LOCK_SUFFIX), db.with_name(db.name + READY_SUFFIX),
                {**expected, "database": str(db)})
    home = Path(settings.home)
    digest = hashlib.sha256(url.encode()).hexdigest()[:16]
    return (home / f"prefect-database{LOCK_SUFFIX}", home / f"prefect-database{READY_SUFFIX}",
            {**expected, "database": digest})


def _readied(settings) -> bool:
    """Whether a server of this Prefect version has brought the database to its schema."""
    _, record, expected = _database_identity(settings)
    try:
        return json.loads(record.read_text()) == expected
    except (OSError, ValueError):
        return False


@contextmanager
def _first_use(settings, timeout: float) -> Iterator[None]:
    """Hold the first-use lock of the database unless it is readied already; on a clean
    exit of the body (the server answered) record it as readied.

    A folder that cannot hold the lock cannot hold the database either: then nothing is
    serialised and the server's start-up reports the cause.
    """
    if _readied(settings):
        yield
        return
    lock_file, record, _ = _database_identity(settings)
    try:
        lock_file.parent.mkdir(parents=True, exist_ok=True)
        handle = open(lock_file, "a+")  # noqa: SIM115 - closed below
    except OSError:
        yield
        return
    try:
        # The holder lets go when its server answers or fails (STARTUP_CAP at most) or
        # when it dies (the kernel releases the lock); the bound is for what cannot happen.
        limit = STARTUP_CAP + timeout
        deadline = time.monotonic() + limit
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TemporaryServerError(
                        f"another command held {lock_file} (the first start of Prefect's "
                        f"database) for more than {limit:g} s") from None
                time.sleep(0.1)
        if _readied(settings):  # readied while this process waited: no need to hold it
            fcntl.flock(handle, fcntl.LOCK_UN)
            yield
            return
        yield
        from cord_ops.atomic import write_json_atomic

        # Read again: the file's identity exists only now that the server created it.
        write_json_atomic(record, _database_identity(settings)[2])
    finally:
        handle.close()  # releases the lock


@contextmanager
def temporary_api(timeout: float = STARTUP_TIMEOUT) -> Iterator[str | None]:
    """Run the body against the configured Prefect API, or against a temporary server
    that dies with this process. Yields the configured URL, or None for a temporary one.
    """
    configured = configured_api_url()
    if configured:
        yield configured
        return
    from prefect.settings import (
        PREFECT_API_AUTH_STRING,
        PREFECT_API_URL,
        get_current_settings,
        temporary_settings,
    )

    settings = get_current_settings()
    port = _free_port()
    url = f"http://127.0.0.1:{port}/api"
    auth = credential.new()
    env = {**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1",
           "PREFECT__SERVER_FINAL": "1",
           **settings.to_environment_variables(exclude_unset=True),
           credential.SERVER_SETTING: auth}
    # Unlinked at once: a killed command leaves no log; a failed start keeps a copy.
    log = tempfile.TemporaryFile(prefix="cord-ops-prefect-server-")
    process = None
    try:
        with _first_use(settings, timeout):
            process = subprocess.Popen(_command(port), env=env,
                                       preexec_fn=_die_with(os.getpid()),
                                       stdin=subprocess.DEVNULL, stdout=log,
                                       stderr=subprocess.STDOUT)
            _wait_healthy(process, url, timeout, log, Path(settings.home))
        token = _TEMPORARY_URL.set(url)
        try:
            with temporary_settings(updates={PREFECT_API_URL: url,
                                             PREFECT_API_AUTH_STRING: auth}):
                yield None
        finally:
            _TEMPORARY_URL.reset(token)
    finally:
        if process is not None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        log.close()
