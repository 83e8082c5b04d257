"""cord_ops.metrics: hand-computed cases, independent reference formulas, the shared tie
rule, and parity with relplot (smECE) and scikit-learn (NLL, Brier)."""

from __future__ import annotations

import re
import subprocess
import sys
import warnings

import numpy as np
import pytest
import relplot
from conftest import load_shared, requires_shared
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from scipy.special import softmax
from sklearn.metrics import brier_score_loss, log_loss

from cord_ops import metrics

# ---------------------------------------------------------------- strategies


@st.composite
def reports(draw, max_rows: int = 60, max_classes: int = 6):
    """(probs, labels) with frequent exact ties: logits are half-integers in [-3, 3]."""
    n = draw(st.integers(1, max_rows))
    k = draw(st.integers(2, max_classes))
    steps = draw(hnp.arrays(np.int64, (n, k), elements=st.integers(-6, 6)))
    probs = softmax(steps / 2.0, axis=1)
    labels = draw(hnp.arrays(np.int64, (n,), elements=st.integers(0, k - 1)))
    return probs, labels


@st.composite
def report_pairs(draw):
    """(reference, probs, labels) of one shape."""
    probs, labels = draw(reports())
    n, k = probs.shape
    steps = draw(hnp.arrays(np.int64, (n, k), elements=st.integers(-6, 6)))
    return softmax(steps / 2.0, axis=1), probs, labels


def _conf_correct(probs, labels):
    pred = probs.argmax(axis=1)
    return probs.max(axis=1), (pred == labels).astype(float)


def _ece_reference(probs, labels, n_bins=15):
    """Guo et al.'s loop over bins (l, u] with boolean masks."""
    conf, correct = _conf_correct(probs, labels)
    edges = np.linspace(0, 1, n_bins + 1)
    total = 0.0
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        in_bin = (conf > lo) & (conf <= hi)
        if in_bin.any():
            total += in_bin.mean() * abs(correct[in_bin].mean() - conf[in_bin].mean())
    return total


