"""Which tracking-store errors are worth a retry.

Tasks that write to MLflow retry only on errors of the store itself being briefly
unavailable (a locked sqlite file, a dropped connection, a 5xx/429 from a tracking
server); a bad argument or a missing model fails at once, so a failure path is not
slowed down by pointless retries.
"""

from __future__ import annotations

#: MLflow error codes that describe a momentary condition of the server.
TRANSIENT_CODES = frozenset({
    "TEMPORARILY_UNAVAILABLE", "REQUEST_LIMIT_EXCEEDED", "DEADLINE_EXCEEDED", "ABORTED",
})
#: Fragments of messages MLflow uses when it wraps a transient backend error.
TRANSIENT_MESSAGES = ("database is locked", "connection refused", "connection reset",
                      "max retries exceeded", "timed out")


def _chain(exc: BaseException):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def is_transient(exc: BaseException) -> bool:
    """True when ``exc`` (or anything in its cause chain) is a passing store outage."""
    from mlflow.exceptions import MlflowException

    for err in _chain(exc):
        if isinstance(err, ConnectionError | TimeoutError):
            return True
        if type(err).__name__ == "OperationalError":  # sqlalchemy / sqlite3, not imported here
            return True
        if isinstance(err, MlflowException) and err.error_code in TRANSIENT_CODES:
            return True
        if any(fragment in str(err).lower() for fragment in TRANSIENT_MESSAGES):
            return True
    return False


def transient_store_error(task, task_run, state) -> bool:
    """Prefect ``retry_condition_fn``: retry the task only for :func:`is_transient` errors."""
    exc = state.result(raise_on_failure=False)
    return isinstance(exc, BaseException) and is_transient(exc)
