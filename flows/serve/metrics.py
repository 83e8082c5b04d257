"""What ``cord-ops serve`` reports on ``GET /metrics``: Prometheus counters, gauges and
histograms in the server's own registry (requests, errors by reason, latency, batch sizes,
the current version, swaps and failed swaps)."""

from __future__ import annotations

import math

from flows.serve.contract import (
    REASONS,
)
from flows.serve.served_model import ServedModel

ERROR_REASONS = (*REASONS, "bad_json", "unsupported_media_type", "no_model", "internal",
                 "bad_host", "unauthorized", "overloaded", "too_large", "slow_body",
                 "too_many_rows", "not_found", "method_not_allowed", "http")
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


# ---------------------------------------------------------------- metrics
class Metrics:
    """The server's Prometheus metrics, in a registry of its own."""

    def __init__(self):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("cord_serve_requests", "Scoring requests by HTTP status",
                                ["status"], registry=r)
        self.errors = Counter("cord_serve_errors", "Refused or failed scoring requests",
                              ["reason"], registry=r)
        for reason in ERROR_REASONS:
            self.errors.labels(reason)
        self.latency = Histogram("cord_serve_request_duration_seconds",
                                 "Time from reading a scoring request to its answer",
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.rows = Counter("cord_serve_rows", "Rows scored", registry=r)
        self.batch_rows = Histogram("cord_serve_batch_rows", "Rows per onnxruntime run",
                                    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096),
                                    registry=r)
        self.version = Gauge("cord_serve_model_version", "Registry version being served "
                             "(0: none yet)", registry=r)
        self.info = Gauge("cord_serve_model_info", "The served model (value 1)",
                          ["name", "version", "run_id"], registry=r)
        self.swaps = Counter("cord_serve_swaps", "Versions swapped in after verification",
                             registry=r)
        self.swap_failures = Counter("cord_serve_swap_failures",
                                     "Versions that failed to load or verify", registry=r)
        self.worker = Gauge("cord_serve_worker", "The worker process answering this "
                            "scrape under --workers (value 1)", ["worker"], registry=r)
        self.poll_errors = Counter("cord_serve_poll_errors",
                                   "Registry polls that could not reach the store", registry=r)
        self._info_labels: tuple[str, ...] | None = None

    def served(self, model: ServedModel) -> None:
        if self._info_labels is not None:
            self.info.remove(*self._info_labels)
        self._info_labels = (model.name, model.version, model.run_id or "")
        self.info.labels(*self._info_labels).set(1)
        self.version.set(float(model.version) if model.version.isdigit() else math.nan)

    def render(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)
