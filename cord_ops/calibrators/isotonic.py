"""Isotonic maps (Zhang, Kailkhura, Han, Mix-n-Match, ICML 2020; docs/calibrators.md section 4).

Each map g is scikit-learn's ``IsotonicRegression(out_of_bounds="clip")`` fit: tied inputs
merged to their mean target, PAV, and only the block endpoints kept as knots (x, y), x
strictly increasing. Predict path, from probabilities p (``saturation_softmax`` of the
logits, or the probability rows themselves for input_kind="probs"; no logarithm is taken):

    g(t)   = np.interp(t, x, y)      linear between knots, constant outside [x_0, x_last]
    r_ik   = g_k(p_ik) + tie_eps * p_ik         (tie_eps = 1e-9, as the reference code)
    q_i    = r_i / sum_k r_ik,  or the uniform row 1/K where that sum is 0

* ``irova``: one map per class k, fitted on (p_ik, 1[y_i = k]); K knot sets. A class absent
  from the calibration labels gets g_k = 0. Not top-1 preserving.
* ``irova-ts``: temperature scaling first, p = softmax(beta * z), then ``irova`` on p.
  As the Mix-n-Match demo ("Method 6", ``ts_calibrate(..., 'mse')``), beta = 1/T minimises
  the mean squared error of softmax(z / T) against the one-hot labels with T in
  [0.05, 5] (``fit_inverse_temperature_mse``), not the NLL of plain TS; on the CIFAR-10
  checkpoints this moves five-split ECE and TPCR by hundredths of a percentage point
  (docs/calibrators.md section 4, experiment 1). Fitted state: ``beta`` and K knot sets.
* ``irm``: one map shared by all classes, fitted on all n * K pairs (p_ik, 1[y_i = k]);
  g + tie_eps * p is strictly increasing, so within-row order, hence the top-1 class, is kept
  (up to float64 rounding: two entries closer than about 1e-7 can become tied).

Saturated classifiers (naive Bayes) put top-1 probabilities within a few ulps of 1 and the
fitted knots there a few ulps apart, so the maps' slope reaches 1e13: a one-ulp change of p
moves g by 1e-3. ``saturation_softmax`` forms p so that its top entry, where such knots
are, is the correctly rounded 1 / (1 + s) of the other entries' sum s whatever order s is
summed in; the ONNX graph forms it the same way (``onnx_export.calibrators``) and agrees to
1e-12 on such data, where the plain softmax (the row sum in another order) gave 9e-4.

The reference functions return r unnormalised; we renormalise (docs/calibrators.md's
recommendation, and scikit-learn's CalibratedClassifierCV behaviour), with the same uniform
fallback as scikit-learn.
"""

from __future__ import annotations

import numpy as np
from sklearn.isotonic import IsotonicRegression

from cord_ops.calibrators._base import PROB_FLOOR, Calibrator
from cord_ops.calibrators.temperature import fit_inverse_temperature_mse

#: Weight of the strictly increasing term added to every isotonic output (Mix-n-Match).
TIE_EPS = 1e-9


def fit_knots(t: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Knots (x, y) of the isotonic regression of ``target`` on ``t`` (clip outside)."""
    iso = IsotonicRegression(out_of_bounds="clip").fit(t, target)
    return (np.asarray(iso.X_thresholds_, dtype=np.float64),
            np.asarray(iso.y_thresholds_, dtype=np.float64))


def saturation_softmax(z: np.ndarray) -> np.ndarray:
    """Row softmax of logits z, every entry exp(z_j - max z) / (1 + s) with s the sum of
    the entries other than the first maximum (whose exp is exactly 1).

    Mathematically the softmax. Summed this way, s is tiny exactly where p's top entry is
    near 1, so the order of the summation moves s by far less than the spacing of floats
    near 1 and the top entry 1 / (1 + s) rounds the same in any implementation (module
    docstring); the plain row sum adds the 1 in class order and rounds differently."""
    rows = np.arange(z.shape[0])
    top = z.argmax(axis=1)
    e = np.exp(z - z[rows, top][:, None])
    e[rows, top] = 0.0
    total = 1.0 + e.sum(axis=1)
    e[rows, top] = 1.0
    e /= total[:, None]
    return e


def normalise(r: np.ndarray) -> np.ndarray:
    """Rows of r divided by their sums; a row summing to 0 becomes uniform."""
    total = r.sum(axis=1, keepdims=True)
    zero = total[:, 0] == 0.0
    q = r / np.where(zero[:, None], 1.0, total)
    q[zero] = 1.0 / r.shape[1]
    return q


class _Isotonic(Calibrator):
    _options = ("tie_eps",)
    _option_checks = {"tie_eps": {"allow_zero": True}}

    def __init__(self, input_kind: str = "logits", prob_floor: float = PROB_FLOOR,
                 tie_eps: float = TIE_EPS):
        super().__init__(input_kind, prob_floor)
        self.tie_eps = tie_eps

    def _calibrate(self, p: np.ndarray) -> np.ndarray:
        r = np.empty_like(p)
        if len(self.knots_) == 1:
            kx, ky = self.knots_[0]
            r[:] = np.interp(p, kx, ky)
        else:
            for k, (kx, ky) in enumerate(self.knots_):
                r[:, k] = np.interp(p[:, k], kx, ky)
        r += self.tie_eps * p
        return normalise(r)

    def _probs(self, x: np.ndarray) -> np.ndarray:
        return x if self.input_kind == "probs" else saturation_softmax(x)

    def _fit_one_vs_rest(self, p: np.ndarray, y: np.ndarray) -> None:
        onehot = np.zeros(p.shape)
        onehot[np.arange(p.shape[0]), y] = 1.0
        self.knots_ = [fit_knots(p[:, k], onehot[:, k]) for k in range(p.shape[1])]


class IsotonicOneVsRest(_Isotonic):
    """``irova``: per-class isotonic maps of p. Fitted state: ``knots`` (K sets of x, y)."""

    name = "irova"
    param_shapes = {"knots": "knots"}

    def _fit(self, x, y):
        self._fit_one_vs_rest(self._probs(x), y)

    def _predict(self, x):
        return self._calibrate(self._probs(x))


class IsotonicOneVsRestTS(_Isotonic):
    """``irova-ts``: p = softmax(beta * z), then per-class isotonic maps.

    Fitted state: ``beta`` (float) and ``knots`` (K sets of x, y).
    """

    name = "irova-ts"
    param_shapes = {"beta": (), "knots": "knots"}

    def _fit(self, x, y):
        z = self._logits(x)
        self.beta_ = fit_inverse_temperature_mse(z, y)
        self._fit_one_vs_rest(saturation_softmax(self.beta_ * z), y)

    def _predict(self, x):
        return self._calibrate(saturation_softmax(self.beta_ * self._logits(x)))


class IsotonicMultiClass(_Isotonic):
    """``irm``: one isotonic map shared by all classes. Fitted state: ``knots`` (1 set)."""

    name = "irm"
    param_shapes = {"knots": "knots"}

    def _fit(self, x, y):
        p = self._probs(x)
        onehot = np.zeros(p.shape)
        onehot[np.arange(p.shape[0]), y] = 1.0
        self.knots_ = [fit_knots(p.ravel(), onehot.ravel())]

    def _predict(self, x):
        return self._calibrate(self._probs(x))
