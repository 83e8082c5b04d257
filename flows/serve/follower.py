"""The thread that keeps ``cord-ops serve`` on its registry alias: it polls the alias,
loads and verifies a version the alias moved to (:mod:`flows.serve.served_model`), and
swaps it in by one reference assignment, so a request is answered wholly by the version it
was validated against."""

from __future__ import annotations

import sys
import threading
import time

from flows.serve.metrics import Metrics
from flows.serve.served_model import ServedModel, VersionRejected, load_version


# ---------------------------------------------------------------- following the alias
class RegistryFollower:
    """Keeps ``current`` at the verified version the alias points to.

    Runs in a daemon thread (a hung store call cannot hold up shutdown). ``current`` is
    replaced by assignment only, so readers always see one whole ServedModel.
    """

    def __init__(self, tracking_uri: str, name: str, alias: str, interval: float,
                 metrics: Metrics, provider: str = "auto"):
        from flows.store import tracking

        self.client = tracking.client(tracking_uri)
        self.tracking_uri, self.name, self.alias = tracking_uri, name, alias
        self.interval, self.metrics, self.provider = interval, metrics, provider
        self.current: ServedModel | None = None
        self.rejected: dict[str, str] = {}
        self.last_error: str | None = None
        self.last_poll: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="registry-follower",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.poll_once()
            self._stop.wait(self.interval)

    def poll_once(self) -> None:
        """One poll: resolve the alias and swap in its version if new and verified."""
        try:
            target = str(self.client.get_model_version_by_alias(self.name, self.alias).version)
        except Exception as exc:  # store down, or the alias is not set (yet)
            self._poll_failed(exc, unset=_alias_unset(exc))
            return
        self.last_poll = time.time()
        served = self.current
        if (served is not None and served.version == target) or target in self.rejected:
            self.last_error = None
            return
        try:
            model = load_version(self.client, self.tracking_uri, self.name, target,
                                 self.provider)
        except VersionRejected as exc:
            self.rejected[target] = str(exc)
            self.metrics.swap_failures.inc()
            say(f"not serving {self.name} v{target}: {exc}")
            return
        except Exception as exc:  # the store failed mid-download: try again next poll
            self._poll_failed(exc, unset=False)
            return
        self.current = model
        self.last_error = None
        self.metrics.served(model)
        if served is not None:
            self.metrics.swaps.inc()
        say(f"serving {self.name} v{model.version} ({model.contract.input_kind}, "
                  f"K={model.contract.n_classes}, {model.providers[0]})")

    def _poll_failed(self, exc: BaseException, unset: bool) -> None:
        """Say once why no version is followed, then poll quietly until that changes; an
        unset alias is the model's state (no outage counted), with the next step named."""
        from flows.errors import in_words

        if unset:
            message = (f"{self.name} has no @{self.alias} yet; serving starts when one is "
                       f"set (`cord-ops status --model-name {self.name}` says why; "
                       f"`cord-ops promote --model-name {self.name} --version N --reason "
                       "TEXT` sets it)")
        else:
            message = "registry poll failed: " + in_words(exc).splitlines()[0][:500]
        if message != self.last_error:
            say(message)
        self.last_error = message
        if not unset:
            self.metrics.poll_errors.inc()



def _alias_unset(exc: BaseException) -> bool:
    """The store answered that the alias (or the model) does not exist: not an outage."""
    from mlflow.exceptions import MlflowException

    return isinstance(exc, MlflowException) and exc.error_code in (
        "RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE") and "not found" in exc.message


def say(message: str) -> None:
    """One line of ``cord-ops serve`` on stderr, where an operator reads what it serves."""
    print(f"cord-ops serve: {message}", file=sys.stderr, flush=True)
