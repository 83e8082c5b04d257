"""The temporary Prefect server of one command, tied to the life of that command.

Without ``PREFECT_API_URL`` Prefect starts a temporary API server as a child process on
first use, and stops it from an ``atexit`` hook. A command killed with SIGKILL runs no
hook, and the server lives on as an orphan. :func:`temporary_api` starts that server
itself, from the calling (main) thread, with Linux's ``PR_SET_PDEATHSIG``: the kernel
sends the server SIGTERM the moment its parent dies, however it dies. The server is the
one Prefect would start (same module, same settings); only its lifetime differs. On other
systems the server is started the same way but without that guarantee.

``PR_SET_PDEATHSIG`` fires when the *thread* that forked the child ends, which is why the
server must be started from the thread that lives as long as the command: the CLI's
main thread, never a Prefect worker thread.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

PR_SET_PDEATHSIG = 1
#: The API URL of the temporary server the current context runs against (None outside
#: :func:`temporary_api`): the flows must not take it for a Prefect server that other
#: processes share (a global concurrency limit on it would serialise nothing).
_TEMPORARY_URL: ContextVar[str | None] = ContextVar("cord_ops_temporary_prefect_url",
                                                    default=None)
#: Seconds to wait for the server's /health (Prefect's own default is 20; a loaded CI
#: machine needs more).
STARTUP_TIMEOUT = 90.0


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
    """preexec_fn: ask the kernel for SIGTERM when ``parent`` dies; exit if it already has."""
    def preexec() -> None:
        if sys.platform.startswith("linux"):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)
    return preexec


def _command(port: int) -> list[str]:
    import prefect

    return [sys.executable, "-m", "uvicorn", "--app-dir", str(prefect.__module_path__.parent),
            "--factory", "prefect.server.api.server:create_app", "--host", "127.0.0.1",
            "--port", str(port), "--log-level", "error", "--lifespan", "on"]


def _wait_healthy(process: subprocess.Popen, url: str, timeout: float, log) -> None:
    import httpx

    def tail() -> str:
        log.seek(0)
        lines = log.read().decode(errors="replace").strip().splitlines()
        return f": {lines[-1]}" if lines else ""

    deadline = time.monotonic() + timeout
    with httpx.Client() as client:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"the temporary Prefect server exited with "
                                   f"{process.returncode} before it was ready{tail()}")
            try:
                if client.get(f"{url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
    raise RuntimeError(f"the temporary Prefect server at {url} was not ready after "
                       f"{timeout:g} s")


@contextmanager
def temporary_api(timeout: float = STARTUP_TIMEOUT) -> Iterator[str | None]:
    """Run the body against the configured Prefect API, or against a temporary server
    that dies with this process. Yields the configured URL, or None for a temporary one.
    """
    configured = configured_api_url()
    if configured:
        yield configured
        return
    from prefect.settings import PREFECT_API_URL, get_current_settings, temporary_settings

    port = _free_port()
    url = f"http://127.0.0.1:{port}/api"
    env = {**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1",
           "PREFECT__SERVER_FINAL": "1",
           **get_current_settings().to_environment_variables(exclude_unset=True)}
    log = tempfile.TemporaryFile()
    process = subprocess.Popen(_command(port), env=env, preexec_fn=_die_with(os.getpid()),
                               stdout=subprocess.DEVNULL, stderr=log)
    try:
        _wait_healthy(process, url, timeout, log)
        token = _TEMPORARY_URL.set(url)
        try:
            with temporary_settings(updates={PREFECT_API_URL: url}):
                yield None
        finally:
            _TEMPORARY_URL.reset(token)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()
