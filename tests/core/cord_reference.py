"""An independent, row-by-row transcription of the paper's CORD (Section 3, Appendix A)
in plain Python floats, used only as the oracle for cord_ops.CORD.

It shares no code with cord_ops: scalar ``math`` arithmetic, exactly rounded sums
(``math.fsum``) and the piecewise response of eq. 16 rather than a clip.
"""

from __future__ import annotations

import math

EPS = 1e-12
DELTA = 1e-10


def _first_argmax(values: list[float]) -> int:
    best = 0
    for j, v in enumerate(values):
        if v > values[best]:
            best = j
    return best


def _stabilised(u: list[float]) -> list[float]:
    if min(u) > 0.0:
        return list(u)
    k = len(u)
    return [(1.0 - DELTA) * x + DELTA / k for x in u]


def row_terms(p0_row, q_row, lam=0.5):
    """(a, b, alpha, lower, upper, g) for one output pair."""
    p0 = _stabilised([float(x) for x in p0_row])
    q = _stabilised([float(x) for x in q_row])
    a = _first_argmax([float(x) for x in p0_row])
    b = q[a]
    tail = math.fsum(q[j] for j in range(len(q)) if j != a)
    alpha = [0.0 if j == a else q[j] / tail for j in range(len(q))]
    rho = max(alpha[j] for j in range(len(q)) if j != a)
    lower = rho / (1.0 + rho) + EPS
    upper = 1.0 - EPS
    flipped = _first_argmax([float(x) for x in q_row]) != a
    g = lam * b + (1.0 - lam) * p0[a] if flipped else b
    return a, b, alpha, lower, upper, g


def h(g, s):
    return (s - g) / (s * (1.0 - s))


def interior(g, eta):
    if eta == 0.0:
        return g
    r = math.hypot(eta + 2.0 * g - 1.0, 2.0 * math.sqrt(g * (1.0 - g)))
    if eta <= 1.0:
        return 2.0 * g / (1.0 - eta + r)
    return (eta - 1.0 + r) / (2.0 * eta)


def psi(eta, g, lower, upper):
    """Eq. 16, evaluated piecewise."""
    if eta <= h(g, lower):
        return lower
    if eta >= h(g, upper):
        return upper
    return min(max(interior(g, eta), lower), upper)


def fit(p0, q, lam=0.5, target="inherited"):
    """Return (eta*, mu) for calibration arrays p0, q (lists of rows or arrays)."""
    terms = [row_terms(p0[i], q[i], lam) for i in range(len(p0))]
    n = len(terms)
    mean = lambda xs: math.fsum(xs) / n  # noqa: E731
    lo_mean = mean(t[3] for t in terms)
    hi_mean = mean(t[4] for t in terms)
    if target == "none":
        return 0.0, mean(psi(0.0, t[5], t[3], t[4]) for t in terms)
    source = {
        "inherited": [t[1] for t in terms],
        "local": [t[5] for t in terms],
        "pointwise": [min(max(t[1], t[3]), t[4]) for t in terms],
    }[target]
    mu = min(max(mean(source), lo_mean), hi_mean)

    def f(eta):
        return mean(psi(eta, t[5], t[3], t[4]) for t in terms)

    f0 = f(0.0)
    if f0 == mu:
        return 0.0, mu
    if f0 < mu:
        lo, hi = 0.0, max(0.0, max(h(t[5], t[4]) for t in terms))
        while True:
            mid = (lo + hi) / 2.0
            if not lo < mid < hi:
                return hi, mu
            if f(mid) >= mu:
                hi = mid
            else:
                lo = mid
    lo, hi = min(0.0, min(h(t[5], t[3]) for t in terms)), 0.0
    while True:
        mid = (lo + hi) / 2.0
        if not lo < mid < hi:
            return lo, mu
        if f(mid) <= mu:
            lo = mid
        else:
            hi = mid


def transform(eta, p0, q, lam=0.5):
    """Repaired rows (list of lists) for a fixed eta*."""
    out = []
    for i in range(len(p0)):
        a, _, alpha, lower, upper, g = row_terms(p0[i], q[i], lam)
        s = psi(eta, g, lower, upper)
        row = [(1.0 - s) * x for x in alpha]
        row[a] = s
        out.append(row)
    return out


def mean_slope(eta, p0, q, lam=0.5):
    """d/d eta of the mean response at eta (0 where every row is clipped).

    Near s = 0 or 1 the response barely moves with eta, so one ulp of the target mean can
    move eta* far: tests scale their eta tolerance by 1 / slope.
    """
    total = 0.0
    for i in range(len(p0)):
        _, _, _, lower, upper, g = row_terms(p0[i], q[i], lam)
        s = interior(g, eta)
        if lower < s < upper:
            total += 1.0 / (g / s**2 + (1.0 - g) / (1.0 - s) ** 2)
    return total / len(p0)
