"""Small synthetic classifier outputs for the reproduction tests (built here, so the tests
run on a fresh clone without the shared data folder)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest


def write_logits(path: Path, n: int, k: int, seed: int) -> Path:
    """Overconfident logits of a noisy classifier: the label's logit gets a boost, then
    everything is scaled up so the softmax is too sharp (there is something to calibrate
    and some top-1 decisions for non-preserving calibrators to flip)."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, k, size=n)
    labels[:k] = np.arange(k)  # every class present in any split of this size
    logits = rng.normal(size=(n, k)) * 1.5
    logits[np.arange(n), labels] += 2.0
    np.savez(path, logits=(2.5 * logits).astype(np.float32), labels=labels.astype(np.int64))
    return path


@pytest.fixture(scope="session")
def synthetic_dir(tmp_path_factory) -> Path:
    """Two 'datasets' (toya: K=5, two classifiers; toyb: K=4), 300 rows each."""
    root = tmp_path_factory.mktemp("reproduce-data")
    write_logits(root / "toya_net1.npz", 300, 5, 1)
    write_logits(root / "toya_net2.npz", 300, 5, 2)
    write_logits(root / "toyb_net1.npz", 300, 4, 3)
    return root


@pytest.fixture(scope="session")
def paper_named_dir(tmp_path_factory) -> Path:
    """Synthetic K=10 outputs under two of the paper's CIFAR-10 classifier names (so the
    report joins them with Tables 7/8) and one name the paper does not have."""
    root = tmp_path_factory.mktemp("reproduce-paper-named")
    write_logits(root / "cifar10_resnet56.npz", 400, 10, 4)
    write_logits(root / "cifar10_vgg16_bn.npz", 400, 10, 5)
    write_logits(root / "cifar10_tinynet.npz", 400, 10, 6)
    return root
