"""Label-free estimates of a classifier's accuracy on a new batch, the batch's class priors,
and drift statistics against a labelled reference split.

Every estimate reads probability rows (n x K, the champion's repaired output in cord-ops)
and the top-1 under the paper's tie rule (``cord_ops.validation.top1``). With ``c_i`` the
top-1 probability of row ``i`` of the batch and, on the reference split, ``c^r_j`` and
``a^r`` its top-1 probabilities and accuracy:

- **CBPE** (NannyML's confidence-based performance estimation, accuracy case): the mean of
  ``m_{y_i}(c_i)``, ``y_i`` the row's top-1 class and ``m_k`` the isotonic regression of
  top-1 correctness on top-1 confidence over the reference rows whose top-1 is ``k``
  (increasing, values in [0, 1], clipped outside those rows' range): a per-predicted-class
  reliability map. The classes predicted on fewer than ``min_map_rows``
  (:data:`MIN_MAP_ROWS`) reference rows share one map ``m`` instead, the same regression
  over their rows together (the *pooled* route; over every row if they have none):
  CIFAR-100's 100 classes of about 30 reference rows each share one map,
  while a binary model's rare predicted class of 75 rows gets its own rather than one
  dominated by the other class's rows. Why per class: one pooled map averages the predicted
  classes' reliabilities at each confidence, at the reference's mix of predictions, so a
  batch that predicts more of a class whose decisions are less reliable than their
  confidence says is over-estimated. A binary model of 3 % positives that predicts 30 %
  positives (95 % of them wrong) has predicted positives of top-1 confidence 0.52-0.82 next
  to predicted negatives of 0.55-0.87 that are mostly right; on batches that predict twice
  the reference's positive share the pooled map missed the accuracy by 27 points, the
  per-class maps by 0.5 (docs/label-free.md). This is NannyML's
  one-vs-rest calibration restricted to where it is evaluated (the top-1's probability,
  among the rows that predict that class), and it keeps every decision: the map only says
  how often the served top-1 is right. With few reference rows per predicted class an
  isotonic fit is a staircase of a few steps, hence the shared map. *Ties*: CORD repairs a
  decision its calibrator disagrees with by moving the row to the tie, so the served top-1
  of a binary model's doubtful positives is 0.5 on every one of them (vector scaling on the
  imbalanced models of the benchmark), and a map of those rows is flat; given the
  classifier's own probabilities (``original``, as ``cord-ops monitor`` has them), the maps
  read ``c_i + TIE_BREAK * o_i``, ``o_i`` the classifier's probability of the same top-1:
  ties ordered as the classifier orders them, nothing else moved (on those models the error
  on confidence-selected batches fell from 0.4-3.2 points to 0.1-1.5). Why a map at all: the
  mean of ``c_i`` itself is unbiased only when the probabilities are calibrated on the
  batch's distribution, which is why NannyML calibrates on reference data first. A champion
  is calibrated on labelled data, but not to the point: vector scaling fitted on 4,000 rows
  of CIFAR-100 leaves its mean top-1 probability 1-3 points above the accuracy of a held-out
  split, and the mean inherits that standing bias; the maps (monotone, so no decision
  changes) remove it. The unmapped mean is kept as ``mean_confidence`` and the raw
  classifier's CBPE is reported beside both.
- **CBPE, one vs rest** (:data:`ONE_VS_REST`, the second recipe; the maps above are
  :data:`CLASS_MAPS`): NannyML's calibration, per class ``k`` the isotonic regression of
  ``label == k`` on the classifier's own probability of ``k`` over *every* reference row
  (:class:`OneVsRestMaps`), read for each batch row at its served top-1 ``y_i`` and the
  classifier's probability of ``y_i``; CBPE is their mean. Only that one value per row is
  read, so no decision changes and nothing is renormalised (NannyML renormalises the
  calibrated rows; on CIFAR-10 that missed random batches by 1.0 point against 0.5).
  Why a second recipe: a per-class top-1 map is fitted on the few hundred rows that
  predict the class, and its lowest steps hold a handful of them, while one-vs-rest
  spans a class's low probabilities with every row where the class is not the top-1; on
  batches of hard inputs (CIFAR-10, confidence-selected) the class maps missed by 4.3
  points, one pooled map by 3.2, one vs rest by 1.9. Why the classifier's own
  probabilities, not the champion's: CORD moves the rows its calibrator disagrees with to
  a tie, so the champion's probabilities of those rows carry less order (on CIFAR-10's
  confidence-selected batches 2.8 points with the champion's, 2.1 with the classifier's;
  the corpus's random batches 2.9 against 1.5). Why not always: with few rows per class
  each one-vs-rest fit is a staircase of a few positives (CIFAR-100, 30 per class: 2.3
  points on random batches against 0.4 for the shared map). *The choice* (:data:`AUTO`,
  ``ReferenceProfile.recipe_``): both recipes are fitted on four fifths of the reference
  split and predict the top-1 correctness of the other fifth, five times
  (:data:`RECIPE_FOLDS`); the recipe of the lower mean Brier score over the held-out
  rows is fitted on the whole split (the class maps on a tie). A proper score of each
  row's correctness, not of a batch's mean: it rewards the map that knows which rows are
  right, whatever shift later selects them, and asks nothing about the shifts to come.
  The class maps are kept without a comparison when the classifier's own rows are not
  given or the split has fewer than :data:`RECIPE_MIN_ROWS` rows. The prior-corrected
  estimate's confidence route reads the class maps whatever the recipe (below).
- **ATC** (average thresholded confidence, Garg et al., ICLR 2022): the threshold ``t`` is
  the ``e``-th smallest reference confidence, ``e`` the number of reference errors, so the
  share of reference confidences below ``t`` equals the reference error (up to ties); the
  batch's estimated accuracy is the share of ``c_i >= t``.
- **DoC** (difference of confidences, Guillory et al., 2021): ``a^r + mean(c) - mean(c^r)``,
  clipped to [0, 1].
- **EM priors** (Saerens, Latinne and Decaestecker, 2002, eqs. 2.9-2.10): with source
  priors ``pi^s`` and posteriors ``p_i`` under them, iterate
  ``p^(t)_ik ∝ (pi^(t)_k / pi^s_k) p_ik`` (rows renormalised) and
  ``pi^(t+1)_k = mean_i p^(t)_ik`` from ``pi^(0) = pi^s``. The source priors used by
  :class:`ReferenceProfile` are the mean probability rows on the reference split (the
  priors the probabilities themselves imply), so EM on reference-like data returns them
  after one step. A class of source prior 0 keeps prior 0.
- **Prior-corrected CBPE**: the accuracy of the decisions served (the *kept* top-1, not the
  corrected argmax) under label shift to the EM priors, one of two ways. *Reweighted*: label
  shift keeps each class's accuracy ``a^r_k`` (the reference rows of true class ``k`` whose
  top-1 is right), so the batch's accuracy is ``sum_k s_k a^r_k`` with ``s_k`` its label
  shares, estimated as the reference's label counts times the EM weights ``pi^t_k / pi^s_k``
  (1 for a class of source prior 0), renormalised (the importance-weighted reference
  accuracy of Lipton et al., 2018; on reference-like data the weights are 1 and it is the
  reference accuracy). *Confidence*: the mean over rows of the kept top-1's class map
  (:data:`CLASS_MAPS`, whichever recipe CBPE took) of its prior-corrected probability: the
  class maps are clipped to the range of the rows predicting each class, the one-vs-rest
  maps are not, and they followed EM's misreading of a batch of hard inputs as a label
  shift (imbalanced binary models of 1 % positives: 23-29 points off against 2-4). The
  reweighted value is used when every class whose estimated share is at least
  :data:`SHARE_FLOOR` has at least :data:`MIN_CLASS_ROWS` labelled reference rows (its
  ``a^r_k`` is then known to a few points), the confidence value otherwise.
  Why two: the maps are fitted on the reference's confidences, and a prior shift
  moves the corrected confidence of a kept decision below the reference's range, where the
  maps are clipped (on binary outputs whose priors move to 0.99 / 0.01 the confidence value
  misses by 3-8 points, the reweighted one by 1-2); with few reference rows per class
  (CIFAR-100: 30) ``a^r_k`` is the noisier of the two. *Label shift rejected*: both routes
  assume the batch differs from the reference by its label shares only. Then each class's
  rows keep their distribution, so CBPE of the batch equals ``sum_k s_k b_k``, ``b_k`` the
  mean of the mapped confidences over the reference rows of true class ``k``. When ``|CBPE -
  sum_k s_k b_k|`` (``label_shift_gap``) is above ``LABEL_SHIFT_FLOOR + LABEL_SHIFT_Z * se``
  (``label_shift_tolerance``; ``se`` the standard error of the difference from the batch's
  and the reference's per-class spread of the mapped confidences), label shift does not
  explain the batch (a covariate shift, such as a batch of hard inputs), and the
  prior-corrected estimate is CBPE itself: on confidence-selected CIFAR-10 batches the
  reweighted route missed by 32 points and CBPE by 3.5, while the gap is 29-34 points there
  and at most 1.5 under Dirichlet label shifts.

Drift statistics (the tests evidently and alibi-detect run on model outputs):
two-sample Kolmogorov-Smirnov on the top-1 confidences (``scipy.stats.ks_2samp``) and
Pearson's chi-squared test of homogeneity on the predicted-class counts, reference vs
batch (``scipy.stats.chi2_contingency`` without Yates' correction; classes predicted in
neither are dropped, and one class left means statistic 0 and p-value 1).

Pure numpy/scipy; nothing here reads files or talks to a store.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.isotonic import IsotonicRegression

from cord_ops.validation import check_labels, check_probabilities, top1

#: EM stops when no prior moves by more than this between two iterations.
EM_TOL = 1e-10
EM_MAX_ITER = 10_000
#: :meth:`ReferenceProfile.prior_noise`: resampled batches, the quantile kept, and a looser
#: EM stop (the noise is a threshold, not an estimate).
NOISE_DRAWS = 32
NOISE_QUANTILE = 0.99
NOISE_TOL = 1e-7
NOISE_MAX_ITER = 2_000
#: CBPE (module docstring): a predicted class needs this many reference rows for a map of
#: its own; classes with fewer take the pooled map.
MIN_MAP_ROWS = 100
#: CBPE's maps order rows by top-1 confidence, then by the classifier's own probability of
#: that top-1 scaled by TIE_BREAK (module docstring): far below any difference of
#: confidences that matters, far above float64's resolution near 1.
TIE_BREAK = 1e-6
#: The map each predicted class's CBPE takes (``ReferenceProfile.map_routes_``).
CLASS_MAP, POOLED_MAP, ONE_VS_REST_MAP = "class", "pooled", "one-vs-rest"
#: CBPE's recipes (``ReferenceProfile(recipe=...)``, ``recipe_``; module docstring): maps of
#: the top-1 confidence per predicted class, or the one-vs-rest calibration of the
#: classifier's own probabilities; AUTO picks one per reference split by the out-of-fold
#: Brier score of top-1 correctness over RECIPE_FOLDS folds, when the classifier's own rows
#: are given and the split has at least RECIPE_MIN_ROWS rows (the class maps otherwise).
CLASS_MAPS, ONE_VS_REST, AUTO = "class-maps", "one-vs-rest", "auto"
RECIPE_FOLDS = 5
RECIPE_MIN_ROWS = 100
#: Prior-corrected CBPE (module docstring): the reweighted reference accuracy is used when
#: every class of estimated share at least SHARE_FLOOR has MIN_CLASS_ROWS reference rows.
MIN_CLASS_ROWS = 100
SHARE_FLOOR = 0.005
#: Label shift is rejected (module docstring) when the gap exceeds
#: LABEL_SHIFT_FLOOR + LABEL_SHIFT_Z standard errors; the floor covers EM's share error,
#: which the standard error leaves out.
LABEL_SHIFT_FLOOR = 0.01
LABEL_SHIFT_Z = 4.0


class EMResult(NamedTuple):
    """The batch's class priors estimated by EM, the iterations taken and whether the last
    step moved every prior by at most the tolerance."""

    priors: np.ndarray
    n_iter: int
    converged: bool


class DriftTest(NamedTuple):
    """One two-sample test, reference vs batch."""

    test: str
    statistic: float
    p_value: float


def top1_confidence(probs) -> np.ndarray:
    """The probability of each row's top-1 class (n,)."""
    p = check_probabilities(probs, "probs")
    return p[np.arange(p.shape[0]), top1(p)]


