"""The knots a float32 graph stores for an isotonic map of probabilities
(``onnx_export.calibrators.for_float32_scores``): an input exactly on a knot in float64
reads that knot's value from its float32 rounding, so two classes on plateaus of the same
value stay tied as in cord_ops; every other family, and maps of logits, keep their knots."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from cord_ops.calibrators import make_calibrator
from onnx_export.calibrators import for_float32_scores
from onnx_export.interpolate import knot_tables


def _votes(k: int = 4, n: int = 400, votes: int = 10, seed: int = 0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, n)
    p = rng.multinomial(votes, np.full(k, 1.0 / k), size=n).astype(np.float64)
    p[np.arange(n), y] += votes // 2
    return p / p.sum(axis=1, keepdims=True), y


def _fit(name: str, kind: str = "probs"):
    x, y = _votes()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scores = x if kind == "probs" else np.log(np.maximum(x, 1e-3))
        return make_calibrator(name, input_kind=kind).fit(scores, y), scores


@pytest.mark.parametrize("name", ["irova", "irm"])
def test_maps_of_the_input_read_a_knot_from_its_float32_rounding(name):
    cal, x = _fit(name)
    stored = for_float32_scores(cal)
    assert stored is not cal and cal.knots_ is not stored.knots_
    for (kx, ky), (sx, sy) in zip(cal.knots_, stored.knots_, strict=True):
        np.testing.assert_array_equal(sx, kx.astype(np.float32))  # the input's rounding
        np.testing.assert_array_equal(sy, ky)
        t = kx.astype(np.float32).astype(np.float64)  # inputs on the knots, as the graph
        np.testing.assert_array_equal(np.interp(t, sx, sy), ky)  # gets them
        knot_tables([(sx, sy)])  # equal knots are accepted
    # the calibrator itself is untouched
    assert all(kx.dtype == np.float64 for kx, _ in cal.knots_)
    assert not np.array_equal(cal.knots_[0][0], cal.knots_[0][0].astype(np.float32))


def test_irova_ts_knots_read_their_value_within_the_input_rounding_of_p():
    """Each knot reads its own y on a window of half-width about |beta| eps32 x_j (how far
    a probability computed from the float32 input can be from cord_ops' float64 one),
    and the map is the original one outside the windows."""
    cal, x = _fit("irova-ts")
    stored = for_float32_scores(cal)
    eps32 = float(np.finfo(np.float32).eps)
    width = abs(float(cal.beta_)) * eps32 * (1 + 2**-10) + 2**-40
    rng = np.random.default_rng(0)
    for (kx, ky), (sx, sy) in zip(cal.knots_, stored.knots_, strict=True):
        assert len(sx) == 4 * len(kx) and np.all(np.diff(sx) >= 0.0)
        inside = kx * (1.0 + np.array([[-1.0], [1.0]]) * abs(float(cal.beta_)) * eps32)
        for t in (kx, *inside):
            np.testing.assert_array_equal(np.interp(t, sx, sy), ky)
        # never wider than the derived width, nor than a quarter of a gap (up to the
        # rounding of x_j -+ w_j)
        slack = 4.0 * np.finfo(np.float64).eps * kx
        left, right = kx - sx[::4], sx[2::4] - kx
        assert np.all(np.maximum(left, right) <= width * kx + slack)
        gaps = np.diff(kx) / 4.0
        assert np.all(right[:-1] <= gaps + slack[:-1]) and np.all(left[1:] <= gaps + slack[1:])
        # outside the windows: the original map, to rounding
        t = rng.uniform(0.0, 1.0, 2000)
        outside = np.all(np.abs(t[:, None] - kx[None, :]) > 2.0 * width * kx, axis=1)
        np.testing.assert_allclose(np.interp(t[outside], sx, sy),
                                   np.interp(t[outside], kx, ky), rtol=0, atol=1e-12)


@pytest.mark.parametrize("name, kind", [("irova", "logits"), ("irova-ts", "logits"),
                                        ("irm", "logits"), ("ts", "probs")])
def test_other_families_and_maps_of_logits_keep_their_calibrator(name, kind):
    cal, _ = _fit(name, kind)
    assert for_float32_scores(cal) is cal
