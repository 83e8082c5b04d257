"""Per-partition reducers: pure numpy functions of one partition (a dict of arrays, see
``cord_ops.reduce``), run where the partition lives, that return sums the drivers of
``cord_ops.reduce`` add. Sums that must not depend on how rows are split are exact
(``exact_sum``: a Python integer, sum * 2^1074), their means correctly rounded
(``exact_mean``).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from cord_ops.calibrators import calibrator_from_dict
from cord_ops.cord_kernels import EPS_NUM, interior_response, multiplier_of, row_terms
from cord_ops.metrics import PROB_FLOOR
from cord_ops.validation import top1

_SCALE = 1074  # 2^-1074 is the smallest subnormal: x * 2^1074 is an integer for every x
_CHUNK = 1 << 21  # values per chunk: 2^21 limbs of <= 2^31 units sum exactly in float64


def exact_sum(x) -> int:
    """sum(x) * 2^1074 exactly, as a Python integer (x finite float64).

    Every finite double is an integer multiple of 2^-1074. The values are peeled into limbs
    of 32 bits from the top: ``(r + C) - C`` with C = 1.5 * 2^(s + 52) rounds each r to a
    multiple of 2^s exactly, the remainder r - limb is exact, and a limb is at most 2^31
    units of 2^s, so the float64 sum of 2^21 limbs is exact too. The loop stops when every
    remainder is zero (three limbs for values in [2^-40, 1]). No rounding happens anywhere,
    so any split of the values gives the same integer.
    """
    x = np.ascontiguousarray(x, dtype=np.float64).ravel()
    total = 0
    for start in range(0, x.shape[0], _CHUNK):
        rest = x[start:start + _CHUNK].copy()
        big = float(np.max(np.abs(rest))) if rest.size else 0.0
        if not math.isfinite(big):
            raise ValueError("exact_sum: expected finite values")
        if big == 0.0:
            continue
        if big >= 2.0**960:  # C would overflow; never the case for probabilities and NLLs
            total += int(sum(map(Fraction, rest.tolist())) * (1 << _SCALE))
            continue
        bound = math.frexp(big)[1]  # |rest| < 2^bound
        while True:
            scale = max(bound - 31, -_SCALE)
            c = 1.5 * 2.0 ** (scale + 52)
            limb = (rest + c) - c
            rest -= limb
            num, den = float(np.sum(limb)).as_integer_ratio()
            total += (num << _SCALE) // den
            if scale == -_SCALE or not rest.any():
                break
            bound = scale - 1
    return total


def exact_mean(total: int, n: int) -> float:
    """The correctly rounded mean of n values whose ``exact_sum`` is ``total``."""
    return float(Fraction(total, n << _SCALE))


def _logits(scores, input_kind: str, prob_floor: float) -> np.ndarray:
    x = np.asarray(scores, dtype=np.float64)
    return np.log(np.maximum(x, prob_floor)) if input_kind == "probs" else x


def rows(part) -> int:
    return int(part["labels"].shape[0])


def ts_moment_sums(part, beta, input_kind, prob_floor, labels: bool = False) -> tuple:
    """Exact sums of E_q[z_i], Var_q(z_i) and the third central moment of z_i under
    q = softmax(beta z_i) (the slope g's first two derivatives, times n, are the last
    two), and with ``labels`` the sum of z_{i, y_i}, all of z shifted by its row maximum as
    ``fit_inverse_temperature`` shifts it. One pass over the rows: what a Newton step
    (the first two) or a Halley step (all three) needs."""
    z = _logits(part["scores"], input_kind, prob_floor)
    z = z - z.max(axis=1, keepdims=True)
    e = np.multiply(z, beta)
    np.exp(e, out=e)
    total = e.sum(axis=1)
    m1 = np.einsum("ik,ik->i", e, z) / total
    e *= z
    m2 = np.einsum("ik,ik->i", e, z) / total
    e *= z
    m3 = np.einsum("ik,ik->i", e, z) / total
    out = (exact_sum(m1), exact_sum(m2 - m1 * m1), exact_sum(m3 - m1 * (3.0 * m2 - 2.0 * m1 * m1)))
    if labels:
        out += (exact_sum(z[np.arange(z.shape[0]), part["labels"]]),)
    return out


def _vs_softmax(part, weights, bias, input_kind, prob_floor):
    """(z, labels, row indices, exact sum of the NLL, q = softmax(z w + b)) of the
    partition: what the VS value, gradient and Hessian sums share. q is computed in one
    buffer, in place (each n x K temporary is a pass over memory)."""
    z = _logits(part["scores"], input_kind, prob_floor)
    y = part["labels"]
    idx = np.arange(z.shape[0])
    s = z * weights
    s += bias
    m = s.max(axis=1)
    picked = s[idx, y]
    s -= m[:, None]
    np.exp(s, out=s)
    total = s.sum(axis=1)
    nll = math.fsum(np.log(total) + m - picked)
    s /= total[:, None]
    return z, y, idx, nll, s


def vs_newton_sums(part, weights, bias, input_kind, prob_floor):
    """(sum NLL, sum of the gradient (K, 2), sum of the Hessian (2K, 2K)) of
    softmax(z w + b) over the partition, in ``_affine``'s theta layout (w_k, b_k per row):
    ``_Problem.value_grad`` and ``_Problem.hessian`` times the partition's row count."""
    z, y, idx, nll, q = _vs_softmax(part, weights, bias, input_kind, prob_floor)
    n, k = z.shape
    d = q.copy()
    d[idx, y] -= 1.0
    grad = np.column_stack([np.einsum("ik,ik->k", d, z), d.sum(axis=0)])
    qx = q * z
    u = np.stack([qx, q], axis=2).reshape(n, 2 * k)
    h = -(u.T @ u)
    blocks = np.empty((k, 2, 2))
    blocks[:, 0, 0] = np.einsum("ik,ik->k", qx, z)
    blocks[:, 0, 1] = blocks[:, 1, 0] = qx.sum(axis=0)
    blocks[:, 1, 1] = q.sum(axis=0)
    for kk in range(k):
        h[2 * kk:2 * kk + 2, 2 * kk:2 * kk + 2] += blocks[kk]
    return nll, grad, h


