"""Label-free estimates (CBPE, ATC, DoC, EM priors), drift statistics and the prior-shift
repair: hand-checked values, and properties on probability rows with exact 0/1 entries,
ties at the top and K = 2."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from scipy.optimize import minimize
from scipy.special import softmax

from cord_ops import label_free as lf
from cord_ops.prior_shift import PriorShiftRepair


@st.composite
def probability_rows(draw, max_rows: int = 40, max_classes: int = 6, k: int | None = None):
    """n x K rows with frequent exact ties (half-integer logits), and with exact 0/1 rows
    (one-hot votes) mixed in."""
    n = draw(st.integers(1, max_rows))
    k = k or draw(st.integers(2, max_classes))
    steps = draw(hnp.arrays(np.int64, (n, k), elements=st.integers(-6, 6)))
    rows = softmax(steps / 2.0, axis=1)
    hard = draw(hnp.arrays(np.bool_, (n,)))
    votes = draw(hnp.arrays(np.int64, (n,), elements=st.integers(0, k - 1)))
    rows[hard] = np.eye(k)[votes[hard]]
    return rows


@st.composite
def labelled_rows(draw):
    rows = draw(probability_rows())
    labels = draw(hnp.arrays(np.int64, (rows.shape[0],),
                             elements=st.integers(0, rows.shape[1] - 1)))
    return rows, labels


def _priors(draw, k: int, zeros: bool = True) -> np.ndarray:
    weights = np.asarray(draw(st.lists(st.integers(0 if zeros else 1, 9), min_size=k,
                                       max_size=k)), dtype=np.float64)
    if weights.sum() == 0:
        weights[0] = 1.0
    return weights / weights.sum()


# ---------------------------------------------------------------- hand-checked values
def test_cbpe_is_the_mean_top1_probability():
    assert lf.cbpe_accuracy([[0.7, 0.3], [0.4, 0.6]]) == pytest.approx(0.65, abs=1e-15)
    # a tie at the top counts once, with its value
    assert lf.cbpe_accuracy([[0.5, 0.5], [1.0, 0.0]]) == pytest.approx(0.75, abs=1e-15)


def test_atc_threshold_leaves_the_reference_error_below_it():
    # two errors among four: the third smallest confidence (0-based index 2)
    t = lf.atc_threshold([0.9, 0.6, 0.8, 0.5], [True, False, True, False])
    assert t == 0.8
    assert lf.atc_accuracy(t, [0.85, 0.7, 0.8]) == pytest.approx(2 / 3)
    assert lf.atc_threshold([0.9, 0.2], [False, False]) == math.inf
    assert lf.atc_accuracy(math.inf, [1.0]) == 0.0
    assert lf.atc_threshold([0.9, 0.2], [True, True]) == 0.2
    with pytest.raises(ValueError, match="expected two"):
        lf.atc_threshold([], [])


def test_doc_moves_the_reference_accuracy_by_the_confidence_change():
    assert lf.doc_accuracy(0.8, 0.7, [0.5, 0.7]) == pytest.approx(0.7)
    assert lf.doc_accuracy(0.95, 0.6, [0.9]) == 1.0
    assert lf.doc_accuracy(0.1, 0.9, [0.5]) == 0.0


def test_em_priors_hand_checked_fixed_points():
    # symmetric rows: the source priors are the fixed point, reached in one step
    em = lf.em_priors([[0.8, 0.2], [0.2, 0.8]], [0.5, 0.5])
    assert em.converged and em.n_iter == 1 and np.allclose(em.priors, [0.5, 0.5], atol=1e-15)
    # every row sure of class 0: the priors go to (1, 0) and stay
    em = lf.em_priors([[1.0, 0.0]] * 3, [0.5, 0.5])
    assert em.converged and em.n_iter == 2 and np.array_equal(em.priors, [1.0, 0.0])
    # identical rows (0.6, 0.4): the likelihood's only interior stationary point is gone,
    # pi_0 = 0.6 pi_0 / (0.2 pi_0 + 0.4) holds only at 0 and 1, and EM climbs to 1
    em = lf.em_priors([[0.6, 0.4]] * 5, [0.5, 0.5])
    assert em.converged and em.priors[0] == pytest.approx(1.0, abs=1e-8)
    # a source prior of 0 keeps its class at 0
    em = lf.em_priors([[0.5, 0.5, 0.0], [0.1, 0.9, 0.0]], [0.4, 0.6, 0.0])
    assert em.priors[2] == 0.0
    with pytest.raises(ValueError, match="source_priors: expected 2 non-negative priors"):
        lf.em_priors([[0.5, 0.5]], [0.7, 0.7])


def test_prior_reweighting_hand_checked():
    # w = target / source = (0.5, 1.5): the row (0.6, 0.4) becomes (0.3, 0.6) / 0.9
    weights = lf.prior_weights(np.array([0.5, 0.5]), np.array([0.25, 0.75]))
    assert weights.tolist() == pytest.approx([0.5, 1.5], abs=1e-15)
    got = lf.reweighted(np.array([[0.6, 0.4]]), weights)
    assert got.tolist()[0] == pytest.approx([1 / 3, 2 / 3], abs=1e-15)


def test_reweighted_accuracy_hand_checked():
    # weights (2, 2/3) on counts (100, 300): shares 1/2, 1/2 of accuracies 0.9 and 0.5
    assert lf.reweighted_accuracy([100, 300], [0.9, 0.5], [0.25, 0.75], [0.5, 0.5]) == \
        pytest.approx(0.7, abs=1e-15)
    # a class the target gives no weight drops out; no class left: 0
    assert lf.reweighted_accuracy([100, 300], [0.9, 0.5], [0.25, 0.75], [1.0, 0.0]) == \
        pytest.approx(0.9, abs=1e-15)
    assert lf.reweighted_accuracy([0, 300], [0.0, 0.5], [0.25, 0.75], [1.0, 0.0]) == 0.0
    # a class of source prior 0 (no probability anywhere) keeps its labelled rows
    assert lf.reweighted_accuracy([100, 100], [0.9, 0.5], [1.0, 0.0], [1.0, 0.0]) == \
        pytest.approx(0.7, abs=1e-15)


def _binary_rows(rng, n, prior1):
    """Exact posteriors of two unit Gaussians at -1 and +1 under equal priors."""
    y = (rng.random(n) < prior1).astype(int)
    p1 = 1.0 / (1.0 + np.exp(-2.0 * rng.normal(np.where(y == 1, 1.0, -1.0), 1.0)))
    return np.column_stack([1.0 - p1, p1]), y


def test_prior_corrected_reweights_the_reference_under_a_binary_label_shift():
    """Priors moving from 50:50 to 97:3 put the corrected confidence of every kept class-1
    decision below the reference's range, where the isotonic map is clipped: the
    confidence route misses by several points, the reweighted reference accuracy by less
    than one."""
    reweighted, confidence = [], []
    for seed in range(5):
        rng = np.random.default_rng(seed)
        profile = lf.ReferenceProfile().fit(*_binary_rows(rng, 4000, 0.5))
        probs, labels = _binary_rows(rng, 4000, 0.03)
        est = profile.estimate(probs)
        realised = float(np.mean(probs.argmax(axis=1) == labels))
        assert est.prior_method == "reweighted"
        assert est.prior_corrected == est.prior_reweighted
        reweighted.append(abs(est.prior_reweighted - realised))
        confidence.append(abs(est.prior_confidence - realised))
    assert np.mean(reweighted) < 0.01
    assert np.mean(confidence) > 2 * np.mean(reweighted)


def test_label_shift_rejected_on_a_batch_of_hard_inputs_and_kept_under_label_shift():
    """A batch of the rows the classifier is least sure of is no label shift of the
    reference: its CBPE is far below what the reference's classes at the EM shares give,
    so the prior-corrected estimate is CBPE. The same reference under a pure label shift
    (priors 80:20) keeps the reweighted route."""
    rng = np.random.default_rng(11)
    profile = lf.ReferenceProfile().fit(*_binary_rows(rng, 4000, 0.5))
    probs, labels = _binary_rows(rng, 20000, 0.5)
    hard = np.flatnonzero(probs.max(axis=1) < 0.75)[:2000]
    est = profile.estimate(probs[hard])
    realised = float(np.mean(probs[hard].argmax(axis=1) == labels[hard]))
    assert est.label_shift_gap > est.label_shift_tolerance
    assert est.prior_method == "cbpe" and est.prior_corrected == est.cbpe
    assert abs(est.cbpe - realised) < 0.05 < abs(est.prior_reweighted - realised)
    shifted = profile.estimate(_binary_rows(rng, 2000, 0.2)[0])
    assert shifted.label_shift_gap <= shifted.label_shift_tolerance
    assert shifted.prior_method == "reweighted"


def test_label_shift_tolerance_hand_checked():
    # confidences 0.6 (one right, one wrong) and 0.9 (both right): the map is 0.5 and 1.0;
    # true class 0 holds one row mapped 0.5, class 1 rows mapped 0.5, 1, 1
    probs = np.array([[0.6, 0.4], [0.6, 0.4], [0.1, 0.9], [0.1, 0.9]])
    profile = lf.ReferenceProfile().fit(probs, [1, 0, 1, 1])
    assert profile.class_cbpe_ == pytest.approx([0.5, 5 / 6], abs=1e-15)
    assert profile.class_cbpe_var_ == pytest.approx([0.0, 1 / 18], abs=1e-15)
    est = profile.estimate(probs)
    # se^2 = var(0.5, 0.5, 1, 1) / 4 + (3/4)^2 (1/18) / 3 = 1/64 + 1/96
    assert est.label_shift_tolerance == pytest.approx(
        lf.LABEL_SHIFT_FLOOR + lf.LABEL_SHIFT_Z * math.sqrt(1 / 64 + 1 / 96), rel=1e-6)
    assert est.label_shift_gap == pytest.approx(0.0, abs=1e-9)


def test_prior_corrected_needs_min_class_rows_per_class_for_the_reweighted_route():
    rng = np.random.default_rng(7)
    probs, labels = _binary_rows(rng, 4000, 0.5)
    order = np.argsort(labels, kind="stable")
    zeros = order[:lf.MIN_CLASS_ROWS]
    ones = order[-lf.MIN_CLASS_ROWS:]
    batch = _binary_rows(rng, 500, 0.2)[0]
    enough = lf.ReferenceProfile().fit(probs[np.r_[zeros, ones]], labels[np.r_[zeros, ones]])
    assert enough.estimate(batch).prior_method == "reweighted"
    short = np.r_[zeros, ones[1:]]
    fewer = lf.ReferenceProfile().fit(probs[short], labels[short]).estimate(batch)
    assert fewer.prior_method == "confidence"
    assert fewer.prior_corrected == fewer.prior_confidence


def test_drift_tests_hand_checked():
    # 2 x 2 table [[10, 10], [20, 0]]: expected [[15, 5], [15, 5]], chi2 = 2 (25/15 + 25/5)
    test = lf.chi2_predicted([10, 10], [20, 0])
    assert test.test == "chi2" and test.statistic == pytest.approx(40 / 3, rel=1e-12)
    assert test.p_value == pytest.approx(math.erfc(math.sqrt(20 / 3)), rel=1e-9)
    # a class predicted in neither is dropped; one class left: no evidence of a change
    assert lf.chi2_predicted([5, 0, 0], [7, 0, 0]) == ("chi2", 0.0, 1.0)
    assert lf.chi2_predicted([5, 0, 3], [10, 0, 6]).statistic == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError, match="non-empty count vectors"):
        lf.chi2_predicted([0, 0], [1, 2])
    # fully separated samples of 3 and 2: D = 1 and, exactly, P = 2 / C(5, 2)
    test = lf.ks_confidence([0.1, 0.2, 0.3], [0.4, 0.5])
    assert test == ("ks", 1.0, pytest.approx(0.2))
    assert lf.total_variation([0.5, 0.5, 0.0], [0.2, 0.5, 0.3]) == pytest.approx(0.3)


def test_cbpe_of_calibrated_rows_meets_the_accuracy():
    rng = np.random.default_rng(3)
    probs = softmax(rng.normal(size=(20_000, 5)) * 1.5, axis=1)
    labels = (rng.random((20_000, 1)) > probs.cumsum(axis=1)).sum(axis=1)  # y ~ probs
    accuracy = float(np.mean(probs.argmax(axis=1) == labels))
    assert abs(lf.cbpe_accuracy(probs) - accuracy) < 0.01  # 3.5 standard errors


def test_cbpe_maps_each_confidence_through_the_reference_isotonic_fit():
    """Reference top-1 confidences 0.6, 0.7, 0.8, 0.9 with correctness 1, 0, 1, 1: the pool
    of adjacent violators makes 0.6 and 0.7 both 1/2, 0.8 and 0.9 both 1; between the
    fitted points the map is linear, outside it is clipped. Batch confidences 0.65, 0.75,
    0.95, 0.55 -> 1/2, 3/4, 1, 1/2."""
    def rows(confidences):
        c = np.asarray(confidences)
        return np.column_stack([c, 1.0 - c])

    profile = lf.ReferenceProfile().fit(rows([0.6, 0.7, 0.8, 0.9]), [0, 1, 0, 0])
    est = profile.estimate(rows([0.65, 0.75, 0.95, 0.55]))
    assert est.cbpe == pytest.approx((0.5 + 0.75 + 1.0 + 0.5) / 4, abs=1e-15)
    assert est.mean_confidence == pytest.approx((0.65 + 0.75 + 0.95 + 0.55) / 4, abs=1e-15)
    assert profile.cbpe_ == pytest.approx(0.75, abs=1e-15)  # the reference's accuracy
    assert profile.mean_confidence_ == pytest.approx(0.75, abs=1e-15)
    # no prior shift is estimated on these rows' own mean: the prior-corrected CBPE maps
    # the same confidences
    same = profile.estimate(rows([0.6, 0.7, 0.8, 0.9]))
    assert same.prior_corrected == pytest.approx(same.cbpe, abs=1e-9)
    assert same.cbpe == pytest.approx(0.75, abs=1e-12)


# ---------------------------------------------------------------- properties
@settings(max_examples=150, deadline=None)
@given(labelled_rows())
def test_profile_on_its_own_reference_sees_no_shift(case):
    probs, labels = case
    profile = lf.ReferenceProfile().fit(probs, labels)
    est = profile.estimate(probs)
    correct = probs.argmax(axis=1) == labels
    assert est.doc == pytest.approx(correct.mean(), abs=1e-12)
    assert est.atc >= correct.mean() - 1e-12  # equal but for ties at the threshold
    # through the reference's own isotonic map, CBPE of the reference is its accuracy
    assert est.cbpe == pytest.approx(correct.mean(), abs=1e-12)
    assert profile.cbpe_ == pytest.approx(correct.mean(), abs=1e-12)
    assert est.mean_confidence == pytest.approx(probs.max(axis=1).mean(), abs=1e-12)
    assert est.em_converged and est.em_iterations <= 2
    assert est.priors == pytest.approx(probs.mean(axis=0), abs=1e-9)
    assert est.prior_shift <= 1e-9 and est.prior_corrected == pytest.approx(est.cbpe, abs=1e-9)
    assert est.prior_reweighted == pytest.approx(correct.mean(), abs=1e-9)
    assert est.prior_confidence == pytest.approx(est.cbpe, abs=1e-9)
    assert est.label_shift_gap <= 1e-9 < est.label_shift_tolerance
    assert [d.test for d in est.drift] == ["ks", "chi2"]
    assert all(d.statistic == pytest.approx(0, abs=1e-9) and d.p_value == pytest.approx(1)
               for d in est.drift)


def _log_likelihood(priors, probs, source):
    weights = lf.prior_weights(source, priors)
    return float(np.log(np.maximum((probs * weights).sum(axis=1), 1e-300)).sum())


@settings(max_examples=100, deadline=None)
@given(probability_rows(), st.data())
def test_em_priors_maximise_the_batch_likelihood(probs, data):
    """Saerens et al.'s EM maximises sum_i log sum_k (pi_k / pi^s_k) p_ik, a concave
    function of pi: no other prior vector does better (checked against scipy's own
    maximiser over the simplex, an independent route to the same optimum)."""
    k = probs.shape[1]
    source = _priors(data.draw, k, zeros=False)
    em = lf.em_priors(probs, source, tol=1e-12, max_iter=200_000)
    assert em.priors.min() >= 0 and em.priors.sum() == pytest.approx(1.0, abs=1e-12)
    best = _log_likelihood(em.priors, probs, source)
    found = minimize(lambda z: -_log_likelihood(softmax(z), probs, source), np.zeros(k),
                     method="Nelder-Mead", options={"xatol": 1e-10, "fatol": 1e-12})
    assert best >= -found.fun - 1e-6 * max(1.0, abs(best))
    other = _priors(data.draw, k)
    assert best >= _log_likelihood(other, probs, source) - 1e-9 * max(1.0, abs(best))


@settings(max_examples=300, deadline=None)
@given(st.one_of(probability_rows(k=2), probability_rows()), st.data())
def test_prior_shift_repair_keeps_every_top1(original, data):
    """Whatever the calibrated rows and the priors (zeros allowed), the reweighted,
    repaired rows keep the original classifier's top-1, ties resolved by its tie rule."""
    n, k = original.shape
    calibrated = data.draw(probability_rows(k=k).filter(lambda r: r.shape[0] >= 1)
                           .map(lambda r: np.resize(r, (n, k))))
    calibrated = calibrated / calibrated.sum(axis=1, keepdims=True)
    source = _priors(data.draw, k, zeros=False)
    target = data.draw(st.one_of(st.none(), st.just(_priors(data.draw, k))))
    repair = PriorShiftRepair().fit(original, calibrated, source, target)
    out = repair.transform(original, calibrated)
    assert out.shape == (n, k) and np.isfinite(out).all() and out.min() >= 0
    assert np.allclose(out.sum(axis=1), 1.0, atol=1e-9)
    assert np.array_equal(out.argmax(axis=1), original.argmax(axis=1))
    if target is not None:
        assert repair.priors_ == pytest.approx(target, abs=1e-15)


