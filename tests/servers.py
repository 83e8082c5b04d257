"""Starting and stopping real server processes in tests: free ports, readiness, clean exit."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx


def clean_env(prefect_home: Path) -> dict[str, str]:
    """This process's environment as a new user's shell would have it: no PREFECT_API_URL
    and no MLFLOW_TRACKING_URI, and a PREFECT_HOME of the test's own."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI")}
    env["PREFECT_HOME"] = str(prefect_home)
    return env


def free_port() -> int:
    """A port the OS just reported free on 127.0.0.1 (bound to port 0, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until_ready(url: str, process: subprocess.Popen, log: Path, timeout: float) -> None:
    """Poll ``url`` until it answers 200; fail with the server's log if it exits or stalls."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"server exited with {process.returncode}:\n{log.read_text()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2.0).status_code == 200:
                return
        time.sleep(0.2)
    raise AssertionError(f"{url} not ready after {timeout} s:\n{log.read_text()}")


@contextlib.contextmanager
def running(command: list[str], log: Path, env: dict[str, str] | None = None,
            cwd: Path | None = None):
    """Run ``command`` (its output to ``log``) and make sure it is gone afterwards: SIGTERM
    to its process group, SIGKILL after 10 s."""
    with open(log, "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                   env=env or dict(os.environ), cwd=cwd,
                                   start_new_session=True)
    try:
        yield process
    finally:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)


@contextlib.contextmanager
def dask_cluster(folder: Path, workers: int = 2, timeout: float = 90.0):
    """A real ``dask scheduler`` and ``workers`` ``dask worker`` processes on 127.0.0.1.

    Workers run without a nanny, so each PID we started is the worker itself (a test can
    kill -9 one). BLAS threads are pinned to one so two workers fit on a 2-core runner.
    Yields (address, [worker PIDs]); every process is gone afterwards.
    """
    import sys

    dask = str(Path(sys.executable).with_name("dask"))
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
           "MKL_NUM_THREADS": "1"}
    with contextlib.ExitStack() as stack:
        started = [stack.enter_context(running(
            [dask, "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"],
            folder / "scheduler.log", env=env, cwd=folder))]
        for i in range(workers):
            started.append(stack.enter_context(running(
                [dask, "worker", address, "--nthreads", "1", "--no-nanny", "--no-dashboard",
                 "--host", "127.0.0.1"], folder / f"worker{i}.log", env=env, cwd=folder)))
        from distributed import Client

        deadline = time.monotonic() + timeout
        while True:
            try:
                with Client(address, timeout=5) as client:
                    client.wait_for_workers(workers, timeout=60)
                break
            except OSError:
                if time.monotonic() > deadline or any(p.poll() is not None for p in started):
                    raise
                time.sleep(0.5)
        yield address, [p.pid for p in started[1:]]
