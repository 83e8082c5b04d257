"""The row-wise kernels of CORD's repair (Kim, Chung & Jang, Section 3 and Appendix A).

For each row, from the original output ``p0`` and the calibrator's direct output ``q``:
the original top-1 class ``a``, ``b = q_a``, the tail mass, the prediction-preserving
interval I and the local reference g (``sweep``, ``repair_terms``, ``row_terms``); the
one-dimensional response family over the multiplier eta (eqs. 13, 16, 19-20); and the
repaired vector rebuilt from a chosen mass ``s`` on ``a`` (eq. 2, ``reconstruct``). The
choice of eta* is :mod:`cord_ops.cord_solve`'s, the estimator :mod:`cord_ops.cord`'s.

- tie rule: the smallest maximizing index (``validation.top1``);
- ``EPS_NUM`` offsets the prediction-preserving interval (eq. 4);
- ``DELTA_STAB`` stabilises boundary rows only, on internal copies (eq. 11);
- the tail mass ``1 - q_a`` is computed as the sum over ``j != a``;
- the local reference ``g`` is eq. 5 (eq. 25 for another ``local_weight``);
- the interior response is the cancellation-safe closed form of eqs. 19-20, clipped to the
  interval (eq. 16).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

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


def sweep(original, calibrated, local_weight: float, n_classes: int | None = None,
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
#: reductions over a handful of entries cost numpy a fixed overhead per row, column
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
    row of validated inputs (``sweep``).

    p0 and q are stabilised independently and only on their boundary rows; for p0 only
    the entry p0_a is ever needed, so only that entry is stabilised.
    """
    return sweep(p0, q, local_weight, keep_rest=True)


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
    # A subnormal tail can push (1 - s) / tail past the float range; those rows form
    # alpha = rest / tail first (in [0, 1], exact to a rounding since sums of subnormals are
    # exact) and scale it by 1 - s. Dividing by tail / (1 - s) instead rounds that quotient
    # to the subnormal grid: a tail of ~1e-322 then put rows 1 % off summing to 1.
    overflow = np.isinf(factor)
    any_same, any_overflow = same.any(), overflow.any()
    kept = out[same] if any_same else None  # fancy indexing copies the rows
    if any_overflow:
        tiny = out[overflow]
        factor[overflow] = 0.0
    out *= factor[:, None]
    if any_overflow:
        out[overflow] = (tiny / tail[overflow][:, None]) * (1.0 - s[overflow])[:, None]
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
    """``sweep``'s RepairTerms of one block (``rest`` only with ``keep_rest``), its
    validation errors naming rows counted from ``first_row``."""
    try:
        return sweep(original, calibrated, local_weight, n_classes=n_classes,
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
