"""Binary models as production runs them, on the corpus's rare-positives models
(tests/corpus.py ``rare_binary``: 1-3 % positives, one score column, float32 and float64):
one column within its rounding, the rarer-class evidence rule, and what the repair did.

Expected values come from numpy on the stored arrays (the flips of the calibrator, a rank
formula for the AUC), never from the functions under test.
"""

from __future__ import annotations

import warnings

import corpus
import numpy as np
import pytest
from scipy.stats import rankdata

from cord_ops import CORD, metrics
from cord_ops.calibrators import make_calibrator
from cord_ops.validation import stored_scores
from flows.promotion import rules

PERCENTS = ("1", "2", "2.8", "3")
F32_EPS = float(np.finfo(np.float32).eps)


def _auc(labels: np.ndarray, score: np.ndarray) -> float:
    """Mann-Whitney: mean rank of the positives, ties sharing their mean rank."""
    ranks = rankdata(score)
    pos = labels == 1
    n_pos, n_neg = pos.sum(), (~pos).sum()
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


# ---------------------------------------------------------------- one column, its rounding
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_rare_positive_column_over_one_by_rounding_has_the_two_column_nll(dtype):
    e = corpus.rare_binary("2", dtype=dtype)
    column = e.eval_scores[:, 0].copy()
    top = int(np.argmax(column))
    column[top] = np.float32(1) + 10 * F32_EPS  # 1.0000011920928955, as the file
    column[int(np.argmin(column))] = -F32_EPS
    one = stored_scores(column, "probs", "p")
    # the same model logged as two columns: [1 - p, p] with the producer's own 1 - p,
    # which for p > 1 is the row [0, p]; renormalised by the loader
    two_rows = np.stack([np.maximum(np.asarray(1, dtype) - column, 0), np.maximum(column, 0)],
                        axis=1)
    two = stored_scores(two_rows, "probs", "p")
    assert one.scores[top].tolist() == [0.0, 1.0] == two.scores[top].tolist()
    assert one.sum_error == pytest.approx(10 * F32_EPS, rel=1e-6) and one.sum_error_row == top
    # other rows differ by the producer's rounding of 1 - p only
    y = e.eval_labels
    assert metrics.nll(one.scores, y) == pytest.approx(metrics.nll(two.scores, y), rel=1e-6)


# ---------------------------------------------------------------- the rarer-class rule
@pytest.mark.parametrize("percent", PERCENTS)
def test_rare_positives_with_enough_rows_pass_the_default_evidence_rule(percent):
    e = corpus.rare_binary(percent)
    evidence = rules.Evidence(rules.label_counts(e.cal_labels, 2),
                              rules.label_counts(e.eval_labels, 2))
    assert 30 <= min(evidence.calibration_counts) <= 90
    assert rules.evidence_problems(evidence, rules.Policy.for_classes(2)) == []
    # a class-balance rule at K = 2 would refuse every one of them
    balance_rule = rules.Policy.for_classes(2, max_class_share=0.9)
    share = max(evidence.calibration_counts) / evidence.n_calibration
    assert rules.evidence_problems(evidence, balance_rule)[0] == (
        f"class 0 holds {share:.1%} of the calibration labels (> 90%; --max-class-share)")


def test_a_single_class_or_too_few_positives_are_refused_naming_the_option():
    e = corpus.rare_binary("1")
    policy = rules.Policy.for_classes(2)
    zeros = rules.Evidence((e.cal_labels.size, 0), rules.label_counts(e.eval_labels, 2))
    assert rules.evidence_problems(zeros, policy) == [
        "class 1 has 0 of the 3000 calibration rows (< 20 needed of each class; "
        "--min-class-rows)"]
    few = e.eval_labels.copy()
    few[np.flatnonzero(few == 1)[19:]] = 0  # 19 positives left
    evidence = rules.Evidence(rules.label_counts(e.cal_labels, 2), rules.label_counts(few, 2))
    assert rules.evidence_problems(evidence, policy) == [
        "class 1 has 19 of the 3000 evaluation rows (< 20 needed of each class; "
        "--min-class-rows)"]


# ---------------------------------------------------------------- what the repair did
def _fitted(percent: str, model: str, kind: str, name: str):
    e = corpus.rare_binary(percent, model, kind=kind, columns=2)
    cal = corpus.original_probs(e.cal_scores, kind)
    ev = corpus.original_probs(e.eval_scores, kind)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        calibrator = make_calibrator(name, input_kind=kind).fit(
            e.cal_scores.astype(np.float64), e.cal_labels)
    repair = CORD().fit(cal, calibrator.predict_proba(e.cal_scores.astype(np.float64)))
    base = calibrator.predict_proba(e.eval_scores.astype(np.float64))
    return e, ev, base, repair.transform(ev, base)


