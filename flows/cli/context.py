"""What a command runs in, besides its own request: the values every command shares
(:class:`Invocation`) and, for a command that runs Prefect flows, the store made ready, a
Prefect API and the registry lock's kind (:func:`flow_context`)."""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass

from flows.platform import managed_server
from flows.store import tracking


@dataclass(frozen=True)
class Invocation:
    """What every command's request carries: the tracking URI resolved once (``--tracking-uri``,
    else ``MLFLOW_TRACKING_URI``, else the embedded default; without ``user:password@``),
    ``given``: the ``--tracking-uri`` the operator typed (None when taken from the
    environment or the default), ``--verbose``, and when the command started
    (``time.perf_counter``, in the process that received it)."""

    tracking_uri: str
    given: str | None
    verbose: bool
    started: float

    def server_hint(self) -> str:
        """The command that stops the managed server of this store."""
        store = "" if self.given is None else f"--tracking-uri {self.tracking_uri} "
        return f"cord-ops {store}server stop"


@dataclass(frozen=True)
class Flows:
    """What :func:`flow_context` made ready: the managed Prefect server in use (or None) and
    the registry lock's kind for the API in use (:func:`flows.store.lock.choose`)."""

    managed: object | None
    lock: str


@contextlib.contextmanager
def prefect_api(tracking_uri: str, start_managed: bool = False):
    """Run the body against one Prefect API; yields the managed server in use, or None.

    ``PREFECT_API_URL`` (environment or Prefect profile) wins, and must answer. Otherwise
    the managed server of the store ``tracking_uri`` is used when it is running, or started
    when ``start_managed``; failing both, a temporary server that dies with this process
    (:func:`flows.platform.temporary_server.temporary_api`). The managed server's URL and
    credential are set for the body through Prefect's settings context (this process's
    environment is untouched) and are inherited by the flow-run processes Prefect starts.
    """
    from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL, temporary_settings

    from flows.platform import temporary_server

    configured = temporary_server.configured_api_url()
    if configured:
        if not managed_server.healthy(configured, auth=PREFECT_API_AUTH_STRING.value()):
            raise managed_server.ServerError(f"the Prefect server PREFECT_API_URL={configured} "
                                             "does not answer")
        yield None
        return
    folder = managed_server.state_folder(tracking_uri)
    managed = managed_server.running(folder)
    if managed is None and start_managed:
        managed, started = managed_server.start(folder)
        print(f"{'started' if started else 'using'} {managed.describe()}", flush=True)
    if managed is None:
        with temporary_server.temporary_api():
            try:
                yield None
            finally:
                _drain_prefect_workers()
        return
    with temporary_settings(updates={PREFECT_API_URL: managed.api_url,
                                     PREFECT_API_AUTH_STRING: managed.auth}):
        yield managed


def _drain_prefect_workers(timeout: float = 10.0) -> None:
    """Send the logs and events Prefect still queues while the temporary server is up;
    left to Prefect's exit hook, they would meet a stopped server and print a connection
    error after the command's last line."""
    from prefect._internal.concurrency.services import QueueService

    QueueService.drain_all(timeout=timeout, at_exit=False)


@contextlib.contextmanager
def flow_context(invocation: Invocation, store_timeout: float = tracking.DEFAULT_STORE_TIMEOUT,
                 start_managed: bool = False):
    """What a command that runs flows needs, after its inputs passed: the store made ready
    (created or upgraded once, under a lock: :func:`flows.store.tracking.prepare_store`), a
    Prefect API (:func:`prefect_api`), the registry lock's kind for it and Prefect's
    console log without tracebacks unless ``--verbose``. Yields :class:`Flows`."""
    from flows.platform import temporary_server
    from flows.store import lock

    uri = invocation.tracking_uri
    tracking.prepare_store(uri, store_timeout)
    with prefect_api(uri, start_managed) as managed:
        # A temporary server serves this process only, so it cannot serialise anything.
        api = temporary_server.configured_api_url() or (managed and managed.api_url)
        kind = lock.choose(tracking.local_store_folder(uri), api)
        with console_tracebacks(invocation.verbose):
            yield Flows(managed, kind)


class _WithoutTraceback(logging.Formatter):
    """Formats like ``inner`` but leaves out exception and stack text."""

    def __init__(self, inner: logging.Formatter | None):
        super().__init__()
        self.inner = inner or logging.Formatter()

    def format(self, record: logging.LogRecord) -> str:
        saved = record.exc_info, record.exc_text, record.stack_info
        record.exc_info = record.exc_text = record.stack_info = None
        try:
            return self.inner.format(record)
        finally:
            record.exc_info, record.exc_text, record.stack_info = saved


@contextlib.contextmanager
def console_tracebacks(verbose: bool):
    """Without ``verbose``, Prefect's console log lines keep their message but drop the
    traceback (the log sent to the Prefect API keeps it); restored afterwards."""
    swapped = []
    if not verbose:
        from flows.platform.tick_lines import prefect_console_handlers

        swapped = [(handler, handler.formatter) for handler in prefect_console_handlers()]
        for handler, formatter in swapped:
            handler.setFormatter(_WithoutTraceback(formatter))
    try:
        yield
    finally:
        for handler, formatter in swapped:
            handler.setFormatter(formatter)
