"""What ``cord-ops serve`` answered, watched without labels: a rolling window of the served
version's repaired rows (outputs only; the raw inputs are never kept), the label-free
estimates and drift statistics of :mod:`cord_ops.label_free` on it against that version's
pinned reference split, as Prometheus gauges, as ``GET /monitor``, and flushed on
``POST /monitor/flush`` to MLflow as one label-free monitoring run
(:func:`flows.monitor.label_free.records.log_batch_run`,
``data.path`` = ``serve:<name>@<version>``).

The window holds the last ``window_rows`` rows answered by the version being served, in
float32 (``window_rows`` x K x 4 bytes); a swap to another version starts a new window.
The reference profile of a version is computed once, on first use, by running its
session on the reference split of its run.
"""

from __future__ import annotations

import hashlib
import threading

import numpy as np

from cord_ops import label_free as estimators
from flows.monitor.label_free import records

DEFAULT_WINDOW_ROWS = 10_000
#: Fewest rows in the window before estimates are published (the drift tests and EM on a
#: handful of rows say nothing).
MIN_ROWS = 50


class TrafficMonitor:
    """The window, the reference profiles by version, and the estimates (module docstring)."""

    def __init__(self, tracking_uri: str, name: str, window_rows: int = DEFAULT_WINDOW_ROWS,
                 thresholds: records.Thresholds | None = None):
        if window_rows < MIN_ROWS:
            raise ValueError(f"--monitor-window: expected at least {MIN_ROWS} rows, got "
                             f"{window_rows}")
        self.tracking_uri, self.name, self.window_rows = tracking_uri, name, window_rows
        self.thresholds = thresholds or records.Thresholds()
        self._lock = threading.Lock()
        self._version: str | None = None
        self._rows: np.ndarray | None = None
        self._filled = 0
        self._next = 0
        self._profiles: dict[str, estimators.ReferenceProfile | str] = {}
        self._recorded = 0  # requests recorded: the snapshot cache's key
        self._cached: tuple[tuple, dict] | None = None

    # ------------------------------------------------------------ recording
    def record(self, model, repaired: np.ndarray) -> None:
        """Add the repaired rows one request was answered with."""
        rows = np.asarray(repaired, dtype=np.float32)[-self.window_rows:]
        with self._lock:
            if self._version != model.version or self._rows is None \
                    or self._rows.shape[1] != rows.shape[1]:
                self._version = model.version
                self._rows = np.empty((self.window_rows, rows.shape[1]), dtype=np.float32)
                self._filled = self._next = 0
            end = self._next + len(rows)
            if end <= self.window_rows:
                self._rows[self._next:end] = rows
            else:
                split = self.window_rows - self._next
                self._rows[self._next:] = rows[:split]
                self._rows[:end - self.window_rows] = rows[split:]
            self._next = end % self.window_rows
            self._filled = min(self.window_rows, self._filled + len(rows))
            self._recorded += 1

    def window(self) -> tuple[str | None, np.ndarray]:
        """(version, a float64 copy of the window's rows, renormalised)."""
        with self._lock:
            if self._rows is None:
                return None, np.empty((0, 0))
            rows = self._rows[:self._filled].astype(np.float64)
            version = self._version
        return version, rows / rows.sum(axis=1, keepdims=True)

    # ------------------------------------------------------------ reference
    def profile(self, model) -> estimators.ReferenceProfile:
        """The version's reference profile (computed once; a failure is remembered)."""
        found = self._profiles.get(model.version)
        if isinstance(found, str):
            raise LookupError(found)
        if found is not None:
            return found
        try:
            found = self._fit_profile(model)
        except Exception as exc:  # no reference split, store down: say so in /monitor
            self._profiles[model.version] = (f"v{model.version} has no usable reference "
                                             f"split: {type(exc).__name__}: {exc}")[:1000]
            raise LookupError(self._profiles[model.version]) from None
        self._profiles[model.version] = found
        return found

    def _fit_profile(self, model) -> estimators.ReferenceProfile:
        from flows.store import reference, tracking
        from onnx_export.runtime import run_host

        client = tracking.client(self.tracking_uri)
        split = reference.load_reference_split(client, model.run_id)
        scores = np.ascontiguousarray(split.scores, dtype=model.contract.dtype)
        (repaired,) = run_host(model.session, scores, ["repaired"])
        repaired = np.asarray(repaired, dtype=np.float64)
        return estimators.ReferenceProfile().fit(
            repaired / repaired.sum(axis=1, keepdims=True), split.labels)

    # ------------------------------------------------------------ estimates
    def snapshot(self, model) -> dict:
        """The estimates on the current window, as JSON-ready values; computed once per
        state of the window (scrapes between requests reuse them)."""
        key = (None if model is None else model.version, self._recorded)
        cached = self._cached
        if cached is not None and cached[0] == key:
            return cached[1]
        body = self._snapshot(model)
        if body.get("status") == "ok":
            self._cached = (key, body)
        return body

    def _snapshot(self, model) -> dict:
        version, rows = self.window()
        body = {"model": self.name, "version": None if model is None else model.version,
                "rows": int(len(rows)), "window_rows": self.window_rows}
        if model is None or version != model.version or len(rows) < MIN_ROWS:
            body["status"] = f"collecting (at least {MIN_ROWS} rows of the served version)"
            return body
        try:
            profile = self.profile(model)
        except LookupError as exc:
            body["status"] = str(exc)
            return body
        est = profile.estimate(rows)
        reasons = records.alert_reasons(est, profile, self.thresholds)
        body.update({
            "status": "ok", "alert": bool(reasons), "alerts": reasons,
            "estimates": {"cbpe": est.cbpe, "atc": est.atc, "doc": est.doc,
                          "cbpe_prior": est.prior_corrected},
            "reference": {"accuracy": profile.accuracy_, "rows": profile.n_},
            "priors": {"estimated": est.priors.tolist(), "shift_tv": est.prior_shift,
                       "em_converged": est.em_converged,
                       "cbpe_prior_route": est.prior_method,
                       "label_shift_gap": est.label_shift_gap,
                       "label_shift_tolerance": est.label_shift_tolerance},
            "drift": {t.test: {"statistic": t.statistic, "p_value": t.p_value}
                      for t in est.drift}})
        return body

    def flush(self, model) -> dict:
        """Log the window as a label-free monitoring run; returns its id and estimates."""
        from flows.store import tracking

        body = self.snapshot(model)
        if body.get("status") != "ok":
            raise LookupError(f"nothing to flush: {body['status']}")
        _, rows = self.window()
        profile = self.profile(model)
        est = profile.estimate(rows)
        reasons = records.alert_reasons(est, profile, self.thresholds)
        digest = hashlib.sha256(np.ascontiguousarray(rows).tobytes()).hexdigest()
        batch = records.Batch(f"serve:{self.name}@{model.version}", rows, None, digest,
                              records.scores_digest(rows))
        # the window holds repaired rows only: raw CBPE is that of the served output
        values = records.estimate_values(est, est.cbpe, profile)
        run_id = records.log_batch_run(tracking.client(self.tracking_uri), self.name,
                                       model.version, batch, values, reasons,
                                       self.thresholds, est, profile.priors_)
        return {**body, "run_id": run_id}

    # ------------------------------------------------------------ Prometheus
    def collector(self, current):
        """A prometheus_client collector of the gauges, computed at each scrape from
        ``current()`` (the served model or None)."""
        from prometheus_client.core import GaugeMetricFamily

        monitor = self

        class _Collector:
            def collect(self):
                body = monitor.snapshot(current())
                rows = GaugeMetricFamily("cord_serve_monitor_rows",
                                         "Rows in the label-free monitoring window")
                rows.add_metric([], body["rows"])
                yield rows
                if body.get("status") != "ok":
                    return
                estimate = GaugeMetricFamily("cord_serve_monitor_estimated_accuracy",
                                             "Label-free accuracy estimates on the window",
                                             labels=["estimate"])
                for key, value in body["estimates"].items():
                    estimate.add_metric([key], value)
                yield estimate
                p_value = GaugeMetricFamily("cord_serve_monitor_drift_p_value",
                                            "Drift test p-values, window vs reference split",
                                            labels=["test"])
                statistic = GaugeMetricFamily("cord_serve_monitor_drift_statistic",
                                              "Drift test statistics, window vs reference "
                                              "split", labels=["test"])
                for test, found in body["drift"].items():
                    p_value.add_metric([test], found["p_value"])
                    statistic.add_metric([test], found["statistic"])
                yield p_value
                yield statistic
                shift = GaugeMetricFamily("cord_serve_monitor_prior_shift",
                                          "Total variation of the EM priors from the "
                                          "reference split's")
                shift.add_metric([], body["priors"]["shift_tv"])
                yield shift
                alert = GaugeMetricFamily("cord_serve_monitor_alert",
                                          "1 when the window is an alert")
                alert.add_metric([], float(body["alert"]))
                yield alert

        return _Collector()

    def routes(self, current, json_response):
        """``GET /monitor`` and ``POST /monitor/flush`` for the Starlette app."""
        import asyncio

        from starlette.routing import Route

        async def monitor(request):
            return json_response(await asyncio.to_thread(self.snapshot, current()))

        async def flush(request):
            try:
                return json_response(await asyncio.to_thread(self.flush, current()))
            except LookupError as exc:
                return json_response({"error": str(exc)}, 409)

        return [Route("/monitor", monitor), Route("/monitor/flush", flush, methods=["POST"])]
