"""CORD: post-fit prediction-preserving repair of a calibrator's output (Kim, Chung & Jang).

Given the original classifier output ``p0`` and a fitted calibrator's direct output ``q``
(both n x K probability rows), CORD keeps the original top-1 class ``a = argmax p0``
strictly on top, keeps q's conditional distribution over the other classes (eq. 9), and
chooses the mass ``s`` on ``a`` by one shared Lagrange multiplier ``eta*`` fitted on a
calibration split (eqs. 7-8, 18). Everything follows Section 3 and Appendix A:

- tie rule: the smallest maximizing index (``validation.top1``);
- ``EPS_NUM`` offsets the prediction-preserving interval (eq. 4);
- ``DELTA_STAB`` stabilises boundary rows only, on internal copies (eq. 11);
- the tail mass ``1 - q_a`` is computed as the sum over ``j != a``;
- the local reference ``g`` is eq. 5 (eq. 25 for another ``local_weight``);
- the target mean ``mu`` is eq. 6;
- ``eta*`` is the nearest-zero multiplier (eqs. 18, 22) found by plateau-aware bisection on
  the finite bracket of eq. 21 until no representable midpoint remains;
- the interior response is the cancellation-safe closed form of eqs. 19-20, clipped to the
  interval (eq. 16).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.exceptions import NotFittedError

from cord_ops.atomic import write_json_atomic
from cord_ops.validation import (
    check_layout,
    check_pair,
    check_probabilities,
    probability_rows_ok,
    row_blocks,
    top1,
)

EPS_NUM = 1e-12
DELTA_STAB = 1e-10
STATE_VERSION = 1
MEAN_TARGETS = ("inherited", "none", "local", "pointwise")


def stabilize(u: np.ndarray) -> np.ndarray:
    """S_delta(u) = (1 - delta) u + delta / K (eq. 11), for rows known to touch the boundary."""
    return (1.0 - DELTA_STAB) * u + DELTA_STAB / u.shape[-1]


def on_boundary(u: np.ndarray) -> np.ndarray:
    """Rows of a probability array outside the relative interior (some entry is 0)."""
    return u.min(axis=1) <= 0.0


@dataclass(frozen=True)
class RepairTerms:
    """Per-row quantities of the one-dimensional repair family (eqs. 2, 4, 5).

    ``rest`` is the stabilised q with the original class zeroed: the numerator of alpha
    and, rescaled in place by ``reconstruct``, the tail of the repaired vector. It is the
    only n x K array CORD allocates, and only ``repair_terms`` and ``transform`` keep it
    (``fit`` needs per-row quantities only and leaves it None).
    """

    label: np.ndarray  # a_i, original top-1
    b: np.ndarray  # q_{i, a_i} of the stabilised copy
    tail: np.ndarray  # sum_{j != a_i} q_ij
    rest: np.ndarray | None  # stabilised q_i with the a_i entry set to 0 (n x K)
    lower: np.ndarray  # min I_i = rho/(1+rho) + eps
    upper: np.ndarray  # max I_i = 1 - eps
    g: np.ndarray  # local reference (eq. 5 / eq. 25)
    changed: np.ndarray | None = None  # argmax q_i != a_i
    calibrated_top: np.ndarray | None = None  # argmax q_i (tie rule of validation.top1)


def _layouts(original, calibrated, n_classes):
    """Both arrays as given when their dtype and shape pass, else None."""
    try:
        p0 = check_layout(original, "original", n_classes=n_classes)
        q = check_layout(calibrated, "calibrated", n_classes=n_classes)
    except (TypeError, ValueError):
        return None
    return (p0, q) if p0.shape == q.shape else None


def _sweep(original, calibrated, local_weight: float, n_classes: int | None = None,
           keep_rest: bool = False, eta: float | None = None):
    """Validate both arrays and compute the repair terms in one row-blocked pass.

    Each block of rows (``validation.row_blocks``, sized to stay in cache) is read from
    memory once: its value checks (``validation.probability_rows_ok``), top-1, boundary
    test, b, tail and runner-up all reduce the cached block. Everything is elementwise or a
    reduction along a row of a C-contiguous float64 block, exactly what the whole-array
    code computes, so the results are the same bit for bit. When a check fails (or the
    dtype or shapes are wrong) the whole-array validation runs to raise its usual error:
    the same checks, in the same order, with the same message.

    ``keep_rest`` (``repair_terms``) or ``eta`` (``transform``) fill an n x K buffer with
    ``rest``; with ``eta`` each block is also repaired in place while it is in cache and the
    buffer is the repaired array. Returns RepairTerms (rest None unless asked for).
    """
    arrays = _layouts(original, calibrated, n_classes)
    if arrays is None:
        _validated_pair(original, calibrated, n_classes)
        raise AssertionError("unreachable: the layout checks above failed")
    p0, q = arrays
    n, k = p0.shape
    label = np.empty(n, dtype=np.intp)
    b, tail, top, p0_a = np.empty(n), np.empty(n), np.empty(n), np.empty(n)
    changed = np.empty(n, dtype=bool)
    calibrated_top = np.empty(n, dtype=np.intp)
    out = np.empty((n, k)) if keep_rest or eta is not None else None
    block_terms = _columns_block if k <= COLUMNWISE_MAX_K else _rows_block
    scratch = None
    for rows in row_blocks(n, k):
        if out is not None:
            rest = out[rows]
        elif block_terms is _rows_block:
            if scratch is None:  # one working block, reused: no allocation per block
                scratch = np.empty((rows.stop - rows.start, k))
            rest = scratch[:rows.stop - rows.start]
        else:
            rest = None
        found = block_terms(p0[rows], q[rows], rest)
        if found is None:
            # Raises the whole-array check's error. Should it pass (only conceivable for a
            # row sum within an ulp of the tolerance, summed in another order for a
            # non-contiguous input), its verdict stands and the block is used unchecked.
            _validated_pair(original, calibrated, n_classes)
            found = block_terms(p0[rows], q[rows], rest, check=False)
        a, pa, p_edge, q_top, b_block, tail[rows], top[rows] = found
        # Stabilisation preserves every pairwise order, so the tie rule picks the same
        # class from the supplied p0 as from its internal copy (Appendix A); only p0_a is
        # ever needed from the copy.
        p0_a[rows] = np.where(p_edge, (1.0 - DELTA_STAB) * pa + DELTA_STAB / k, pa)
        label[rows], b[rows], changed[rows] = a, b_block, q_top != a
        calibrated_top[rows] = q_top
        if eta is not None:
            lower = _lower(top[rows], tail[rows])
            g = _local_reference(changed[rows], b_block, p0_a[rows], local_weight)
            s = np.clip(interior_response(eta, g), lower, 1.0 - EPS_NUM)
            _reconstruct(out[rows], a, b_block, tail[rows], s)
    return RepairTerms(label, b, tail, out, _lower(top, tail), np.full(n, 1.0 - EPS_NUM),
                       _local_reference(changed, b, p0_a, local_weight), changed, calibrated_top)


#: Up to this many classes a block is processed transposed, one class per vector op: row
#: reductions over a handful of entries cost numpy ~20-60 ns of overhead per row, column
#: operations over thousands of rows run at memory speed.
COLUMNWISE_MAX_K = 32


def _rows_block(pb, qb, rest, check: bool = True):
    """Terms of one block by row reductions (K above COLUMNWISE_MAX_K). Returns None when a
    value check fails, else (a, p0_a, p0 on boundary, argmax q, b, tail, runner-up); fills
    ``rest``, a C-contiguous float64 buffer of the block's shape."""
    pb = np.ascontiguousarray(pb, dtype=np.float64)
    qb = np.ascontiguousarray(qb, dtype=np.float64)
    idx = np.arange(pb.shape[0])
    a, q_top = top1(pb), top1(qb)
    # A row's minimum gathered at its argmin: the same value (a NaN's position when there
    # is one), and several times faster than ndarray.min for rows of 100 entries.
    p_min, q_min = pb[idx, pb.argmin(axis=1)], qb[idx, qb.argmin(axis=1)]
    pa = pb[idx, a]
    if check and not (probability_rows_ok(pb, p_min, pa)
                      and probability_rows_ok(qb, q_min, qb[idx, q_top])):
        return None
    rest[...] = qb
    q_edge = q_min <= 0.0
    if q_edge.any():
        rest[q_edge] = stabilize(qb[q_edge])
    b = rest[idx, a]
    rest[idx, a] = 0.0
    return a, pa, p_min <= 0.0, q_top, b, rest.sum(axis=1), rest[idx, rest.argmax(axis=1)]