def cbpe_accuracy(probs) -> float:
    """CBPE's estimated accuracy: the mean top-1 probability."""
    return float(top1_confidence(probs).mean())


def _isotonic(confidence: np.ndarray, correct: np.ndarray) -> IsotonicRegression:
    return IsotonicRegression(y_min=0.0, y_max=1.0, increasing=True,
                              out_of_bounds="clip").fit(confidence, correct)


class ConfidenceMaps:
    """CBPE's reliability maps (module docstring): per predicted class with at least
    ``min_rows`` reference rows predicting it, the isotonic regression of top-1 correctness
    on top-1 confidence over those rows; one such regression shared by the other classes,
    fitted on their rows together (on every row when they have none).

    ``fit(predicted, confidence, correct, n_classes)`` sets ``maps_`` (one fitted
    ``IsotonicRegression`` per class, the shared one repeated), ``pooled_`` (the shared
    one) and ``routes_`` (:data:`CLASS_MAP` or :data:`POOLED_MAP` per class);
    ``predict(predicted, confidence)`` is each row's estimated probability that its top-1
    is right. Every map keeps the mean of the rows it is fitted on, so the mapped
    reference rows average to the reference accuracy whatever the routes."""

    def __init__(self, min_rows: float = MIN_MAP_ROWS):
        self.min_rows = min_rows

    def fit(self, predicted, confidence, correct, n_classes: int) -> ConfidenceMaps:
        if not self.min_rows >= 1:
            raise ValueError(f"min_map_rows: expected a number >= 1, got {self.min_rows!r}")
        predicted = np.asarray(predicted, dtype=np.int64)
        confidence = np.asarray(confidence, dtype=np.float64)
        right = np.asarray(correct, dtype=np.float64)
        own = np.bincount(predicted, minlength=n_classes) >= self.min_rows
        shared = ~own[predicted]
        if not shared.any():
            shared[:] = True
        self.pooled_ = _isotonic(confidence[shared], right[shared])
        self.maps_ = [_isotonic(confidence[predicted == k], right[predicted == k]) if own[k]
                      else self.pooled_ for k in range(n_classes)]
        self.routes_ = tuple(CLASS_MAP if o else POOLED_MAP for o in own)
        return self

    def predict(self, predicted, confidence) -> np.ndarray:
        predicted = np.asarray(predicted, dtype=np.int64)
        confidence = np.asarray(confidence, dtype=np.float64)
        out = np.empty_like(confidence)
        for k in np.unique(predicted):
            rows = predicted == k
            out[rows] = self.maps_[k].predict(confidence[rows])
        return out


