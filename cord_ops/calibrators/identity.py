"""The identity map (docs/calibrators.md, "identity"): the classifier's own probabilities.

    q = softmax(z)          on logits
    q = p / sum_k p_k       on probabilities (the row renormalised once in float64)

No parameters and nothing to fit: ``fit`` only records K and the classes. It is what
``--calibrator auto`` compares every family against (:mod:`cord_ops.select`), and what is
served when no family improves a model: CORD on (original, identity) keeps every top-1
(the map is monotone in each row), so its eta* is exactly 0 and the repair returns q.
Probabilities are not passed through ``log(max(p, prob_floor))``: an exact zero stays zero,
as in the classifier's output (``prob_floor`` is accepted and stored like every family's).
"""

from __future__ import annotations

import numpy as np

from cord_ops.calibrators._base import PROB_FLOOR, Calibrator
from cord_ops.softmax import softmax


class IdentityCalibrator(Calibrator):
    """``identity``: q = the classifier's probabilities; no fitted parameters."""

    name = "identity"
    param_shapes = {}

    def __init__(self, input_kind: str = "logits", prob_floor: float = PROB_FLOOR):
        super().__init__(input_kind, prob_floor)

    def _fit(self, x: np.ndarray, y: np.ndarray) -> None:
        pass

    def _predict(self, x: np.ndarray) -> np.ndarray:
        if self.input_kind == "probs":
            return x / x.sum(axis=1, keepdims=True)
        return softmax(x)
