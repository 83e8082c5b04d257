"""Serving a registered model: the scoring-input contract, the MLflow pyfunc, HTTP and
batch scoring."""
