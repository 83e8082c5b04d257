"""Fixtures shared by every test package: where the real CIFAR logits live (the
``shared/data`` folder beside the repository, or ``CORD_OPS_SHARED_DATA``), and a skip for
fresh clones that do not have them."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("CORD_OPS_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
# Prefect reads PREFECT_HOME at import time: point it at a throwaway folder before any
# test module imports prefect, so the suite never touches ~/.prefect.
os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="cord-ops-prefect-"))


def shared_files() -> list[Path]:
    """The CIFAR logit files of the shared data folder, or [] on a fresh clone."""
    if not (SHARED_DATA / "manifest.json").exists():
        return []
    names = json.loads((SHARED_DATA / "manifest.json").read_text())
    return [SHARED_DATA / f"{name}.npz" for name in sorted(names)]


requires_shared = pytest.mark.skipif(
    not shared_files(),
    reason=f"../shared/data not present at {SHARED_DATA} (fresh clone): uses the real CIFAR logits",
)


@pytest.fixture(scope="session")
def shared_data_dir() -> Path:
    if not shared_files():
        pytest.skip(f"../shared/data not present at {SHARED_DATA}")
    return SHARED_DATA


def load_shared(name: str) -> tuple[np.ndarray, np.ndarray]:
    """(logits, labels) of one shared data file, by stem (e.g. 'cifar10_resnet56')."""
    with np.load(SHARED_DATA / f"{name}.npz", allow_pickle=False) as f:
        return f["logits"].astype(np.float64), f["labels"].astype(np.int64)


@pytest.fixture(scope="session")
def prefect_harness():
    """One temporary Prefect API server for the whole session (7-15 s cold start)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=90):
        yield


@pytest.fixture
def mlflow_uri(tmp_path, monkeypatch) -> str:
    """A fresh embedded MLflow store (sqlite + local artifacts) for one test."""
    uri = f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}"
    (tmp_path / "mlruns").mkdir()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)
    return uri
