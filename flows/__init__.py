"""Prefect flows, MLflow tracking and registry, and the ``cord-ops`` command line.

Importing this package (or any module in it) changes nothing process-wide: no environment
variable, no MLflow tracking URI or experiment, no matplotlib backend. The ``cord-ops``
program switches MLflow and Prefect telemetry off for its own process
(:func:`flows.cli.main.main`).
"""