def test_prior_shift_repair_without_a_shift_changes_nothing():
    """Target = source priors and calibrated rows that keep the top-1: eta* = 0, rows as
    given."""
    rng = np.random.default_rng(5)
    original = softmax(rng.normal(size=(300, 3)) * 2, axis=1)
    calibrated = softmax(np.log(original) * 0.7, axis=1)  # temperature: same top-1
    source = calibrated.mean(axis=0)
    repair = PriorShiftRepair().fit(original, calibrated, source, source)
    assert repair.cord_.eta_ == 0.0
    assert np.array_equal(repair.transform(original, calibrated), calibrated)


def test_prior_shift_repair_follows_a_label_shift():
    """Rows drawn with class 0 three times as frequent as in the source: EM finds the new
    priors and the repaired rows' mean moves to them, top-1s kept."""
    rng = np.random.default_rng(8)
    n, k = 6000, 3
    labels = rng.choice(k, size=n, p=[0.6, 0.2, 0.2])
    logits = rng.normal(size=(n, k)) + 2.0 * np.eye(k)[labels]
    source = np.full(k, 1 / k)
    # posteriors under uniform priors, from the class-conditional Gaussians
    posteriors = softmax(2.0 * logits, axis=1)  # exp(2 x_k - 2) ∝ p(x | y = k)
    repair = PriorShiftRepair().fit(posteriors, posteriors, source)
    assert repair.priors_ == pytest.approx([0.6, 0.2, 0.2], abs=0.03)
    out = repair.transform(posteriors, posteriors)
    assert np.array_equal(out.argmax(axis=1), posteriors.argmax(axis=1))
    assert out.mean(axis=0)[0] > posteriors.mean(axis=0)[0] + 0.05