class OneVsRestMaps:
    """CBPE's one-vs-rest recipe (module docstring, NannyML's calibration): per class ``k``
    the isotonic regression of ``label == k`` on the score of class ``k`` over *every*
    reference row. ``fit(scores, labels, n_classes)`` sets ``maps_`` and ``routes_``
    (:data:`ONE_VS_REST_MAP` for every class); ``predict(predicted, score)`` reads each
    row's map of its predicted class at ``score``, the row's score of that class: the
    estimated probability that the predicted class is right. Not renormalised across
    classes: only the predicted class's value is read."""

    def fit(self, scores, labels, n_classes: int) -> OneVsRestMaps:
        scores = np.asarray(scores, dtype=np.float64)
        labels = np.asarray(labels, dtype=np.int64)
        self.maps_ = [_isotonic(scores[:, k], (labels == k).astype(np.float64))
                      for k in range(n_classes)]
        self.routes_ = (ONE_VS_REST_MAP,) * n_classes
        return self

    predict = ConfidenceMaps.predict


def atc_threshold(confidence, correct) -> float:
    """ATC's threshold from reference confidences and correctness: the ``e``-th smallest
    confidence (0-based), ``e`` the number of errors; +inf when every row is wrong."""
    conf = np.asarray(confidence, dtype=np.float64)
    right = np.asarray(correct, dtype=bool)
    if conf.ndim != 1 or conf.shape != right.shape or conf.size == 0:
        raise ValueError(f"confidence, correct: expected two (n,) arrays with n >= 1, got "
                         f"shapes {conf.shape} and {right.shape}")
    errors = int(np.count_nonzero(~right))
    if errors == conf.size:
        return float("inf")
    return float(np.partition(conf, errors)[errors])


