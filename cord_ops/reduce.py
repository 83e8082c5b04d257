"""Fits and metrics whose data is split into partitions: the drivers that combine the
results of per-partition reducers (``cord_ops.partition_sums``, pure numpy, run where a
partition lives), and the seeded split of a shard's rows (``split_rows``).

A driver never sees rows. It is given ``reduce(fn, *args)``, which applies
``fn(partition, *args)`` (a reducer of ``cord_ops.partition_sums``) to every partition
and returns the list of results in partition order; ``local_reduce`` does that for arrays
in this process, ``flows.shards.session`` for partitions held by Dask workers. A partition
is a dict of arrays: ``scores`` (n x K, float32 or float64), ``labels`` (n,) and, once
computed, ``b``, ``lower``, ``g`` (CORD's per-row scalars, ``cord_kernels.row_scalars``).

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
from cord_ops.cord_kernels import EPS_NUM
from cord_ops.cord_solve import bisect_multiplier, screen_margin
from cord_ops.names import REDUCIBLE
from cord_ops.partition_sums import (
    cord_multiplier_range,
    cord_response_estimate,
    cord_response_sum,
    cord_row_scalars,
    cord_sums,
    exact_mean,
    ts_moment_sums,
    vs_newton_sums,
    vs_value_grad_sums,
)


def local_reduce(partitions):
    """``reduce`` over partitions held in this process (a list of dicts)."""
    return lambda fn, *args: [fn(part, *args) for part in partitions]


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
    full-data steps by the whole sample's at the refined theta, which saves full passes
    against using the first-start Hessian for both (docs/scale.md, "What the workers
    do")."""
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


def fit_calibrator_from_sums(name: str, reduce, n: int, k: int, *, input_kind="logits", sample=None,
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
    estimate``: the sqrt form of R and plain pairwise sums, far cheaper than an exact sum)
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



def fit_cord_from_sums(reduce, n: int, k: int, cord: CORD | None = None, *,
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