def test_prior_noise_shrinks_with_the_batch_and_is_zero_without_spread():
    rng = np.random.default_rng(2)
    probs = softmax(rng.normal(size=(2000, 4)) * 2, axis=1)
    labels = probs.argmax(axis=1)
    profile = lf.ReferenceProfile().fit(probs, labels)
    small, large = profile.prior_noise(50), profile.prior_noise(2000)
    assert 0 < large < small < 0.5
    assert profile.prior_noise(50) == small  # seeded and cached
    # identical rows: every resampled batch is the reference itself
    same = lf.ReferenceProfile().fit(np.tile([[0.7, 0.2, 0.1]], (30, 1)), np.zeros(30, int))
    assert same.prior_noise(10) == pytest.approx(0.0, abs=1e-12)


# ---------------------------------------------------------------- per-class maps
def _overpredicting_champion():
    """The over-predicting binary model through the champion cord-ops fits (temperature
    scaling, then CORD, on a third of the rows): reference and pool thirds of the repaired
    rows."""
    from cord_ops import CORD
    from cord_ops.calibrators import make_calibrator
    from tests import corpus

    positive, labels = corpus.overpredicting_binary()
    probs = np.column_stack([1.0 - positive[:, 0], positive[:, 0]])  # the one-column load
    cal_i, ref_i, pool_i = np.array_split(np.random.default_rng(0).permutation(len(labels)),
                                          3)
    calibrator = make_calibrator("ts", input_kind="probs").fit(probs[cal_i], labels[cal_i])
    cord = CORD().fit(probs[cal_i], calibrator.predict_proba(probs[cal_i]))

    def repaired(rows):
        return cord.transform(probs[rows], calibrator.predict_proba(probs[rows]))

    return (repaired(ref_i), labels[ref_i], probs[ref_i]), \
        (repaired(pool_i), labels[pool_i], probs[pool_i])


def test_cbpe_follows_an_imbalanced_binary_model_predicting_twice_its_positive_share():
    """2.8 % positives, about 30 % predicted, 95 % of those wrong: batches of 2,000 pool
    rows that predict twice the reference's positive share. The per-class maps are within
    1.5 points of the realised accuracy on every batch; one pooled map (``min_map_rows``
    above the reference's size) misses by over 10."""
    (ref_p, ref_y, _), (pool_p, pool_y, _) = _overpredicting_champion()
    profile = lf.ReferenceProfile().fit(ref_p, ref_y)
    pooled = lf.ReferenceProfile(min_map_rows=len(ref_y) + 1).fit(ref_p, ref_y)
    assert profile.map_routes_ == (lf.CLASS_MAP, lf.CLASS_MAP)
    assert pooled.map_routes_ == (lf.POOLED_MAP, lf.POOLED_MAP)
    share = float(np.mean(ref_p.argmax(axis=1) == 1))
    assert 0.2 < share < 0.4 and np.mean(ref_y[ref_p.argmax(axis=1) == 1]) < 0.1
    predicted = pool_p.argmax(axis=1)
    correct = predicted == pool_y
    positives, negatives = np.flatnonzero(predicted == 1), np.flatnonzero(predicted == 0)
    rng = np.random.default_rng(4)
    n_pos = round(2 * share * 2000)
    for _ in range(5):
        rows = np.r_[rng.choice(positives, n_pos), rng.choice(negatives, 2000 - n_pos)]
        realised = float(correct[rows].mean())
        est = profile.estimate(pool_p[rows])
        assert abs(est.cbpe - realised) < 0.015
        assert est.class_map_share == 1.0
        assert abs(pooled.estimate(pool_p[rows]).cbpe - realised) > 0.10


def test_cbpe_with_the_classifiers_own_rows_follows_the_overpredicting_binary_model():
    """The batches above, estimated as ``cord-ops monitor`` does, with the classifier's own
    probabilities beside the champion's: the recipe chosen on the reference split and
    the one-vs-rest recipe forced are each within 1.5 points of the realised accuracy on
    every batch."""
    (ref_p, ref_y, ref_o), (pool_p, pool_y, pool_o) = _overpredicting_champion()
    chosen = lf.ReferenceProfile().fit(ref_p, ref_y, ref_o)
    ovr = lf.ReferenceProfile(recipe=lf.ONE_VS_REST).fit(ref_p, ref_y, ref_o)
    assert chosen.recipe_ in (lf.CLASS_MAPS, lf.ONE_VS_REST) and ovr.recipe_ == lf.ONE_VS_REST
    assert set(chosen.recipe_brier_) == {lf.CLASS_MAPS, lf.ONE_VS_REST}
    share = float(np.mean(ref_p.argmax(axis=1) == 1))
    predicted = pool_p.argmax(axis=1)
    correct = predicted == pool_y
    positives, negatives = np.flatnonzero(predicted == 1), np.flatnonzero(predicted == 0)
    rng = np.random.default_rng(5)
    n_pos = round(2 * share * 2000)
    for _ in range(5):
        rows = np.r_[rng.choice(positives, n_pos), rng.choice(negatives, 2000 - n_pos)]
        realised = float(correct[rows].mean())
        for profile in (chosen, ovr):
            assert abs(profile.estimate(pool_p[rows], pool_o[rows]).cbpe - realised) < 0.015


