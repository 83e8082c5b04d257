"""Temperature scaling fitted Top-versus-All (TS-TvA; Le Coz, Herbin & Adjed, "Confidence
calibration of classifiers with many classes", NeurIPS 2024).

TvA turns multiclass calibration into one binary problem: does the top-1 prediction match
the label? For temperature scaling the map is unchanged,

    q = softmax(beta * z),  beta = 1 / T > 0,

but beta minimises the binary cross-entropy of the top-1 confidence against top-1
correctness instead of the multiclass NLL:

    c_i(beta) = max_k softmax(beta z_i)_k,   y_i = 1[argmax z_i == label_i]
    L(beta)   = -mean_i [ y_i log c_i + (1 - y_i) log(1 - c_i) ].

With d_ik = z_ik - max_k z_ik and R_i = logsumexp_{k != a_i} beta d_ik (a_i the top-1,
smallest index on ties), log c_i = -softplus(R_i) and log(1 - c_i) = R_i - softplus(R_i),
so L = mean_i [softplus(R_i) - (1 - y_i) R_i] stays finite however confident a row is.
Top-1 is kept exactly as by TS: beta > 0 scales a row's logits by one factor.

Fit: L is one-dimensional but not convex in beta, so log beta is scanned on
``GRID_POINTS`` points of [-16, 16] (probmetrics' temperature range) and the best point
refined by bounded Brent search on its two neighbouring grid intervals (to 1e-10 in log
beta). Deviations from the reference code (``calibrators.py``: T initialised at 1.5, Adam
with lr 1e-3 for 200 epochs over mini-batches): we return the minimiser of the same loss
rather than an Adam iterate; a minimiser at the end of the range is returned with a
ConvergenceWarning (recorded in ``warnings_``).
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import minimize_scalar

from cord_ops.calibrators._base import PROB_FLOOR, Calibrator
from cord_ops.softmax import softmax

#: log(beta) range scanned, as TS's bracket.
LOG_BETA_RANGE = (-16.0, 16.0)
#: Points of the initial scan (spacing 0.25 in log beta).
GRID_POINTS = 129


def tva_loss(log_beta: float, d: np.ndarray, top: np.ndarray, correct: np.ndarray) -> float:
    """The TvA binary cross-entropy at beta = exp(log_beta) (module docstring); ``d`` are
    the logits minus their row maximum, ``top`` the top-1 column, ``correct`` 0/1."""
    s = np.exp(log_beta) * d
    s[np.arange(d.shape[0]), top] = -np.inf  # R_i sums over the other classes only
    m = s.max(axis=1)
    rest = m + np.log(np.exp(s - m[:, None]).sum(axis=1))
    return float(np.mean(np.logaddexp(0.0, rest) - (1.0 - correct) * rest))


def fit_tva_inverse_temperature(z: np.ndarray, y: np.ndarray) -> tuple[float, bool]:
    """(beta, at_bound) minimising the TvA loss of softmax(beta z) on labels y."""
    d = z - z.max(axis=1, keepdims=True)
    top = np.argmax(z, axis=1)
    correct = (top == y).astype(np.float64)
    grid = np.linspace(*LOG_BETA_RANGE, GRID_POINTS)
    values = [tva_loss(u, d, top, correct) for u in grid]
    best = int(np.nanargmin(values))
    lo, hi = grid[max(best - 1, 0)], grid[min(best + 1, GRID_POINTS - 1)]
    res = minimize_scalar(tva_loss, bounds=(lo, hi), args=(d, top, correct),
                          method="bounded", options={"xatol": 1e-10})
    u = float(res.x) if res.fun <= values[best] else float(grid[best])
    at_bound = min(u - LOG_BETA_RANGE[0], LOG_BETA_RANGE[1] - u) < 1e-6
    return float(np.exp(u)), at_bound


class TemperatureScalingTvA(Calibrator):
    """``ts-tva``: q = softmax(beta * z), beta fitted on the Top-versus-All binary loss.

    Fitted state: ``beta`` (float). No options besides ``input_kind`` and ``prob_floor``.
    """

    name = "ts-tva"
    _options = ()
    param_shapes = {"beta": ()}

    def __init__(self, input_kind: str = "logits", prob_floor: float = PROB_FLOOR):
        super().__init__(input_kind, prob_floor)

    def _fit(self, x, y):
        self.beta_, at_bound = fit_tva_inverse_temperature(self._logits(x), y)
        if at_bound:
            self._warn(f"the TvA-optimal inverse temperature lies at or beyond {self.beta_:.6g}, "
                       "which is returned (top-1 correctness separable by the confidence, or "
                       "unrelated to it)")

    def _predict(self, x):
        return softmax(self.beta_ * self._logits(x))
