"""Prior shift without labels, decisions kept: move calibrated probabilities to a batch's
class priors (estimated by EM, :func:`cord_ops.label_free.em_priors`) and repair them with
CORD against the original classifier, so that no top-1 changes.

Under label shift (``p(x | y)`` fixed, only ``p(y)`` moved) the posteriors under the new
priors are ``p^t(y | x) ∝ (pi^t_y / pi^s_y) p^s(y | x)`` (Saerens, Latinne and
Decaestecker, 2002, eq. 2.4). That reweighting can move a row's argmax; CORD (Algorithm 1
of the paper, eqs. 5-6 and 18-22) then repairs the reweighted rows against the original
classifier's probabilities with one fitted ``eta*``, so every row keeps the classifier's
top-1 and the probabilities follow the new priors as closely as that allows. Under concept
shift (``p(y | x)`` itself moved) the reweighting is not valid and the result is not a
calibrated model for the new traffic; docs/label-free.md says how to tell.
"""

from __future__ import annotations

import numpy as np
from sklearn.base import BaseEstimator

from cord_ops.cord import CORD
from cord_ops.label_free import (
    EM_MAX_ITER,
    EM_TOL,
    check_priors,
    em_priors,
    prior_weights,
    reweighted,
)
from cord_ops.validation import check_pair, check_probabilities


class PriorShiftRepair(BaseEstimator):
    """Reweight calibrated probabilities to new class priors, then CORD-repair them against
    the original classifier.

    ``fit(original, calibrated, source_priors, target_priors=None)``: ``original`` are the
    classifier's probabilities and ``calibrated`` the (already repaired) calibrated ones on
    the batch; ``source_priors`` the priors ``calibrated`` was calibrated under; without
    ``target_priors`` they are estimated by EM on ``calibrated``. Fitted: ``priors_`` (the
    target priors), ``weights_`` (``pi^t / pi^s``, 0 where the source prior is 0),
    ``em_iterations_`` and ``em_converged_`` (0 and True when the priors were given),
    ``cord_`` (the fitted :class:`cord_ops.CORD`).
    """

    def __init__(self, em_tol: float = EM_TOL, em_max_iter: int = EM_MAX_ITER):
        self.em_tol = em_tol
        self.em_max_iter = em_max_iter

    def fit(self, original, calibrated, source_priors, target_priors=None) -> PriorShiftRepair:
        p0 = check_probabilities(original, "original")
        q = check_probabilities(calibrated, "calibrated")
        check_pair(p0, q, ("original", "calibrated"))
        source = check_priors(source_priors, q.shape[1], "source_priors")
        if target_priors is None:
            em = em_priors(q, source, self.em_tol, int(self.em_max_iter))
            target, self.em_iterations_, self.em_converged_ = em
        else:
            target = check_priors(target_priors, q.shape[1], "target_priors")
            self.em_iterations_, self.em_converged_ = 0, True
        self.priors_ = target
        self.weights_ = prior_weights(source, target)
        self.cord_ = CORD().fit(p0, reweighted(q, self.weights_))
        return self

    def transform(self, original, calibrated) -> np.ndarray:
        """The reweighted, repaired n x K rows; the top-1 of each is ``original``'s."""
        if not hasattr(self, "cord_"):
            raise ValueError("PriorShiftRepair: fit it first")
        p0 = check_probabilities(original, "original")
        q = check_probabilities(calibrated, "calibrated", n_classes=self.weights_.size)
        check_pair(p0, q, ("original", "calibrated"))
        return self.cord_.transform(p0, reweighted(q, self.weights_))

    def fit_transform(self, original, calibrated, source_priors, target_priors=None):
        return self.fit(original, calibrated, source_priors, target_priors).transform(
            original, calibrated)