def test_one_vs_rest_maps_hand_checked():
    """Five reference rows of 3 classes (the champion's rows are the classifier's own).
    Class 0's scores 0.1, 0.2, 0.3, 0.5, 0.6 with label 0 on 0.3 and 0.6: the pool of
    adjacent violators makes 0.3 and 0.5 both 1/2, so the map is 0, 0, 1/2, 1/2, 1; class
    1's 0.2, 0.3, 0.3, 0.4, 0.7 (label 1 on 0.4 and 0.7): 0, 0, 0, 1, 1; class 2's 0.1
    (three rows), 0.5, 0.6 (label 2 on 0.6): 0, 0, 1. Batch: class 0 at 0.55 -> 3/4 (linear
    between 0.5 and 0.6) and at 0.4 -> 1/2; class 1 at 0.35 (a tie with class 2, top-1 the
    smaller index) -> 1/2; class 2 at 0.9 -> 1 (clipped). Each map is fitted over every
    reference row, not only those predicting the class, and only the predicted class's
    value is read (no renormalisation)."""
    rows = np.array([[0.6, 0.3, 0.1], [0.5, 0.4, 0.1], [0.2, 0.7, 0.1], [0.1, 0.3, 0.6],
                     [0.3, 0.2, 0.5]])
    labels = np.array([0, 1, 1, 2, 0])
    profile = lf.ReferenceProfile(recipe=lf.ONE_VS_REST).fit(rows, labels, rows)
    assert profile.recipe_ == lf.ONE_VS_REST and profile.recipe_brier_ == {}
    assert profile.map_routes_ == (lf.ONE_VS_REST_MAP,) * 3
    # reference rows: predicted 0, 0, 1, 2, 2 at 0.6, 0.5, 0.7, 0.6, 0.5 -> 1, 1/2, 1, 1, 0
    assert profile.cbpe_ == pytest.approx(3.5 / 5, abs=1e-12)
    batch = np.array([[0.55, 0.25, 0.2], [0.4, 0.3, 0.3], [0.3, 0.35, 0.35],
                      [0.05, 0.05, 0.9]])
    est = profile.estimate(batch, batch)
    assert est.cbpe == pytest.approx((0.75 + 0.5 + 0.5 + 1.0) / 4, abs=1e-12)
    assert est.class_map_share == 1.0 and est.map_routes == (lf.ONE_VS_REST_MAP,) * 3
    assert est.recipe == lf.ONE_VS_REST
    # the maps read the classifier's own probability of the champion's top-1
    champion = np.array([[0.5, 0.3, 0.2], [0.5, 0.3, 0.2], [0.2, 0.5, 0.3], [0.1, 0.1, 0.8]])
    assert profile.estimate(champion, batch).cbpe == pytest.approx(est.cbpe, abs=1e-12)
    # without the classifier's own rows, the champion's are calibrated one vs rest
    assert lf.ReferenceProfile(recipe=lf.ONE_VS_REST).fit(rows, labels).estimate(
        batch).cbpe == pytest.approx(est.cbpe, abs=1e-12)
    with pytest.raises(ValueError, match="recipe: expected one of"):
        lf.ReferenceProfile(recipe="isotonic").fit(rows, labels, rows)


def _informative_and_noise(rng, n: int):
    """Binary rows whose labels are drawn from ``informative`` (so its probabilities are
    calibrated), and rows of ``noise`` drawn independently of the labels."""
    positive = rng.beta(0.7, 0.7, size=n)
    informative = np.column_stack([1.0 - positive, positive])
    labels = (rng.random(n) < positive).astype(np.int64)
    noise = rng.uniform(0.5, 1.0, size=n)
    flip = rng.random(n) < 0.5
    noise = np.column_stack([np.where(flip, noise, 1 - noise), np.where(flip, 1 - noise, noise)])
    return informative, noise, labels


def test_auto_recipe_takes_the_maps_that_predict_held_out_correctness_better():
    """2,000 reference rows. When the classifier's own rows carry the labels' probability
    and the champion's are noise, the one-vs-rest calibration of the classifier's rows
    predicts each held-out row's correctness better (lower Brier score) than maps of the
    champion's confidence: it is chosen. Swapped, the class maps are. Without the
    classifier's rows, or below RECIPE_MIN_ROWS rows, the class maps are kept without a
    comparison."""
    rng = np.random.default_rng(6)
    informative, noise, labels = _informative_and_noise(rng, 2000)
    own_is_better = lf.ReferenceProfile().fit(noise, labels, informative)
    assert own_is_better.recipe_ == lf.ONE_VS_REST
    assert own_is_better.recipe_brier_[lf.ONE_VS_REST] < \
        own_is_better.recipe_brier_[lf.CLASS_MAPS] - 0.05
    champion_is_better = lf.ReferenceProfile().fit(informative, labels, noise)
    assert champion_is_better.recipe_ == lf.CLASS_MAPS
    assert champion_is_better.recipe_brier_[lf.CLASS_MAPS] < \
        champion_is_better.recipe_brier_[lf.ONE_VS_REST] - 0.05
    assert champion_is_better.map_routes_ == (lf.CLASS_MAP, lf.CLASS_MAP)
    # the choice shows: on fresh rows of the same kind, CBPE of the noise champion meets
    # the accuracy its decisions have (the noise's top-1 is right about half the time)
    fresh, fresh_noise, fresh_labels = _informative_and_noise(rng, 2000)
    realised = float(np.mean(fresh_noise.argmax(axis=1) == fresh_labels))
    assert abs(own_is_better.estimate(fresh_noise, fresh).cbpe - realised) < 0.03
    without = lf.ReferenceProfile().fit(noise, labels)
    assert without.recipe_ == lf.CLASS_MAPS and without.recipe_brier_ == {}
    assert without.estimate(fresh_noise).recipe == lf.CLASS_MAPS
    few = lf.ReferenceProfile().fit(noise[:lf.RECIPE_MIN_ROWS - 1],
                                    labels[:lf.RECIPE_MIN_ROWS - 1],
                                    informative[:lf.RECIPE_MIN_ROWS - 1])
    assert few.recipe_ == lf.CLASS_MAPS and few.recipe_brier_ == {}
    enough = lf.ReferenceProfile().fit(noise[:lf.RECIPE_MIN_ROWS],
                                       labels[:lf.RECIPE_MIN_ROWS],
                                       informative[:lf.RECIPE_MIN_ROWS])
    assert set(enough.recipe_brier_) == {lf.CLASS_MAPS, lf.ONE_VS_REST}
    # the prior-corrected confidence route reads the class maps whatever the recipe
    class_maps = lf.ReferenceProfile(recipe=lf.CLASS_MAPS).fit(noise, labels, informative)
    skewed = np.flatnonzero(fresh_labels == 1)[:300]
    assert own_is_better.estimate(fresh_noise[skewed], fresh[skewed]).prior_confidence == \
        class_maps.estimate(fresh_noise[skewed], fresh[skewed]).prior_confidence


def test_rarely_predicted_classes_share_one_map_of_their_own_rows():
    """Class 0 predicted on 4 reference rows (min_map_rows 4): a map of its own, 0.6 and
    0.7 wrong, 0.8 and 0.9 right: 0, 0, 1, 1 (linear between). Classes 1 and 2 predicted
    on 2 and 1 rows share one map of those 3 rows: confidences 0.6 (right), 0.9 (wrong),
    0.95 (right) map to 1/2, 1/2, 1, whatever class 0's rows say. Batch: class 0 at 0.75
    and 0.95 -> 1/2 and 1; classes 1 and 2 at 0.7 -> 1/2 each."""
    rows = np.array([[0.6, 0.4, 0.0], [0.7, 0.3, 0.0], [0.8, 0.2, 0.0], [0.9, 0.1, 0.0],
                     [0.4, 0.6, 0.0], [0.1, 0.9, 0.0], [0.0, 0.05, 0.95]])
    labels = [1, 1, 0, 0, 1, 0, 2]
    profile = lf.ReferenceProfile(min_map_rows=4).fit(rows, labels)
    assert profile.map_routes_ == (lf.CLASS_MAP, lf.POOLED_MAP, lf.POOLED_MAP)
    batch = np.array([[0.75, 0.25, 0.0], [0.0, 0.7, 0.3], [0.3, 0.0, 0.7], [0.95, 0.05, 0.0]])
    est = profile.estimate(batch)
    assert est.cbpe == pytest.approx((0.5 + 0.5 + 0.5 + 1.0) / 4, abs=1e-12)
    assert est.class_map_share == 0.5
    assert profile.cbpe_ == pytest.approx(4 / 7, abs=1e-12)  # the reference's accuracy
    # no class with enough rows: every class shares the map of every row
    everything = lf.ReferenceProfile(min_map_rows=5).fit(rows, labels)
    assert everything.map_routes_ == (lf.POOLED_MAP,) * 3
    assert everything.estimate(batch).class_map_share == 0.0
    with pytest.raises(ValueError, match="min_map_rows"):
        lf.ReferenceProfile(min_map_rows=0).fit(rows, labels)


