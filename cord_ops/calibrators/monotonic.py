"""MCCT-I: instance-wise monotonic calibration by constrained transformation, with inverse
temperatures (Zhang, Batista & Kanhere 2025, arXiv 2507.06516; reference code
``Mono_cali.py``, class ``MCCT_I``).

Each row's logits are ranked, and rank r (0 = the largest) gets its own inverse scale and
bias, constrained so that a higher rank never gets a smaller one:

    order_i = the classes of row i by decreasing score (ties: smaller index first)
    x_ir    = z_{i, order_ir} - min_k z_ik                      (>= 0)
    s_{i, order_ir} = a_r * x_ir + b_r,                          q_i = softmax(s_i)
    a_0 >= a_1 >= ... >= a_{K-1} >= 1e-3,   b_0 >= b_1 >= ... >= b_{K-1} = 0.

Because x_i0 >= x_ir >= 0, a_0 >= a_r >= 1e-3 and b_0 >= b_r,
s_{i, top} - s_{i, j} >= 1e-3 (x_i0 - x_ij) > 0 wherever z_{i, top} > z_ij: the ranking,
hence the top-1, is kept (rounding is monotone, so it never reverses two entries; it can
only tie entries whose exact values differ by less than about one ulp of s, and exact ties
in z keep the smaller index on top, as argmax does). The rank is taken on the scores as
given: from probabilities, z = log(max(p, floor)) can round two probabilities one ulp apart
to one value, and ranking that tie by index could lift a class above the input's top-1
(near-uniform rows do). The reference writes z / T_r + b_r
with T descending along the ascending ranks; a_r = 1 / T_r is the same constraint.

Fit: mean NLL, which is convex in (a, b); we optimise it exactly with L-BFGS-B over the
non-negative increments u_r = a_r - a_{r+1}, v_r = b_r - b_{r+1} (so the constraints are
bounds), with the analytic gradient, from T = 1, b = 0 as the reference. Stops at a
gradient max-abs <= ``gtol`` or a relative decrease <= ``ftol``; ``max_iter`` (default 1000)
caps it, recorded in ``warnings_`` with a ConvergenceWarning.

Deviations from the reference: (1) it applies the map to the raw logits, which keeps the
order only when they are non-negative (a larger inverse scale makes a negative logit
smaller); we subtract each row's minimum logit first, which leaves the input probabilities
unchanged and makes the order guarantee hold for every row; (2) b_{K-1} = 0 removes the
softmax's shift invariance (the reference leaves it free; the maps are the same);
(3) the reference bounds T_r to [0, inf), i.e. a_r > 0; we bound a_r >= 1e-3 (T_r <= 1000,
far beyond any fitted temperature) so that a fit on uninformative labels (a -> 0) cannot
tie the top with a smaller-index class; (4) SLSQP with maxiter 100 and inequality
constraints is replaced by L-BFGS-B on the increments (same optimum, converged); (5) all
K ranks are calibrated (the README's ``topk=num_classes``); ``bounds`` and ``filter`` are
the reference's defaults (off).
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import minimize

from cord_ops.calibrators._base import PROB_FLOOR, Calibrator
from cord_ops.softmax import softmax

#: Smallest inverse scale (largest temperature, 1e3): keeps the top rank strictly above
#: every rank whose logit is smaller (module docstring).
INV_SCALE_FLOOR = 1e-3


def rank_order(z: np.ndarray) -> np.ndarray:
    """Per row, the class indices by decreasing value, smaller index first among ties (the
    order of ONNX TopK)."""
    return np.argsort(-z, axis=1, kind="stable")


def ranked_features(z: np.ndarray, scores: np.ndarray | None = None
                    ) -> tuple[np.ndarray, np.ndarray]:
    """(order, x): the rank order and the ranked logits minus the row minimum.

    The order is that of ``scores``, the input as given (default: ``z``). For
    probabilities it must be: log can round two probabilities one ulp apart to one value,
    and ranking the tie by index could put a class above the one that is the input's
    top-1. A log is monotone, so the ranked logits are non-increasing either way."""
    order = rank_order(z if scores is None else scores)
    ranked = np.take_along_axis(z, order, axis=1)
    return order, ranked - ranked[:, -1:]


def monotone_scores(z: np.ndarray, inv_scales: np.ndarray, biases: np.ndarray,
                    scores: np.ndarray | None = None) -> np.ndarray:
    """The transformed logits s in the original class order, ranked by ``scores``
    (default ``z``; :func:`ranked_features`)."""
    order, x = ranked_features(z, scores)
    s = np.empty_like(x)
    np.put_along_axis(s, order, x * inv_scales + biases, axis=1)
    return s


def _from_increments(theta: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    u, v = theta[:k], theta[k:]
    a = np.cumsum(u[::-1])[::-1]
    b = np.zeros(k)
    b[:-1] = np.cumsum(v[::-1])[::-1]
    return a, b


def fit_monotone(z: np.ndarray, y: np.ndarray, *, max_iter: int, gtol: float,
                 ftol: float, scores: np.ndarray | None = None
                 ) -> tuple[np.ndarray, np.ndarray, bool, str]:
    """(inverse scales, biases, converged, message) minimising the mean NLL; rows ranked
    by ``scores`` (default ``z``)."""
    n, k = z.shape
    order, x = ranked_features(z, scores)
    label_rank = np.argmax(order == y[:, None], axis=1)
    rows = np.arange(n)

    def value_grad(theta):
        a, b = _from_increments(theta, k)
        s = x * a + b
        m = s.max(axis=1, keepdims=True)
        e = np.exp(s - m)
        total = e.sum(axis=1)
        loss = float(np.mean(np.log(total) + m[:, 0] - s[rows, label_rank]))
        d = e / total[:, None]
        d[rows, label_rank] -= 1.0
        d /= n
        grad_a = np.einsum("ir,ir->r", d, x)
        grad_b = d.sum(axis=0)
        # d a_r / d u_t = 1 for t >= r, so dL/du_t = sum_{r <= t} dL/da_r (same for v).
        return loss, np.concatenate([np.cumsum(grad_a), np.cumsum(grad_b)[:-1]])

    theta0 = np.zeros(2 * k - 1)
    theta0[k - 1] = 1.0  # a = 1 (T = 1), b = 0
    bounds = [(0.0, None)] * (2 * k - 1)
    bounds[k - 1] = (INV_SCALE_FLOOR, None)  # a_{K-1} = u_{K-1} >= floor, so every a_r is
    res = minimize(value_grad, theta0, jac=True, method="L-BFGS-B", bounds=bounds,
                   options={"maxiter": max_iter, "maxfun": 2 * max_iter + 20,
                            "gtol": gtol, "ftol": ftol})
    a, b = _from_increments(res.x, k)
    return a, b, res.status == 0, str(res.message)


class MonotoneCalibrationMCCTI(Calibrator):
    """``mcct-i``: rank-wise inverse scales and biases on the row-min-shifted ranked
    logits (module docstring).

    Fitted state: ``inv_scales`` (K,) and ``biases`` (K,), by rank (0 = the top-1).
    """

    name = "mcct-i"
    _options = ("max_iter", "gtol", "ftol")
    param_shapes = {"inv_scales": ("K",), "biases": ("K",)}

    _option_checks = {"max_iter": {"integer": True}, "gtol": {}, "ftol": {"allow_zero": True}}

    def __init__(self, input_kind: str = "logits", prob_floor: float = PROB_FLOOR,
                 max_iter: int = 1000, gtol: float = 1e-7, ftol: float = 1e-12):
        super().__init__(input_kind, prob_floor)
        self.max_iter = max_iter
        self.gtol = gtol
        self.ftol = ftol

    @classmethod
    def from_dict(cls, d: dict) -> MonotoneCalibrationMCCTI:
        """As ``Calibrator.from_dict``, and rejects a state that breaks the order
        constraints (the top-1 guarantee rests on them)."""
        obj = super().from_dict(d)
        a, b = obj.inv_scales_, obj.biases_
        if np.any(a < 0) or np.any(np.diff(a) > 0) or np.any(np.diff(b) > 0):
            raise ValueError("calibrator state: mcct-i inv_scales must be non-negative and "
                             "non-increasing and biases non-increasing along the ranks")
        return obj

    def _fit(self, x, y):
        a, b, converged, message = fit_monotone(self._logits(x), y, max_iter=self.max_iter,
                                                gtol=self.gtol, ftol=self.ftol, scores=x)
        self.inv_scales_, self.biases_ = a, b
        if not converged:
            self._warn(f"optimiser stopped before convergence ({message}; max_iter="
                       f"{self.max_iter}); the returned map is the last iterate")

    def _predict(self, x):
        return softmax(monotone_scores(self._logits(x), self.inv_scales_, self.biases_,
                                       scores=x))
