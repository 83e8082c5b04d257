"""Statistics of the reproduction tables against hand-computed and known cases."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from scipy import stats

from flows.reproduce import stats as rs

finite = st.floats(-10.0, 10.0, allow_nan=False, allow_infinity=False)


def test_holm_on_a_known_vector():
    # sorted: .005 .01 .03 .04 -> x4 x3 x2 x1 = .02 .03 .06 .04 -> running max .02 .03 .06 .06
    adjusted = rs.holm_adjust([0.01, 0.04, 0.03, 0.005])
    np.testing.assert_allclose(adjusted, [0.03, 0.06, 0.06, 0.02])


def test_holm_caps_at_one_and_keeps_a_single_p_value():
    np.testing.assert_allclose(rs.holm_adjust([0.5, 0.6]), [1.0, 1.0])
    np.testing.assert_allclose(rs.holm_adjust([0.2]), [0.2])


@given(arrays(np.float64, st.integers(1, 30), elements=st.floats(0.0, 1.0)))
def test_holm_is_monotone_and_between_raw_and_bonferroni(p):
    adjusted = rs.holm_adjust(p)
    assert np.all(adjusted >= p - 1e-15)
    assert np.all(adjusted <= np.minimum(1.0, p.size * p) + 1e-15)
    order = np.argsort(p, kind="stable")
    assert np.all(np.diff(adjusted[order]) >= -1e-15)


def test_holm_rejects_bad_p_values():
    with pytest.raises(ValueError, match="p_values"):
        rs.holm_adjust([0.1, 1.5])


def test_bootstrap_of_two_pairs_matches_the_exact_resampling_distribution():
    # differences 0 and 1: resampled means are 0, .5, 1 with probabilities 1/4, 1/2, 1/4,
    # so the 2.5% and 97.5% percentiles are 0 and 1 and the estimate is 0.5
    ci = rs.paired_bootstrap_ci([1.0, 3.0], [1.0, 2.0], n_resamples=20_000)
    assert ci.mean == 0.5
    assert (ci.low, ci.high) == (0.0, 1.0)
    assert ci.level == 0.95


def test_bootstrap_of_constant_differences_is_a_point():
    ci = rs.paired_bootstrap_ci(np.full(7, 2.5), np.full(7, 0.5))
    assert ci.mean == ci.low == ci.high == pytest.approx(2.0)


@settings(max_examples=40, deadline=None)
@given(arrays(np.float64, st.integers(2, 40), elements=finite),
       arrays(np.float64, 40, elements=finite), st.integers(1, 12))
def test_bootstrap_ci_contains_the_mean_and_widens_with_more_intervals(base, other, m):
    repaired = other[: base.size]
    single = rs.paired_bootstrap_ci(base, repaired, n_resamples=2000, seed=3)
    family = rs.paired_bootstrap_ci(base, repaired, n_resamples=2000, seed=3, n_intervals=m)
    mean = float(np.mean(base - repaired))
    assert single.mean == pytest.approx(mean, abs=1e-12)
    assert family.low - 1e-9 <= mean <= family.high + 1e-9
    assert family.low <= single.low + 1e-12 and family.high >= single.high - 1e-12
    assert family.level == pytest.approx(1.0 - 0.05 / m)


def test_bootstrap_covers_the_true_mean_at_about_the_nominal_rate():
    rng = np.random.default_rng(7)
    hits = 0
    for i in range(200):
        diff = rng.normal(1.0, 2.0, size=40)
        ci = rs.paired_bootstrap_ci(diff, np.zeros(40), n_resamples=1000, seed=i)
        hits += ci.low <= 1.0 <= ci.high
    assert 0.88 <= hits / 200 <= 0.99


def test_bootstrap_rejects_unpaired_or_non_finite_input():
    with pytest.raises(ValueError, match="equal length"):
        rs.paired_bootstrap_ci([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="pair 1"):
        rs.paired_bootstrap_ci([1.0, np.nan], [1.0, 2.0])


def test_paired_test_matches_scipy_and_handles_all_zero_differences():
    rng = np.random.default_rng(0)
    base = rng.normal(size=25) + 0.4
    cord = rng.normal(size=25)
    expected = stats.wilcoxon(base - cord, alternative="greater").pvalue
    assert rs.paired_test(base, cord) == pytest.approx(expected)
    assert rs.paired_test(np.ones(5), np.ones(5)) == 1.0
    # a clear reduction in every pair is significant; the reverse direction is not
    assert rs.paired_test(np.arange(10) + 1.0, np.arange(10.0)) < 0.01
    assert rs.paired_test(np.arange(10.0), np.arange(10) + 1.0) > 0.9


def test_stars_follow_the_paper_thresholds():
    assert [rs.significance_stars(p) for p in (0.0005, 0.005, 0.03, 0.2)] == \
        ["***", "**", "*", ""]


def test_agreement_on_a_known_pair():
    out = rs.agreement([1.0, 2.0, 3.0], [1.5, 2.0, 2.5])
    assert out["n"] == 3
    assert out["mean_abs_diff"] == pytest.approx(1.0 / 3.0)
    assert out["pearson_r"] == pytest.approx(1.0)
    assert np.isnan(rs.agreement([1.0, 1.0], [0.0, 2.0])["pearson_r"])


def test_mean_interval_uses_student_t():
    mean, low, high = rs.mean_interval([1.0, 2.0, 3.0])
    half = stats.t.ppf(0.975, 2) * 1.0 / np.sqrt(3.0)
    assert (mean, low, high) == pytest.approx((2.0, 2.0 - half, 2.0 + half))
    assert rs.mean_interval([4.0]) == (4.0, 4.0, 4.0)