def _columns_block(pb, qb, rest, check: bool = True):
    """``_rows_block`` on the transposed block (K <= COLUMNWISE_MAX_K), same results bit for
    bit: minima, maxima and gathers are exact in any order, and row sums use numpy's own
    pairwise order (``pairwise_column_sum``)."""
    pt = np.array(pb.T, dtype=np.float64, order="C")
    qt = np.array(qb.T, dtype=np.float64, order="C")
    k, m = pt.shape
    idx = np.arange(m)
    p_min, p_max = np.minimum.reduce(pt, axis=0), np.maximum.reduce(pt, axis=0)
    q_min, q_max = np.minimum.reduce(qt, axis=0), np.maximum.reduce(qt, axis=0)
    if check and not (probability_rows_ok(pt, p_min, p_max, sums=pairwise_column_sum(pt))
                      and probability_rows_ok(qt, q_min, q_max,
                                              sums=pairwise_column_sum(qt))):
        return None
    a, q_top = top1(pb), top1(qb)  # argmax over short rows is fast, unlike min and max
    pa = pt[a, idx]
    q_edge = q_min <= 0.0
    if q_edge.any():
        qt[:, q_edge] = (1.0 - DELTA_STAB) * qt[:, q_edge] + DELTA_STAB / k
    b = qt[a, idx]
    qt[a, idx] = 0.0
    tail, runner_up = pairwise_column_sum(qt), np.maximum.reduce(qt, axis=0)
    if rest is not None:
        rest[...] = qt.T
    return a, pa, p_min <= 0.0, q_top, b, tail, runner_up


