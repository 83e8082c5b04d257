"""Decisions at an operator's threshold for a binary model.

A binary model is rarely used at 1/2: a fraud model flags a row when its positive-class
probability ``p1`` reaches 0.1, a moderation model at 0.8. CORD as the paper states it
keeps the argmax, the decision at 1/2; with a threshold ``t`` it must keep ``1[p1 > t]``
instead. The derivation, beside the paper's eqs. 2-5 (docs/calibrators.md links here):

1. **The decision at t is an argmax after reweighting.** Let ``w = (t, 1 - t)`` and
   ``W_t(p) = (t p0, (1 - t) p1) / (t p0 + (1 - t) p1)``. Then class 1 is the argmax of
   ``W_t(p)`` iff ``(1 - t) p1 > t p0 = t (1 - p1)`` iff ``p1 > t``. ``W_t`` is the
   prior-shift map of Saerens et al. (eq. 2.4; :func:`cord_ops.label_free.reweighted`
   with weights w) and a bijection of the open simplex, its inverse the reweighting by
   ``(1 / t, 1 / (1 - t))``, i.e. by ``(1 - t, t)`` once renormalised.
2. **Repair in the reweighted space, map back.** With ``p0`` the classifier's and ``q``
   the calibrator's rows, CORD (eqs. 2-6, 18) runs unchanged on ``W_t(p0)`` and
   ``W_t(q)``: its label ``a = argmax W_t(p0)`` is the decision at t, rows whose
   ``W_t(q)`` keeps it take g = b (eq. 5), the others the local reference
   ``(b + W_t(p0)_a) / 2``, and ``eta*`` is fitted on the calibration split's reweighted
   rows as the paper fits it. The output is ``W_t^-1`` of the repaired row. Because
   ``W_t`` maps the argmax onto the decision at t and the repaired row's label leads by
   at least ``(1 + rho) EPS_NUM`` (eq. 23), the calibrated ``p1`` of every row ends on the
   same side of t as the classifier's own; a row whose calibrated p1 crossed t is pinned
   just on the classifier's side of t (``W_t^-1`` of min I = 1/2 + EPS_NUM), as the
   paper's closed form pins it just above 1/2.
3. **t = 1/2 is the paper's CORD.** ``W_{1/2}`` is the identity (equal weights), so with
   t = 1/2 the repair is ``CORD.transform`` itself, bit for bit (``reweighted`` returns
   rows under equal weights unchanged).

Ties: ``p1 == t`` exactly (in the reweighted row's rounding) goes to class 0, the tie
rule of the argmax, which at t = 1/2 is today's rule; otherwise the decision is
``1[p1 >= t]`` as an operator writes it.
"""

from __future__ import annotations

import math

import numpy as np

from cord_ops.label_free import reweighted
from cord_ops.validation import top1


def check_threshold(threshold, n_classes: int | None = None) -> float | None:
    """``threshold`` as a float in (0, 1), or None when not given; a threshold is a binary
    model's (``n_classes`` 2 when given). Raises ValueError naming the option."""
    if threshold is None:
        return None
    if isinstance(threshold, bool) or not isinstance(threshold, int | float | np.floating) \
            or not math.isfinite(threshold) or not 0.0 < float(threshold) < 1.0:
        raise ValueError(f"decision_threshold: expected a number in (0, 1), got {threshold!r}")
    if n_classes is not None and n_classes != 2:
        raise ValueError(f"decision_threshold: a binary model's (K = 2); this one has "
                         f"K = {n_classes}")
    return float(threshold)


def weights(threshold: float) -> np.ndarray:
    """(t, 1 - t): the class weights whose argmax is the decision at t."""
    return np.array([threshold, 1.0 - threshold])


def back_weights(threshold: float) -> np.ndarray:
    """(1 - t, t): proportional to (1 / t, 1 / (1 - t)), the inverse reweighting (the
    renormalisation removes the factor t (1 - t))."""
    return np.array([1.0 - threshold, threshold])


def to_decision_space(probs: np.ndarray, threshold: float | None) -> np.ndarray:
    """``W_t(probs)`` (module docstring); the rows themselves when t is None. At t = 1/2
    the weights are equal and ``reweighted`` returns the rows unchanged (a copy)."""
    if threshold is None:
        return probs
    return reweighted(np.asarray(probs), weights(threshold))


def from_decision_space(rows: np.ndarray, threshold: float | None) -> np.ndarray:
    """``W_t^-1(rows)``: the reweighting by :func:`back_weights`."""
    if threshold is None:
        return rows
    return reweighted(rows, back_weights(threshold))


def decisions(probs: np.ndarray, threshold: float | None = None) -> np.ndarray:
    """Each row's decision: the argmax (smallest index on ties) without a threshold, else
    class 1 where p1 > t (``argmax W_t(p)``, ties to class 0)."""
    return top1(to_decision_space(probs, threshold))