@settings(max_examples=150, deadline=None)
@given(labelled_rows(), st.integers(1, 6), st.data())
def test_class_maps_keep_the_reference_accuracy_and_stay_in_the_unit_interval(case, min_rows,
                                                                            data):
    """Whatever the routes: each map keeps the mean of the rows it is fitted on, so on its
    own reference CBPE is the accuracy of every class's predicted rows; on any batch each
    row's mapped value (hence CBPE) is in [0, 1]; a route is a class's own map exactly
    when the class is predicted on min_map_rows reference rows. With or without the
    classifier's own rows to order ties."""
    probs, labels = case
    n, k = probs.shape
    # the classifier's own rows, when given, only order ties: any rows will do
    original = data.draw(st.one_of(st.none(), probability_rows(k=k).map(
        lambda r: np.resize(r, (n, k)))))
    profile = lf.ReferenceProfile(min_map_rows=min_rows, recipe=lf.CLASS_MAPS).fit(
        probs, labels, original)
    predicted = lf.top1(probs)
    correct = predicted == labels
    read = probs.max(axis=1) if original is None else \
        probs.max(axis=1) + lf.TIE_BREAK * original[np.arange(n), predicted]
    mapped = profile.maps_.predict(predicted, read)
    assert profile.cbpe_ == pytest.approx(correct.mean(), abs=1e-12)
    counts = np.bincount(predicted, minlength=probs.shape[1])
    assert profile.map_routes_ == tuple(lf.CLASS_MAP if c >= min_rows else lf.POOLED_MAP
                                        for c in counts)
    for c in np.flatnonzero(counts >= min_rows):
        assert mapped[predicted == c].mean() == pytest.approx(correct[predicted == c].mean(),
                                                              abs=1e-12)
    batch = data.draw(probability_rows(k=k))
    est = profile.estimate(batch, None if original is None else batch[::-1])
    assert 0.0 <= est.cbpe <= 1.0 and 0.0 <= est.prior_confidence <= 1.0
    values = profile.maps_.predict(lf.top1(batch), batch.max(axis=1))
    assert values.min() >= 0.0 and values.max() <= 1.0
    assert est.class_map_share == pytest.approx(
        np.mean(counts[lf.top1(batch)] >= min_rows), abs=1e-15)


@settings(max_examples=12, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(2, 4))
def test_cbpe_meets_the_expected_accuracy_of_a_generator_with_per_class_reliability(seed, k):
    """Rows whose top-1 is right with probability ``c ** g_k`` (``c`` the top-1
    confidence, ``g_k`` drawn per predicted class in [0.5, 3]: a different reliability per
    class), a reference of 20,000 rows and a batch whose predicted-class shares are drawn
    afresh. CBPE meets the batch's expected accuracy, the mean of ``c ** g_k`` over its
    rows, within 4 standard errors of the per-class maps' reference means plus half a
    point for the isotonic fits' shape."""
    rng = np.random.default_rng(seed)
    exponents = rng.uniform(0.5, 3.0, size=k)

    def rows(n, weights):
        probs = softmax(rng.normal(size=(4 * n, k)) * 2.0, axis=1)
        predicted = probs.argmax(axis=1)
        keep = rng.random(4 * n) < weights[predicted] / weights.max()
        probs, predicted = probs[keep][:n], predicted[keep][:n]
        hit = probs.max(axis=1) ** exponents[predicted]
        right = rng.random(len(hit)) < hit
        wrong = (predicted + rng.integers(1, k, size=len(hit))) % k
        return probs, np.where(right, predicted, wrong), hit

    ref_p, ref_y, _ = rows(20_000, np.ones(k))
    batch, _, hit = rows(3_000, rng.dirichlet(np.ones(k)) + 0.05)
    profile = lf.ReferenceProfile().fit(ref_p, ref_y)
    assert profile.map_routes_ == (lf.CLASS_MAP,) * k
    predicted = batch.argmax(axis=1)
    shares = np.bincount(predicted, minlength=k) / len(predicted)
    ref_predicted = ref_p.argmax(axis=1)
    ref_counts = np.bincount(ref_predicted, minlength=k)
    ref_acc = np.bincount(ref_predicted, weights=ref_predicted == ref_y, minlength=k) / ref_counts
    se = np.sqrt(np.sum(shares ** 2 * ref_acc * (1 - ref_acc) / ref_counts))
    assert abs(profile.estimate(batch).cbpe - hit.mean()) < 4 * se + 0.005


def test_ties_left_by_the_repair_are_ordered_by_the_classifiers_own_probabilities():
    """Four reference rows predicting class 1, all repaired to 0.55 (as CORD leaves the
    decisions its calibrator disagrees with), the classifier's own 0.7, 0.8, 0.9, 0.95,
    right only on the last two. Without the classifier's rows the map is flat at 1/2; with
    them it is 0, 0, 1, 1 along the classifier's order, so batch rows of its own 0.85 and
    0.98 map to 1/2 (linear between 0.8 and 0.9) and 1 (clipped)."""
    repaired = np.tile([0.45, 0.55], (4, 1))
    original = np.array([[0.3, 0.7], [0.2, 0.8], [0.1, 0.9], [0.05, 0.95]])
    labels = [0, 0, 1, 1]
    batch = np.tile([0.45, 0.55], (2, 1))
    batch_original = np.array([[0.15, 0.85], [0.02, 0.98]])
    ordered = lf.ReferenceProfile(min_map_rows=4).fit(repaired, labels, original)
    assert ordered.tie_break_ and ordered.map_routes_ == (lf.POOLED_MAP, lf.CLASS_MAP)
    assert ordered.estimate(batch, batch_original).cbpe == pytest.approx(0.75, abs=1e-9)
    # the prior-corrected confidence route orders the ties likewise (no shift here)
    assert ordered.estimate(batch, batch_original).prior_confidence == \
        pytest.approx(0.75, abs=1e-6)
    flat = lf.ReferenceProfile(min_map_rows=4).fit(repaired, labels)
    assert flat.estimate(batch).cbpe == pytest.approx(0.5, abs=1e-12)
    with pytest.raises(ValueError, match="fitted with the classifier's own"):
        ordered.estimate(batch)
    with pytest.raises(ValueError, match="fitted without the classifier's own"):
        flat.estimate(batch, batch_original)
    with pytest.raises(ValueError, match="original: expected 2 rows"):
        ordered.estimate(batch, original)


@settings(max_examples=100, deadline=None)
@given(labelled_rows(), st.data())
def test_one_vs_rest_maps_read_the_served_top1_and_stay_in_the_unit_interval(case, data):
    """The one-vs-rest recipe on any rows (exact 0/1, ties at the top, K = 2): each batch
    row's value is the isotonic regression of ``label == k`` on the classifier's own
    probability of class ``k`` over every reference row, read at the champion's top-1
    ``k`` (under the paper's tie rule) and its own probability of that class: the served
    decision, never another; CBPE is their mean, in [0, 1], and the predicted counts are the
    champion's."""
    from sklearn.isotonic import IsotonicRegression

    probs, labels = case
    n, k = probs.shape
    original = data.draw(probability_rows(k=k).map(lambda r: np.resize(r, (n, k))))
    profile = lf.ReferenceProfile(recipe=lf.ONE_VS_REST).fit(probs, labels, original)
    batch = data.draw(probability_rows(k=k))
    own = data.draw(probability_rows(k=k).map(lambda r: np.resize(r, batch.shape)))
    est = profile.estimate(batch, own)
    served = lf.top1(batch)
    expected = [IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip")
                .fit(original[:, c], (labels == c).astype(float)).predict([own[i, c]])[0]
                for i, c in enumerate(served)]
    assert est.cbpe == pytest.approx(np.mean(expected), abs=1e-12)
    assert 0.0 <= est.cbpe <= 1.0 and est.class_map_share == 1.0
    assert est.predicted_counts.tolist() == np.bincount(served, minlength=k).tolist()