def _ece_em_reference(probs, labels, n_bins=15, p=1.0):
    """Equal-mass bins built by slicing the stably sorted examples rank by rank."""
    conf, correct = _conf_correct(probs, labels)
    n = conf.size
    order = np.argsort(conf, kind="stable")
    total = 0.0
    for b in range(n_bins):
        members = [order[r] for r in range(n) if min(n_bins - 1, (r * n_bins) // n) == b]
        if members:
            gap = abs(correct[members].mean() - conf[members].mean())
            total += len(members) * gap**p
    return (total / n) ** (1 / p)


# ---------------------------------------------------------------- hand-computed cases

# conf (0.9, 0.95, 0.62, 0.55), correct (1, 0, 1, 0); no confidence on a bin edge
HAND_PROBS = np.array([[0.9, 0.1], [0.95, 0.05], [0.38, 0.62], [0.55, 0.45]])
HAND_LABELS = np.array([0, 1, 1, 1])


def test_ece_hand_computed():
    # bins (0.5, 0.75]: conf mean .585, acc .5; (0.75, 1]: conf mean .925, acc .5
    assert metrics.ece(HAND_PROBS, HAND_LABELS, n_bins=4) == pytest.approx(
        0.5 * 0.085 + 0.5 * 0.425, abs=1e-15
    )
    # with 15 bins every example has its own bin: ECE = mean |a - c|
    assert metrics.ece(HAND_PROBS, HAND_LABELS) == pytest.approx(
        (0.1 + 0.95 + 0.38 + 0.55) / 4, abs=1e-15
    )


def test_ece_bins_are_closed_on_the_right():
    # confidence exactly 0.75 belongs to (0.5, 0.75], confidence 1.0 to the last bin
    probs = np.array([[0.75, 0.25], [1.0, 0.0], [0.5, 0.5]])
    diagram = metrics.reliability_diagram(probs, np.array([0, 0, 1]), n_bins=4)
    np.testing.assert_array_equal(diagram["count"], [0, 1, 1, 1])
    assert metrics.ece(probs, np.array([0, 0, 1]), n_bins=4) == pytest.approx(
        (0.25 + 0.0 + 0.5) / 3, abs=1e-15
    )


def test_ece_em_hand_computed():
    # sorted conf .55(0) .62(1) | .9(1) .95(0): gaps .085 and .425
    assert metrics.ece_em(HAND_PROBS, HAND_LABELS, n_bins=2) == pytest.approx(0.255, abs=1e-15)
    assert metrics.ece_em(HAND_PROBS, HAND_LABELS, n_bins=2, p=2) == pytest.approx(
        np.sqrt((2 * 0.085**2 + 2 * 0.425**2) / 4), abs=1e-15
    )


def test_ece_em_splits_ties_by_row_order():
    # equal confidences: rows 0, 1 (correct) fill bin 0, rows 2, 3 (wrong) bin 1
    probs = np.full((4, 2), [0.8, 0.2])
    labels = np.array([0, 0, 1, 1])
    assert metrics.ece_em(probs, labels, n_bins=2) == pytest.approx(0.5 * 0.2 + 0.5 * 0.8)
    # one bin: the gap of the pooled means
    assert metrics.ece_em(probs, labels, n_bins=1) == pytest.approx(0.3)


def test_ece_em_with_fewer_rows_than_bins_is_mean_gap():
    probs = HAND_PROBS[:3]
    assert metrics.ece_em(probs, HAND_LABELS[:3]) == pytest.approx((0.1 + 0.95 + 0.38) / 3)


def test_nll_hand_computed_and_clip():
    probs = np.array([[0.5, 0.5], [0.2, 0.8]])
    assert metrics.nll(probs, np.array([0, 1])) == pytest.approx(-(np.log(0.5) + np.log(0.8)) / 2)
    # zero mass on the label is clipped to machine epsilon instead of giving inf
    assert metrics.nll(np.array([[1.0, 0.0]]), np.array([1])) == pytest.approx(
        -np.log(np.finfo(np.float64).eps)
    )
    # a label of probability 1 costs -log(1 - eps) = 2.2e-16, not 0: the default abs=1e-12
    # of approx would take 0 too
    eps = np.finfo(np.float64).eps
    assert metrics.nll(np.array([[1.0, 0.0]]), np.array([0])) == pytest.approx(eps, rel=1e-6,
                                                                               abs=0)
    # a top-1 a rounding above 1 (within the sum tolerance) is clipped to 1 - eps as well
    assert metrics.nll(np.array([[1.00001, 0.0]]), np.array([0])) == pytest.approx(
        eps, rel=1e-6, abs=0)


def test_brier_hand_computed():
    probs = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.0, 0.0, 1.0]])
    # rows: 0, 0.25 + 0.25, 1 + 1
    assert metrics.brier(probs, np.array([0, 0, 0])) == pytest.approx((0 + 0.5 + 2) / 3)


def test_accuracy_tpcr_and_changes_hand_computed():
    reference = np.array([
        [0.6, 0.3, 0.1],  # 0 -> 1, label 1: incorrect -> correct
        [0.5, 0.2, 0.3],  # 0 -> 2, label 0: correct -> incorrect
        [0.2, 0.5, 0.3],  # 1 -> 2, label 0: incorrect -> incorrect
        [0.7, 0.2, 0.1],  # unchanged
    ])
    probs = np.array([
        [0.3, 0.6, 0.1],
        [0.3, 0.2, 0.5],
        [0.2, 0.3, 0.5],
        [0.8, 0.1, 0.1],
    ])
    labels = np.array([1, 0, 0, 0])
    assert metrics.accuracy(reference, labels) == 0.5
    assert metrics.accuracy(probs, labels) == 0.5
    assert metrics.tpcr(reference, probs) == 0.75
    assert metrics.prediction_changes(reference, probs, labels) == {
        "c_plus": 1, "c_minus": 1, "c_zero": 1,
    }


# ---------------------------------------------------------------- tie rule


