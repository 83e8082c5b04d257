"""Temperature scaling (Guo et al. 2017; docs/calibrators.md section 1).

    q = softmax(beta * z),  beta = 1 / T > 0

Fit: the mean NLL is convex in beta and its derivative
``g(beta) = mean_i [sum_k q_ik z_ik - z_{i,y_i}]`` is increasing, with
``g'(beta) = mean_i Var_{q_i}(z_i) >= 0``. We solve g(beta) = 0 by Newton steps in beta
from the lower end of a sign bracket found by factors of 4 from beta = 1 within
[e^-16, e^16] (probmetrics' bisection range); a step that leaves the bracket is replaced by
its midpoint. This is the bounded 1-D search docs/calibrators.md describes, with Newton instead
of Brent/bisection because it needs a third of the softmax passes: a deviation from
the references' optimiser, not from their optimum (it stops when a step changes beta by
<= 1e-12 relative). When the bracket search runs into a bound (a calibration set the logits
separate, or labels unrelated to them) that bound is returned with a ConvergenceWarning.
Cap: ``max_iter=100`` Newton iterations (ConvergenceWarning when exhausted).

Bounded refit (deviation from the references): the reported NLL
(:func:`cord_ops.metrics.nll`) floors a true-class probability at ``PROB_FLOOR`` = 2.2e-16,
so a row the calibrated map gives less than that costs it 36.04 nats however small, while
the smooth objective above keeps charging it. When some row's label is at or below the
floor at the identity map (beta = 1: a zero on the label, or a logit gap beyond 36), the
Newton optimum is compared with the minimum of the reported NLL itself over beta (a grid
of log beta in [-16, 16] by 0.25, then a bounded 1-D search around the best point), and
the latter is kept only when it is lower by more than 1e-9 relative. On logits whose
calibrated true-class probabilities stay above 2.2e-16 (the CIFAR sets) nothing changes;
on probability files with exact zeros on the label (an out-of-fold text classifier's) the
fit then optimises what is reported.

Top-1 is preserved: beta > 0 scales every logit of a row by the same factor.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
from scipy.optimize import minimize_scalar

from cord_ops.calibrators._base import PROB_FLOOR, Calibrator, ConvergenceWarning
from cord_ops.calibrators.solvers import warn_not_converged
from cord_ops.softmax import softmax

#: Bracket of the inverse temperature, as in probmetrics' bisection (log beta in [-16, 16]).
BETA_BOUNDS = (math.exp(-16.0), math.exp(16.0))
#: Relative step size at which the Newton iteration has converged.
BETA_RTOL = 1e-12


def fit_inverse_temperature(
    z: np.ndarray, y: np.ndarray, *, max_iter: int = 100, name: str = "ts"
) -> float:
    """The beta minimising mean NLL of softmax(beta * z) on labels y (see module docstring)."""
    return solve_inverse_temperature(slope_kernel(z, y), max_iter=max_iter, name=name)


def slope_kernel(z: np.ndarray, y: np.ndarray):
    """``slope_and_curvature(beta)`` = (g(beta), g'(beta)) of the module docstring on
    logits z and labels y: one softmax pass per call."""
    # Shifting each row by its max changes no softmax and keeps exp(beta * z) in (0, 1].
    z = z - z.max(axis=1, keepdims=True)
    z2 = z * z
    mean_zy = float(np.mean(z[np.arange(z.shape[0]), y]))
    def slope_and_curvature(beta):
        e = np.exp(beta * z)
        total = e.sum(axis=1)
        mean_z = np.einsum("ik,ik->i", e, z) / total
        mean_z2 = np.einsum("ik,ik->i", e, z2) / total
        return float(np.mean(mean_z)) - mean_zy, float(np.mean(mean_z2 - mean_z * mean_z))

    return slope_and_curvature


def solve_inverse_temperature(slope_and_curvature, *, max_iter: int = 100,
                              name: str = "ts") -> float:
    """The root of the mean-NLL slope g(beta), given ``slope_and_curvature(beta)`` =
    (g(beta), g'(beta)): the bracket search and safeguarded Newton of the module docstring.
    The one source of the iteration for the in-memory fit and for fits reduced over
    partitions without a warm start (``cord_ops.reduce.fit_temperature``)."""
    # Bracket the root by factors of 4 from beta = 1 (a typical optimum is 0.3-3, so this
    # takes one or two evaluations); running into a bound means the optimum lies beyond it.
    factor = 4.0
    lo = hi = start = 1.0
    g_lo, h_lo = slope_and_curvature(start)
    g_hi, h_hi = g_lo, h_lo
    while g_lo > 0.0 and lo > BETA_BOUNDS[0]:
        hi, g_hi, h_hi = lo, g_lo, h_lo
        lo = max(lo / factor, BETA_BOUNDS[0])
        g_lo, h_lo = slope_and_curvature(lo)
    while g_hi < 0.0 and hi < BETA_BOUNDS[1]:
        lo, g_lo, h_lo = hi, g_hi, h_hi
        hi = min(hi * factor, BETA_BOUNDS[1])
        g_hi, h_hi = slope_and_curvature(hi)
    at_lower = lo == BETA_BOUNDS[0] and g_lo >= 0.0
    # A slope of exactly 0 with zero curvature means every softmax is one-hot on its label:
    # the NLL is 0 to float64 resolution and keeps falling toward beta = infinity.
    flat_top = g_hi == 0.0 and h_hi == 0.0 and hi > 1.0
    if at_lower or flat_top or (hi == BETA_BOUNDS[1] and g_hi <= 0.0):
        bound = lo if at_lower else hi
        warnings.warn(
            f"{name}: the NLL-optimal inverse temperature lies at or beyond "
            f"{bound:.6g}, which is returned (labels separable by the logits, or "
            "unrelated to them)",
            ConvergenceWarning,
            stacklevel=5,
        )
        return bound
    if g_lo == 0.0 or g_hi == 0.0:
        return lo if g_lo == 0.0 else hi
    # Newton from the left end: g is increasing and, as the softmax sharpens, its slope
    # falls, so steps from below approach the root without overshooting; any step that
    # still leaves the bracket is replaced by the bracket's midpoint.
    return bracketed_iteration(
        slope_and_curvature, lo, (g_lo, h_lo), lo, hi,
        lambda beta, d: beta - d[0] / d[1] if d[1] > 0.0 else math.nan,
        tolerance=BETA_RTOL, max_iter=max_iter, name=name, what="Newton/bisection")


def bracketed_iteration(derivatives, beta: float, found: tuple, lo: float, hi: float, step,
                        *, tolerance: float, max_iter: int, name: str, what: str) -> float:
    """Safeguarded root iteration on the increasing slope g: ``found`` =
    ``derivatives(beta)`` (g first); each round narrows the sign bracket (lo, hi) at beta,
    takes ``step(beta, found)``, replaces a step that leaves the bracket by its midpoint
    (geometric when the ends are more than a factor 4 apart), and returns the new beta once
    a step changes it by <= ``tolerance`` relative (or beta where g is exactly 0). Shared
    by the in-memory Newton fit and the reduced fit's Halley steps (``cord_ops.reduce``)."""
    for _ in range(max_iter):
        g = found[0]
        if g == 0.0:
            return beta
        if g > 0.0:
            hi = beta
        else:
            lo = beta
        new = step(beta, found)
        # A step within the tolerance has converged, also one that rounds onto beta itself
        # (|g| / g' below half an ulp of beta), which the bracket test would take for a step
        # out of the bracket and replace by a midpoint: ~40 more evaluations to get back.
        if not lo < new < hi and not abs(new - beta) <= tolerance * beta:
            new = math.sqrt(lo * hi) if hi / lo > 4.0 else 0.5 * (lo + hi)
        if abs(new - beta) <= tolerance * beta:
            return new
        beta = new
        found = derivatives(beta)
    warn_not_converged(name, f"{max_iter} {what} steps, max_iter={max_iter}")
    return beta


#: Below this relative gain the Newton optimum is kept (the bounded refit is for rows the
#: floor caps, not for rounding).
BOUNDED_GAIN = 1e-9


#: Temperature range of Mix-n-Match's ``temperature_scaling`` (T, not beta), used by IROvA-TS.
MSE_TEMPERATURE_BOUNDS = (0.05, 5.0)


def fit_inverse_temperature_mse(z: np.ndarray, y: np.ndarray) -> float:
    """The beta = 1/T minimising the mean squared error of softmax(z / T) against the
    one-hot labels, T in ``MSE_TEMPERATURE_BOUNDS``: the first layer of Mix-n-Match's
    IROvA-TS (its demo's "Method 6" fits TS with ``loss='mse'``, T in [0.05, 5] from T = 1;
    docs/calibrators.md section 4).

    The squared error (the multiclass Brier score over K) is smooth in T and unimodal on
    the CIFAR fits we checked; bounded Brent on T finds the minimiser the reference's
    L-BFGS-B reaches, to ``xatol`` 1e-10 in T. A minimiser at a bound is returned as is,
    as the reference does."""
    rows = np.arange(z.shape[0])

    def mse(t: float) -> float:
        q = softmax(z / t)
        q[rows, y] -= 1.0
        return float(np.einsum("ij,ij->", q, q)) / q.size

    lo, hi = MSE_TEMPERATURE_BOUNDS
    t = minimize_scalar(mse, bounds=(lo, hi), method="bounded",
                        options={"xatol": 1e-10, "maxiter": 500}).x
    return 1.0 / float(t)


def reported_nll(z: np.ndarray, y: np.ndarray, beta: float) -> float:
    """The reported NLL (true-class probability clipped to [PROB_FLOOR, 1 - PROB_FLOOR])
    of softmax(beta * z), from the log-sum-exp form."""
    s = beta * z
    m = s.max(axis=1)
    log_q = s[np.arange(z.shape[0]), y] - m - np.log(np.exp(s - m[:, None]).sum(axis=1))
    return float(np.mean(np.clip(-log_q, -math.log1p(-PROB_FLOOR), -math.log(PROB_FLOOR))))


def bounded_refit(z: np.ndarray, y: np.ndarray, beta: float) -> float:
    """``beta``, or the minimiser of :func:`reported_nll` when some row of ``z`` (shifted
    so each row's maximum is 0) puts its label at or below log(PROB_FLOOR) and that
    minimiser is better by more than :data:`BOUNDED_GAIN` relative (module docstring)."""
    from scipy.optimize import minimize_scalar

    # Only rows whose label is at or below the floor already at the identity map (a zero
    # on the label, a logit gap beyond 36) make the two objectives disagree at every beta.
    log_q = z[np.arange(z.shape[0]), y] - np.log(np.exp(z).sum(axis=1))
    if not np.any(log_q <= math.log(PROB_FLOOR) + 1e-12):
        return beta
    grid = np.arange(-16.0, 16.0 + 1e-9, 0.25)
    values = [reported_nll(z, y, math.exp(t)) for t in grid]
    best = float(grid[int(np.argmin(values))])
    found = minimize_scalar(lambda t: reported_nll(z, y, math.exp(t)), method="bounded",
                            bounds=(max(best - 0.25, -16.0), min(best + 0.25, 16.0)),
                            options={"xatol": 1e-10})
    candidate = math.exp(float(found.x))
    kept = reported_nll(z, y, beta)
    if reported_nll(z, y, candidate) < kept - BOUNDED_GAIN * abs(kept):
        return candidate
    return beta


class TemperatureScaling(Calibrator):
    """``ts``: q = softmax(beta * z) with z the logits (or log(max(p, prob_floor))).

    Fitted state: ``beta`` (float). Options: ``max_iter`` (default 100).
    """

    name = "ts"
    _options = ("max_iter",)
    _option_checks = {"max_iter": {"integer": True}}
    param_shapes = {"beta": ()}

    def __init__(self, input_kind: str = "logits", prob_floor: float = PROB_FLOOR,
                 max_iter: int = 100):
        super().__init__(input_kind, prob_floor)
        self.max_iter = max_iter

    def _fit(self, x, y):
        z = self._logits(x)
        z = z - z.max(axis=1, keepdims=True)
        self.beta_ = bounded_refit(z, y, fit_inverse_temperature(z, y, max_iter=self.max_iter,
                                                                 name=self.name))

    def _predict(self, x):
        return softmax(self.beta_ * self._logits(x), overwrite=True)
