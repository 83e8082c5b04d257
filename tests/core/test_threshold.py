"""CORD at an operator's decision threshold (cord_ops.threshold).

The decision at t is class 1 where p1 > t (ties to class 0), written here as the plain
comparison, not through the code under test; the repair in the reweighted space is checked
against the paper's independent transcription (tests/core/cord_reference.py) run on rows
reweighted by hand.
"""

from __future__ import annotations

import corpus
import numpy as np
import pytest
from core import cord_reference as ref
from hypothesis import given, settings
from hypothesis import strategies as st

from cord_ops import CORD, metrics
from cord_ops.threshold import (
    check_threshold,
    decisions,
    from_decision_space,
    to_decision_space,
)

THRESHOLDS = st.one_of(st.sampled_from([0.1, 0.8, 0.05, 0.95, 0.3]),
                       st.floats(0.01, 0.99, allow_nan=False))


def _by_comparison(probs: np.ndarray, t: float) -> np.ndarray:
    """1[(1 - t) p1 > t p0]: class 1 iff p1 > t for rows summing to 1."""
    return ((1 - t) * probs[:, 1] > t * probs[:, 0]).astype(np.int64)


@st.composite
def pairs(draw):
    """(original, calibrated) binary rows with the corpus's pathologies (exact 0 and 1,
    ties, float32 rows off the simplex, saturated rows)."""
    n = draw(st.integers(2, 40))
    return (draw(corpus.probability_rows(k=2, n_rows=(n, n))),
            draw(corpus.probability_rows(k=2, n_rows=(n, n))))


@settings(max_examples=200, deadline=None)
@given(rows=pairs(), t=THRESHOLDS)
def test_no_decision_at_t_is_ever_flipped(rows, t):
    original, calibrated = rows
    repair = CORD(decision_threshold=t).fit(original, calibrated)
    repaired = repair.transform(original, calibrated)
    np.testing.assert_array_equal(decisions(repaired, t), decisions(original, t))
    # the strategy's float32 rows miss 1 by up to ~1e-7 and a kept row is returned as given
    # (at t = 1/2 nothing is reweighted): each row is as close to 1 as its inputs, no further
    given = np.maximum(np.abs(original.sum(axis=1) - 1), np.abs(calibrated.sum(axis=1) - 1))
    assert np.all(np.abs(repaired.sum(axis=1) - 1) <= given + 1e-12)
    assert metrics.tpcr(original, repaired, t) == 0.0


@settings(max_examples=100, deadline=None)
@given(rows=pairs(), t=THRESHOLDS)
def test_the_decision_is_p1_above_t(rows, t):
    probs = rows[0]
    # away from rounding at t itself, the reweighted argmax is the comparison
    clear = np.abs(probs[:, 1] - t) > 1e-12
    np.testing.assert_array_equal(decisions(probs, t)[clear], _by_comparison(probs, t)[clear])


@settings(max_examples=100, deadline=None)
@given(rows=pairs())
def test_threshold_one_half_is_the_papers_cord_bit_for_bit(rows):
    original, calibrated = rows
    plain = CORD().fit(original, calibrated)
    half = CORD(decision_threshold=0.5).fit(original, calibrated)
    assert half.eta_ == plain.eta_
    assert np.array_equal(half.transform(original, calibrated),
                          plain.transform(original, calibrated))
    np.testing.assert_array_equal(decisions(original, 0.5), np.argmax(original, axis=1))


@pytest.mark.parametrize("t", [0.1, 0.8])
def test_the_repair_is_the_papers_cord_on_rows_reweighted_by_hand(t):
    rng = np.random.default_rng(44)
    original = rng.dirichlet([1.0, 1.0], 60)
    calibrated = np.clip(original + rng.normal(0, 0.2, original.shape), 0.01, None)
    calibrated /= calibrated.sum(axis=1, keepdims=True)
    w = np.array([t, 1 - t])
    p0w = original * w / (original * w).sum(axis=1, keepdims=True)
    qw = calibrated * w / (calibrated * w).sum(axis=1, keepdims=True)
    eta, _ = ref.fit(p0w.tolist(), qw.tolist())
    back = np.array(ref.transform(eta, p0w.tolist(), qw.tolist())) / w
    expected = back / back.sum(axis=1, keepdims=True)
    repair = CORD(decision_threshold=t).fit(original, calibrated)
    assert abs(repair.eta_ - eta) <= 1e-9 * (1 + abs(eta))
    np.testing.assert_allclose(repair.transform(original, calibrated), expected, atol=1e-9)
    # rows the calibrator moved across t are pinned just on the classifier's side of t
    crossed = _by_comparison(calibrated, t) != _by_comparison(original, t)
    assert crossed.sum() >= 3
    repaired = repair.transform(original, calibrated)
    assert np.all(_by_comparison(repaired, t) == _by_comparison(original, t))


def test_without_a_threshold_the_decision_is_the_argmax_and_nothing_is_reweighted():
    rows = np.array([[0.5, 0.5], [0.3, 0.7], [0.9, 0.1], [0.4, 0.6]], dtype=np.float32)
    assert decisions(rows).tolist() == [0, 1, 0, 1]
    assert to_decision_space(rows, None) is rows and from_decision_space(rows, None) is rows
    # the weights, by hand: (t, 1 - t) forward, (1 - t, t) back
    forward = to_decision_space(rows, 0.25)
    expected = rows * np.array([0.25, 0.75])
    np.testing.assert_allclose(forward, expected / expected.sum(axis=1, keepdims=True),
                               rtol=1e-7)
    np.testing.assert_allclose(from_decision_space(forward, 0.25), rows, rtol=1e-6)
    assert decisions(rows, 0.25).tolist() == [1, 1, 0, 1]
    assert decisions(rows, 0.65).tolist() == [0, 1, 0, 0]


def test_the_threshold_is_saved_and_only_when_given():
    rng = np.random.default_rng(1)
    p = rng.dirichlet([1.0, 1.0], 20)
    state = CORD(decision_threshold=0.1).fit(p, p[:, ::-1]).to_dict()
    assert state["decision_threshold"] == 0.1
    restored = CORD.from_dict(state)
    assert restored.decision_threshold == 0.1
    assert "decision_threshold" not in CORD().fit(p, p[:, ::-1]).to_dict()
    assert CORD.from_dict(CORD().fit(p, p).to_dict()).decision_threshold is None


@pytest.mark.parametrize("bad, message", [
    (0.0, "decision_threshold: expected a number in (0, 1), got 0.0"),
    (1.0, "decision_threshold: expected a number in (0, 1), got 1.0"),
    (float("nan"), "decision_threshold: expected a number in (0, 1), got nan"),
    ("0.1", "decision_threshold: expected a number in (0, 1), got '0.1'"),
    (True, "decision_threshold: expected a number in (0, 1), got True"),
])
def test_a_bad_threshold_is_refused_naming_it(bad, message):
    with pytest.raises(ValueError) as raised:
        check_threshold(bad)
    assert str(raised.value) == message
    with pytest.raises(ValueError):
        CORD(decision_threshold=bad).fit(np.full((2, 2), 0.5), np.full((2, 2), 0.5))


def test_a_threshold_is_a_binary_models():
    p = np.full((3, 3), 1 / 3)
    with pytest.raises(ValueError, match=r"decision_threshold: a binary model's \(K = 2\); "
                                         r"this one has K = 3"):
        CORD(decision_threshold=0.2).fit(p, p)