def test_ties_resolve_to_the_smallest_index_everywhere():
    tied = np.array([[0.4, 0.4, 0.2], [0.25, 0.375, 0.375]])
    assert metrics.accuracy(tied, np.array([0, 1])) == 1.0
    assert metrics.accuracy(tied, np.array([1, 2])) == 0.0
    shifted = np.array([[0.4, 0.41, 0.19], [0.25, 0.375, 0.375]])
    assert metrics.tpcr(tied, tied) == 0.0
    assert metrics.tpcr(tied, shifted) == 0.5
    assert metrics.prediction_changes(tied, shifted, np.array([1, 1])) == {
        "c_plus": 1, "c_minus": 0, "c_zero": 0,
    }
    # a uniform row is correct exactly for class 0, with confidence 1/K
    uniform = np.full((2, 4), 0.25)
    assert metrics.ece(uniform, np.array([0, 3])) == pytest.approx(abs(0.5 - 0.25))


# ---------------------------------------------------------------- properties


@settings(max_examples=80, deadline=None)
@given(reports())
def test_binned_metrics_match_reference_loops(report):
    probs, labels = report
    value = metrics.ece(probs, labels)
    assert 0.0 <= value <= 1.0
    assert value == pytest.approx(_ece_reference(probs, labels), abs=1e-12)
    assert metrics.ece(probs, labels, n_bins=7) == pytest.approx(
        _ece_reference(probs, labels, 7), abs=1e-12)
    assert metrics.ece_em(probs, labels) == pytest.approx(
        _ece_em_reference(probs, labels), abs=1e-12)
    assert metrics.ece_em(probs, labels, n_bins=4, p=2) == pytest.approx(
        _ece_em_reference(probs, labels, 4, 2.0), abs=1e-12)


@settings(max_examples=80, deadline=None)
@given(reports())
def test_reliability_diagram_is_consistent_with_ece(report):
    probs, labels = report
    diagram = metrics.reliability_diagram(probs, labels)
    assert diagram["edges"].shape == (16,)
    assert diagram["count"].sum() == labels.size
    filled = diagram["count"] > 0
    assert np.isnan(diagram["confidence"][~filled]).all()
    assert np.isnan(diagram["accuracy"][~filled]).all()
    lo, hi = diagram["edges"][:-1][filled], diagram["edges"][1:][filled]
    # a bin's mean confidence lies in the bin, up to the rounding of the mean
    mean_conf = diagram["confidence"][filled]
    assert np.all((mean_conf > lo - 1e-12) & (mean_conf <= hi + 1e-12))
    gaps = np.abs(diagram["accuracy"][filled] - diagram["confidence"][filled])
    assert np.sum(diagram["count"][filled] * gaps) / labels.size == pytest.approx(
        metrics.ece(probs, labels), abs=1e-12)


@settings(max_examples=80, deadline=None)
@given(reports())
def test_nll_brier_accuracy_match_sklearn(report):
    probs, labels = report
    k = probs.shape[1]
    assert metrics.nll(probs, labels) == pytest.approx(
        log_loss(labels, probs, labels=np.arange(k)), rel=1e-12)
    brier = metrics.brier(probs, labels)
    assert 0.0 <= brier <= 2.0
    assert brier == pytest.approx(
        brier_score_loss(labels, probs, labels=np.arange(k), scale_by_half=False), rel=1e-12)
    explicit = np.mean(np.sum((probs - np.eye(k)[labels]) ** 2, axis=1))
    assert brier == pytest.approx(explicit, rel=1e-12)
    assert metrics.accuracy(probs, labels) == np.mean(probs.argmax(axis=1) == labels)


@settings(max_examples=80, deadline=None)
@given(report_pairs())
def test_prediction_changes_decompose_tpcr_and_accuracy_change(pair):
    reference, probs, labels = pair
    n = labels.size
    assert metrics.tpcr(probs, probs) == 0.0
    changes = metrics.prediction_changes(reference, probs, labels)
    assert min(changes.values()) >= 0
    total = changes["c_plus"] + changes["c_minus"] + changes["c_zero"]
    assert total == round(metrics.tpcr(reference, probs) * n)
    accuracy_change = metrics.accuracy(probs, labels) - metrics.accuracy(reference, labels)
    assert accuracy_change == pytest.approx((changes["c_plus"] - changes["c_minus"]) / n,
                                            abs=1e-12)


