"""Fits and metrics whose data is split into partitions: per-partition reducers (pure numpy,
run where a partition lives) and drivers that combine their results.

A driver never sees rows. It is given ``reduce(fn, *args)``, which applies
``fn(partition, *args)`` to every partition and returns the list of results in partition
order; ``local_reduce`` does that for arrays in this process, ``flows.shards.session`` for
partitions held by Dask workers. A partition is a dict of arrays: ``scores`` (n x K,
float32 or float64), ``labels`` (n,) and, once computed, ``b``, ``lower``, ``g`` (CORD's
per-row scalars, ``cord_kernels.row_scalars``).

Calibrators: ``ts`` (``temperature.solve_inverse_temperature``'s Newton iteration on
exact slope and curvature sums or, from a sample's estimate, Halley steps on exact sums of
the slope and its two derivatives, so beta does not depend on the split either) and ``vs``
(without a sample ``_affine``'s damped Newton on NLL, gradient and Hessian sums; with one,
L-BFGS on full-data gradients preconditioned by the sample's Hessian). Both reach the
in-memory optimum within its stopping tolerance. Deviation from the plan of plain L-BFGS:
from VS's identity start it needed hundreds of reductions at K = 100 (a pass over every row
each); see ``fit_vector``.

CORD: eta* and mu are defined through correctly rounded means of the per-row scalars
(``exact_sum``: every finite double is an integer multiple of 2^-1074, so a partition
returns its sum as an exact Python integer and the driver adds integers). eta* therefore
does not depend on how the rows are split into partitions, to the last bit. Deviation from
``CORD.fit``: fit's means are numpy's pairwise sums, so the two eta* agree only to the
rounding of a mean (a few ulps of mu divided by the mean response's slope); both solve
eq. 22 with the same bisection (``cord_solve.bisect_multiplier``).
"""

from __future__ import annotations

import math
import warnings
from fractions import Fraction

import numpy as np
from scipy.linalg import cho_factor, cho_solve

from cord_ops.calibrators import calibrator_from_dict, make_calibrator
from cord_ops.calibrators.solvers import dense_newton_step, newton, warn_not_converged
from cord_ops.calibrators.temperature import (
    BETA_BOUNDS,
    BETA_RTOL,
    bracketed_iteration,
    solve_inverse_temperature,
)
from cord_ops.cord import CORD, check_cord_params, fit_from_row_scalars, set_fitted
from cord_ops.cord_kernels import EPS_NUM, interior_response, multiplier_of, row_terms
from cord_ops.cord_solve import bisect_multiplier, screen_margin
from cord_ops.metrics import PROB_FLOOR
from cord_ops.names import REDUCIBLE
from cord_ops.validation import top1

_SCALE = 1074  # 2^-1074 is the smallest subnormal: x * 2^1074 is an integer for every x
_CHUNK = 1 << 21  # values per chunk: 2^21 limbs of <= 2^31 units sum exactly in float64


def local_reduce(partitions):
    """``reduce`` over partitions held in this process (a list of dicts)."""
    return lambda fn, *args: [fn(part, *args) for part in partitions]


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