def vs_value_grad_sums(part, weights, bias, input_kind, prob_floor):
    """(sum NLL, sum of the gradient (K, 2)) of softmax(z w + b) over the partition: the
    part of ``vs_newton_sums`` a preconditioned gradient step needs (no Hessian)."""
    z, y, idx, nll, d = _vs_softmax(part, weights, bias, input_kind, prob_floor)
    d[idx, y] -= 1.0
    bias_grad = d.sum(axis=0)
    d *= z  # column sums of d * z: the weights' gradient (sum over rows of a C array)
    return nll, np.column_stack([d.sum(axis=0), bias_grad])


def cord_sums(part) -> tuple[int, int, int, int]:
    """Exact sums of b, min I, g and Pi_I(b) over the partition (``exact_sum``)."""
    b, lower, g = part["b"], part["lower"], part["g"]
    return (exact_sum(b), exact_sum(lower), exact_sum(g),
            exact_sum(np.clip(b, lower, 1.0 - EPS_NUM)))


#: Rows per chunk of a bisection step's per-row work: 64K doubles per array stay in the
#: L2 cache, so each operation of a step reads its rows from the cache instead of from
#: memory, as one whole-partition pass per operation would.
STEP_ROWS = 1 << 16


def cord_response_sum(part, eta) -> int:
    """Exact sum of psi(eta) = Pi_I(H(g, eta)) over the partition (eq. 16), chunk by
    chunk (exact sums add exactly)."""
    g, lower = part["g"], part["lower"]
    return sum(exact_sum(np.clip(interior_response(eta, g[i:i + STEP_ROWS]),
                                 lower[i:i + STEP_ROWS], 1.0 - EPS_NUM))
               for i in range(0, g.shape[0], STEP_ROWS))


def cord_response_estimate(part, eta) -> float:
    """sum of psi(eta) over the partition with R = sqrt(x^2 + y^2) instead of hypot and
    pairwise float sums of ``STEP_ROWS`` chunks added by ``math.fsum``: within
    ``screen_margin`` of the exact mean per row (``_ReducedMean``)."""
    sums = []
    for i in range(0, part["g"].shape[0], STEP_ROWS):
        g = part["g"][i:i + STEP_ROWS]
        x = eta + (2.0 * g - 1.0)
        y = 2.0 * np.sqrt(g * (1.0 - g))  # as _MeanResponse.approximate forms x^2 + y^2
        r = np.sqrt(x * x + y * y)
        s = 2.0 * g / ((1.0 - eta) + r) if eta <= 1.0 else ((eta - 1.0) + r) / (2.0 * eta)
        np.maximum(s, part["lower"][i:i + STEP_ROWS], out=s)
        np.minimum(s, 1.0 - EPS_NUM, out=s)
        sums.append(float(np.add.reduce(s)))
    return math.fsum(sums)


def cord_multiplier_range(part) -> tuple[float, float]:
    """(max h_g(max I), min h_g(min I)) over the partition: eq. 21's bracket ends."""
    g, lower = part["g"], part["lower"]
    upper = np.full_like(g, 1.0 - EPS_NUM)
    return float(multiplier_of(g, upper).max()), float(multiplier_of(g, lower).min())