@pytest.mark.parametrize("percent", ["1", "2.8"])
@pytest.mark.parametrize("kind", ["probs", "logits"])
def test_a_repair_that_flattens_the_flipped_rows_is_measured_and_warned(percent, kind):
    # a fraud model trained with balanced class weights flags far more rows than are
    # positive; VS pulls them below 1/2 and CORD pins every one at min I = 1/2 + 1e-12
    e, uncal, base, repaired = _fitted(percent, "logreg_balanced", kind, "vs")
    flipped = np.argmax(base, axis=1) != np.argmax(uncal, axis=1)
    assert flipped.mean() > 0.05
    effect = metrics.repair_effect(uncal, base, repaired, e.eval_labels)
    pinned = np.abs(repaired[:, 0] - repaired[:, 1]) <= 1e-6
    assert effect["boundary_share"] == pinned.mean() >= flipped.mean()
    assert effect["flat_value"] == 0.5 + 1e-12
    assert effect["flat_share"] == np.mean(repaired.max(axis=1) == 0.5 + 1e-12)
    assert effect["moved_share"] == np.mean(np.abs(repaired - base).max(axis=1) > 1e-6)
    for name, probs in (("uncal", uncal), ("base", base), ("cord", repaired)):
        assert effect[f"auc_{name}"] == pytest.approx(_auc(e.eval_labels, probs[:, 1]),
                                                      abs=1e-12)
    assert effect["auc_cord"] < effect["auc_base"] - 0.005  # the ties cost ranking
    warning = metrics.flat_warning(effect)
    assert warning.startswith(f"FlatRepairWarning: CORD repaired {effect['flat_share']:.1%} "
                              "of the outputs to one value (0.500000000001)")
    assert warning.endswith("a top-1-preserving calibrator (ts, irm) never needs the repair")
    assert metrics.flat_warning(effect, 0.1).endswith(
        "a monotone map (ts) keeps the ranking and needs the repair less")
    assert metrics.flat_warning({**effect, "flat_share": 0.01}) is None  # 1 % is allowed


@pytest.mark.parametrize("name", ["ts", "irm"])
def test_a_map_that_keeps_the_ranking_moves_nothing_onto_the_boundary(name):
    e, uncal, base, repaired = _fitted("2.8", "logreg_balanced", "logits", name)
    effect = metrics.repair_effect(uncal, base, repaired, e.eval_labels)
    assert (effect["moved_share"], effect["boundary_share"], effect["flat_share"]) == (
        0.0, 0.0, 0.0)
    if name == "ts":  # irm's plateaus are ties the repair's sub-1e-6 moves may reorder
        assert effect["auc_cord"] == effect["auc_base"] == effect["auc_uncal"]
    assert metrics.flat_warning(effect) is None


def test_tree_leaves_moved_alike_are_not_counted_as_flattened():
    # the same calibrated value on several rows (leaves) repaired alike: not the repair's
    original = np.array([[0.8, 0.2], [0.8, 0.2], [0.8, 0.2], [0.3, 0.7]])
    calibrated = np.array([[0.9, 0.1], [0.9, 0.1], [0.9, 0.1], [0.4, 0.6]])
    repaired = np.array([[0.85, 0.15], [0.85, 0.15], [0.85, 0.15], [0.45, 0.55]])
    effect = metrics.repair_effect(original, calibrated, repaired, np.array([0, 0, 1, 1]))
    assert effect["moved_share"] == 1.0 and effect["flat_share"] == 0.0
    assert np.isnan(effect["flat_value"]) and effect["boundary_share"] == 0.0
    # two different calibrated rows pinned to one value: flattened
    calibrated[1] = [0.45, 0.55]
    calibrated[2] = [0.35, 0.65]
    repaired[1] = repaired[2] = [0.5 + 1e-12, 0.5 - 1e-12]
    effect = metrics.repair_effect(original, calibrated, repaired)
    assert effect["flat_share"] == 0.5 and effect["flat_value"] == 0.5 + 1e-12
    assert effect["boundary_share"] == 0.5 and "auc_cord" not in effect


# ---------------------------------------------------------------- the effect's edges
def test_repair_effect_refuses_naming_the_array():
    good = np.array([[0.6, 0.4], [0.3, 0.7]])
    bad = np.array([[1.2, -0.2], [0.3, 0.7]])
    for position, name in enumerate(("original", "calibrated", "repaired")):
        args = [good, good, good]
        args[position] = bad
        with pytest.raises(ValueError, match=rf"^{name}: row 0 has a negative entry"):
            metrics.repair_effect(*args)
    three = np.vstack([good, good[:1]])
    with pytest.raises(ValueError, match=r"^calibrated: expected 2 rows to match original, "
                                         r"got 3$"):
        metrics.repair_effect(good, three, good)
    with pytest.raises(ValueError, match=r"^repaired: expected 2 rows to match original, "
                                         r"got 3$"):
        metrics.repair_effect(good, good, three)
    with pytest.raises(ValueError, match=r"^labels: row 0 is 2; expected a class in \[0, 2\)"):
        metrics.repair_effect(good, good, good, np.array([2, 0]))


