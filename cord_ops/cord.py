"""CORD: post-fit prediction-preserving repair of a calibrator's output (Kim, Chung & Jang).

Given the original classifier output ``p0`` and a fitted calibrator's direct output ``q``
(both n x K probability rows), CORD keeps the original top-1 class ``a = argmax p0``
strictly on top, keeps q's conditional distribution over the other classes (eq. 9), and
chooses the mass ``s`` on ``a`` by one shared Lagrange multiplier ``eta*`` fitted on a
calibration split (eqs. 7-8, 18). Everything follows Section 3 and Appendix A:

- tie rule: the smallest maximizing index (``validation.top1``);
- ``EPS_NUM`` offsets the prediction-preserving interval (eq. 4);
- ``DELTA_STAB`` stabilises boundary rows only, on internal copies (eq. 11);
- the tail mass ``1 - q_a`` is computed as the sum over ``j != a``;
- the local reference ``g`` is eq. 5 (eq. 25 for another ``local_weight``);
- the target mean ``mu`` is eq. 6;
- ``eta*`` is the nearest-zero multiplier (eqs. 18, 22) found by plateau-aware bisection on
  the finite bracket of eq. 21 until no representable midpoint remains;
- the interior response is the cancellation-safe closed form of eqs. 19-20, clipped to the
  interval (eq. 16).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.exceptions import NotFittedError

from cord_ops.atomic import write_json_atomic
from cord_ops.validation import check_pair, check_probabilities, top1

EPS_NUM = 1e-12
DELTA_STAB = 1e-10
STATE_VERSION = 1
MEAN_TARGETS = ("inherited", "none", "local", "pointwise")


def stabilize(u: np.ndarray) -> np.ndarray:
    """S_delta(u) = (1 - delta) u + delta / K (eq. 11), for rows known to touch the boundary."""
    return (1.0 - DELTA_STAB) * u + DELTA_STAB / u.shape[-1]


def on_boundary(u: np.ndarray) -> np.ndarray:
    """Rows of a probability array outside the relative interior (some entry is 0)."""
    return u.min(axis=1) <= 0.0


@dataclass(frozen=True)
class RepairTerms:
    """Per-row quantities of the one-dimensional repair family (eqs. 2, 4, 5).

    ``rest`` is the stabilised q with the original class zeroed: the numerator of alpha
    and, rescaled in place by ``reconstruct``, the tail of the repaired vector. It is the
    only n x K array CORD allocates.
    """

    label: np.ndarray  # a_i, original top-1
    b: np.ndarray  # q_{i, a_i} of the stabilised copy
    tail: np.ndarray  # sum_{j != a_i} q_ij
    rest: np.ndarray  # stabilised q_i with the a_i entry set to 0 (n x K)
    lower: np.ndarray  # min I_i = rho/(1+rho) + eps
    upper: np.ndarray  # max I_i = 1 - eps
    g: np.ndarray  # local reference (eq. 5 / eq. 25)


def repair_terms(p0: np.ndarray, q: np.ndarray, local_weight: float) -> RepairTerms:
    """Compute a, b, the tail, the interval I and the local reference g for every row.

    p0 and q are stabilised independently and only on their boundary rows; for p0 only
    the entry p0_a is ever needed, so only that entry is stabilised.
    """
    n, k = p0.shape
    rows = np.arange(n)
    # Stabilisation preserves every pairwise order, so the tie rule picks the same class
    # from the supplied p0 as from its internal copy (Appendix A).
    label = top1(p0)
    p0_a = p0[rows, label]
    p0_edge = on_boundary(p0)
    p0_a = np.where(p0_edge, (1.0 - DELTA_STAB) * p0_a + DELTA_STAB / k, p0_a)
    rest = q.copy()
    q_edge = on_boundary(q)
    if q_edge.any():
        rest[q_edge] = stabilize(q[q_edge])
    b = rest[rows, label].copy()
    rest[rows, label] = 0.0
    tail = rest.sum(axis=1)
    # max_j (q_j / tail) == (max_j q_j) / tail exactly: division by a positive number is a
    # monotone correctly-rounded map, so this saves an n x K division.
    rho = rest.max(axis=1) / tail
    lower = rho / (1.0 + rho) + EPS_NUM
    upper = np.full(n, 1.0 - EPS_NUM)
    changed = top1(q) != label
    g = np.where(changed, local_weight * b + (1.0 - local_weight) * p0_a, b)
    return RepairTerms(label, b, tail, rest, lower, upper, g)


def interior_response(eta: float, g: np.ndarray) -> np.ndarray:
    """H(g, eta): the root in (0, 1) of (s - g) / (s (1 - s)) = eta (eqs. 19-20).

    Uses the hypot form of R and the branch on eta that avoids cancellation; H(g, 0) = g
    exactly, which the identity characterisation relies on.
    """
    if eta == 0.0:
        return g.copy()
    r = np.hypot(eta + (2.0 * g - 1.0), 2.0 * np.sqrt(g * (1.0 - g)))
    if eta <= 1.0:
        return 2.0 * g / ((1.0 - eta) + r)
    return ((eta - 1.0) + r) / (2.0 * eta)


def response(eta: float, terms: RepairTerms) -> np.ndarray:
    """psi(eta; g, I): the interval-constrained response (eq. 16)."""
    return np.clip(interior_response(eta, terms.g), terms.lower, terms.upper)


def multiplier_of(g: np.ndarray, s: np.ndarray) -> np.ndarray:
    """h_g(s) = (s - g) / (s (1 - s)), the multiplier at which the response equals s (eq. 13)."""
    return (s - g) / (s * (1.0 - s))


def nearest_zero_multiplier(terms: RepairTerms, mu: float) -> float:
    """eta* = projection of 0 onto {eta : mean psi(eta) = mu} (eqs. 18, 21, 22).

    Plateau-aware bisection: on the side where the target lies, the endpoint on the target
    side moves on equality, and the loop runs until the bracket has no representable
    midpoint; that endpoint is returned.
    """

    def mean_response(eta: float) -> float:
        return float(np.mean(response(eta, terms)))

    at_zero = mean_response(0.0)
    if at_zero == mu:
        return 0.0
    if at_zero < mu:
        lo, hi = 0.0, max(0.0, float(multiplier_of(terms.g, terms.upper).max()))
        while True:
            mid = 0.5 * (lo + hi)
            if mid <= lo or mid >= hi:
                return hi
            if mean_response(mid) >= mu:
                hi = mid
            else:
                lo = mid
    lo, hi = min(0.0, float(multiplier_of(terms.g, terms.lower).min())), 0.0
    while True:
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            return lo
        if mean_response(mid) <= mu:
            lo = mid
        else:
            hi = mid


def target_mean(terms: RepairTerms, mean_target: str) -> float:
    """The calibration-split mean mu the repair must hit.

    ``inherited`` is eq. 6 (the Base mean of b projected onto the attainable interval);
    ``local`` targets the mean of g and ``pointwise`` the mean of Pi_I(b), both projected
    the same way (Table 3's ablations).
    """
    source = {
        "inherited": terms.b,
        "local": terms.g,
        "pointwise": np.clip(terms.b, terms.lower, terms.upper),
    }[mean_target]
    lo, hi = float(np.mean(terms.lower)), float(np.mean(terms.upper))
    return min(max(float(np.mean(source)), lo), hi)


def reconstruct(terms: RepairTerms, s: np.ndarray) -> np.ndarray:
    """p~ = s e_a + (1 - s) alpha (eq. 2), reusing ``terms.rest`` as the output buffer.

    Rows whose mass is unchanged (s == b) get the internal copy of q back bit for bit: the
    identity characterisation says the repair is q there, and the algebraic route would
    differ from it in the last ulp.
    """
    out = terms.rest
    same = s == terms.b
    with np.errstate(over="ignore"):
        factor = (1.0 - s) / terms.tail
    # A subnormal tail can push (1 - s) / tail past the float range; those rows divide by
    # tail / (1 - s) instead, which is finite whenever the tail is positive.
    overflow = np.isinf(factor)
    kept, tiny = out[same], out[overflow]  # fancy indexing copies the rows before rescaling
    factor[overflow] = 0.0
    out *= factor[:, None]
    out[overflow] = tiny / (terms.tail[overflow] / (1.0 - s[overflow]))[:, None]
    out[same] = kept
    out[np.arange(out.shape[0]), terms.label] = s
    return out


def _validated_pair(original, calibrated, n_classes: int | None = None):
    p0 = check_probabilities(original, "original", n_classes=n_classes)
    q = check_probabilities(calibrated, "calibrated", n_classes=n_classes)
    check_pair(p0, q, ("original", "calibrated"))
    return p0, q


class CORD(BaseEstimator):
    """Prediction-preserving repair with one fitted scalar eta* (Algorithm 1).

    A scikit-learn estimator (``get_params``, ``set_params``, ``clone``,
    ``check_is_fitted``): parameters are stored as given and checked in ``fit``. Unlike a
    transformer, ``fit`` and ``transform`` take two arrays, the original output and the
    calibrated one; for an estimator that takes the features, see
    ``cord_ops.CORDCalibratedClassifier``.

    Parameters
    ----------
    mean_target : {"inherited", "none", "local", "pointwise"}
        ``inherited`` is the paper's CORD (eq. 6). ``none`` repairs each row independently,
        s_i = Pi_I(g_i), i.e. eta* = 0. ``local`` and ``pointwise`` are Table 3's ablations.
    local_weight : float in [0, 1]
        lambda of eq. 25, the weight of b in the changed-prediction local reference;
        0.5 is the paper's eq. 5.

    Attributes
    ----------
    eta_ : float
        The nearest-zero multiplier eta* (eq. 18).
    mu_ : float
        The calibration-split target mean the fit enforced.
    n_classes_ : int
        K seen at fit; ``transform`` requires the same.
    n_features_in_ : int
        K again (the width of each input), scikit-learn's name for it.
    n_fit_ : int
        Number of calibration rows.
    """

    def __init__(self, mean_target: str = "inherited", local_weight: float = 0.5):
        self.mean_target = mean_target
        self.local_weight = local_weight

    def _check_params(self) -> None:
        if not isinstance(self.mean_target, str) or self.mean_target not in MEAN_TARGETS:
            raise ValueError(
                f"mean_target: expected one of {MEAN_TARGETS}, got {self.mean_target!r}"
            )
        weight = self.local_weight
        if (not isinstance(weight, int | float | np.floating) or isinstance(weight, bool)
                or not 0.0 <= float(weight) <= 1.0):
            raise ValueError(f"local_weight: expected a number in [0, 1], got {weight!r}")

    def fit(self, original, calibrated) -> CORD:
        """Fit eta* on a calibration split of original (p0) and calibrated (q) outputs."""
        self._check_params()
        p0, q = _validated_pair(original, calibrated)
        terms = repair_terms(p0, q, float(self.local_weight))
        if self.mean_target == "none":
            mu, eta = float(np.mean(response(0.0, terms))), 0.0
        else:
            mu = target_mean(terms, self.mean_target)
            eta = nearest_zero_multiplier(terms, mu)
        self.eta_ = float(eta)
        self.mu_ = float(mu)
        self.n_classes_ = int(p0.shape[1])
        self.n_features_in_ = self.n_classes_
        self.n_fit_ = int(p0.shape[0])
        return self

    def __sklearn_is_fitted__(self) -> bool:
        return hasattr(self, "eta_")

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        # Both inputs are probability rows; ``calibrated`` takes the place of y.
        tags.input_tags.positive_only = True
        tags.target_tags.required = True
        return tags

    def _check_fitted(self) -> None:
        if not self.__sklearn_is_fitted__():
            raise NotFittedError("CORD: call fit(original, calibrated) before transform")

    def transform(self, original, calibrated) -> np.ndarray:
        """Repair new output pairs with the fitted eta*; returns an n x K float64 array.

        Every row's argmax is the argmax of ``original`` (uniquely top-ranked) and its
        conditional distribution over the other classes is q's (Proposition 1).
        """
        self._check_fitted()
        p0, q = _validated_pair(original, calibrated, self.n_classes_)
        terms = repair_terms(p0, q, float(self.local_weight))
        return reconstruct(terms, response(self.eta_, terms))

    def fit_transform(self, original, calibrated) -> np.ndarray:
        return self.fit(original, calibrated).transform(original, calibrated)

    def to_dict(self) -> dict:
        """JSON-safe fitted state: eta* (float and exact repr), constants and options."""
        self._check_fitted()
        return {
            "kind": "cord",
            "version": STATE_VERSION,
            "eta_star": self.eta_,
            "eta_star_repr": repr(self.eta_),
            "mu": self.mu_,
            "n_classes": self.n_classes_,
            "n_fit": self.n_fit_,
            "mean_target": self.mean_target,
            "local_weight": float(self.local_weight),
            "eps_num": EPS_NUM,
            "delta_stab": DELTA_STAB,
        }

    @classmethod
    def from_dict(cls, state: dict) -> CORD:
        """Rebuild a fitted CORD; rejects state from another version or other constants."""
        if not isinstance(state, dict) or state.get("kind") != "cord":
            raise ValueError("CORD state: expected a dict with kind 'cord'")
        required = ("version", "eta_star_repr", "mu", "n_classes", "n_fit", "mean_target",
                    "local_weight", "eps_num", "delta_stab")
        missing = [key for key in required if key not in state]
        if missing:
            raise ValueError(f"CORD state: missing keys {missing}")
        if state["version"] != STATE_VERSION:
            raise ValueError(
                f"CORD state: expected version {STATE_VERSION}, got {state['version']!r}"
            )
        if state["eps_num"] != EPS_NUM or state["delta_stab"] != DELTA_STAB:
            raise ValueError(
                "CORD state: eps_num/delta_stab differ from this build's constants "
                f"({EPS_NUM}, {DELTA_STAB})"
            )
        try:
            eta = float(state["eta_star_repr"])
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"CORD state: eta_star_repr {state['eta_star_repr']!r} is not a float"
            ) from exc
        if not math.isfinite(eta):
            raise ValueError(f"CORD state: eta_star must be finite, got {eta!r}")
        model = cls(mean_target=state["mean_target"], local_weight=state["local_weight"])
        model._check_params()
        n_classes = state["n_classes"]
        if not isinstance(n_classes, int) or n_classes < 2:
            raise ValueError(f"CORD state: n_classes must be an integer >= 2, got {n_classes!r}")
        model.eta_ = eta
        model.mu_ = float(state["mu"])
        model.n_classes_ = n_classes
        model.n_features_in_ = n_classes
        model.n_fit_ = int(state["n_fit"])
        return model

    def save(self, path) -> None:
        """Write the fitted state as JSON atomically (temp file, then rename)."""
        write_json_atomic(path, self.to_dict())

    @classmethod
    def load(cls, path) -> CORD:
        """Read a state written by ``save``; a corrupt file raises ValueError naming it."""
        path = Path(path)
        try:
            state = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"{path}: not a readable CORD state file ({exc})") from exc
        try:
            return cls.from_dict(state)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from exc


def minimal_repair(original, calibrated) -> np.ndarray:
    """Table 2's minimal pointwise repair.

    Rows where q already has the original top-1 are returned unchanged; elsewhere
    s = Pi_I(b) and the vector is rebuilt with q's conditional distribution (eq. 2).
    """
    p0, q = _validated_pair(original, calibrated)
    terms = repair_terms(p0, q, 0.5)
    out = reconstruct(terms, np.clip(terms.b, terms.lower, terms.upper))
    kept = top1(q) == terms.label
    out[kept] = q[kept]
    return out
