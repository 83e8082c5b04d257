"""The Prefect API that flows with worker processes report to.

A flow whose tasks run in other processes (Dask workers) needs one Prefect API that every
process reaches: without ``PREFECT_API_URL`` Prefect would start a temporary server in the
flow's process and, separately, in every worker. :func:`prefect_api` starts one server and
makes it current through Prefect's settings context, which Prefect serialises into every
task it submits, so workers report to the same server. Nothing in ``os.environ`` changes;
a subprocess this process starts itself gets the URL and the server's credential through
:func:`api_environment`.
"""

from __future__ import annotations

import contextlib

#: A first start migrates a fresh database, slow on a busy machine.
SERVER_STARTUP_SECONDS = 120


def current_api_url() -> str | None:
    """The Prefect API URL in effect here (settings context or environment), if any."""
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value() or None


def api_environment() -> dict[str, str]:
    """Environment entries that point a child process at the current Prefect API, with the
    credential it requires (:mod:`flows.platform.credential`) when there is one."""
    from prefect.settings import PREFECT_API_AUTH_STRING

    url = current_api_url()
    if not url:
        return {}
    auth = PREFECT_API_AUTH_STRING.value()
    return {"PREFECT_API_URL": url, **({"PREFECT_API_AUTH_STRING": auth} if auth else {})}


@contextlib.contextmanager
def prefect_api():
    """Inside: a Prefect API every process of the flow reaches.

    Yields the API URL. When one is configured already it is used as it is; otherwise the
    command's temporary server is started (:func:`flows.platform.temporary_server.temporary_api`:
    the first use of a new database serialised, dead with this process however it dies),
    made current through the settings context, and stopped on exit after the log queue
    has drained. Call it from the main thread.
    """
    url = current_api_url()
    if url:
        yield url
        return
    from prefect.logging.handlers import APILogWorker

    from flows.platform.temporary_server import temporary_api

    with temporary_api(timeout=SERVER_STARTUP_SECONDS):
        yield current_api_url()
        with contextlib.suppress(RuntimeError):
            APILogWorker.drain_all(timeout=10)
