"""Matrix scaling (Guo et al. 2017; CALIBRATORS.md section 1).

    q = softmax(z @ W.T + b),  W in R^{K x K} (rows = output classes), b in R^K

Fit: unregularised mean NLL from the identity (W = I, b = 0) with the analytic gradient
``dL/dW = D.T @ z`` and ``dL/db = sum_i D_i``, D = (q - onehot) / n (two BLAS matrix
products per evaluation): Newton up to K = 21, preconditioned L-BFGS-B above (``_affine``).
Unregularised MS with K^2 + K parameters has no finite optimum when the calibration set is
(nearly) separable, the usual case at K = 100 and n = 5,000: probmetrics' L-BFGS (cap
200 x #params iterations) then runs for minutes and ends with probabilities of exactly 0 on
the true class. Here ``max_iter`` (default 300 iterations, a few seconds at K = 100,
n = 5,000) caps the fit; hitting the cap raises a ConvergenceWarning and returns the last
iterate. Stops earlier at a scaled-gradient max-abs <= ``gtol`` or a relative decrease
<= ``ftol``.
"""

from __future__ import annotations

from cord_ops.calibrators._affine import affine_logits, fit_affine
from cord_ops.calibrators._base import PROB_FLOOR, Calibrator, check_option, softmax


class MatrixScaling(Calibrator):
    """``ms``: q = softmax(z @ weights.T + bias); fitted ``weights`` (K, K), ``bias`` (K,)."""

    name = "ms"
    _options = ("max_iter", "gtol", "ftol")
    _param_shapes = {"weights": ("K", "K"), "bias": ("K",)}

    def __init__(self, input_kind: str = "logits", prob_floor: float = PROB_FLOOR,
                 max_iter: int = 300, gtol: float = 1e-6, ftol: float = 1e-12):
        super().__init__(input_kind, prob_floor)
        self.max_iter = check_option("max_iter", max_iter, integer=True)
        self.gtol = check_option("gtol", gtol)
        self.ftol = check_option("ftol", ftol, allow_zero=True)

    def _fit(self, x, y):
        fit = fit_affine(self._logits(x), y, full=True, max_iter=self.max_iter,
                         gtol=self.gtol, ftol=self.ftol, name=self.name)
        self.weights_, self.bias_ = fit.weights, fit.bias

    def _predict(self, x):
        return softmax(affine_logits(self._logits(x), self.weights_, self.bias_))