@settings(max_examples=30, deadline=None)
@given(reports(max_rows=200))
def test_smece_is_in_unit_interval_and_matches_relplot(report):
    probs, labels = report
    conf, correct = relplot.multiclass_logits_to_confidences(probs, labels, probs=True)
    value = metrics.smece(probs, labels)
    assert 0.0 <= value <= 1.0
    assert value == pytest.approx(relplot.smECE(conf, correct), abs=1e-9)


# ---------------------------------------------------------------- smECE parity


def _synthetic(seed: int, n: int, k: int, temperature: float, label_noise: float):
    rng = np.random.default_rng(seed)
    probs = softmax(rng.normal(size=(n, k)) * 3 / temperature, axis=1)
    sampled = (probs.cumsum(axis=1) < rng.random((n, 1))).sum(axis=1).clip(0, k - 1)
    noisy = rng.random(n) < label_noise
    labels = np.where(noisy, rng.integers(0, k, n), sampled)
    return probs, labels


@pytest.mark.parametrize(
    ("seed", "n", "k", "temperature", "label_noise"),
    [
        (0, 10_000, 10, 1.0, 0.0),   # calibrated: small bandwidth, fine grid
        (1, 5_000, 100, 0.3, 0.0),   # overconfident
        (2, 2_000, 2, 3.0, 0.0),     # underconfident, binary
        (3, 1_000, 10, 1.0, 0.5),    # noisy labels
        (4, 50, 5, 1.0, 0.0),        # few rows
        (5, 30_000, 10, 1.0, 0.0),   # very small bandwidth
    ],
)
def test_smece_equals_relplot(seed, n, k, temperature, label_noise):
    probs, labels = _synthetic(seed, n, k, temperature, label_noise)
    conf, correct = relplot.multiclass_logits_to_confidences(probs, labels, probs=True)
    expected, expected_width = relplot.smECE(conf, correct, return_width=True)
    value, width = metrics.smece_with_width(probs, labels)
    assert width == expected_width
    assert value == pytest.approx(expected, abs=1e-9)
    assert metrics.smece(probs, labels) == value


def test_smece_edge_cases_equal_relplot():
    all_right = np.eye(3)[[0, 1, 2, 0]]
    assert metrics.smece(all_right, np.array([0, 1, 2, 0])) == 0.0
    all_wrong_value, all_wrong_width = metrics.smece_with_width(all_right, np.array([1, 2, 0, 1]))
    assert all_wrong_width == 1.0
    assert all_wrong_value == pytest.approx(
        relplot.smECE(np.ones(4), np.zeros(4)), abs=1e-12)
    assert all_wrong_value > 0.99
    # tied halves: top-1 is class 0, right half the time at confidence 0.5, so the residual
    # cancels, smECE_sigma = 0 for every sigma and bisection runs down to the last
    # bandwidth above eps = 1e-3, 2^-9
    tied = np.full((10, 2), 0.5)
    labels = np.arange(10) % 2
    value, width = metrics.smece_with_width(tied, labels)
    assert (value, width) == (0.0, 2.0**-9)
    assert value == pytest.approx(relplot.smECE(np.full(10, 0.5), 1.0 - labels), abs=1e-12)


@requires_shared
@pytest.mark.shared_data
@pytest.mark.parametrize("name", ["cifar10_resnet56", "cifar100_vgg16_bn"])
def test_smece_equals_relplot_on_real_logits(name):
    logits, labels = load_shared(name)
    conf, correct = relplot.multiclass_logits_to_confidences(logits, labels)
    probs = softmax(logits, axis=1)
    assert metrics.smece(probs, labels) == pytest.approx(relplot.smECE(conf, correct), abs=1e-9)


