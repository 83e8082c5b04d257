"""CORD: post-fit prediction-preserving repair of a calibrator's output (Kim, Chung & Jang).

Given the original classifier output ``p0`` and a fitted calibrator's direct output ``q``
(both n x K probability rows), CORD keeps the original top-1 class ``a = argmax p0``
strictly on top, keeps q's conditional distribution over the other classes (eq. 9), and
chooses the mass ``s`` on ``a`` by one shared Lagrange multiplier ``eta*`` fitted on a
calibration split (eqs. 7-8, 18). Everything follows Section 3 and Appendix A:
the row-wise kernels (terms, interval, local reference, response, reconstruction) are
:mod:`cord_ops.cord_kernels`, the choice of mu and eta* :mod:`cord_ops.cord_solve`, and
this module is the estimator around them (fit, transform, its JSON state) and Table 2's
minimal repair.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.exceptions import NotFittedError

from cord_ops.atomic import write_json_atomic
from cord_ops.cord_kernels import (
    DELTA_STAB,
    EPS_NUM,
    RepairTerms,
    reconstruct,
    response,
    row_scalars,
    sweep,
)
from cord_ops.cord_solve import nearest_zero_multiplier, target_mean
from cord_ops.threshold import check_threshold, from_decision_space, to_decision_space
from cord_ops.validation import check_pair, check_probabilities

STATE_VERSION = 1
MEAN_TARGETS = ("inherited", "none", "local", "pointwise")


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
    decision_threshold : float in (0, 1) or None
        K = 2 only: keep the decision ``1[p1 > t]`` instead of the argmax, by repairing in
        the reweighted space ``W_t`` and mapping back (:mod:`cord_ops.threshold` derives
        it). None (the default) or 0.5 is the paper's CORD, bit for bit.

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

    def __init__(self, mean_target: str = "inherited", local_weight: float = 0.5,
                 decision_threshold: float | None = None):
        self.mean_target = mean_target
        self.local_weight = local_weight
        self.decision_threshold = decision_threshold

    def _check_params(self) -> None:
        if not isinstance(self.mean_target, str) or self.mean_target not in MEAN_TARGETS:
            raise ValueError(
                f"mean_target: expected one of {MEAN_TARGETS}, got {self.mean_target!r}"
            )
        weight = self.local_weight
        if (not isinstance(weight, int | float | np.floating) or isinstance(weight, bool)
                or not 0.0 <= float(weight) <= 1.0):
            raise ValueError(f"local_weight: expected a number in [0, 1], got {weight!r}")
        check_threshold(self.decision_threshold)

    def _threshold(self, k: int) -> float | None:
        """The decision threshold for K = ``k`` columns (refused unless K = 2)."""
        return check_threshold(self.decision_threshold,
                               None if self.decision_threshold is None else k)

    def fit(self, original, calibrated) -> CORD:
        """Fit eta* on a calibration split of original (p0) and calibrated (q) outputs."""
        self._check_params()
        original = np.asarray(original)
        t = self._threshold(original.shape[1] if original.ndim == 2 else 0)
        if t is not None:
            original, calibrated = self._decision_space(original, calibrated, t)
        terms = sweep(original, calibrated, float(self.local_weight))
        return self._fit_terms(terms, *original.shape)

    @staticmethod
    def _decision_space(original, calibrated, t: float):
        """Both inputs validated and reweighted by W_t (:mod:`cord_ops.threshold`)."""
        p0 = check_probabilities(original, "original", n_classes=2)
        q = check_probabilities(calibrated, "calibrated", n_classes=2)
        check_pair(p0, q, ("original", "calibrated"))
        return to_decision_space(p0, t), to_decision_space(q, t)

    def fit_blocks(self, blocks) -> CORD:
        """Fit eta* from an iterable of (original, calibrated) row blocks, read once.

        Each block goes through the same row-blocked sweep as ``fit`` and is then dropped;
        only the per-row scalars the bisection needs (b, the lower bound of I, g: 24 bytes
        a row) are kept, so memory does not grow with K. Every per-row scalar depends on
        its own row only, and the bisection then runs on the concatenated vectors, so on
        the same rows ``fit_blocks`` gives ``fit``'s eta* and mu bit for bit however the
        rows are split. A bad block raises ``fit``'s error with the row counted from the
        first row of the first block.
        """
        self._check_params()
        if self.decision_threshold is not None:
            raise ValueError("decision_threshold: fit_blocks does not reweight its blocks; "
                             "fit a thresholded CORD with fit()")
        weight = float(self.local_weight)
        b, lower, g = [], [], []
        n, k = 0, None
        for original, calibrated in blocks:
            original = np.asarray(original)
            block = row_scalars(original, calibrated, weight, n_classes=k, first_row=n)
            k = original.shape[1] if k is None else k
            n += original.shape[0]
            b.append(block[0])
            lower.append(block[1])
            g.append(block[2])
        if k is None:
            raise ValueError("blocks: expected at least one (original, calibrated) block")
        return self._fit_scalars(np.concatenate(b), np.concatenate(lower), np.concatenate(g),
                                 k)

    def _fit_scalars(self, b, lower, g, k: int) -> CORD:
        """Fit from the per-row scalars of ``row_scalars`` for all rows, in row order."""
        n = b.shape[0]
        terms = RepairTerms(label=None, b=b, tail=None, rest=None, lower=lower,
                            upper=np.full(n, 1.0 - EPS_NUM), g=g)
        return self._fit_terms(terms, n, k)

    def _fit_terms(self, terms: RepairTerms, n: int, k: int) -> CORD:
        """Set eta*, mu and the shape attributes from the per-row scalars of n rows."""
        if self.mean_target == "none":
            mu, eta = float(np.mean(response(0.0, terms))), 0.0
        else:
            mu = target_mean(terms, self.mean_target)
            eta = nearest_zero_multiplier(terms, mu)
        return self._set_fitted(eta, mu, n, k)

    def _set_fitted(self, eta: float, mu: float, n: int, k: int) -> CORD:
        self.eta_ = float(eta)
        self.mu_ = float(mu)
        self.n_classes_ = int(k)
        self.n_features_in_ = self.n_classes_
        self.n_fit_ = int(n)
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
        conditional distribution over the other classes is q's (Proposition 1); with a
        ``decision_threshold`` t, every row's decision at t is ``original``'s instead.
        """
        self._check_fitted()
        t = self._threshold(self.n_classes_)
        if t is not None:
            original, calibrated = self._decision_space(original, calibrated, t)
        repaired = sweep(original, calibrated, float(self.local_weight), self.n_classes_,
                         eta=self.eta_).rest
        return from_decision_space(repaired, t)

    def fit_transform(self, original, calibrated) -> np.ndarray:
        return self.fit(original, calibrated).transform(original, calibrated)

    def to_dict(self) -> dict:
        """JSON-safe fitted state: eta* (float and exact repr), constants and options."""
        self._check_fitted()
        # written only when set, so a state without a threshold is today's, byte for byte
        threshold = ({} if self.decision_threshold is None
                     else {"decision_threshold": float(self.decision_threshold)})
        return {
            **threshold,
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
        # absent from states written without a decision threshold: the argmax, as they were fitted
        model = cls(mean_target=state["mean_target"], local_weight=state["local_weight"],
                    decision_threshold=state.get("decision_threshold"))
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


def check_cord_params(cord: CORD) -> None:
    """Raise ValueError when ``cord``'s ``mean_target`` or ``local_weight`` is not valid:
    the check ``CORD.fit`` makes first, for code that fits eta* elsewhere (the partition
    drivers of :mod:`cord_ops.reduce`) or wants a bad parameter to fail before any fit."""
    cord._check_params()


def fit_from_row_scalars(cord: CORD, b: np.ndarray, lower: np.ndarray, g: np.ndarray,
                         k: int) -> CORD:
    """Fit ``cord`` from the per-row scalars of :func:`row_scalars` (b, the lower bound of
    I, g) of every calibration row of K = ``k`` classes, in row order: the eta* and mu of
    ``CORD.fit`` on those rows, bit for bit. Returns ``cord``, fitted."""
    return cord._fit_scalars(b, lower, g, k)


def set_fitted(cord: CORD, eta: float, mu: float, n: int, k: int) -> CORD:
    """Record ``eta`` and ``mu``, computed elsewhere (a reduction over partitions), as
    ``cord``'s fit on ``n`` rows of K = ``k`` classes; ``transform`` then uses them.
    Returns ``cord``, fitted."""
    return cord._set_fitted(eta, mu, n, k)


def minimal_repair(original, calibrated) -> np.ndarray:
    """Table 2's minimal pointwise repair.

    Rows where q already has the original top-1 are returned unchanged; elsewhere
    s = Pi_I(b) and the vector is rebuilt with q's conditional distribution (eq. 2).
    """
    terms = sweep(original, calibrated, 0.5, keep_rest=True)
    out = reconstruct(terms, np.clip(terms.b, terms.lower, terms.upper))
    kept = ~terms.changed
    out[kept] = np.asarray(calibrated)[kept]
    return out
