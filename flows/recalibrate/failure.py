"""How a recalibration fails: the one-line :class:`RecalibrationError` naming the step, and
:class:`Failure`, which records once why a started run failed (through the store, or in the
local journal of :mod:`flows.store.journal` when the store is what failed).
"""

from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger

from flows.errors import CordOpsError, in_words
from flows.redact import redact
from flows.store import journal, registry, tracking
from flows.store.retries import is_store_outage


class RecalibrationError(CordOpsError, RuntimeError):
    """A recalibration failed; ``step`` is the task that raised.

    The message is one line: the step, the error's first line in words, the tracking URI
    when the store was involved, and where the failure was journaled when the store could
    not record it (``journal``).
    """

    def __init__(self, step: str, cause: BaseException, tracking_uri: str | None = None,
                 journal: str | None = None):
        self.step = step
        self.journal = journal
        text = in_words(cause)
        first = text.splitlines()[0] if text else ""
        first = first if len(first) <= 300 else first[:297] + "..."
        message = f"recalibration failed in step '{step}': {first}"
        if tracking_uri is not None:
            message += f" (tracking URI {tracking_uri})"
        if journal is not None:
            message += (f"; the store could not record this failure, so it was journaled to "
                        f"{journal} and the next command against this store records it")
        super().__init__(redact(message))  # it becomes the Prefect run's stored state message


#: Steps that talk to the tracking store: their errors name the tracking URI.
STORE_STEPS = frozenset({"prepare_store", "start_run", "skip_if_unchanged",
                         "log_params_and_metrics",
                         "log_report_artifacts", "log_onnx_model", "verify_artifacts",
                         "ensure_model", "registry_lock", "register", "gate", "finish_run"})


def uri_if_store(step: str, uri: str) -> str | None:
    """``uri`` when ``step`` talks to the store (so the error names it), else None."""
    return uri if step in STORE_STEPS else None


class Failure:
    """Records, once, why a started run failed: through the store, or in the journal.

    ``version``/``previous`` are the version this run registered and the champion before
    it, known once :func:`flows.recalibrate.store_steps.register` returned. ``journal``
    is the journal file when the store could not take the record.
    """

    def __init__(self, uri: str, folder: Path | None, run_id: str, model_name: str):
        self.uri, self.folder, self.run_id, self.model_name = uri, folder, run_id, model_name
        self.version: str | None = None
        self.previous: str | None = None
        self.journal: str | None = None
        self.recorded = False

    def record(self, exc: BaseException) -> None:
        """Mark the run FAILED (KILLED on Ctrl-C) with a ``cord.error`` tag and withdraw its
        version; journal that instead when the store is what failed. Never raises: the
        caller's error is the one to report."""
        if self.recorded:
            return
        self.recorded = True
        entry = {"kind": "run_failed", "run_id": self.run_id, "model_name": self.model_name,
                 "version": self.version, "previous_champion": self.previous,
                 "error": f"{type(exc).__name__}: {exc}"[:5000],
                 "status": "FAILED" if isinstance(exc, Exception) else "KILLED"}
        logger = get_run_logger()
        if not is_store_outage(exc):  # an unreachable store would only fail again, slowly
            try:
                registry.record_failure(tracking.client(self.uri), entry)
                return
            except Exception as store_exc:  # noqa: BLE001 - journaled below
                logger.warning("could not record the failure of run %s in %s (%s: %s)",
                               self.run_id, self.uri, type(store_exc).__name__,
                               str(store_exc).splitlines()[0] if str(store_exc) else "")
        try:
            self.journal = str(journal.record(self.uri, self.folder, entry))
        except OSError as journal_exc:
            logger.error("could not journal the failure of run %s either (%s); the next "
                         "registration marks it FAILED as abandoned", self.run_id, journal_exc)