def pairwise_column_sum(columns: np.ndarray) -> np.ndarray:
    """Sums over axis 0 of a (K, m) array, added in the order numpy's pairwise summation
    adds the K entries of a contiguous row (sequential below 8; eight interleaved partial
    sums up to 128; halves at multiples of 8 above), so the result equals
    ``columns.T.sum(axis=1)`` of a C-contiguous copy bit for bit (checked by
    tests/core/test_cord.py against the installed numpy)."""
    k = columns.shape[0]
    if k < 8:
        total = columns[0] + 0.0
        for j in range(1, k):
            total += columns[j]
        return total
    if k <= 128:
        partial = columns[:8].copy()
        end = k - k % 8
        for j in range(8, end, 8):
            partial += columns[j:j + 8]
        total = ((partial[0] + partial[1]) + (partial[2] + partial[3])) + (
            (partial[4] + partial[5]) + (partial[6] + partial[7]))
        for j in range(end, k):
            total += columns[j]
        return total
    half = k // 2
    half -= half % 8
    return pairwise_column_sum(columns[:half]) + pairwise_column_sum(columns[half:])


def _lower(top: np.ndarray, tail: np.ndarray) -> np.ndarray:
    """min I = rho / (1 + rho) + eps (eq. 4), rho = max_{j != a} q_j / tail.

    max_j (q_j / tail) == (max_j q_j) / tail exactly: division by a positive number is a
    monotone correctly-rounded map, so this saves an n x K division.
    """
    rho = top / tail
    return rho / (1.0 + rho) + EPS_NUM


def _local_reference(changed, b, p0_a, local_weight: float) -> np.ndarray:
    """g = b where q keeps the original top-1, else lambda b + (1 - lambda) p0_a (eq. 25)."""
    return np.where(changed, local_weight * b + (1.0 - local_weight) * p0_a, b)


def repair_terms(p0: np.ndarray, q: np.ndarray, local_weight: float) -> RepairTerms:
    """Compute a, b, the tail, ``rest``, the interval I and the local reference g for every
    row of validated inputs (``_sweep``).

    p0 and q are stabilised independently and only on their boundary rows; for p0 only
    the entry p0_a is ever needed, so only that entry is stabilised.
    """
    return _sweep(p0, q, local_weight, keep_rest=True)


def interior_response(eta: float, g: np.ndarray) -> np.ndarray:
    """H(g, eta): the root in (0, 1) of (s - g) / (s (1 - s)) = eta (eqs. 19-20).

    Uses the hypot form of R and the branch on eta that avoids cancellation; H(g, 0) = g
    exactly, which the identity characterisation relies on.
    """
    if eta == 0.0:
        return g.copy()
    r = np.hypot(eta + (2.0 * g - 1.0), 2.0 * np.sqrt(g * (1.0 - g)))
    if eta <= 1.0:
        return 2.0 * g / ((1.0 - eta) + r)
    return ((eta - 1.0) + r) / (2.0 * eta)


def response(eta: float, terms: RepairTerms) -> np.ndarray:
    """psi(eta; g, I): the interval-constrained response (eq. 16)."""
    return np.clip(interior_response(eta, terms.g), terms.lower, terms.upper)