# --- per-partition reducers (pure functions of one partition) ----------------------------

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
#: L2 cache, which makes a step ~3x faster on 5M rows (exact 210 -> 72 ms) than one
#: whole-partition pass per operation.
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
      of the tail (0 when the label is the original top-1), the tail's sum of squares and
      whether the label is the original top-1. The repair is p~ = s e_a + (1 - s) rest /
      tail (eq. 2), so those give its top-1 probability s, its label entry and its sum of
      squares without the K-vector;
    - ``temperature``: per-row E_q[z] - z_y and Var_q(z) (the calibrator a TS), whose
      sums let ``temperature_step`` confirm the fitted beta on this pass.

    Only per-row arrays: ``cord_pass_sums`` reduces a whole partition's at once (exact
    sums cost a fixed ~30 us a call, too much per small block).
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
        out.update(tail=terms.tail, rest_y=rest[idx, y], rest_sq=np.einsum("ik,ik->i", rest, rest),
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
    s^2 + ((1 - s) / tail)^2 times the tail's. The per-row values are ``transform``'s:
    rows with s == b keep q's own entries (factor 1) and a factor that overflows divides
    instead, as ``cord_kernels._reconstruct`` does."""
    s = np.clip(interior_response(eta, part["g"]), part["lower"], 1.0 - EPS_NUM)
    tail, rest_y, hit = part["tail"], part["rest_y"], part["hit"]
    with np.errstate(over="ignore"):
        factor = (1.0 - s) / tail
    factor[s == part["b"]] = 1.0
    on_label = np.where(hit, s, rest_y * factor)
    sum_sq = s * s + part["rest_sq"] * (factor * factor)
    overflow = np.isinf(factor)
    if overflow.any():
        divisor = tail[overflow] / (1.0 - s[overflow])
        on_label[overflow] = np.where(hit[overflow], s[overflow], rest_y[overflow] / divisor)
        sum_sq[overflow] = s[overflow] ** 2 + part["rest_sq"][overflow] / divisor**2
    out = _row_metric_sums(s, hit, on_label, sum_sq, n_bins)
    out.update(changed=0, c_plus=0, c_minus=0, c_zero=0)
    return out


# --- drivers ------------------------------------------------------------------------------

def fit_temperature(reduce, n: int, *, input_kind="logits", prob_floor=None, max_iter=100,
                    start: float | None = None, settle: float | None = None):
    """TemperatureScaling fitted from partition sums.

    Without ``start``: ``solve_inverse_temperature`` (the in-memory iteration: bracket
    search by factors of 4 from beta = 1, then Newton) on exact slope and curvature sums.
    With ``start``, an estimate of beta (e.g. fitted on a row sample, within a few percent):
    Halley steps from there on exact sums of the slope and its first two derivatives
    (``ts_moment_sums``; the label sum rides on the first pass). Deviation from the
    in-memory Newton, not from its optimum: Halley converges cubically, so a start 1e-2
    off is 1e-6 off after one pass and at float64 resolution after two, where Newton needs
    four. The steps are kept inside the sign bracket found so far (a step that leaves it is
    replaced by the midpoint) and the loop stops, like the in-memory one, when a step
    changes beta by <= BETA_RTOL relative. Beta therefore matches the in-memory fit to
    that tolerance, and exact sums make it independent of the split bit for bit.

    ``settle`` (warm start only): stop as soon as a step is <= ``settle`` relative and
    return the stepped beta unverified; the caller checks it with ``temperature_step`` on
    sums of a later pass over the rows (``cord_partition_pass``), saving the pass that
    would only confirm it. Returns ({"beta": beta}, prob_floor).
    """
    cal = make_calibrator("ts", input_kind=input_kind, max_iter=max_iter)
    floor = cal.prob_floor if prob_floor is None else prob_floor
    if start is None:
        labels: dict = {}  # mean z_y, from the first pass

        def slope_and_curvature(beta):
            sums = reduce(ts_moment_sums, beta, input_kind, floor, not labels)
            if not labels:
                labels["mean"] = exact_mean(sum(s[3] for s in sums), n)
            return _slope_derivatives(sums, n, labels["mean"])[:2]

        return {"beta": float(solve_inverse_temperature(slope_and_curvature,
                                                        max_iter=max_iter, name="ts"))}, floor
    return {"beta": _halley(reduce, n, input_kind, floor, start, max_iter, settle)}, floor


def _slope_derivatives(sums: list, n: int, mean_zy: float) -> tuple[float, float, float]:
    """(g, g', g'') of the mean-NLL slope from ``ts_moment_sums`` of every partition."""
    return (exact_mean(sum(s[0] for s in sums), n) - mean_zy,
            exact_mean(sum(s[1] for s in sums), n), exact_mean(sum(s[2] for s in sums), n))


def _halley(reduce, n, input_kind, floor, start, max_iter, settle) -> float:
    """``fit_temperature``'s warm-started iteration (its docstring)."""
    lo, hi = BETA_BOUNDS
    beta = min(max(float(start), lo), hi)
    sums = reduce(ts_moment_sums, beta, input_kind, floor, True)
    mean_zy = exact_mean(sum(s[3] for s in sums), n)

    def derivatives(beta):
        return _slope_derivatives(reduce(ts_moment_sums, beta, input_kind, floor, True), n,
                                  mean_zy)

    def halley(beta, d):
        g, g1, g2 = d
        denominator = 2.0 * g1 * g1 - g * g2
        return beta - 2.0 * g * g1 / denominator if g1 > 0.0 and denominator > 0.0 else math.nan

    return bracketed_iteration(derivatives, beta, _slope_derivatives(sums, n, mean_zy), lo, hi,
                               halley, tolerance=BETA_RTOL if settle is None
                               else max(settle, BETA_RTOL), max_iter=max_iter, name="ts",
                               what="Halley")


def temperature_step(beta: float, sums: tuple[int, int], n: int) -> float:
    """The relative Newton step |g / (g' beta)| at ``beta`` from exact sums over every row
    of E_q[z_i] - z_{i, y_i} and Var_q(z_i) at that beta (``cord_partition_pass``): the
    warm-started ``fit_temperature`` has converged there when it is <= BETA_RTOL."""
    g, g1 = exact_mean(sums[0], n), exact_mean(sums[1], n)
    if g == 0.0:
        return 0.0
    return abs(g / g1) / beta if g1 > 0.0 else math.inf


class _ReducedVectorProblem:
    """``_affine._Problem`` for a diagonal map whose sums come from partitions: the mean
    NLL, its gradient and (as ``d``) its Hessian, for ``solvers.newton``."""

    def __init__(self, reduce, n, input_kind, prob_floor):
        self.reduce, self.n, self.kind, self.floor = reduce, n, input_kind, prob_floor
        self.full = False

    def value_grad(self, theta):
        parts = self.reduce(vs_newton_sums, theta[:, 0], theta[:, 1], self.kind, self.floor)
        loss = math.fsum(p[0] for p in parts) / self.n
        return loss, sum(p[1] for p in parts) / self.n, sum(p[2] for p in parts) / self.n

    def hessian(self, d):
        return d.copy()

    def split(self, theta):
        return theta[:, 0], theta[:, 1]


def fit_vector(reduce, n: int, k: int, *, input_kind="logits", prob_floor=None,
               max_iter=1000, gtol=1e-6, sample=None):
    """VectorScaling weights and bias from partition sums, stopping where the in-memory
    fit does (max |mean gradient| <= ``gtol``, or no decrease at float64 resolution).

    Without ``sample``: ``_affine``'s damped dense Newton (the in-memory solver up to 250
    classes), every gradient and Hessian a sum over partitions (one reduction per
    iteration and line-search trial; a Hessian pass costs about five gradient passes at
    K = 100). With ``sample`` = (scores, labels), a row sample held here: VS is fitted in
    memory on the sample (the start), then full-data L-BFGS steps follow whose initial
    inverse Hessian is the sample's mean Hessian there (``_preconditioned``), with Armijo
    backtracking on the full NLL: one value-and-gradient pass each. Deviation: above 250
    classes the in-memory fit switches to Newton-CG; this keeps dense 2K x 2K matrices."""
    cal = make_calibrator("vs", input_kind=input_kind)
    floor = cal.prob_floor if prob_floor is None else prob_floor
    if sample is not None:
        theta, factor = _vs_start(sample, k, input_kind, floor, gtol)
        theta, n_iter, converged, message = _preconditioned(reduce, n, theta, factor,
                                                            input_kind, floor, max_iter, gtol)
    else:
        problem = _ReducedVectorProblem(reduce, n, input_kind, floor)
        theta0 = np.column_stack([np.ones(k), np.zeros(k)])
        theta, _, n_iter, converged, message = newton(problem, theta0, max_iter, gtol,
                                                      dense_newton_step)
    if not converged:
        warn_not_converged("vs", f"{message}; {n_iter} iterations, max_iter={max_iter}")
    return {"weights": theta[:, 0].tolist(), "bias": theta[:, 1].tolist()}, floor


#: Sample rows VS is fitted on for the start of the reduced fit (the rest of the sample
#: only sharpens the preconditioner).
START_ROWS = 20_000

#: Curvature pairs the reduced VS fit keeps (L-BFGS memory).
LBFGS_MEMORY = 10


def _two_loop(grad, memory, factor):
    """L-BFGS's two-loop recursion with the sample Hessian (Cholesky ``factor``) as the
    initial inverse-Hessian approximation: an approximation of H^-1 grad."""
    q = grad.copy()
    alphas = []
    for s_k, y_k, rho in reversed(memory):
        a = rho * float(s_k @ q)
        alphas.append(a)
        q -= a * y_k
    r = cho_solve(factor, q)
    for (s_k, y_k, rho), a in zip(memory, reversed(alphas), strict=True):
        r += s_k * (a - rho * float(y_k @ r))
    return r


def _vs_start(sample, k, input_kind, floor, gtol):
    """(theta, Cholesky factor of the sample's Hessian) for fit_vector: VS fitted in memory
    on the first ``START_ROWS`` rows of the sample, then, on a larger sample, refined by
    the same preconditioned steps over the whole sample held here (cheap passes): each
    level leaves the next a start as close as its sample allows, which is what saves
    full-data passes. The refinement is preconditioned by the first rows' Hessian; the
    full-data steps by the whole sample's at the refined theta (measured, 1M x 100 rows,
    100,000-row sample: 5 full passes; with the first-start Hessian for both, 7)."""
    scores, labels = sample
    start = make_calibrator("vs", input_kind=input_kind, prob_floor=floor)
    with warnings.catch_warnings():  # the sample's own convergence is not the fit's
        warnings.simplefilter("ignore")
        start.fit(scores[:START_ROWS], labels[:START_ROWS])
    theta = np.column_stack([start.weights_, start.bias_])
    whole = {"scores": scores, "labels": labels}
    if len(labels) > START_ROWS:
        first = {"scores": scores[:START_ROWS], "labels": labels[:START_ROWS]}
        theta, *_ = _preconditioned(local_reduce([whole]), len(labels), theta,
                                    _sample_factor(first, theta, input_kind, floor),
                                    input_kind, floor, 100, gtol)
    return theta, _sample_factor(whole, theta, input_kind, floor)


def _sample_factor(sample, theta, input_kind, floor):
    """Cholesky factor of the sample's mean VS Hessian at theta."""
    _, _, h = vs_newton_sums(sample, theta[:, 0], theta[:, 1], input_kind, floor)
    h = h / len(sample["labels"])
    # the Hessian is positive semi-definite; a tiny ridge keeps the solve defined when a
    # class never wins in the sample
    h[np.diag_indices_from(h)] += 1e-10 * max(1.0, float(np.max(np.diag(h))))
    return cho_factor(h)


def _preconditioned(reduce, n, theta, factor, input_kind, floor, max_iter, gtol, rtol=1e-15):
    """(theta, passes, converged, message) of L-BFGS steps from ``theta`` whose initial
    inverse Hessian is the sample's (``factor``), Armijo backtracking on the reduced NLL."""
    def value_grad(theta):
        parts = reduce(vs_value_grad_sums, theta[:, 0], theta[:, 1], input_kind, floor)
        return math.fsum(p[0] for p in parts) / n, sum(p[1] for p in parts) / n

    memory: list = []  # L-BFGS pairs (s, y, 1 / y.s), newest last
    loss, grad = value_grad(theta)
    for it in range(1, max_iter + 1):
        if np.max(np.abs(grad)) <= gtol:
            return theta, it - 1, True, "gradient below gtol"
        step = -_two_loop(grad.ravel(), memory, factor).reshape(theta.shape)
        slope = float(np.sum(grad * step))
        if slope >= 0.0:  # not a descent direction: fall back to the gradient
            step, slope = -grad, -float(np.sum(grad * grad))
        t = 1.0
        for _ in range(40):
            new_theta = theta + t * step
            new_loss, new_grad = value_grad(new_theta)
            if new_loss <= loss + 1e-4 * t * slope:
                break
            t *= 0.5
        else:
            return theta, it, bool(np.max(np.abs(grad)) <= 10 * gtol), "line search stalled"
        flat = loss - new_loss <= rtol * max(1.0, abs(loss))
        s_k, y_k = (new_theta - theta).ravel(), (new_grad - grad).ravel()
        if float(y_k @ s_k) > 1e-12 * float(np.linalg.norm(s_k) * np.linalg.norm(y_k)):
            memory = [*memory[-(LBFGS_MEMORY - 1):], (s_k, y_k, 1.0 / float(y_k @ s_k))]
        theta, loss, grad = new_theta, new_loss, new_grad
        if flat:
            return theta, it, True, "objective decrease at float64 resolution"
    done = bool(np.max(np.abs(grad)) <= gtol)
    return theta, max_iter, done, "gradient below gtol" if done else "max_iter reached"


def calibrator_state(name: str, params: dict, k: int, input_kind: str, prob_floor: float,
                     classes=None) -> dict:
    """The JSON state (``Calibrator.to_dict`` layout) of a calibrator fitted by reduction."""
    # The family's default options: its constructor parameters (scikit-learn's get_params)
    # other than the two every calibrator has, which the state keeps at the top level.
    options = {key: value for key, value in
               make_calibrator(name, input_kind=input_kind).get_params().items()
               if key not in ("input_kind", "prob_floor")}
    return {"name": name, "version": 2, "input_kind": input_kind,
            "prob_floor": float(prob_floor), "n_classes": int(k),
            "classes": list(range(k)) if classes is None else list(classes),
            "options": options, "params": params}


def fit_calibrator(name: str, reduce, n: int, k: int, *, input_kind="logits", sample=None,
                   settle: float | None = None):
    """A fitted calibrator ``name`` (one of REDUCIBLE) from partition reductions;
    ``sample`` = (scores, labels), a row sample, gives the fits a warm start (the same
    optimum to tolerance, fewer passes over the rows). ``settle``: TS with a sample only,
    ``fit_temperature``'s unverified early stop."""
    if name not in REDUCIBLE:
        raise ValueError(f"calibrator {name!r} cannot be fitted over partitions (it needs "
                         f"every row at once); expected one of {', '.join(REDUCIBLE)}")
    if name == "ts":
        start = None
        if sample is not None:
            start = make_calibrator("ts", input_kind=input_kind).fit(*sample).beta_
        params, floor = fit_temperature(reduce, n, input_kind=input_kind, start=start,
                                        settle=settle)
    else:
        params, floor = fit_vector(reduce, n, k, input_kind=input_kind, sample=sample)
    return calibrator_from_dict(calibrator_state(name, params, k, input_kind, floor))


class _ReducedMean:
    """mean psi(eta) as a correctly rounded mean of exact partition sums, with
    ``cord_solve._MeanResponse``'s screening: a step whose estimated mean (``cord_response_
    estimate``: the sqrt form of R and plain pairwise sums, ~5x cheaper than an exact sum)
    is further than ``screen_margin(n)`` from mu takes the branch the exact mean would; the
    first step that is not switches to exact means for the rest. The bound of
    ``_MeanResponse`` holds here: every partition's pairwise sum is within (20 + log2 n) u
    of its exact sum per row, and the driver adds the partition sums with ``math.fsum``."""

    def __init__(self, reduce, n):
        self.reduce, self.n = reduce, n
        self.margin = screen_margin(n)
        self.screening = True

    def exact(self, eta: float) -> float:
        return exact_mean(sum(self.reduce(cord_response_sum, eta)), self.n)

    def _screened(self, eta: float, mu: float) -> float | None:
        if not self.screening or eta == 0.0:
            return None
        estimate = math.fsum(self.reduce(cord_response_estimate, eta)) / self.n
        if abs(estimate - mu) > self.margin:
            return estimate
        self.screening = False
        return None

    def at_least(self, eta: float, mu: float) -> bool:
        estimate = self._screened(eta, mu)
        return self.exact(eta) >= mu if estimate is None else estimate > mu

    def at_most(self, eta: float, mu: float) -> bool:
        estimate = self._screened(eta, mu)
        return self.exact(eta) <= mu if estimate is None else estimate < mu


def cord_row_scalars(part) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The partition's (b, min I, g), for a driver that gathers them."""
    return part["b"], part["lower"], part["g"]


def fit_cord(reduce, n: int, k: int, cord: CORD | None = None, *,
             gather: bool = False) -> CORD:
    """Fit ``cord`` (default CORD()) from partitions that hold ``b``, ``lower`` and ``g``.

    Default: mu is eq. 6 (or the chosen ablation) with correctly rounded means and eta* is
    ``bisect_multiplier`` on the correctly rounded mean response; only scalars travel
    (module docstring). ``gather=True`` brings the per-row scalars (24 bytes a row) to
    the driver in partition order and runs ``CORD.fit``'s own bisection on them: the same
    eta* as ``fit`` on all rows, bit for bit.
    """
    cord = CORD() if cord is None else cord
    check_cord_params(cord)
    if gather:
        scalars = reduce(cord_row_scalars)
        return fit_from_row_scalars(cord, *(np.concatenate([s[i] for s in scalars])
                                            for i in range(3)), k)
    upper = 1.0 - EPS_NUM
    mean = _ReducedMean(reduce, n)
    if cord.mean_target == "none":
        return set_fitted(cord, 0.0, mean.exact(0.0), n, k)
    sums = reduce(cord_sums)
    b, lower, g, pointwise = (exact_mean(sum(s[i] for s in sums), n) for i in range(4))
    source = {"inherited": b, "local": g, "pointwise": pointwise}[cord.mean_target]
    mu = min(max(source, lower), upper)

    def ranges():
        return reduce(cord_multiplier_range)

    eta = bisect_multiplier(mean, mu, lambda: max(r[0] for r in ranges()),
                            lambda: min(r[1] for r in ranges()))
    return set_fitted(cord, eta, mu, n, k)


def metrics_from_sums(sums: list[dict]) -> dict:
    """ECE, NLL, Brier (and TPCR when present) from ``metric_sums`` of every partition."""
    n = sum(s["n"] for s in sums)
    counts = sum(s["counts"] for s in sums)
    acc = sum(s["acc"] for s in sums)
    conf = [exact_mean(sum(s["conf"][i] for s in sums), 1) for i in range(len(counts))]
    gap = math.fsum(abs(float(acc[i]) - conf[i]) for i in range(len(counts)) if counts[i])
    out = {"n": n, "ece": gap / n,
           "nll": exact_mean(sum(s["nll"] for s in sums), n),
           "brier": exact_mean(sum(s["brier"] for s in sums), n),
           "accuracy": float(acc.sum()) / n}
    if all("changed" in s for s in sums):
        out["tpcr"] = sum(s["changed"] for s in sums) / n
        out["changes"] = {key: sum(s[key] for s in sums)
                          for key in ("c_plus", "c_minus", "c_zero")}
    return out


def label_counts(part, k: int) -> np.ndarray:
    """Rows per class in the partition (the gate's label histograms)."""
    return np.bincount(part["labels"], minlength=k).astype(np.int64)


def split_rows(n: int, seed: int, fraction: float, shard_key: int):
    """(calibration mask, sample keys) of a shard's n rows: deterministic in (seed, shard),
    whatever worker reads the shard and however many there are.

    Row i goes to calibration when u_i < ``fraction`` (1.0: every row, for calibration
    shards beside a separate evaluation set; 0.0: none, for that set) and gets the
    sample key v_i, with
    (u, v) the first 2n draws of ``np.random.default_rng([seed, shard_key])``. Unlike
    ``data.split_indices`` the split sizes are binomial, not round(fraction * n): the
    rows of one shard never depend on the others.
    """
    rng = np.random.default_rng([int(seed), int(shard_key)])
    u = rng.random(n)
    keys = rng.random(n)
    return u < fraction, keys