# ---------------------------------------------------------------- arguments and refusals
def test_each_refusal_names_the_argument_it_is_about():
    """Rows that do not sum to 1, a label outside the classes, the classifier's rows of
    another width and a batch of another width: the message starts with the argument's
    own name, so the caller knows which input to fix."""
    bad = [[0.5, 0.6]]
    with pytest.raises(ValueError, match=r"^probs: row 0 sums to 1\.1"):
        lf.top1_confidence(bad)
    with pytest.raises(ValueError, match=r"^probs: row 0 sums to 1\.1"):
        lf.cbpe_accuracy(bad)
    with pytest.raises(ValueError, match=r"^probs: row 0 sums to 1\.1"):
        lf.em_priors(bad, [0.5, 0.5])
    with pytest.raises(ValueError, match=r"^probs: row 0 sums to 1\.1"):
        lf.ReferenceProfile().fit(bad, [0])
    with pytest.raises(ValueError, match=r"^labels: row 0 is 2; expected a class in \[0, 2\)"):
        lf.ReferenceProfile().fit([[0.5, 0.5]], [2])
    with pytest.raises(ValueError, match=r"^original: expected 2 classes \(columns\), got 3"):
        lf.ReferenceProfile().fit([[0.5, 0.5]], [0], [[0.5, 0.2, 0.3]])
    with pytest.raises(ValueError, match=r"^original: expected 1 rows, one per row of probs, "
                                         r"got 3$"):
        lf.ReferenceProfile().fit([[0.5, 0.5]], [0], [[0.5, 0.5]] * 3)
    for original in (None, [[0.5, 0.5]]):
        with pytest.raises(ValueError, match=r"^recipe: expected one of 'class-maps', "
                                             r"'one-vs-rest', 'auto', got 'isotonic'$"):
            lf.ReferenceProfile(recipe="isotonic").fit([[0.5, 0.5]], [0], original)
    profile = lf.ReferenceProfile().fit([[0.5, 0.5]], [0])
    with pytest.raises(ValueError, match=r"^probs: expected 2 classes \(columns\), got 3"):
        profile.estimate([[0.5, 0.2, 0.3]])
    with pytest.raises(ValueError, match=r"^probs: row 0 sums to 1\.1"):
        profile.estimate(bad)
    with_own = lf.ReferenceProfile().fit([[0.5, 0.5]], [0], [[0.5, 0.5]])
    with pytest.raises(ValueError, match=r"^original: expected 2 classes \(columns\), got 3"):
        with_own.estimate([[0.5, 0.5]], [[0.5, 0.2, 0.3]])
    for fitted, own, word in ((profile, [[0.5, 0.5]], "without"),
                              (lf.ReferenceProfile().fit([[0.5, 0.5]], [0], [[0.5, 0.5]]),
                               None, "with")):
        with pytest.raises(ValueError, match=(
                rf"^original: the reference profile was fitted {word} the classifier's own "
                r"probabilities; estimate a batch likewise$")):
            fitted.estimate([[0.5, 0.5]], own)


def test_an_unfitted_profile_says_so():
    for call in (lambda p: p.estimate([[0.5, 0.5]]), lambda p: p.prior_noise(10)):
        with pytest.raises(ValueError,
                           match=r"^ReferenceProfile: fit it on the reference split first$"):
            call(lf.ReferenceProfile())


def _em_steps(ratio: float, tol: float, max_iter: int) -> tuple[float, int]:
    """EM on a batch of identical binary rows (a, b), ratio = a / b, from source priors
    (1/2, 1/2): each step multiplies the odds of class 0 by the ratio, so after t steps the
    prior of class 0 is 1 / (1 + ratio^-t); EM stops at the first step that moves it by at
    most tol, or after max_iter steps. (The prior of class 0, the steps taken.)"""
    previous = 0.5
    for step in range(1, max_iter + 1):
        current = 1.0 / (1.0 + ratio ** -step)
        if abs(current - previous) <= tol:
            return current, step
        previous = current
    return current, max_iter


def test_the_estimate_runs_em_with_the_profiles_tolerance_and_step_limit():
    """The reference (0.6, 0.4) and (0.4, 0.6) has source priors (1/2, 1/2); a batch of
    (0.6, 0.4) rows drives class 0's prior towards 1 by odds 1.5^t (``_em_steps``): how
    far EM gets and how many steps it takes are the profile's em_tol and em_max_iter."""
    reference = np.array([[0.6, 0.4], [0.4, 0.6]])
    batch = np.tile([0.6, 0.4], (5, 1))
    for tol, max_iter in ((lf.EM_TOL, lf.EM_MAX_ITER), (1e-3, lf.EM_MAX_ITER), (1e-10, 4)):
        est = lf.ReferenceProfile(em_tol=tol, em_max_iter=max_iter).fit(
            reference, [0, 1]).estimate(batch)
        prior, steps = _em_steps(1.5, tol, max_iter)
        assert (est.em_iterations, est.em_converged) == (steps, steps < max_iter)
        assert est.priors[0] == pytest.approx(prior, abs=1e-12)
    assert steps == 4 and est.priors[0] == pytest.approx(1.5 ** 4 / (1 + 1.5 ** 4), abs=1e-12)


def test_prior_noise_resamples_every_reference_row_with_the_noise_em():
    """Two one-hot reference rows (source priors 1/2, 1/2): a resampled batch of one row
    moves the priors by 1/2 whichever row it is; a batch of two differing rows is the
    reference's mix and moves them by 0, which some of the 32 seeded draws are (row 0
    among them). Rows (0.6, 0.4) and (0.4, 0.6): a batch of one drives the priors towards
    (1, 0) or (0, 1) at odds 1.5^t, as far as the noise EM's looser stop lets it
    (``_em_steps``); and rows (0.5005, 0.4995) and the mirror, odds 1.001^t, stop at the
    noise EM's step limit. Seeded by ``seed`` (0 by default)."""
    one_hot = lf.ReferenceProfile().fit([[1.0, 0.0], [0.0, 1.0]], [0, 1])
    assert one_hot.prior_noise(1, quantile=0.0) == 0.5
    assert one_hot.prior_noise(2, quantile=0.0) == 0.0
    slow = lf.ReferenceProfile().fit([[0.6, 0.4], [0.4, 0.6]], [0, 1])
    prior, steps = _em_steps(1.5, lf.NOISE_TOL, lf.NOISE_MAX_ITER)
    assert slow.prior_noise(1, quantile=0.0) == pytest.approx(prior - 0.5, abs=1e-12)
    assert 10 < steps < lf.NOISE_MAX_ITER
    a, b = 0.5005, 0.4995
    slower = lf.ReferenceProfile().fit([[a, b], [b, a]], [0, 1])
    prior, steps = _em_steps(a / b, lf.NOISE_TOL, lf.NOISE_MAX_ITER)
    assert steps == lf.NOISE_MAX_ITER
    assert slower.prior_noise(1, draws=2) == pytest.approx(prior - 0.5, abs=1e-9)
    rng = np.random.default_rng(2)
    probs = softmax(rng.normal(size=(200, 3)) * 2, axis=1)
    profile = lf.ReferenceProfile().fit(probs, probs.argmax(axis=1))
    again = lf.ReferenceProfile().fit(probs, probs.argmax(axis=1))
    assert profile.prior_noise(20) == again.prior_noise(20) == again.prior_noise(20, seed=0)
    assert profile.prior_noise(20, seed=1) != profile.prior_noise(20)