def atc_accuracy(threshold: float, confidence) -> float:
    """ATC's estimated accuracy: the share of batch confidences at or above the threshold."""
    return float(np.mean(np.asarray(confidence, dtype=np.float64) >= threshold))


def doc_accuracy(reference_accuracy: float, reference_confidence: float, confidence) -> float:
    """DoC's estimated accuracy: the reference accuracy moved by the change of the mean
    confidence, clipped to [0, 1]."""
    shift = float(np.mean(np.asarray(confidence, dtype=np.float64))) - reference_confidence
    return float(np.clip(reference_accuracy + shift, 0.0, 1.0))


def check_priors(priors, n_classes: int, name: str) -> np.ndarray:
    pi = np.asarray(priors, dtype=np.float64)
    if pi.shape != (n_classes,) or not np.isfinite(pi).all() or pi.min() < 0 \
            or abs(pi.sum() - 1.0) > 1e-6:
        raise ValueError(f"{name}: expected {n_classes} non-negative priors summing to 1, "
                         f"got {np.array2string(pi, precision=4, threshold=8)}")
    return pi / pi.sum()


def prior_weights(source_priors, target_priors) -> np.ndarray:
    """``pi^t_k / pi^s_k`` per class (0 where the source prior is 0)."""
    source = np.asarray(source_priors, dtype=np.float64)
    target = np.asarray(target_priors, dtype=np.float64)
    return target / np.where(source > 0, source, np.inf)