def metric_sums(part, probs_key, reference_key=None, n_bins: int = 15,
                reference_top=None) -> dict:
    """Sums behind ECE (per-bin counts, confidence and accuracy sums, equal-width bins
    (l, u]), NLL, Brier of ``part[probs_key]`` against the labels and, with
    ``reference_key``, the rows whose top-1 differs from the reference's (TPCR), whose
    top-1 classes may be passed as ``reference_top`` when already known.

    Brier per row is sum_k q_k^2 - 2 q_y + 1, one pass over the row instead of forming the
    residual: the same value up to a few ulps of 1 per row (``metrics.brier`` forms it)."""
    p = np.asarray(part[probs_key], dtype=np.float64)
    y = part["labels"]
    idx = np.arange(p.shape[0])
    top = top1(p)
    out = _row_metric_sums(p[idx, top], top == y, p[idx, y], np.einsum("ik,ik->i", p, p),
                           n_bins)
    if reference_key is not None:
        before = (top1(np.asarray(part[reference_key])) if reference_top is None
                  else reference_top)
        changed = before != top
        out["changed"] = int(changed.sum())
        # metrics.prediction_changes' counts: incorrect -> correct, correct -> incorrect,
        # incorrect -> another incorrect class
        out["c_plus"] = int((changed & (top == y)).sum())
        out["c_minus"] = int((changed & (before == y)).sum())
        out["c_zero"] = int((changed & (before != y) & (top != y)).sum())
    return out


def _row_metric_sums(conf, correct, on_label, sum_sq, n_bins: int) -> dict:
    """``metric_sums`` from per-row top-1 probability, top-1 == label, probability of the
    label and sum of squared probabilities."""
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    bins = np.clip(np.searchsorted(edges, conf, side="left") - 1, 0, n_bins - 1)
    true_mass = np.clip(on_label, PROB_FLOOR, 1.0 - PROB_FLOOR)
    return {
        "n": int(conf.shape[0]),
        "counts": np.bincount(bins, minlength=n_bins).astype(np.int64),
        "conf": [exact_sum(conf[bins == i]) for i in range(n_bins)],
        "acc": np.bincount(bins, weights=correct.astype(np.float64),
                           minlength=n_bins).astype(np.int64),
        "nll": exact_sum(-np.log(true_mass)),
        "brier": exact_sum(sum_sq - 2.0 * on_label + 1.0),
    }


def cord_partition_pass(part, calibrator_state, input_kind, local_weight, first_row, *,
                        metrics: bool = False, temperature: bool = False) -> dict:
    """One pass over a block for CORD's fit: per-row arrays ``b``, ``lower``, ``g``
    (``cord_kernels.row_scalars``) and, riding on the same pass,

    - ``metrics``: the per-row values behind ``metric_sums`` of the original output (p0)
      and of the calibrator's (q, TPCR against p0), and those the repaired output's sums
      need once eta* is known (``repaired_metric_sums``): the tail mass, the label's entry
      of the tail (0 when the label is the original top-1), the sum of squares of
      alpha = rest / tail (``alpha_sq``) and whether the label is the original top-1. The
      repair is p~ = s e_a + (1 - s) alpha (eq. 2), so those give its top-1 probability
      s, its label entry and its sum of squares without the K-vector;
    - ``temperature``: per-row E_q[z] - z_y and Var_q(z) (the calibrator a TS), whose
      sums let ``temperature_step`` confirm the fitted beta on this pass.

    Only per-row arrays: ``cord_pass_sums`` reduces a whole partition's at once (exact
    sums cost a fixed overhead per call, too much to pay per small block).
    """
    from cord_ops.softmax import softmax

    scores = np.asarray(part["scores"], dtype=np.float64)
    p0 = scores if input_kind == "probs" else softmax(scores)
    cal = calibrator_from_dict(calibrator_state)
    q = cal.predict_proba(scores)
    terms = row_terms(p0, q, local_weight, first_row=first_row, keep_rest=metrics)
    out = {"b": terms.b, "lower": terms.lower, "g": terms.g}
    y = part["labels"]
    idx = np.arange(q.shape[0])
    if metrics:
        rest, a, q_top = terms.rest, terms.label, terms.calibrated_top
        rest_y = rest[idx, y]  # a copy: rest is rescaled to alpha below
        # alpha = rest / tail (eq. 2): its sum of squares is in [1 / (K - 1), 1] whatever
        # the tail's size; the tail's own (rest . rest) underflows to a subnormal or 0
        # below a tail of ~2^-511, and ((1 - s) / tail)^2 overflows there
        rest /= terms.tail[:, None]
        out.update(tail=terms.tail, rest_y=rest_y, alpha_sq=np.einsum("ik,ik->i", rest, rest),
                   hit=a == y, p0_top=p0[idx, a], p0_y=p0[idx, y],
                   p0_sq=np.einsum("ik,ik->i", p0, p0), q_top=q_top.astype(np.int32),
                   q_conf=q[idx, q_top], q_y=q[idx, y], q_sq=np.einsum("ik,ik->i", q, q),
                   changed=terms.changed)
    if temperature:
        z = _logits(scores, input_kind, cal.prob_floor)
        mean_z = np.einsum("ik,ik->i", q, z)
        q *= z
        out["t_slope"] = mean_z - z[idx, y]
        out["t_var"] = np.einsum("ik,ik->i", q, z) - mean_z * mean_z
    return out


