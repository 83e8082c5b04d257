"""Structured vector and matrix scaling (Berta, Holzmueller, Jordan, Bach, arXiv 2511.03685;
probmetrics >= 1.1 ``SVSCalibrator`` / ``SMSCalibrator``; docs/calibrators.md section 2).

Predict path (both), from logits z (or log(max(p, prob_floor)) for input_kind="probs"):

    ts-mix:  p_mix = (1 - mix_eps) * softmax(mix_beta * z) + mix_eps / K
    features x = log(p_mix)
    svs:     q = softmax(weights * x + bias)          weights = 1 + v            (K,)
    sms:     q = softmax(x @ weights.T + bias)        weights = I + Delta        (K, K)

Fit, on the same calibration split:
1. ``mix_beta`` = the NLL-optimal inverse temperature of z (``fit_inverse_temperature``;
   probmetrics uses 30 bisection steps, we solve to 1e-12 relative), and
   ``mix_eps = 1 / (n + 1)`` (probmetrics ``MixtureCalibrator(output_constant=1)``).
2. Hierarchical ridge, shrinking each group toward the next simpler model:
   ``L = NLL + lambda_b * rho_b * ||b||^2 + lambda_v * rho_v * ||diag Delta||^2
   + lambda_M * rho_M * ||offdiag Delta||^2`` with ``rho_b = rho_v = K^rho / n^tau`` and
   ``rho_M = (K (K - 1))^rho / n^tau``; defaults lambda = rho = tau = 1 (the reference's).
3. Identity start (Delta = 0, b = 0) and the analytic gradient: L-BFGS-B (preconditioned, see
   ``_affine``) for SVS, whose ridge makes it converge in under 10 iterations, and for SMS
   above 500 parameters; Newton for SMS up to K = 21. ``gtol = 1e-5`` on the
   preconditioned gradient (at K = 100 the objective then agrees with gtol = 1e-6 to 1e-10
   and the evaluation NLL to 1e-6, in 19 instead of 24 iterations), capped at ``max_iter``
   (default 1000; ConvergenceWarning when reached).

Deviations from probmetrics: float64 throughout (it casts the features to float32 and
optimises in float32 with torchmin BFGS/L-BFGS), and no clip of the features at
log(float32 tiny), which is inert here because p_mix >= mix_eps / K. Probability inputs
are floored at ``PROB_FLOOR`` (float64 eps) before their log, where probmetrics uses
float32 tiny (see ``_base``).
"""

from __future__ import annotations

import numpy as np

from cord_ops.calibrators._affine import Penalty, affine_logits, fit_affine
from cord_ops.calibrators._base import PROB_FLOOR, Calibrator
from cord_ops.calibrators.temperature import fit_inverse_temperature
from cord_ops.softmax import softmax


def ts_mix(z: np.ndarray, beta: float, eps: float) -> np.ndarray:
    """``(1 - eps) * softmax(beta * z) + eps / K``: temperature scaling mixed with uniform."""
    return (1.0 - eps) * softmax(beta * z) + eps / z.shape[1]


class _StructuredScaling(Calibrator):
    _full = False
    _options = ("reg_lambda_bias", "reg_lambda_diag", "reg_lambda_offdiag", "rho", "tau",
                "max_iter", "gtol", "ftol")
    _option_checks = {
        "reg_lambda_bias": {"allow_zero": True}, "reg_lambda_diag": {"allow_zero": True},
        "reg_lambda_offdiag": {"allow_zero": True}, "rho": {"any_sign": True},
        "tau": {"any_sign": True}, "max_iter": {"integer": True}, "gtol": {},
        "ftol": {"allow_zero": True},
    }

    def __init__(self, input_kind: str = "logits", prob_floor: float = PROB_FLOOR,
                 reg_lambda_bias: float = 1.0, reg_lambda_diag: float = 1.0,
                 reg_lambda_offdiag: float = 1.0, rho: float = 1.0, tau: float = 1.0,
                 max_iter: int = 1000, gtol: float = 1e-5, ftol: float = 1e-12):
        super().__init__(input_kind, prob_floor)
        self.reg_lambda_bias = reg_lambda_bias
        self.reg_lambda_diag = reg_lambda_diag
        self.reg_lambda_offdiag = reg_lambda_offdiag
        self.rho = rho
        self.tau = tau
        self.max_iter = max_iter
        self.gtol = gtol
        self.ftol = ftol

    def penalty(self, n: int, k: int) -> Penalty:
        """The ridge strengths for n calibration rows and K classes (docstring, step 2)."""
        rho_vb = k**self.rho / n**self.tau
        rho_m = (k * (k - 1)) ** self.rho / n**self.tau
        return Penalty(
            diag=self.reg_lambda_diag * rho_vb,
            offdiag=self.reg_lambda_offdiag * rho_m if self._full else 0.0,
            bias=self.reg_lambda_bias * rho_vb,
        )

    def _fit(self, x, y):
        z = self._logits(x)
        n, k = z.shape
        self.mix_beta_ = fit_inverse_temperature(z, y, name=self.name)
        self.mix_eps_ = 1.0 / (n + 1)
        features = np.log(ts_mix(z, self.mix_beta_, self.mix_eps_))
        fit = fit_affine(features, y, full=self._full, penalty=self.penalty(n, k),
                         max_iter=self.max_iter, gtol=self.gtol, ftol=self.ftol,
                         name=self.name, solver="auto" if self._full else "lbfgs")
        self.weights_, self.bias_ = fit.weights, fit.bias

    def _predict(self, x):
        features = np.log(ts_mix(self._logits(x), self.mix_beta_, self.mix_eps_))
        return softmax(affine_logits(features, self.weights_, self.bias_))


class StructuredVectorScaling(_StructuredScaling):
    """``svs``: ts-mix, then q = softmax(weights * log(p_mix) + bias); ``weights`` (K,).

    Fitted state: ``mix_beta``, ``mix_eps`` (floats), ``weights`` (K,), ``bias`` (K,).
    ``reg_lambda_offdiag`` is accepted for symmetry with ``sms`` and unused.
    """

    name = "svs"
    _full = False
    param_shapes = {"mix_beta": (), "mix_eps": (), "weights": ("K",), "bias": ("K",)}


class StructuredMatrixScaling(_StructuredScaling):
    """``sms``: ts-mix, then q = softmax(log(p_mix) @ weights.T + bias); ``weights`` (K, K).

    Fitted state: ``mix_beta``, ``mix_eps`` (floats), ``weights`` (K, K), ``bias`` (K,).
    """

    name = "sms"
    _full = True
    param_shapes = {"mix_beta": (), "mix_eps": (), "weights": ("K", "K"), "bias": ("K",)}
