"""Which tracking-store errors are worth a retry, and which mean the store is down.

One retry layer, not two multiplied. Against a tracking server, MLflow's HTTP client
already retries refused connections, timeouts and 429/5xx answers (bounded by the
settings of :func:`flows.store.tracking.http_environment`); a Prefect task retry on top would
repeat that whole sequence. So the Prefect store tasks retry only what no lower layer
does: an embedded sqlite database briefly locked by another process's write. The callers
that insert a row other processes may insert at the same moment retry
:func:`is_insert_race` themselves, re-reading the row first.

Everything else fails at once: a bad argument, a missing model, and the store errors
that waiting does not cure (a read-only database, a full disk, a permission error, a
schema that does not match).

:func:`is_store_outage` tells apart the errors that mean the store cannot be reached at
all: the failure is then journaled locally rather than written through that store.
"""

from __future__ import annotations

#: sqlite's own words for "another connection holds the write lock right now".
TRANSIENT_MESSAGES = ("database is locked", "database table is locked")
#: The words of a unique-key violation. MLflow's database store inserts a missing row (a
#: dataset, a registered-model tag) without a lock, so processes writing the same first row
#: at once all insert and all but one hit the key; the row then exists and a second try
#: updates it or finds it written.
INSERT_RACE_MESSAGE = "unique constraint"
#: Fragments of the messages of a store that cannot be reached (requests, urllib3 and
#: MLflow's wrapping of them).
OUTAGE_MESSAGES = ("connection refused", "max retries exceeded", "failed to establish",
                   "connection aborted", "connection reset", "remotedisconnected",
                   "read timed out", "connect timeout", "name or service not known",
                   "temporarily unavailable", "service unavailable", "bad gateway")


def _chain(exc: BaseException):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def is_store_outage(exc: BaseException) -> bool:
    """True when ``exc`` (or its cause chain) says the tracking store could not be reached
    (after MLflow's own HTTP retries)."""
    for err in _chain(exc):
        if isinstance(err, ConnectionError | TimeoutError):
            return True
        module = type(err).__module__ or ""
        if module.startswith(("requests", "urllib3")) and isinstance(err, OSError):
            return True
        if any(fragment in str(err).lower() for fragment in OUTAGE_MESSAGES):
            return True
    return False


def is_transient(exc: BaseException) -> bool:
    """True only for a momentarily locked sqlite database (see the module docstring)."""
    if is_store_outage(exc):
        return False
    return any(fragment in str(err).lower()
               for err in _chain(exc) for fragment in TRANSIENT_MESSAGES)


def is_insert_race(exc: BaseException) -> bool:
    """True when ``exc`` (or its cause chain) is a lost race to insert the same row
    (:data:`INSERT_RACE_MESSAGE`): worth one more try once the winner's row is read."""
    return any(INSERT_RACE_MESSAGE in str(err).lower() for err in _chain(exc))


def transient_store_error(task, task_run, state) -> bool:
    """Prefect ``retry_condition_fn``: retry the task only for :func:`is_transient` errors."""
    exc = state.result(raise_on_failure=False)
    return isinstance(exc, BaseException) and is_transient(exc)
