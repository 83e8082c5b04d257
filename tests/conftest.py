"""Fixtures shared by every test package: where ../shared/data lives, and a skip for
fresh clones that do not have it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("CORD_OPS_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


def shared_files() -> list[Path]:
    """The CIFAR logit files of ../shared/data, or [] on a fresh clone."""
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
    """(logits, labels) of one ../shared/data file, by stem (e.g. 'cifar10_resnet56')."""
    with np.load(SHARED_DATA / f"{name}.npz", allow_pickle=False) as f:
        return f["logits"].astype(np.float64), f["labels"].astype(np.int64)