def multiplier_of(g: np.ndarray, s: np.ndarray) -> np.ndarray:
    """h_g(s) = (s - g) / (s (1 - s)), the multiplier at which the response equals s (eq. 13)."""
    return (s - g) / (s * (1.0 - s))


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


def _reconstruct(out: np.ndarray, label: np.ndarray, b: np.ndarray, tail: np.ndarray,
                 s: np.ndarray) -> np.ndarray:
    """p~ = s e_a + (1 - s) alpha (eq. 2) in place, ``out`` holding ``rest`` on entry.

    Rows whose mass is unchanged (s == b) get the internal copy of q back bit for bit: the
    identity characterisation says the repair is q there, and the algebraic route would
    differ from it in the last ulp.
    """
    same = s == b
    with np.errstate(over="ignore"):
        factor = (1.0 - s) / tail
    # A subnormal tail can push (1 - s) / tail past the float range; those rows divide by
    # tail / (1 - s) instead, which is finite whenever the tail is positive.
    overflow = np.isinf(factor)
    any_same, any_overflow = same.any(), overflow.any()
    kept = out[same] if any_same else None  # fancy indexing copies the rows
    if any_overflow:
        tiny = out[overflow]
        factor[overflow] = 0.0
    out *= factor[:, None]
    if any_overflow:
        out[overflow] = tiny / (tail[overflow] / (1.0 - s[overflow]))[:, None]
    if any_same:
        out[same] = kept
    out[np.arange(out.shape[0]), label] = s
    return out


def reconstruct(terms: RepairTerms, s: np.ndarray) -> np.ndarray:
    """p~ = s e_a + (1 - s) alpha (eq. 2), reusing ``terms.rest`` as the output buffer."""
    return _reconstruct(terms.rest, terms.label, terms.b, terms.tail, s)