def test_settings_and_inputs_out_of_range_are_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^min_map_rows: expected a number >= 1, got 0$"):
        lf.ReferenceProfile(min_map_rows=0).fit([[0.5, 0.5]], [0])
    lf.ReferenceProfile(min_map_rows=1).fit([[0.5, 0.5]], [0])  # 1 is allowed
    for tol, max_iter in ((0.0, 5), (-1e-10, 5), (1e-10, 0)):
        with pytest.raises(ValueError, match=(
                r"^em_tol, em_max_iter: expected em_tol > 0 and em_max_iter >= 1, got "
                rf"{tol!r}, {max_iter!r}$")):
            lf.ReferenceProfile(em_tol=tol, em_max_iter=max_iter).fit([[0.5, 0.5]], [0])
        with pytest.raises(ValueError, match=(
                r"^tol, max_iter: expected tol > 0 and max_iter >= 1, got "
                rf"{tol!r}, {max_iter!r}$")):
            lf.em_priors([[0.5, 0.5]], [0.5, 0.5], tol, max_iter)
    lf.ReferenceProfile(em_tol=1e-300, em_max_iter=1).fit([[0.5, 0.5]], [0])
    assert lf.em_priors([[1.0, 0.0]] * 3, [0.5, 0.5], max_iter=1) == (
        pytest.approx([1.0, 0.0]), 1, False)
    with pytest.raises(ValueError, match=(
            r"^confidence, correct: expected two \(n,\) arrays with n >= 1, got shapes "
            r"\(1, 1\) and \(1,\)$")):
        lf.atc_threshold([[0.5]], [True])
    assert lf.atc_threshold([0.7], [True]) == 0.7  # one row is enough
    assert lf.atc_threshold([0.9, 0.6], [1, 0]) == 0.9  # correctness as 0/1 integers
    with pytest.raises(ValueError, match=r"^confidence, correct: expected two \(n,\) arrays"):
        lf.atc_threshold([[0.5]], [[True]])
    with pytest.raises(ValueError, match=(
            r"^counts: expected two non-empty count vectors of one length >= 2, got shape "
            r"\(2, 2\)$")):
        lf.chi2_predicted([0, 0], [1, 2])
    assert lf.chi2_predicted([1, 0], [0, 1]).statistic == pytest.approx(2.0, abs=1e-12)
    # priors: the message shows them to 4 digits, nine or more of them summarised
    with pytest.raises(ValueError, match=(
            r"^pri: expected 2 non-negative priors summing to 1, got \[0\.3333 0\.8   \]$")):
        lf.check_priors([1 / 3, 0.8], 2, "pri")
    with pytest.raises(ValueError, match=(
            r"^pri: expected 9 non-negative priors summing to 1, got "
            r"\[0\.2 0\.2 0\.2 \.\.\. 0\.2 0\.2 0\.2\]$")):
        lf.check_priors([0.2] * 9, 9, "pri")
    for priors, k in (([math.nan, 1.0], 2), ([math.inf, 0.0], 2), ([-0.5, 1.5], 2),
                      ([0.5, 0.5], 3), ([[0.5, 0.5]], 2)):
        with pytest.raises(ValueError, match=rf"^pri: expected {k} non-negative priors"):
            lf.check_priors(priors, k, "pri")
    with pytest.raises(ValueError, match=r"^confidence, correct: expected two \(n,\) arrays "
                                         r"with n >= 1, got shapes \(2,\) and \(1,\)$"):
        lf.atc_threshold([0.5, 0.6], [True])
    with pytest.raises(ValueError, match=r"^pri: expected 8 non-negative priors summing to 1, "
                                         r"got \[0\.2 0\.2 0\.2 0\.2 0\.2 0\.2 0\.2 0\.2\]$"):
        lf.check_priors([0.2] * 8, 8, "pri")


def test_priors_within_the_sum_tolerance_are_renormalised():
    # 0.5 + (0.5 + 5e-7) is within 1e-6 of 1, and comes back divided by its sum
    pi = lf.check_priors([0.5, 0.5 + 5e-7], 2, "pri")
    assert pi.sum() == pytest.approx(1.0, abs=1e-15)
    assert pi[0] == pytest.approx(0.5 / (1.0 + 5e-7), abs=1e-15)
    with pytest.raises(ValueError, match="^pri: "):
        lf.check_priors([0.5, 0.5 + 2e-6], 2, "pri")
    # float32 priors are renormalised in float64: thirds of float32 sum to 1 within 1e-6
    thirds = np.full(3, 1 / 3, dtype=np.float32)
    as_float64 = thirds.astype(np.float64)
    assert lf.check_priors(thirds, 3, "pri").tolist() == \
        pytest.approx((as_float64 / as_float64.sum()).tolist(), abs=1e-16)


def test_em_stops_at_the_first_step_that_moves_no_prior_by_more_than_the_tolerance():
    # rows sure of class 0 from (1/2, 1/2): the first step moves the prior by exactly 1/2
    assert lf.em_priors([[1.0, 0.0]] * 3, [0.5, 0.5], tol=0.5) == (
        pytest.approx([1.0, 0.0]), 1, True)
    assert lf.em_priors([[1.0, 0.0]] * 3, [0.5, 0.5], tol=0.4999) == (
        pytest.approx([1.0, 0.0]), 2, True)


def test_zero_source_priors_and_rows_the_weights_empty():
    """A class of source prior 0 gets weight 0 (not 1) even where rows hold probability of
    it; a row the weights send to zero everywhere stays as it was; equal weights give the
    rows back bit for bit (no renormalisation's rounding), whatever the weight."""
    assert lf.prior_weights([0.5, 0.5, 0.0], [0.25, 0.75, 0.0]).tolist() == [0.5, 1.5, 0.0]
    assert lf.prior_weights([0.5, 0.5], [1, 0]).tolist() == [2.0, 0.0]  # integer priors
    assert lf.reweighted(np.array([[1.0]]), np.array([2.0])).tolist() == [[1.0]]  # one class
    rows = np.array([[0.2, 0.2, 0.6], [0.1, 0.3, 0.6]])
    assert lf.reweighted(rows, lf.prior_weights([0.5, 0.5, 0.0], [0.5, 0.5, 0.0])) == \
        pytest.approx(np.array([[0.5, 0.5, 0.0], [0.25, 0.75, 0.0]]), abs=1e-15)
    got = lf.reweighted(np.array([[0.0, 1.0], [0.5, 0.5]]), np.array([1.0, 0.0]))
    assert got.tolist() == [[0.0, 1.0], [1.0, 0.0]]
    # 0.7 + 0.2 + 0.1 is not 1 in floating point: a renormalisation would move the rows
    uneven = np.array([[0.7, 0.2, 0.1], [0.6, 0.3, 0.1]])
    assert uneven[0].sum() != 1.0
    for weight in (0.5, 1.0, 3.0):
        assert np.array_equal(lf.reweighted(uneven, np.full(3, weight)), uneven)


def test_a_decreasing_reliability_is_not_read_as_one():
    """Reference confidences 0.6 and 0.7 right, 0.8 and 0.9 wrong: the increasing isotonic
    fit pools all four at 1/2, so every batch confidence maps to 1/2 (a fit free to
    decrease would map 0.65 to 1 and 0.85 to 0)."""
    c = np.array([0.6, 0.7, 0.8, 0.9])
    profile = lf.ReferenceProfile().fit(np.column_stack([c, 1 - c]), [0, 0, 1, 1])
    batch = np.array([[0.65, 0.35], [0.85, 0.15]])
    assert profile.estimate(batch).cbpe == pytest.approx(0.5, abs=1e-15)
    assert profile.maps_.predict([0, 0], [0.65, 0.85]).tolist() == pytest.approx([0.5, 0.5])


def test_a_class_without_reference_labels_has_zero_accuracy_and_mapped_confidence():
    probs = np.array([[0.7, 0.2, 0.1], [0.2, 0.7, 0.1], [0.6, 0.3, 0.1], [0.3, 0.6, 0.1]])
    profile = lf.ReferenceProfile().fit(probs, [0, 1, 1, 1])
    assert profile.label_counts_.tolist() == [1, 3, 0]
    assert profile.label_priors_.tolist() == [0.25, 0.75, 0.0]
    assert profile.predicted_counts_.tolist() == [2, 2, 0]
    assert profile.class_accuracy_.tolist() == pytest.approx([1.0, 2 / 3, 0.0], abs=1e-15)
    assert profile.class_cbpe_[2] == 0.0 and profile.class_cbpe_var_[2] == 0.0


def test_a_class_at_exactly_the_share_floor_needs_its_reference_rows():
    """One label of class 1 among 200 reference rows: its share is 1/200, exactly
    SHARE_FLOOR, so its single row keeps the reweighted route out (confidence route); among
    201 rows it is below the floor and the reweighted route is taken. Each batch is its
    own reference (no label shift, gap 0)."""
    assert 1 / 200 == lf.SHARE_FLOOR
    rng = np.random.default_rng(0)
    for n, route in ((200, "confidence"), (201, "reweighted")):
        positive = rng.uniform(0.0, 0.4, n)
        probs = np.column_stack([1 - positive, positive])
        labels = np.zeros(n, dtype=np.int64)
        labels[0] = 1
        est = lf.ReferenceProfile().fit(probs, labels).estimate(probs)
        assert est.label_shift_gap <= est.label_shift_tolerance
        assert est.prior_method == route


def test_recipes_that_predict_equally_well_keep_the_class_maps():
    """Identical rows all predicting class 0: each fold's class map and class 0's
    one-vs-rest map are both the training rows' share of label 0, so the held-out Brier
    scores are equal and the tie goes to the class maps."""
    rows = np.tile([0.7, 0.3], (100, 1))
    labels = np.random.default_rng(1).integers(0, 2, 100)
    profile = lf.ReferenceProfile().fit(rows, labels, rows)
    assert profile.recipe_brier_[lf.CLASS_MAPS] == profile.recipe_brier_[lf.ONE_VS_REST]
    assert profile.recipe_ == lf.CLASS_MAPS