def test_metrics_module_does_not_import_relplot():
    code = "import sys, cord_ops.metrics; sys.exit('relplot' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_smece_at_fixed_bandwidth_equals_relplot():
    probs, labels = _synthetic(7, 3_000, 10, 0.5, 0.0)
    conf, correct = relplot.multiclass_logits_to_confidences(probs, labels, probs=True)
    for sigma in (0.003, 0.05, 0.4):
        assert metrics.smece_at(conf, correct, sigma) == pytest.approx(
            relplot.smECE_sigma(conf, correct, sigma), abs=1e-9)


# ---------------------------------------------------------------- evaluate


def test_evaluate_collects_every_metric():
    probs, labels = _synthetic(8, 500, 4, 0.5, 0.1)
    reference, _ = _synthetic(9, 500, 4, 1.0, 0.0)
    report = metrics.evaluate(probs, labels, reference=reference)
    assert report == {
        "ece": metrics.ece(probs, labels),
        "ece_em": metrics.ece_em(probs, labels),
        "smece": metrics.smece(probs, labels),
        "nll": metrics.nll(probs, labels),
        "brier": metrics.brier(probs, labels),
        "accuracy": metrics.accuracy(probs, labels),
        "tpcr": metrics.tpcr(reference, probs),
    }
    assert report["tpcr"] > 0
    assert all(type(v) is float for v in report.values())
    assert metrics.evaluate(probs, labels)["tpcr"] == 0.0


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize("metric", [
    metrics.ece, metrics.ece_em, metrics.smece, metrics.nll, metrics.brier, metrics.accuracy,
    metrics.reliability_diagram, metrics.evaluate,
])
def test_bad_inputs_are_named(metric):
    good = np.array([[0.7, 0.3], [0.2, 0.8]])
    with pytest.raises(ValueError, match=r"probs: row 1 contains NaN"):
        metric(np.array([[0.7, 0.3], [np.nan, 0.5]]), [0, 1])
    with pytest.raises(ValueError, match=r"probs: row 0 has a negative entry"):
        metric(np.array([[1.2, -0.2], [0.2, 0.8]]), [0, 1])
    with pytest.raises(ValueError, match=r"probs: row 1 sums to"):
        metric(np.array([[0.7, 0.3], [2.0, 3.0]]), [0, 1])
    with pytest.raises(ValueError, match=r"probs: expected a 2-D array"):
        metric(np.array([0.7, 0.3]), [0])
    with pytest.raises(ValueError, match=r"probs: expected K >= 2"):
        metric(np.ones((2, 1)), [0, 0])
    with pytest.raises(ValueError, match=r"labels: row 1 is .*2.*; expected a class in \[0, 2\)"):
        metric(good, [0, 2])
    with pytest.raises(ValueError, match=r"labels: expected 2 labels"):
        metric(good, [0, 1, 1])
    with pytest.raises(TypeError, match=r"probs: expected a real numeric array"):
        metric(np.array([["a", "b"]]), [0])


def test_report_pairs_must_match():
    a = np.array([[0.7, 0.3], [0.2, 0.8]])
    with pytest.raises(ValueError, match=r"probs: expected 2 rows to match reference"):
        metrics.tpcr(a, a[:1])
    with pytest.raises(ValueError, match=r"probs: expected 2 classes to match reference"):
        metrics.prediction_changes(a, np.full((2, 3), 1 / 3), [0, 1])
    with pytest.raises(ValueError, match=r"reference: row 0 sums to"):
        metrics.evaluate(a, [0, 1], reference=a * 2)


def test_bin_options_are_checked():
    a = np.array([[0.7, 0.3]])
    with pytest.raises(ValueError, match="n_bins"):
        metrics.ece(a, [0], n_bins=0)
    with pytest.raises(ValueError, match="p: expected"):
        metrics.ece_em(a, [0], p=0.5)