def row_scalars(original, calibrated, local_weight: float, n_classes: int | None = None,
                first_row: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(b, min I, g) of every row of one block: what a fit keeps of it (``fit_blocks``,
    ``cord_ops.reduce``). Validation as in ``fit``, rows named from ``first_row``."""
    terms = row_terms(original, calibrated, local_weight, n_classes, first_row)
    return terms.b, terms.lower, terms.g


def row_terms(original, calibrated, local_weight: float, n_classes: int | None = None,
              first_row: int = 0, keep_rest: bool = False) -> RepairTerms:
    """``_sweep``'s RepairTerms of one block (``rest`` only with ``keep_rest``), its
    validation errors naming rows counted from ``first_row``."""
    try:
        return _sweep(original, calibrated, local_weight, n_classes=n_classes,
                      keep_rest=keep_rest)
    except ValueError as exc:
        raise ValueError(_global_row(str(exc), first_row)) from None


def _global_row(message: str, offset: int) -> str:
    """A block's validation message with its first "row i" renumbered to row offset + i."""
    return re.sub(r"\brow (\d+)\b", lambda m: f"row {int(m.group(1)) + offset}", message,
                  count=1)


def _validated_pair(original, calibrated, n_classes: int | None = None):
    p0 = check_probabilities(original, "original", n_classes=n_classes)
    q = check_probabilities(calibrated, "calibrated", n_classes=n_classes)
    check_pair(p0, q, ("original", "calibrated"))
    return p0, q


class CORD(BaseEstimator):
    """Prediction-preserving repair with one fitted scalar eta* (Algorithm 1).

    A scikit-learn estimator (``get_params``, ``set_params``, ``clone``,
    ``check_is_fitted``): parameters are stored as given and checked in ``fit``. Unlike a
    transformer, ``fit`` and ``transform`` take two arrays, the original output and the
    calibrated one; for an estimator that takes the features, see
    ``cord_ops.CORDCalibratedClassifier``.

    Parameters
    ----------
    mean_target : {"inherited", "none", "local", "pointwise"}
        ``inherited`` is the paper's CORD (eq. 6). ``none`` repairs each row independently,
        s_i = Pi_I(g_i), i.e. eta* = 0. ``local`` and ``pointwise`` are Table 3's ablations.
    local_weight : float in [0, 1]
        lambda of eq. 25, the weight of b in the changed-prediction local reference;
        0.5 is the paper's eq. 5.

    Attributes
    ----------
    eta_ : float
        The nearest-zero multiplier eta* (eq. 18).
    mu_ : float
        The calibration-split target mean the fit enforced.
    n_classes_ : int
        K seen at fit; ``transform`` requires the same.
    n_features_in_ : int
        K again (the width of each input), scikit-learn's name for it.
    n_fit_ : int
        Number of calibration rows.
    """

    def __init__(self, mean_target: str = "inherited", local_weight: float = 0.5):
        self.mean_target = mean_target
        self.local_weight = local_weight

    def _check_params(self) -> None:
        if not isinstance(self.mean_target, str) or self.mean_target not in MEAN_TARGETS:
            raise ValueError(
                f"mean_target: expected one of {MEAN_TARGETS}, got {self.mean_target!r}"
            )
        weight = self.local_weight
        if (not isinstance(weight, int | float | np.floating) or isinstance(weight, bool)
                or not 0.0 <= float(weight) <= 1.0):
            raise ValueError(f"local_weight: expected a number in [0, 1], got {weight!r}")

    def fit(self, original, calibrated) -> CORD:
        """Fit eta* on a calibration split of original (p0) and calibrated (q) outputs."""
        self._check_params()
        original = np.asarray(original)
        terms = _sweep(original, calibrated, float(self.local_weight))
        return self._fit_terms(terms, *original.shape)

    def fit_blocks(self, blocks) -> CORD:
        """Fit eta* from an iterable of (original, calibrated) row blocks, read once.

        Each block goes through the same row-blocked sweep as ``fit`` and is then dropped;
        only the per-row scalars the bisection needs (b, the lower bound of I, g: 24 bytes
        a row) are kept, so memory does not grow with K. Every per-row scalar depends on
        its own row only, and the bisection then runs on the concatenated vectors, so on
        the same rows ``fit_blocks`` gives ``fit``'s eta* and mu bit for bit however the
        rows are split. A bad block raises ``fit``'s error with the row counted from the
        first row of the first block.
        """
        self._check_params()
        weight = float(self.local_weight)
        b, lower, g = [], [], []
        n, k = 0, None
        for original, calibrated in blocks:
            original = np.asarray(original)
            block = row_scalars(original, calibrated, weight, n_classes=k, first_row=n)
            k = original.shape[1] if k is None else k
            n += original.shape[0]
            b.append(block[0])
            lower.append(block[1])
            g.append(block[2])
        if k is None:
            raise ValueError("blocks: expected at least one (original, calibrated) block")
        return self._fit_scalars(np.concatenate(b), np.concatenate(lower), np.concatenate(g),
                                 k)

    def _fit_scalars(self, b, lower, g, k: int) -> CORD:
        """Fit from the per-row scalars of ``row_scalars`` for all rows, in row order."""
        n = b.shape[0]
        terms = RepairTerms(label=None, b=b, tail=None, rest=None, lower=lower,
                            upper=np.full(n, 1.0 - EPS_NUM), g=g)
        return self._fit_terms(terms, n, k)

    def _fit_terms(self, terms: RepairTerms, n: int, k: int) -> CORD:
        """Set eta*, mu and the shape attributes from the per-row scalars of n rows."""
        if self.mean_target == "none":
            mu, eta = float(np.mean(response(0.0, terms))), 0.0
        else:
            mu = target_mean(terms, self.mean_target)
            eta = nearest_zero_multiplier(terms, mu)
        return self._set_fitted(eta, mu, n, k)

    def _set_fitted(self, eta: float, mu: float, n: int, k: int) -> CORD:
        self.eta_ = float(eta)
        self.mu_ = float(mu)
        self.n_classes_ = int(k)
        self.n_features_in_ = self.n_classes_
        self.n_fit_ = int(n)
        return self

    def __sklearn_is_fitted__(self) -> bool:
        return hasattr(self, "eta_")

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        # Both inputs are probability rows; ``calibrated`` takes the place of y.
        tags.input_tags.positive_only = True
        tags.target_tags.required = True
        return tags

    def _check_fitted(self) -> None:
        if not self.__sklearn_is_fitted__():
            raise NotFittedError("CORD: call fit(original, calibrated) before transform")

    def transform(self, original, calibrated) -> np.ndarray:
        """Repair new output pairs with the fitted eta*; returns an n x K float64 array.

        Every row's argmax is the argmax of ``original`` (uniquely top-ranked) and its
        conditional distribution over the other classes is q's (Proposition 1).
        """
        self._check_fitted()
        return _sweep(original, calibrated, float(self.local_weight), self.n_classes_,
                      eta=self.eta_).rest

    def fit_transform(self, original, calibrated) -> np.ndarray:
        return self.fit(original, calibrated).transform(original, calibrated)

    def to_dict(self) -> dict:
        """JSON-safe fitted state: eta* (float and exact repr), constants and options."""
        self._check_fitted()
        return {
            "kind": "cord",
            "version": STATE_VERSION,
            "eta_star": self.eta_,
            "eta_star_repr": repr(self.eta_),
            "mu": self.mu_,
            "n_classes": self.n_classes_,
            "n_fit": self.n_fit_,
            "mean_target": self.mean_target,
            "local_weight": float(self.local_weight),
            "eps_num": EPS_NUM,
            "delta_stab": DELTA_STAB,
        }

    @classmethod
    def from_dict(cls, state: dict) -> CORD:
        """Rebuild a fitted CORD; rejects state from another version or other constants."""
        if not isinstance(state, dict) or state.get("kind") != "cord":
            raise ValueError("CORD state: expected a dict with kind 'cord'")
        required = ("version", "eta_star_repr", "mu", "n_classes", "n_fit", "mean_target",
                    "local_weight", "eps_num", "delta_stab")
        missing = [key for key in required if key not in state]
        if missing:
            raise ValueError(f"CORD state: missing keys {missing}")
        if state["version"] != STATE_VERSION:
            raise ValueError(
                f"CORD state: expected version {STATE_VERSION}, got {state['version']!r}"
            )
        if state["eps_num"] != EPS_NUM or state["delta_stab"] != DELTA_STAB:
            raise ValueError(
                "CORD state: eps_num/delta_stab differ from this build's constants "
                f"({EPS_NUM}, {DELTA_STAB})"
            )
        try:
            eta = float(state["eta_star_repr"])
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"CORD state: eta_star_repr {state['eta_star_repr']!r} is not a float"
            ) from exc
        if not math.isfinite(eta):
            raise ValueError(f"CORD state: eta_star must be finite, got {eta!r}")
        model = cls(mean_target=state["mean_target"], local_weight=state["local_weight"])
        model._check_params()
        n_classes = state["n_classes"]
        if not isinstance(n_classes, int) or n_classes < 2:
            raise ValueError(f"CORD state: n_classes must be an integer >= 2, got {n_classes!r}")
        model.eta_ = eta
        model.mu_ = float(state["mu"])
        model.n_classes_ = n_classes
        model.n_features_in_ = n_classes
        model.n_fit_ = int(state["n_fit"])
        return model

    def save(self, path) -> None:
        """Write the fitted state as JSON atomically (temp file, then rename)."""
        write_json_atomic(path, self.to_dict())

    @classmethod
    def load(cls, path) -> CORD:
        """Read a state written by ``save``; a corrupt file raises ValueError naming it."""
        path = Path(path)
        try:
            state = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"{path}: not a readable CORD state file ({exc})") from exc
        try:
            return cls.from_dict(state)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from exc


