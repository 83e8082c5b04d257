"""Statistics of the reproduction tables: paired bootstrap CIs (Table 1), paired tests with
Holm adjustment (Tables 2, 3, 10) and agreement with the paper's numbers.

Every function here works on condition-level values: one number per (classifier,
calibrator) condition after averaging its five splits, which is how the paper forms the
entries of Tables 1-3 and 6 (Appendix B: "the unweighted mean of the condition-level paired
reductions after first averaging over the five splits within each condition"). Pure numpy /
scipy; nothing here reads files or talks to a service.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

#: Resamples per bootstrap interval; the percentile endpoints at the Bonferroni level of a
#: 9-interval family (0.28% per tail) then rest on about 28 resamples each.
N_RESAMPLES = 10_000


@dataclass(frozen=True)
class BootstrapCI:
    """Mean of the paired differences and its percentile bootstrap interval at ``level``."""

    mean: float
    low: float
    high: float
    level: float


def _paired(reference, candidate, what: str) -> np.ndarray:
    a = np.asarray(reference, dtype=np.float64)
    b = np.asarray(candidate, dtype=np.float64)
    if a.ndim != 1 or a.shape != b.shape:
        raise ValueError(f"{what}: expected two 1-D arrays of equal length, got shapes "
                         f"{a.shape} and {b.shape}")
    if a.size == 0:
        raise ValueError(f"{what}: expected at least one paired value, got none")
    bad = ~(np.isfinite(a) & np.isfinite(b))
    if bad.any():
        raise ValueError(f"{what}: pair {int(np.argmax(bad))} is not finite "
                         f"({a[bad][0]!r}, {b[bad][0]!r})")
    return a - b


def bonferroni_level(confidence: float, n_intervals: int) -> float:
    """Per-interval coverage that makes ``n_intervals`` intervals hold jointly at
    ``confidence``: 1 - (1 - confidence) / n_intervals."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence: expected a level in (0, 1), got {confidence!r}")
    if n_intervals < 1:
        raise ValueError(f"n_intervals: expected a positive count, got {n_intervals!r}")
    return 1.0 - (1.0 - confidence) / n_intervals


def paired_bootstrap_ci(reference, candidate, *, confidence: float = 0.95,
                        n_intervals: int = 1, n_resamples: int = N_RESAMPLES,
                        seed: int = 0) -> BootstrapCI:
    """Mean of ``reference - candidate`` with a Bonferroni-adjusted percentile bootstrap CI.

    The pairs are resampled jointly (the paired bootstrap): each resample draws n indices
    with replacement and takes the mean difference over them. The interval is the
    ``(alpha/2, 1 - alpha/2)`` percentile range of those means with
    ``alpha = (1 - confidence) / n_intervals``, so a family of ``n_intervals`` such intervals
    covers jointly with probability at least ``confidence`` (Table 1: Base minus
    Base+CORD per metric and dataset). Deterministic in ``seed``.
    """
    diff = _paired(reference, candidate, "paired_bootstrap_ci")
    level = bonferroni_level(confidence, n_intervals)
    if n_resamples < 1:
        raise ValueError(f"n_resamples: expected a positive count, got {n_resamples!r}")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, diff.size, size=(n_resamples, diff.size))
    means = diff[idx].mean(axis=1)
    alpha = 1.0 - level
    low, high = np.quantile(means, [alpha / 2.0, 1.0 - alpha / 2.0])
    return BootstrapCI(float(diff.mean()), float(low), float(high), level)


def paired_test(reference, candidate) -> float:
    """One-sided p-value that ``candidate`` is lower than ``reference`` (Wilcoxon signed-rank).

    H1: the median of ``reference - candidate`` is positive, i.e. the candidate (CORD)
    reduces the metric. Zero differences are dropped (Wilcoxon's convention); when every
    difference is zero there is no evidence either way and the p-value is 1.
    """
    diff = _paired(reference, candidate, "paired_test")
    if not np.any(diff != 0.0):
        return 1.0
    return float(stats.wilcoxon(diff, zero_method="wilcox", alternative="greater").pvalue)


def holm_adjust(p_values) -> np.ndarray:
    """Holm's step-down adjusted p-values, in the input order.

    With the m p-values sorted ascending, p_(i) becomes max_{j <= i} min(1, (m - j + 1)
    p_(j)); a hypothesis is rejected at level alpha when its adjusted value is <= alpha,
    which controls the family-wise error rate at alpha.
    """
    p = np.asarray(p_values, dtype=np.float64)
    if p.ndim != 1:
        raise ValueError(f"p_values: expected a 1-D array, got shape {p.shape}")
    if np.any(~np.isfinite(p)) or np.any((p < 0.0) | (p > 1.0)):
        raise ValueError("p_values: expected finite probabilities in [0, 1]")
    m = p.size
    order = np.argsort(p, kind="stable")
    scaled = np.minimum(1.0, (m - np.arange(m)) * p[order])
    adjusted = np.empty(m)
    adjusted[order] = np.maximum.accumulate(scaled)
    return adjusted


def significance_stars(p_value: float) -> str:
    """The paper's markers: * p < 0.05, ** p < 0.01, *** p < 0.001, else empty."""
    for threshold, stars in ((0.001, "***"), (0.01, "**"), (0.05, "*")):
        if p_value < threshold:
            return stars
    return ""


def agreement(ours, paper) -> dict[str, float]:
    """How closely our per-cell values follow the paper's: n, both means, the mean absolute
    difference and Pearson's r (NaN when either side is constant)."""
    diff = _paired(ours, paper, "agreement")
    a = np.asarray(ours, dtype=np.float64)
    b = np.asarray(paper, dtype=np.float64)
    r = float(np.corrcoef(a, b)[0, 1]) if a.size > 1 and a.std() > 0 and b.std() > 0 else \
        float("nan")
    return {"n": int(a.size), "mean_ours": float(a.mean()), "mean_paper": float(b.mean()),
            "mean_abs_diff": float(np.abs(diff).mean()), "pearson_r": r}


def mean_interval(values, confidence: float = 0.95) -> tuple[float, float, float]:
    """Mean of ``values`` (over splits) with a pointwise Student-t interval; with a single
    value the interval collapses to the mean (Figure 4's shading)."""
    v = np.asarray(values, dtype=np.float64)
    mean = float(v.mean())
    if v.size < 2:
        return mean, mean, mean
    half = stats.t.ppf(0.5 + confidence / 2.0, v.size - 1) * v.std(ddof=1) / np.sqrt(v.size)
    return mean, float(mean - half), float(mean + half)