@pytest.mark.parametrize("metric", [metrics.ece, metrics.ece_em, metrics.reliability_diagram])
def test_n_bins_must_be_a_positive_integer_and_not_a_bool(metric):
    a = np.array([[0.7, 0.3]])
    for bad in (0, -1, True, False, 2.0, "3"):
        with pytest.raises(ValueError, match=rf"^n_bins: expected a positive integer, got "
                                             rf"{re.escape(repr(bad))}$"):
            metric(a, [0], n_bins=bad)
    # numpy integers are integers; one bin is a valid binning
    assert metrics.ece(a, [0], n_bins=np.int64(3)) == pytest.approx(0.3)
    assert metrics.ece(a, [0], n_bins=1) == pytest.approx(0.3)


def test_the_norm_order_must_be_finite_and_at_least_one():
    a = np.array([[0.7, 0.3]])
    for bad in (0.5, np.inf, np.nan, -1.0):
        with pytest.raises(ValueError, match=rf"^p: expected a finite norm order >= 1, got "
                                             rf"{re.escape(repr(bad))}$"):
            metrics.ece_em(a, [0], p=bad)
    assert metrics.ece_em(a, [0], p=1) == pytest.approx(0.3)


def test_the_compared_report_is_named_probs():
    a = np.array([[0.7, 0.3], [0.2, 0.8]])
    bad = np.array([[0.7, 0.3], [0.5, 0.8]])
    for call in (lambda: metrics.tpcr(a, bad), lambda: metrics.prediction_changes(a, bad, [0, 1])):
        with pytest.raises(ValueError, match=r"^probs: row 1 sums to 1\.3; expected rows summing "
                                             r"to 1 within 0\.0001$"):
            call()


def test_the_first_and_last_bins_are_kept_for_extreme_confidences():
    # K = 5: a uniform row has confidence 0.2, inside the first of 4 bins (0, 0.25]; a top-1
    # a rounding above 1 (row sum 1 + 1e-5, within the tolerance) belongs to the last bin
    probs = np.array([[0.2] * 5, [1.00001, 0, 0, 0, 0], [0.9, 0.1, 0, 0, 0],
                      [0.3, 0.7, 0, 0, 0]])
    labels = np.array([0, 1, 0, 1])
    diagram = metrics.reliability_diagram(probs, labels, n_bins=4)
    assert diagram["count"].dtype == np.int64
    assert diagram["count"].tolist() == [1, 0, 1, 2]
    np.testing.assert_array_equal(diagram["edges"], [0.0, 0.25, 0.5, 0.75, 1.0])
    np.testing.assert_allclose(diagram["confidence"], [0.2, np.nan, 0.7, (1.00001 + 0.9) / 2],
                               rtol=1e-15)
    np.testing.assert_array_equal(diagram["accuracy"], [1.0, np.nan, 1.0, 0.5])
    # bins: |1 - 0.2|, |1 - 0.7| and |0.5 - 0.950005| (both rows of the last bin pooled)
    expected = (0.8 + 0.3 + 2 * abs(0.5 - (1.00001 + 0.9) / 2)) / 4
    assert metrics.ece(probs, labels, n_bins=4) == pytest.approx(expected, rel=1e-12)


def test_empty_bins_are_nan_without_a_warning():
    probs = np.array([[0.9, 0.1], [0.6, 0.4]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # 0/0 in an empty bin must not warn
        diagram = metrics.reliability_diagram(probs, np.array([0, 1]), n_bins=5)
    assert diagram["count"].tolist() == [0, 0, 1, 0, 1]
    assert np.isnan(diagram["confidence"][[0, 1, 3]]).all()
    assert np.isnan(diagram["accuracy"][[0, 1, 3]]).all()


def test_smece_at_equals_relplot_for_confidences_near_zero():
    # below the first grid node's spacing (1/1000 at sigma 0.05): the grid's first interval
    rng = np.random.default_rng(3)
    conf = np.concatenate([[0.0, 1e-4, 5e-4], rng.uniform(0.0, 0.01, 40), [1.0]])
    correct = (rng.random(conf.size) < 0.5).astype(float)
    for sigma in (0.05, 0.3):
        assert metrics.smece_at(conf, correct, sigma) == pytest.approx(
            relplot.smECE_sigma(conf, correct, sigma), abs=1e-12)