def check_cord_params(cord: CORD) -> None:
    """Raise ValueError when ``cord``'s ``mean_target`` or ``local_weight`` is not valid:
    the check ``CORD.fit`` makes first, for code that fits eta* elsewhere (the partition
    drivers of :mod:`cord_ops.reduce`) or wants a bad parameter to fail before any fit."""
    cord._check_params()


def fit_from_row_scalars(cord: CORD, b: np.ndarray, lower: np.ndarray, g: np.ndarray,
                         k: int) -> CORD:
    """Fit ``cord`` from the per-row scalars of :func:`row_scalars` (b, the lower bound of
    I, g) of every calibration row of K = ``k`` classes, in row order: the eta* and mu of
    ``CORD.fit`` on those rows, bit for bit. Returns ``cord``, fitted."""
    return cord._fit_scalars(b, lower, g, k)


def set_fitted(cord: CORD, eta: float, mu: float, n: int, k: int) -> CORD:
    """Record ``eta`` and ``mu``, computed elsewhere (a reduction over partitions), as
    ``cord``'s fit on ``n`` rows of K = ``k`` classes; ``transform`` then uses them.
    Returns ``cord``, fitted."""
    return cord._set_fitted(eta, mu, n, k)


def minimal_repair(original, calibrated) -> np.ndarray:
    """Table 2's minimal pointwise repair.

    Rows where q already has the original top-1 are returned unchanged; elsewhere
    s = Pi_I(b) and the vector is rebuilt with q's conditional distribution (eq. 2).
    """
    terms = _sweep(original, calibrated, 0.5, keep_rest=True)
    out = reconstruct(terms, np.clip(terms.b, terms.lower, terms.upper))
    kept = ~terms.changed
    out[kept] = np.asarray(calibrated)[kept]
    return out