def reweighted(probs: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Rows of ``probs`` times ``weights``, renormalised (Saerens et al., eq. 2.4); a row the
    weights send to zero everywhere stays as it was. Equal weights change nothing, so the rows
    come back as they are, without a renormalisation's rounding."""
    if np.all(weights == weights[0]) and weights[0] > 0:
        return probs.copy()
    q = probs * weights
    sums = q.sum(axis=1, keepdims=True)
    dead = sums[:, 0] <= 0
    if dead.any():
        q[dead], sums[dead] = probs[dead], 1.0
    return q / sums


def em_priors(probs, source_priors, tol: float = EM_TOL,
              max_iter: int = EM_MAX_ITER) -> EMResult:
    """Saerens et al.'s EM estimate of the batch's class priors (module docstring)."""
    p = check_probabilities(probs, "probs")
    source = check_priors(source_priors, p.shape[1], "source_priors")
    if not (tol > 0 and max_iter >= 1):
        raise ValueError(f"tol, max_iter: expected tol > 0 and max_iter >= 1, got {tol!r}, "
                         f"{max_iter!r}")
    current = source
    for step in range(1, max_iter + 1):
        updated = reweighted(p, prior_weights(source, current)).mean(axis=0)
        moved = float(np.abs(updated - current).max())
        current = updated
        if moved <= tol:
            return EMResult(current, step, True)
    return EMResult(current, max_iter, False)


def label_shares(label_counts, source_priors, target_priors) -> np.ndarray:
    """The label shares a label shift to ``target_priors`` makes of ``label_counts``: the
    counts times ``target / source``, renormalised (all zeros when no class keeps a count).
    A class of source prior 0 keeps its count: EM keeps its prior at 0, so the batch says
    nothing about it (its rows still count, at the reference's share)."""
    source = np.asarray(source_priors, dtype=np.float64)
    target = np.asarray(target_priors, dtype=np.float64)
    shares = np.asarray(label_counts, dtype=np.float64) * np.divide(
        target, source, out=np.ones_like(target), where=source > 0)
    total = shares.sum()
    return shares / total if total > 0 else shares


def reweighted_accuracy(label_counts, class_accuracy, source_priors, target_priors) -> float:
    """``sum_k s_k a_k`` with ``s`` the :func:`label_shares` and ``a`` the per-class
    ``class_accuracy``: the accuracy under label shift (module docstring); 0 when no class
    keeps a share."""
    return float(label_shares(label_counts, source_priors, target_priors)
                 @ np.asarray(class_accuracy, dtype=np.float64))


def ks_confidence(reference_confidence, confidence) -> DriftTest:
    """Two-sample KS test of the top-1 confidences."""
    from scipy.stats import ks_2samp

    result = ks_2samp(np.asarray(reference_confidence, dtype=np.float64),
                      np.asarray(confidence, dtype=np.float64))
    return DriftTest("ks", float(result.statistic), float(result.pvalue))


def chi2_predicted(reference_counts, counts) -> DriftTest:
    """Chi-squared test of homogeneity of two predicted-class count vectors."""
    from scipy.stats import chi2_contingency

    table = np.vstack([np.asarray(reference_counts, dtype=np.float64),
                       np.asarray(counts, dtype=np.float64)])
    if table.ndim != 2 or table.shape[1] < 2 or (table < 0).any() \
            or (table.sum(axis=1) == 0).any():
        raise ValueError(f"counts: expected two non-empty count vectors of one length >= 2, "
                         f"got shape {table.shape}")
    table = table[:, table.sum(axis=0) > 0]
    if table.shape[1] < 2:
        return DriftTest("chi2", 0.0, 1.0)
    result = chi2_contingency(table, correction=False)
    return DriftTest("chi2", float(result.statistic), float(result.pvalue))


def total_variation(p, q) -> float:
    """Half the L1 distance between two distributions."""
    return 0.5 * float(np.abs(np.asarray(p, dtype=np.float64)
                              - np.asarray(q, dtype=np.float64)).sum())


class Estimates(NamedTuple):
    """What :meth:`ReferenceProfile.estimate` returns for one batch. ``class_map_share``
    is the share of its rows whose CBPE came from a map of their predicted class's own
    (:data:`CLASS_MAP` or :data:`ONE_VS_REST_MAP`; the rest took the pooled map),
    ``map_routes`` the profile's route per class, ``recipe`` its recipe (``recipe_``)."""

    n: int
    cbpe: float
    class_map_share: float
    map_routes: tuple[str, ...]
    atc: float
    doc: float
    prior_corrected: float
    prior_method: str
    prior_confidence: float
    prior_reweighted: float
    label_shift_gap: float
    label_shift_tolerance: float
    priors: np.ndarray
    em_iterations: int
    em_converged: bool
    prior_shift: float
    mean_confidence: float
    predicted_counts: np.ndarray
    drift: tuple[DriftTest, ...]
    recipe: str = CLASS_MAPS


class ReferenceProfile(BaseEstimator):
    """What label-free monitoring needs from a labelled reference split, and the batch
    estimates against it (module docstring).

    ``fit(probs, labels, original=None)`` on the reference split's probability rows (the
    champion's output; ``original``, the classifier's own rows, breaks CBPE's ties, and
    :meth:`estimate` then needs them too: ``tie_break_``) sets ``accuracy_``,
    ``confidence_`` (sorted top-1 confidences), ``mean_confidence_``, ``recipe_`` (CBPE's
    recipe, ``recipe`` or, for :data:`AUTO`, the one chosen; ``recipe_brier_``, the
    held-out Brier score of each recipe compared, empty without a comparison), ``maps_``
    (CBPE's :class:`ConfidenceMaps`, where classes predicted on fewer than ``min_map_rows``
    reference rows take the pooled map, or :class:`OneVsRestMaps`), ``prior_maps_`` (the
    class maps, which the prior-corrected confidence route reads), ``map_routes_`` (per
    class, :data:`CLASS_MAP`, :data:`POOLED_MAP` or :data:`ONE_VS_REST_MAP`), ``cbpe_``
    (CBPE of the reference split itself: the mean of the maps there, which is
    ``accuracy_`` up to rounding for the class maps, whose isotonic fits keep the mean, and
    close to it for one vs rest, whose fits keep each class's label count instead),
    ``atc_threshold_``, ``priors_`` (mean probability row, the EM source priors),
    ``label_priors_`` (label frequencies), ``label_counts_``, ``class_accuracy_`` (per true
    class, the share of its rows whose top-1 is right; 0 for a class without rows),
    ``class_cbpe_`` and ``class_cbpe_var_`` (per true class, the mean and variance of the
    mapped confidences over its rows; 0 for a class without rows), ``predicted_counts_``,
    ``n_`` (rows), ``n_classes_`` and ``probs_`` (the rows, for :meth:`prior_noise`).
    """

    def __init__(self, em_tol: float = EM_TOL, em_max_iter: int = EM_MAX_ITER,
                 min_map_rows: float = MIN_MAP_ROWS, recipe: str = AUTO):
        self.em_tol = em_tol
        self.em_max_iter = em_max_iter
        self.min_map_rows = min_map_rows
        self.recipe = recipe

    @staticmethod
    def _own_rows(original, n: int, n_classes: int):
        """The classifier's own probability rows, checked against the batch's ``n``."""
        if original is None:
            return None
        raw = check_probabilities(original, "original", n_classes=n_classes)
        if raw.shape[0] != n:
            raise ValueError(f"original: expected {n} rows, one per row of probs, got "
                             f"{raw.shape[0]}")
        return raw

    @staticmethod
    def _reads(recipe: str, probs: np.ndarray, predicted: np.ndarray, raw) -> np.ndarray:
        """What ``recipe``'s maps read per row (module docstring): the top-1 confidence,
        ties ordered by the classifier's own probability of that top-1 when given; or, one
        vs rest, that probability itself (the champion's when the classifier's is not
        given)."""
        rows = np.arange(probs.shape[0])
        if recipe == ONE_VS_REST:
            return (probs if raw is None else raw)[rows, predicted]
        read = probs[rows, predicted]
        return read if raw is None else read + TIE_BREAK * raw[rows, predicted]

    def _fit_maps(self, recipe: str, probs, labels, predicted, correct, raw):
        k = probs.shape[1]
        if recipe == ONE_VS_REST:
            return OneVsRestMaps().fit(probs if raw is None else raw, labels, k)
        return ConfidenceMaps(self.min_map_rows).fit(
            predicted, self._reads(recipe, probs, predicted, raw), correct, k)

    def _choose_recipe(self, probs, labels, predicted, correct, raw) -> str:
        """:data:`AUTO`: the recipe whose maps, fitted on the other folds, predict the
        top-1 correctness of each fold's rows with the lower Brier score (module
        docstring); the class maps on a tie, without the classifier's own rows or below
        :data:`RECIPE_MIN_ROWS`."""
        if self.recipe not in (CLASS_MAPS, ONE_VS_REST, AUTO):
            raise ValueError(f"recipe: expected one of {CLASS_MAPS!r}, {ONE_VS_REST!r}, "
                             f"{AUTO!r}, got {self.recipe!r}")
        self.recipe_brier_ = {}
        if self.recipe != AUTO:
            return self.recipe
        if raw is None or probs.shape[0] < RECIPE_MIN_ROWS:
            return CLASS_MAPS
        from sklearn.model_selection import KFold

        folds = KFold(RECIPE_FOLDS, shuffle=True, random_state=0).split(probs)
        held = {CLASS_MAPS: np.empty(probs.shape[0]), ONE_VS_REST: np.empty(probs.shape[0])}
        for train, test in folds:
            for recipe, out in held.items():
                maps = self._fit_maps(recipe, probs[train], labels[train], predicted[train],
                                      correct[train], raw[train])
                out[test] = maps.predict(predicted[test], self._reads(
                    recipe, probs[test], predicted[test], raw[test]))
        self.recipe_brier_ = {r: float(np.mean((v - correct) ** 2)) for r, v in held.items()}
        return ONE_VS_REST if self.recipe_brier_[ONE_VS_REST] < self.recipe_brier_[CLASS_MAPS] \
            else CLASS_MAPS

    def fit(self, probs, labels, original=None) -> ReferenceProfile:
        if not (self.em_tol > 0 and int(self.em_max_iter) >= 1):
            raise ValueError(f"em_tol, em_max_iter: expected em_tol > 0 and em_max_iter >= 1, "
                             f"got {self.em_tol!r}, {self.em_max_iter!r}")
        p = check_probabilities(probs, "probs")
        n, k = p.shape
        y = check_labels(labels, n, k, "labels")
        predicted = top1(p)
        confidence = p[np.arange(n), predicted]
        correct = predicted == y
        self.n_classes_ = k
        self.n_ = n
        self.accuracy_ = float(correct.mean())
        self.confidence_ = np.sort(confidence)
        self.mean_confidence_ = float(confidence.mean())
        raw = self._own_rows(original, n, k)
        self.tie_break_ = raw is not None
        self.recipe_ = self._choose_recipe(p, y, predicted, correct, raw)
        self.maps_ = self._fit_maps(self.recipe_, p, y, predicted, correct, raw)
        self.map_routes_ = self.maps_.routes_
        self.prior_maps_ = self.maps_ if self.recipe_ == CLASS_MAPS else \
            self._fit_maps(CLASS_MAPS, p, y, predicted, correct, raw)
        mapped = self.maps_.predict(predicted, self._reads(self.recipe_, p, predicted, raw))
        self.cbpe_ = float(mapped.mean())
        self.atc_threshold_ = atc_threshold(confidence, correct)
        self.priors_ = p.mean(axis=0)
        self.label_counts_ = np.bincount(y, minlength=k)
        self.label_priors_ = self.label_counts_ / n
        # a class without labelled rows sums to 0 and is divided by 1: its means are 0
        rows = np.maximum(self.label_counts_, 1)
        self.class_accuracy_ = np.bincount(y, weights=correct, minlength=k) / rows
        self.class_cbpe_ = np.bincount(y, weights=mapped, minlength=k) / rows
        self.class_cbpe_var_ = np.bincount(
            y, weights=(mapped - self.class_cbpe_[y]) ** 2, minlength=k) / rows
        self.predicted_counts_ = np.bincount(predicted, minlength=k)
        self.probs_ = p
        self._noise = {}
        return self

    def prior_noise(self, n: int, quantile: float = NOISE_QUANTILE, draws: int = NOISE_DRAWS,
                    seed: int = 0) -> float:
        """The ``quantile`` of the total variation between the EM priors of ``draws``
        batches of ``n`` rows resampled from the reference split and :attr:`priors_`: how
        far the EM priors of a batch of this size move with no shift at all (EM priors are
        noisier than label shares, the more so for small batches and large K). Seeded,
        cached per ``n``."""
        if not hasattr(self, "probs_"):
            raise ValueError("ReferenceProfile: fit it on the reference split first")
        key = (int(n), quantile, draws, seed)
        if key not in self._noise:
            rng = np.random.default_rng(seed)
            moved = [total_variation(em_priors(self.probs_[rng.integers(0, self.n_, int(n))],
                                               self.priors_, NOISE_TOL, NOISE_MAX_ITER).priors,
                                     self.priors_) for _ in range(draws)]
            self._noise[key] = float(np.quantile(moved, quantile))
        return self._noise[key]

    def estimate(self, probs, original=None) -> Estimates:
        """The label-free estimates and drift statistics of the batch ``probs``."""
        if not hasattr(self, "accuracy_"):
            raise ValueError("ReferenceProfile: fit it on the reference split first")
        p = check_probabilities(probs, "probs", n_classes=self.n_classes_)
        predicted = top1(p)
        confidence = p[np.arange(p.shape[0]), predicted]
        em = em_priors(p, self.priors_, self.em_tol, int(self.em_max_iter))
        counts = np.bincount(predicted, minlength=self.n_classes_)
        if (original is None) == self.tie_break_:
            raise ValueError("original: the reference profile was fitted "
                             f"{'with' if self.tie_break_ else 'without'} the classifier's own "
                             "probabilities; estimate a batch likewise")
        raw = self._own_rows(original, p.shape[0], self.n_classes_)
        mapped = self.maps_.predict(predicted, self._reads(self.recipe_, p, predicted, raw))
        cbpe = float(mapped.mean())
        # the prior-corrected top-1 through the class maps whatever CBPE's recipe (module
        # docstring: clipped to the range of the rows predicting each class)
        by_confidence = float(self.prior_maps_.predict(predicted, self._reads(
            CLASS_MAPS, reweighted(p, prior_weights(self.priors_, em.priors)), predicted,
            raw)).mean())
        shares = label_shares(self.label_counts_, self.priors_, em.priors)
        by_reweighting = float(shares @ self.class_accuracy_)  # reweighted_accuracy
        known = shares.sum() > 0 and bool(
            np.all(self.label_counts_[shares >= SHARE_FLOOR] >= MIN_CLASS_ROWS))
        gap = abs(cbpe - float(shares @ self.class_cbpe_))
        rows = np.maximum(self.label_counts_, 1)
        se = np.sqrt(float(mapped.var()) / p.shape[0]
                     + float(np.sum(shares ** 2 * self.class_cbpe_var_ / rows)))
        tolerance = LABEL_SHIFT_FLOOR + LABEL_SHIFT_Z * se
        route = "cbpe" if gap > tolerance else "reweighted" if known else "confidence"
        chosen = {"cbpe": cbpe, "reweighted": by_reweighting, "confidence": by_confidence}
        return Estimates(
            n=int(p.shape[0]),
            cbpe=cbpe,
            class_map_share=float(np.isin(predicted, np.flatnonzero(
                np.array(self.map_routes_) != POOLED_MAP)).mean()),
            map_routes=self.map_routes_,
            atc=atc_accuracy(self.atc_threshold_, confidence),
            doc=doc_accuracy(self.accuracy_, self.mean_confidence_, confidence),
            prior_corrected=chosen[route], prior_method=route,
            prior_confidence=by_confidence, prior_reweighted=by_reweighting,
            label_shift_gap=gap, label_shift_tolerance=tolerance,
            priors=em.priors, em_iterations=em.n_iter, em_converged=em.converged,
            prior_shift=total_variation(em.priors, self.priors_),
            mean_confidence=float(confidence.mean()),
            predicted_counts=counts,
            drift=(ks_confidence(self.confidence_, confidence),
                   chi2_predicted(self.predicted_counts_, counts)),
            recipe=self.recipe_)
