"""How far an exported graph may be from cord_ops and still count as the same model.

The ONNX graph computes in float32 or float64 what cord_ops computes in float64; the
tolerance of that comparison follows the fitted pipeline's own rounding sensitivity
(:func:`parity_tolerance`). The recalibration checks its graph against it before
registering, serving checks a loaded version against it before it serves.
"""

from __future__ import annotations

import numpy as np

from cord_ops.softmax import softmax

#: The least max-abs parity tolerance per float type, and the whole of it for runs
#: logged before the derived one (:func:`parity_tolerance`) was logged as
#: ``onnx.tolerance`` and for a served graph without its logged state.
FIXED_PARITY_TOLERANCE = {"float32": 1e-5, "float64": 1e-12}
#: Safety factor of :func:`parity_tolerance` over the measured rounding sensitivity.
PARITY_FACTOR = 8.0


def parity_tolerance(calibrator, repair, scores: np.ndarray, dtype: str,
                     seed: int = 0) -> float:
    """The max-abs tolerance of a ``dtype`` graph of (``calibrator``, ``repair``) against
    cord_ops in float64 on ``scores``: ``PARITY_FACTOR * (s_store + s_input + K * eps)``,
    and at least :data:`FIXED_PARITY_TOLERANCE` (below it, a few float32 cases the terms
    do not see: docs/promotion.md "Parity").

    Measured with cord_ops in float64 on these rows, so the bound follows each family and
    each fit (large logits, steep isotonic knots raise it; tidy probabilities keep it
    small):

    - ``s_store``: the largest change of a repaired probability when the input and every
      fitted parameter (weights, knots, eta*) are rounded to ``dtype``, as the graph
      stores and reads them (0 for float64);
    - ``s_input``: the largest change when every input entry moves by one relative
      ``eps`` of ``dtype`` (random signs): the map's conditioning, which scales the
      rounding of each stage of the graph;
    - ``K * eps``: the rounding of the softmax sums and normalisations.

    The factor covers the handful of roundings each stage adds. Measured ratios of graph
    error to this bound are in docs/promotion.md ("Parity").
    """
    import copy

    eps = float(np.finfo(dtype).eps)
    x = np.asarray(scores, dtype=np.float64)
    kind = calibrator.input_kind

    def pipeline(cal, rep, rows):
        if kind == "probs":
            rows = np.clip(rows, 0.0, 1.0)
            rows = rows / rows.sum(axis=1, keepdims=True)
        uncal = rows if kind == "probs" else softmax(rows)
        return rep.transform(uncal, cal.predict_proba(rows))

    exact = pipeline(calibrator, repair, x)
    stored_cal, stored_rep = calibrator, repair
    if dtype != "float64":
        stored_cal = copy.deepcopy(calibrator)
        for key, shape in calibrator.param_shapes.items():
            value = getattr(calibrator, key + "_")
            if shape == "knots":  # knots may round onto each other, as in the graph
                value = [(_rounded(kx, dtype), _rounded(ky, dtype)) for kx, ky in value]
            else:
                value = _rounded(value, dtype)
            setattr(stored_cal, key + "_", value)
        stored_rep = copy.copy(repair)
        stored_rep.eta_ = float(np.asarray(repair.eta_, dtype=dtype))
    stored = pipeline(stored_cal, stored_rep, x.astype(dtype).astype(np.float64))
    signs = np.random.default_rng(seed).choice([-1.0, 1.0], size=x.shape)
    moved = pipeline(calibrator, repair, x * (1.0 + eps * signs))
    s_store = float(np.max(np.abs(stored - exact)))
    s_input = float(np.max(np.abs(moved - exact)))
    return max(FIXED_PARITY_TOLERANCE[dtype],
               PARITY_FACTOR * (s_store + s_input + x.shape[1] * eps))


def _rounded(value, dtype: str):
    """``value`` (a float or an array) rounded to ``dtype`` and back to float64."""
    rounded = np.asarray(value, dtype=dtype).astype(np.float64)
    return float(rounded) if rounded.ndim == 0 else rounded
