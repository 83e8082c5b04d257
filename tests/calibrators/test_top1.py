"""TS and IRM keep every row's top-1 class (ties by the smallest index, np.argmax)."""

from __future__ import annotations

import warnings

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from cord_ops.calibrators import (
    CALIBRATOR_NAMES,
    TOP1_PRESERVING,
    ConvergenceWarning,
    make_calibrator,
)
from cord_ops.softmax import softmax
from cord_ops.validation import top1


@st.composite
def calibration_and_eval(draw):
    k = draw(st.integers(2, 8))
    n = draw(st.integers(2, 40))
    values = st.floats(-30, 30, allow_nan=False, allow_infinity=False, width=64)
    cal = draw(arrays(np.float64, (n, k), elements=values))
    labels = draw(arrays(np.int64, (n,), elements=st.integers(0, k - 1)))
    scale = draw(st.sampled_from([0.01, 1.0, 5.0]))
    ev = draw(arrays(np.float64, (draw(st.integers(1, 40)), k), elements=values)) * scale
    return cal, labels, ev


def _assert_top1_kept(original, q, margin):
    a = top1(original)
    # Rounding may at most tie the top class with another, never put one above it ...
    assert np.all(q[np.arange(q.shape[0]), a] >= q.max(axis=1) - 1e-15)
    # ... and where every entry below the top value is clear of it, the top-1 stays exactly
    # (entries tied at the top stay tied, so argmax keeps their smallest index).
    top = original.max(axis=1, keepdims=True)
    below = np.where(original < top, original, -np.inf).max(axis=1)
    keep = top[:, 0] - below > margin
    assert np.array_equal(top1(q)[keep], a[keep])


@settings(max_examples=60, deadline=None)
@given(calibration_and_eval())
def test_temperature_scaling_keeps_top1(data):
    cal, labels, ev = data
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # random labels may hit a bound
        ts = make_calibrator("ts").fit(cal, labels)
    _assert_top1_kept(ev, ts.predict_proba(ev), margin=1e-9 * (1 + np.abs(ev).max()))


@settings(max_examples=60, deadline=None)
@given(calibration_and_eval())
def test_irm_keeps_top1(data):
    cal, labels, ev = data
    irm = make_calibrator("irm").fit(cal, labels)
    # g is flat between knots, so only the 1e-9 p term separates two entries there; it
    # resolves probability gaps above about 1e-7 (float64 spacing near 1 / 1e-9).
    p = softmax(ev)
    _assert_top1_kept(p, irm.predict_proba(ev), margin=1e-6)


def test_top1_preserving_lists_exactly_the_maps_that_kept_every_decision():
    """On a classifier that over-predicts class 0, every map that may change decisions
    does change some (it learns the bias), and exactly the TOP1_PRESERVING ones change
    none: the list is a measured property, not a label."""
    rng = np.random.default_rng(0)
    n, k = 600, 5
    labels = rng.integers(0, k, n)
    logits = rng.normal(size=(n, k)) * 1.5
    logits[np.arange(n), labels] += 2.0
    logits[:, 0] += 1.5  # the bias a calibrator corrects, flipping decisions
    logits *= 2.5
    kept = set()
    for name in CALIBRATOR_NAMES:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            q = make_calibrator(name).fit(logits[:300], labels[:300]).predict_proba(logits[300:])
        if np.array_equal(top1(q), top1(logits[300:])):
            kept.add(name)
    assert kept == set(TOP1_PRESERVING)
