"""Prefect flows, MLflow tracking and registry, and the ``cord-ops`` command line.

Importing the package switches MLflow and Prefect telemetry off before either is loaded.
"""

from flows.tracking import disable_telemetry

disable_telemetry()
