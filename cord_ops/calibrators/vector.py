"""Vector scaling (Guo et al. 2017; docs/calibrators.md section 1).

    q = softmax(w * z + b),  w, b in R^K  (a diagonal weight matrix)

Fit: unregularised mean NLL from the identity (w = 1, b = 0) with the analytic gradient
``dL/dw_k = sum_i D_ik z_ik``, ``dL/db_k = sum_i D_ik``, D = (q - onehot) / n, and Hessian:
Newton up to K = 250 (5 iterations on CIFAR-100), Newton with conjugate-gradient steps
above (``_affine``; 11 iterations at K = 1,000). The references use BFGS
(probmetrics/torchmin, Kull's scipy port); the objective is convex in (w, b), so the
optimum is the same. Stops at a gradient max-abs <= ``gtol``; ``max_iter`` (default 1000)
caps it with a ConvergenceWarning. probmetrics writes ``z / t + b``; ``w = 1 / t`` is the
same map.
"""

from __future__ import annotations

from cord_ops.calibrators._affine import UnregularisedAffine
from cord_ops.calibrators._base import PROB_FLOOR


class VectorScaling(UnregularisedAffine):
    """``vs``: q = softmax(weights * z + bias); fitted ``weights`` (K,), ``bias`` (K,)."""

    name = "vs"
    full = False
    param_shapes = {"weights": ("K",), "bias": ("K",)}

    def __init__(self, input_kind: str = "logits", prob_floor: float = PROB_FLOOR,
                 max_iter: int = 1000, gtol: float = 1e-6, ftol: float = 1e-12):
        super().__init__(input_kind, prob_floor, max_iter, gtol, ftol)
