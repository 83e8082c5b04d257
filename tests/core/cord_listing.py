"""CORD as a whole-array numpy listing: the comparison reference for cord_ops.CORD.

The paper's Appendix C prints a Python listing of CORD; our copy of the paper omits it and
says the equations specify it fully. This module is that listing written from the
equations, one numpy statement per formula, in the style such a listing takes: whole
n x K arrays, no input validation, no buffer reuse. It is the ONE numpy transcription in
the repository: ``tests/core/test_cord.py`` checks cord_ops against it and
``benchmarks/bench_cord.py`` times cord_ops against it in the same process.
(``cord_reference.py`` beside it is the other, scalar oracle: plain Python floats, row by
row.)

    p0, q stabilised on boundary rows ............ eq. 11
    a = argmax p0 (first maximiser), b = q_a ...... Appendix A tie rule
    alpha = q_{j != a} / sum_{j != a} q_j ......... eq. 2, Appendix A's tail sum
    I = [rho / (1 + rho) + eps, 1 - eps] ........... eq. 4
    g = b, or (b + p0_a) / 2 where argmax q != a .. eq. 5 (eq. 25 for lam != 1/2)
    mu = clip(mean b, mean I_lo, mean I_hi) ....... eq. 6
    psi(eta) = clip(H(g, eta), I) ................. eqs. 16, 19-20
    eta* by plateau-aware bisection on [L, U] ..... eqs. 21-22
    p~ = s e_a + (1 - s) alpha .................... eq. 2
"""

from __future__ import annotations

import numpy as np

EPS, DELTA = 1e-12, 1e-10


def terms(p0, q, lam=0.5):
    """(a, b, alpha, lower, upper, g) for every row."""
    n, k = p0.shape
    rows = np.arange(n)
    p0s = np.where((p0 <= 0).any(axis=1)[:, None], (1 - DELTA) * p0 + DELTA / k, p0)
    qs = np.where((q <= 0).any(axis=1)[:, None], (1 - DELTA) * q + DELTA / k, q)
    a = np.argmax(p0s, axis=1)
    is_a = np.zeros((n, k), dtype=bool)
    is_a[rows, a] = True
    b = qs[rows, a]
    others = np.where(is_a, 0.0, qs)
    tail = others.sum(axis=1)
    alpha = others / tail[:, None]
    rho = alpha.max(axis=1)
    lower = rho / (1 + rho) + EPS
    upper = np.full(n, 1 - EPS)
    g = np.where(np.argmax(qs, axis=1) == a, b, lam * b + (1 - lam) * p0s[rows, a])
    return a, b, alpha, lower, upper, g


def psi(eta, g, lower, upper):
    """The interval-constrained response (eq. 16) through H of eqs. 19-20."""
    if eta == 0:
        return np.clip(g, lower, upper)
    r = np.sqrt((eta + 2 * g - 1) ** 2 + 4 * g * (1 - g))
    h = 2 * g / (1 - eta + r) if eta <= 1 else (eta - 1 + r) / (2 * eta)
    return np.clip(h, lower, upper)


def fit(p0, q, lam=0.5):
    """(eta*, mu) of the inherited-mean CORD on a calibration split."""
    _, b, _, lower, upper, g = terms(p0, q, lam)
    mu = np.clip(b.mean(), lower.mean(), upper.mean())

    def f(eta):
        return psi(eta, g, lower, upper).mean()

    f0 = f(0.0)
    if f0 == mu:
        return 0.0, float(mu)
    if f0 < mu:
        lo, hi = 0.0, max(0.0, ((upper - g) / (upper * (1 - upper))).max())
        while lo < (lo + hi) / 2 < hi:
            mid = (lo + hi) / 2
            hi, lo = (mid, lo) if f(mid) >= mu else (hi, mid)
        return float(hi), float(mu)
    lo, hi = min(0.0, ((lower - g) / (lower * (1 - lower))).min()), 0.0
    while lo < (lo + hi) / 2 < hi:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) <= mu else (lo, mid)
    return float(lo), float(mu)


def transform(eta, p0, q, lam=0.5):
    """Repaired rows for a fixed eta*."""
    a, _, alpha, lower, upper, g = terms(p0, q, lam)
    s = psi(eta, g, lower, upper)
    out = (1 - s)[:, None] * alpha
    out[np.arange(len(a)), a] = s
    return out
