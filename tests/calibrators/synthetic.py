"""The miscalibrated classifier the calibrator tests build for themselves (numpy only, so
``benchmarks/probmetrics_reference.py`` can build the same data in a probmetrics
environment)."""

from __future__ import annotations

import numpy as np


def miscalibrated(seed: int, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Logits of an overconfident, class-biased model and labels drawn from the true model.

    True logits t ~ N(0, 1.5^2) per class; labels ~ softmax(t); the model reports
    3 t + class offsets, so its probabilities are too sharp and tilted: every calibrator
    family (temperature, per-class, full matrix, isotonic) has something to fix.
    """
    rng = np.random.default_rng(seed)
    true = rng.normal(scale=1.5, size=(n, k))
    p = np.exp(true - true.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    labels = (p.cumsum(axis=1) > rng.random((n, 1))).argmax(axis=1)
    logits = 3.0 * true + np.linspace(-1.0, 1.0, k)
    return logits, labels
