"""Matrix scaling (Guo et al. 2017; docs/calibrators.md section 1).

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

from cord_ops.calibrators._affine import UnregularisedAffine
from cord_ops.calibrators._base import PROB_FLOOR


class MatrixScaling(UnregularisedAffine):
    """``ms``: q = softmax(z @ weights.T + bias); fitted ``weights`` (K, K), ``bias`` (K,)."""

    name = "ms"
    full = True
    _param_shapes = {"weights": ("K", "K"), "bias": ("K",)}

    def __init__(self, input_kind: str = "logits", prob_floor: float = PROB_FLOOR,
                 max_iter: int = 300, gtol: float = 1e-6, ftol: float = 1e-12):
        super().__init__(input_kind, prob_floor, max_iter, gtol, ftol)