def test_a_move_of_exactly_the_tolerance_is_not_a_move():
    calibrated = np.array([[0.0, 1e-6, 1 - 1e-6], [0.2, 0.3, 0.5]])
    repaired = np.array([[1e-6, 0.0, 1 - 1e-6], [0.25, 0.3, 0.45]])
    effect = metrics.repair_effect(calibrated, calibrated, repaired)
    assert effect["moved_share"] == 0.5
    # K = 3: a moved row whose top-1 leads by 0.15 is not on the boundary
    assert effect["boundary_share"] == 0.0


def test_the_boundary_at_a_threshold_is_p1_next_to_it():
    original = np.array([[0.8, 0.2], [0.7, 0.3], [0.95, 0.05]])
    calibrated = np.array([[0.95, 0.05], [0.6, 0.4], [0.97, 0.03]])
    repaired = np.array([[0.9 - 1e-12, 0.1 + 1e-12], [0.6, 0.4], [0.96, 0.04]])
    effect = metrics.repair_effect(original, calibrated, repaired, threshold=0.1)
    assert effect["boundary_share"] == pytest.approx(1 / 3)  # rows 0 and 2 moved; row 0 at t
    assert effect["moved_share"] == pytest.approx(2 / 3)
    assert metrics.repair_effect(original, calibrated, repaired)["boundary_share"] == 0.0


def test_the_largest_group_made_one_value_is_the_one_reported():
    n = 7
    original = np.tile([0.3, 0.7], (n, 1))
    calibrated = np.array([[0.6, 0.4], [0.55, 0.45], [0.7, 0.3], [0.65, 0.35], [0.8, 0.2],
                           [0.2, 0.8], [0.2, 0.8]])
    repaired = np.array([[0.45, 0.55]] * 2 + [[0.3, 0.7]] * 3 + [[0.1, 0.9]] * 2)
    effect = metrics.repair_effect(original, calibrated, repaired)
    # 0.55 gathers 2 distinct rows, 0.7 gathers 3; 0.9 is two equal rows moved alike
    assert effect["flat_value"] == 0.7 and effect["flat_share"] == 3 / n


@pytest.mark.parametrize("labels, has_auc", [
    ([0, 0, 0, 0], False), ([1, 1, 1, 1], False), ([0, 0, 0, 1], True), ([1, 0, 1, 1], True)])
def test_the_auc_needs_both_classes(labels, has_auc):
    rows = np.array([[0.9, 0.1], [0.6, 0.4], [0.3, 0.7], [0.2, 0.8]])
    effect = metrics.repair_effect(rows, rows, rows, np.array(labels))
    assert ("auc_uncal" in effect) is has_auc and ("auc_cord" in effect) is has_auc


def test_the_flat_warning_word_for_word():
    effect = {"flat_share": 0.129, "flat_value": 0.500000000001}
    assert metrics.flat_warning(effect) == (
        "FlatRepairWarning: CORD repaired 12.9% of the outputs to one value "
        "(0.500000000001): they keep their decision but tie with each other (a ranking, a "
        "reliability bin or a monitor's threshold sees one point); a top-1-preserving "
        "calibrator (ts, irm) never needs the repair")
    assert metrics.flat_warning(effect, 0.5) == metrics.flat_warning(effect)
    assert metrics.flat_warning({}) is None


def test_accuracy_tpcr_and_changes_at_a_threshold():
    # p1: 0.05, 0.15, 0.4, 0.7 -> decisions at 0.1: 0, 1, 1, 1; argmax: 0, 0, 0, 1
    original = np.array([[0.95, 0.05], [0.85, 0.15], [0.6, 0.4], [0.3, 0.7]])
    moved = np.array([[0.85, 0.15], [0.95, 0.05], [0.6, 0.4], [0.3, 0.7]])
    y = np.array([1, 1, 1, 1])
    assert metrics.accuracy(original, y, 0.1) == 0.75
    assert metrics.accuracy(original, y) == 0.25
    assert metrics.tpcr(original, moved, 0.1) == 0.5 and metrics.tpcr(original, moved) == 0.0
    # at 0.1 row 0 goes wrong -> right, row 1 right -> wrong; the argmax moves none
    assert metrics.prediction_changes(original, moved, y, 0.1) == {
        "c_plus": 1, "c_minus": 1, "c_zero": 0}
    assert metrics.prediction_changes(original, moved, y) == {
        "c_plus": 0, "c_minus": 0, "c_zero": 0}
    report = metrics.evaluate(moved, y, reference=original, threshold=0.1)
    assert (report["accuracy"], report["tpcr"]) == (0.75, 0.5)
