"""What CORD fits on a calibration split: the target mean mu and the one shared multiplier
eta* that meets it (Kim, Chung & Jang, Section 3 and Appendix A).

- the target mean ``mu`` is eq. 6 (``target_mean``; Table 3's ablations too);
- ``eta*`` is the nearest-zero multiplier (eqs. 18, 22) found by plateau-aware bisection on
  the finite bracket of eq. 21 until no representable midpoint remains
  (``nearest_zero_multiplier``, ``bisect_multiplier``).

The per-row terms and the response psi(eta) it solves over are
:mod:`cord_ops.cord_kernels`'.
"""

from __future__ import annotations

import math

import numpy as np

from cord_ops.cord_kernels import RepairTerms, multiplier_of


def screen_margin(n: int) -> float:
    """Four times the bound on |approximate - exact mean response| over n rows
    (``_MeanResponse``): 7.5 u per row plus two pairwise sums' (20 + log2 n) u each."""
    u = 2.0**-53
    return 4.0 * (7.5 + 2.0 * (20.0 + math.log2(max(n, 1)))) * u


class _MeanResponse:
    """mean psi(eta) over the rows, as ``np.mean(response(eta, terms))`` computes it.

    ``exact`` repeats the operations of ``response`` on precomputed per-row constants
    (2g - 1, 2 sqrt(g (1 - g)), 2g) into reused buffers, so its value is the same bit for
    bit. ``approximate`` replaces hypot(x, y) by sqrt(x^2 + y^2), four times faster. Per
    row the two R differ by at most 4.5 u relative (u = 2^-53; glibc hypot < 1 ulp, the
    sqrt form < 1.25 ulp), every later operation adds a non-negative term, divides or
    clips, so the responses in (0, 1) differ by < 7.5 u each, and numpy's pairwise sums
    of n such terms are each within (20 + log2 n) u of the exact sum (eight interleaved
    runs of at most 16 terms, then log2 n levels). A bisection step whose approximate mean
    is further than four times that bound (``screen_margin``: 3.2e-14 at n = 5,000) from
    mu takes the same branch as the exact one; only the steps near the root pay for
    hypot.
    """

    def __init__(self, terms: RepairTerms):
        g = terms.g
        self.g, self.lower, self.upper = g, terms.lower, terms.upper
        self.twice_g, self.shift = 2.0 * g, 2.0 * g - 1.0
        self.y = 2.0 * np.sqrt(g * (1.0 - g))
        self.y2 = self.y * self.y
        self.buf, self.buf2 = np.empty_like(g), np.empty_like(g)
        self.margin = screen_margin(g.shape[0])
        self.screening = True

    def _finish(self, eta: float, r: np.ndarray) -> float:
        buf = self.buf
        if eta <= 1.0:
            np.add(1.0 - eta, r, out=buf)
            np.divide(self.twice_g, buf, out=buf)
        else:
            np.add(eta - 1.0, r, out=buf)
            np.divide(buf, 2.0 * eta, out=buf)
        # np.clip and np.mean without their Python wrappers: the same operations.
        np.maximum(buf, self.lower, out=buf)
        np.minimum(buf, self.upper, out=buf)
        return float(np.add.reduce(buf) / buf.shape[0])

    def exact(self, eta: float) -> float:
        if eta == 0.0:
            return float(np.mean(np.clip(self.g, self.lower, self.upper)))
        x = np.add(eta, self.shift, out=self.buf2)
        return self._finish(eta, np.hypot(x, self.y, out=self.buf2))

    def approximate(self, eta: float) -> float:
        x = np.add(eta, self.shift, out=self.buf2)
        np.multiply(x, x, out=x)
        np.add(x, self.y2, out=x)
        return self._finish(eta, np.sqrt(x, out=x))

    def _screened(self, eta: float, mu: float) -> float | None:
        """The approximate mean when it is decisively away from mu, else None. After the
        first step that is not, the bisection's later midpoints crowd the root, so they go
        straight to the exact mean (``screening`` off)."""
        if not self.screening:
            return None
        approx = self.approximate(eta)
        if abs(approx - mu) > self.margin:
            return approx
        self.screening = False
        return None

    def at_least(self, eta: float, mu: float) -> bool:
        """mean psi(eta) >= mu, as the exact mean decides it."""
        approx = self._screened(eta, mu)
        return self.exact(eta) >= mu if approx is None else approx > mu

    def at_most(self, eta: float, mu: float) -> bool:
        """mean psi(eta) <= mu, as the exact mean decides it."""
        approx = self._screened(eta, mu)
        return self.exact(eta) <= mu if approx is None else approx < mu


def nearest_zero_multiplier(terms: RepairTerms, mu: float) -> float:
    """eta* = projection of 0 onto {eta : mean psi(eta) = mu} (eqs. 18, 21, 22).

    Plateau-aware bisection (``bisect_multiplier``) on the bracket of eq. 21. Each step's
    comparison is the exact mean's (``_MeanResponse`` screens the steps far from the root
    with a cheaper mean).
    """
    mean = _MeanResponse(terms)
    return bisect_multiplier(
        mean, mu, lambda: float(multiplier_of(terms.g, terms.upper).max()),
        lambda: float(multiplier_of(terms.g, terms.lower).min()))


def bisect_multiplier(mean, mu: float, highest, lowest) -> float:
    """The bisection of eq. 22 over any mean response: ``mean`` has ``exact(eta)``,
    ``at_least(eta, mu)`` and ``at_most(eta, mu)``; ``highest()`` / ``lowest()`` give the
    largest / smallest row multiplier of eq. 21 (asked for only on the side that needs it).

    On the side where the target lies, the endpoint on the target side moves on equality,
    and the loop runs until the bracket has no representable midpoint; that endpoint is
    returned. The one source of the bisection for the in-memory fit and for fits whose
    mean is reduced over partitions (``cord_ops.reduce``).
    """
    at_zero = mean.exact(0.0)
    if at_zero == mu:
        return 0.0
    if at_zero < mu:
        lo, hi = 0.0, max(0.0, highest())
        while True:
            mid = 0.5 * (lo + hi)
            if mid <= lo or mid >= hi:
                return hi
            if mean.at_least(mid, mu):
                hi = mid
            else:
                lo = mid
    lo, hi = min(0.0, lowest()), 0.0
    while True:
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            return lo
        if mean.at_most(mid, mu):
            lo = mid
        else:
            hi = mid


def target_mean(terms: RepairTerms, mean_target: str) -> float:
    """The calibration-split mean mu the repair must hit.

    ``inherited`` is eq. 6 (the Base mean of b projected onto the attainable interval);
    ``local`` targets the mean of g and ``pointwise`` the mean of Pi_I(b), both projected
    the same way (Table 3's ablations).
    """
    source = {
        "inherited": terms.b,
        "local": terms.g,
        "pointwise": np.clip(terms.b, terms.lower, terms.upper),
    }[mean_target]
    lo, hi = float(np.mean(terms.lower)), float(np.mean(terms.upper))
    return min(max(float(np.mean(source)), lo), hi)