#: Per-row arrays of ``cord_partition_pass`` that only ``cord_pass_sums`` needs.
PASS_ONLY = ("p0_top", "p0_y", "p0_sq", "q_top", "q_conf", "q_y", "q_sq", "changed",
             "t_slope", "t_var")


def cord_pass_sums(rows: dict, n_bins: int = 15) -> dict:
    """The sums of ``cord_partition_pass``'s per-row arrays of a whole partition:
    ``original`` and ``calibrated`` (``metric_sums``' layout), ``temperature`` (exact sums
    of the slope and variance); only what was computed."""
    out = {}
    if "p0_top" in rows:
        hit, y, q_top = rows["hit"], rows["labels"], rows["q_top"]
        out["original"] = _row_metric_sums(rows["p0_top"], hit, rows["p0_y"], rows["p0_sq"],
                                           n_bins)
        calibrated = _row_metric_sums(rows["q_conf"], q_top == y, rows["q_y"], rows["q_sq"],
                                      n_bins)
        changed = rows["changed"]
        calibrated["changed"] = int(changed.sum())
        calibrated["c_plus"] = int((changed & (q_top == y)).sum())
        calibrated["c_minus"] = int((changed & hit).sum())
        calibrated["c_zero"] = int((changed & ~hit & (q_top != y)).sum())
        out["calibrated"] = calibrated
    if "t_slope" in rows:
        out["temperature"] = (exact_sum(rows["t_slope"]), exact_sum(rows["t_var"]))
    return out


def repaired_metric_sums(part, eta: float, n_bins: int = 15) -> dict:
    """``metric_sums`` of CORD's repair at ``eta`` (TPCR against the original) from the
    per-row arrays of ``cord_partition_pass(..., metrics=True)``: s = Pi_I(H(g, eta)) is
    the repaired top-1 probability (the original top-1 stays on top, Proposition 1), the
    label's entry is s or (1 - s) / tail times its tail entry, the sum of squares is
    s^2 + (1 - s)^2 |alpha|^2. The label entries are ``transform``'s: rows with s == b
    keep q's own entries (factor 1, tail^2 |alpha|^2) and where the factor overflows the
    entry is alpha_y = rest_y / tail times 1 - s, as ``cord_kernels._reconstruct`` does;
    the sum of squares equals the transformed row's to rounding."""
    s = np.clip(interior_response(eta, part["g"]), part["lower"], 1.0 - EPS_NUM)
    tail, rest_y, hit = part["tail"], part["rest_y"], part["hit"]
    kept = s == part["b"]
    with np.errstate(over="ignore"):
        factor = (1.0 - s) / tail
    factor[kept] = 1.0
    on_label = np.where(hit, s, rest_y * factor)
    overflow = np.isinf(factor)
    if overflow.any():
        # alpha_y = rest_y / tail first (in [0, 1]), then times 1 - s: dividing by
        # tail / (1 - s) would round that quotient to the subnormal grid
        alpha_y = rest_y[overflow] / tail[overflow]
        on_label[overflow] = np.where(hit[overflow], s[overflow],
                                      alpha_y * (1.0 - s[overflow]))
    # the repaired tail is w alpha, w = 1 - s (the tail itself where q is kept): its sum
    # of squares w^2 |alpha|^2 is finite for any tail, where the tail's own sum of squares
    # times factor^2 is inf or 0 * inf below a tail of ~2^-500
    w = np.where(kept, tail, 1.0 - s)
    sum_sq = s * s + (w * w) * part["alpha_sq"]
    out = _row_metric_sums(s, hit, on_label, sum_sq, n_bins)
    out.update(changed=0, c_plus=0, c_minus=0, c_zero=0)
    return out



def cord_row_scalars(part) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The partition's (b, min I, g), for a driver that gathers them."""
    return part["b"], part["lower"], part["g"]


def partition_label_counts(part, k: int) -> np.ndarray:
    """Rows per class in the partition (the gate's label histograms)."""
    return np.bincount(part["labels"], minlength=k).astype(np.int64)

