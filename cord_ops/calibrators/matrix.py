"""Matrix scaling (Guo et al. 2017; docs/calibrators.md section 1).

    q = softmax(z @ W.T + b),  W in R^{K x K} (rows = output classes), b in R^K

Fit: unregularised mean NLL from the identity (W = I, b = 0) with the analytic gradient
``dL/dW = D.T @ z`` and ``dL/db = sum_i D_i``, D = (q - onehot) / n (two BLAS matrix
products per evaluation), by damped Newton (``_affine``): dense steps up to K = 21,
Newton-CG steps with Hessian-vector products up to K = ``NEWTON_CG_MAX_CLASSES`` (50, the
range of tabular classifiers, where L-BFGS-B stalls far from the optimum after thousands
of iterations and Newton-CG converges in a few hundred steps), preconditioned L-BFGS-B
above.
Unregularised MS with K^2 + K parameters has no finite optimum when the calibration set is
(nearly) separable, the usual case at K = 100 and n = 5,000: probmetrics' L-BFGS (cap
200 x #params iterations) then runs for minutes and ends with probabilities of exactly 0 on
the true class. Here ``max_iter`` (default 300 iterations, a few seconds at K = 100,
n = 5,000) caps the fit; hitting the cap is recorded in ``warnings_`` (``converged_`` is
then False, which flows report) with a ConvergenceWarning, and the last iterate is
returned. Stops earlier at a gradient max-abs <= ``gtol`` (scaled for L-BFGS-B) or a
relative decrease <= ``ftol``. A converged MS is the faithful method, and it can overfit:
on confident tabular classifiers its evaluation NLL can be far above the uncalibrated one
(docs/reproduction.md); Dir-ODIR is its regularised form.
"""

from __future__ import annotations

from cord_ops.calibrators._affine import NEWTON_MAX_PARAMS, UnregularisedAffine
from cord_ops.calibrators._base import PROB_FLOOR

#: Largest K fitted by Newton-CG (``_solver``); L-BFGS-B above.
NEWTON_CG_MAX_CLASSES = 50


class MatrixScaling(UnregularisedAffine):
    """``ms``: q = softmax(z @ weights.T + bias); fitted ``weights`` (K, K), ``bias`` (K,)."""

    name = "ms"
    full = True
    param_shapes = {"weights": ("K", "K"), "bias": ("K",)}

    def __init__(self, input_kind: str = "logits", prob_floor: float = PROB_FLOOR,
                 max_iter: int = 300, gtol: float = 1e-6, ftol: float = 1e-12):
        super().__init__(input_kind, prob_floor, max_iter, gtol, ftol)

    def _solver(self, k: int) -> str:
        if k * (k + 1) <= NEWTON_MAX_PARAMS or k > NEWTON_CG_MAX_CLASSES:
            return "auto"
        return "newton-cg"