def test_the_recipe_brier_scores_are_those_of_five_shuffled_folds():
    """The held-out Brier score of each recipe, recomputed with scikit-learn's KFold (5,
    shuffled, seed 0) and IsotonicRegression directly: class maps of the champion's top-1
    confidence (plus TIE_BREAK times the classifier's own probability of it) per predicted
    class (min_map_rows 1: every class its own map), and per class the one-vs-rest map of
    the classifier's own probability."""
    from sklearn.isotonic import IsotonicRegression
    from sklearn.model_selection import KFold

    def iso(x, y):
        return IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip").fit(x, y)

    rng = np.random.default_rng(9)
    own, probs, labels = _informative_and_noise(rng, 150)
    profile = lf.ReferenceProfile(min_map_rows=1).fit(probs, labels, own)
    n = len(labels)
    predicted = probs.argmax(axis=1)
    correct = (predicted == labels).astype(float)
    read = probs[np.arange(n), predicted] + lf.TIE_BREAK * own[np.arange(n), predicted]
    maps, ovr = np.empty(n), np.empty(n)
    for train, test in KFold(5, shuffle=True, random_state=0).split(probs):
        for k in range(2):
            fit_rows, rows = train[predicted[train] == k], test[predicted[test] == k]
            maps[rows] = iso(read[fit_rows], correct[fit_rows]).predict(read[rows])
            ovr[rows] = iso(own[train, k], labels[train] == k).predict(own[rows, k])
    assert profile.recipe_brier_ == pytest.approx(
        {lf.CLASS_MAPS: np.mean((maps - correct) ** 2),
         lf.ONE_VS_REST: np.mean((ovr - correct) ** 2)}, abs=1e-12)


def test_the_reweighted_route_hand_checked():
    """Reference: (1, 0) twice, labelled 0 and 0; (0, 1) twice, labelled 1 and 0. Source
    priors (1/2, 1/2), label counts (3, 1), class accuracies 2/3 and 1. A batch of three
    (1, 0) rows and one (0, 1): EM's priors are (3/4, 1/4), the weights (3/2, 1/2), the
    label shares (3 x 3/2, 1 x 1/2) / 5 = (9/10, 1/10), the reweighted accuracy
    9/10 x 2/3 + 1/10 x 1 = 7/10 (the reference's own label shares would give 3/4)."""
    reference = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0]])
    profile = lf.ReferenceProfile().fit(reference, [0, 0, 1, 0])
    assert profile.class_accuracy_ == pytest.approx([2 / 3, 1.0], abs=1e-15)
    est = profile.estimate(reference[[0, 1, 0, 2]])
    assert est.priors == pytest.approx([0.75, 0.25], abs=1e-15)
    assert est.prior_reweighted == pytest.approx(0.7, abs=1e-12)
    # every other figure: one map pooled over the four rows (all at confidence 1, 3 of 4
    # right), so every row maps to 3/4 with no spread (tolerance = the floor); the ATC
    # threshold is the second smallest confidence, 1; chi-squared of [[2, 2], [3, 1]]
    # (expected 2.5 and 1.5 per row) is 2 (1/4 / 2.5 + 1/4 / 1.5) = 8/15, one degree of
    # freedom; too few labelled rows per class for the reweighted route
    assert est._replace(priors=None, prior_reweighted=None, drift=None) == lf.Estimates(
        n=4, cbpe=pytest.approx(0.75, abs=1e-15), class_map_share=0.0,
        map_routes=(lf.POOLED_MAP, lf.POOLED_MAP), atc=1.0, doc=0.75,
        prior_corrected=pytest.approx(0.75, abs=1e-15), prior_method="confidence",
        prior_confidence=pytest.approx(0.75, abs=1e-15), prior_reweighted=None,
        label_shift_gap=pytest.approx(0.0, abs=1e-15),
        label_shift_tolerance=pytest.approx(lf.LABEL_SHIFT_FLOOR, abs=1e-15), priors=None,
        em_iterations=2, em_converged=True, prior_shift=pytest.approx(0.25, abs=1e-15),
        mean_confidence=1.0, predicted_counts=pytest.approx([3, 1]), drift=None,
        recipe=lf.CLASS_MAPS)
    assert est.drift == (("ks", 0.0, 1.0), ("chi2", pytest.approx(8 / 15, rel=1e-12),
                                              pytest.approx(math.erfc(math.sqrt(4 / 15)),
                                                            rel=1e-9)))


def test_no_labelled_class_left_by_the_shift_means_the_confidence_route():
    """Reference rows predicting class 0, all labelled 1 (so the map of class 0 is 0); a
    batch of rows sure of class 0: EM's priors (1, 0) leave class 1, the only labelled
    class, no share. The label shares are all 0, so there is no reweighted reference
    accuracy to take: the confidence route (CBPE 0, no gap)."""
    reference = np.array([[0.8, 0.2], [0.9, 0.1], [0.7, 0.3]])
    profile = lf.ReferenceProfile().fit(reference, [1, 1, 1])
    est = profile.estimate(np.tile([1.0, 0.0], (2, 1)))
    assert est.priors.tolist() == [1.0, 0.0]
    assert est.cbpe == 0.0 and est.label_shift_gap == 0.0
    assert est.prior_method == "confidence"


def test_maps_are_fitted_in_float64_whatever_the_scores_dtype():
    """Scores 0.25, 0.5 (three rows, one of them right) and 0.75 (right), handed over as
    float32: the map at 0.5 is 1/3 in float64 (a float32 fit would hold 0.33333334)."""
    scores = np.array([0.25, 0.5, 0.5, 0.5, 0.75], dtype=np.float32)
    right = np.array([0, 0, 1, 0, 1])
    maps = lf.ConfidenceMaps(min_rows=1).fit(np.zeros(5, np.int64), scores, right, 1)
    assert maps.predict([0, 0, 0], [0.5, 0.125, 0.625]).tolist() == \
        pytest.approx([1 / 3, 0.0, 2 / 3], abs=1e-15)
    ovr = lf.OneVsRestMaps().fit(np.column_stack([scores, 1 - scores]), 1 - right, 2)
    assert ovr.predict([0, 0], [0.5, 0.875]).tolist() == pytest.approx([1 / 3, 1.0], abs=1e-15)
    # read at float32 confidences, and with the predicted classes given as floats (as a
    # file of class indices may hold them), the values are the same float64 figures
    assert maps.predict(np.zeros(2), np.array([0.5, 0.625], np.float32)).tolist() == \
        pytest.approx([1 / 3, 2 / 3], abs=1e-15)
    floats = lf.ConfidenceMaps(min_rows=1).fit(np.zeros(5), scores, right, 1)
    assert floats.predict([0.0], [0.5]).tolist() == pytest.approx([1 / 3], abs=1e-15)


def test_doc_averages_float32_confidences_in_float64():
    tiny = 2.0 ** -24  # in float32, 1 + tiny rounds back to 1
    confidence = np.array([1.0, tiny, tiny], dtype=np.float32)
    assert lf.doc_accuracy(0.0, 0.0, confidence) == pytest.approx((1 + 2 * tiny) / 3,
                                                                   abs=1e-15)


def test_atc_compares_float32_confidences_in_float64():
    """A float32 confidence a hair (1e-12) below the threshold is below it (compared in
    float32, the threshold would round onto it)."""
    confidence = np.array([0.3], dtype=np.float32)
    assert lf.atc_accuracy(float(confidence[0]) + 1e-12, confidence) == 0.0
    assert lf.atc_accuracy(float(confidence[0]), confidence) == 1.0


def test_label_shares_hand_checked_at_small_totals_and_integer_priors():
    # one labelled row of class 0, weight 1/2: the shares are still renormalised to (1, 0)
    assert lf.label_shares([1, 0], [0.5, 0.5], [0.25, 0.75]).tolist() == [1.0, 0.0]
    # target priors given as integers (1, 0): weights (4, 0)
    assert lf.reweighted_accuracy([100, 300], [0.9, 0.5], [0.25, 0.75], [1, 0]) == \
        pytest.approx(0.9, abs=1e-15)


def test_negative_counts_and_a_single_class_are_refused():
    for reference, counts, shape in (([2, -1], [1, 2], r"\(2, 2\)"), ([5], [3], r"\(2, 1\)")):
        with pytest.raises(ValueError, match=rf"^counts: expected two non-empty count vectors "
                                             rf"of one length >= 2, got shape {shape}$"):
            lf.chi2_predicted(reference, counts)
