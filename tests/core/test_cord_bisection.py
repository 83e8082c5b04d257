"""CORD's bisection (eq. 22) returns, on either side of zero, the endpoint of the final
bracket on the target side: the float eta* whose mean response reaches mu while its
neighbour towards zero does not. Asserted bit for bit on both sides, and on a plateau on
either side (the set {eta : mean psi(eta) = mu} is an interval there, and eta* is its end
nearest zero, eq. 18).
"""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from cord_ops.cord_kernels import RepairTerms, multiplier_of, response
from cord_ops.cord_solve import nearest_zero_multiplier


def _terms(g, lower, upper) -> RepairTerms:
    g, lower, upper = (np.asarray(v, dtype=np.float64) for v in (g, lower, upper))
    return RepairTerms(label=None, b=g.copy(), tail=None, rest=None, lower=lower,
                       upper=upper, g=g)


def _mean(eta: float, terms: RepairTerms) -> float:
    """mean psi(eta) (eq. 16), as ``np.mean`` of the module's response sums it."""
    return float(np.mean(response(eta, terms)))


def assert_target_side_endpoint(eta: float, terms: RepairTerms, mu: float) -> None:
    """eta* is the float nearest zero on its side whose mean reaches mu: the next float
    towards zero falls short (the bracket's other end)."""
    towards_zero = np.nextafter(eta, 0.0)
    if eta > 0:
        assert _mean(eta, terms) >= mu > _mean(towards_zero, terms)
    else:
        assert _mean(eta, terms) <= mu < _mean(towards_zero, terms)


# ------------------------------------------------------------- plateaus, both sides
def test_plateau_on_the_positive_side_returns_its_end_nearest_zero():
    # Row 0 reaches its upper bound 0.6 at h0 = h(0.5, 0.6) > 0; row 1 (g below its lower
    # bound 0.5) stays at 0.5 until h1 = h(0.3, 0.5) > h0. The mean is mu = 0.55 on all of
    # [h0, h1] and below it for eta < h0.
    terms = _terms([0.5, 0.3], [0.1, 0.5], [0.6, 0.9])
    h0, h1 = multiplier_of(terms.g, terms.upper)[0], multiplier_of(terms.g, terms.lower)[1]
    mu = float(np.mean([0.6, 0.5]))
    assert 0 < h0 < h1 / 1.5
    assert _mean(0.0, terms) < mu == _mean(0.5 * (h0 + h1), terms) == _mean(h1, terms)

    eta = nearest_zero_multiplier(terms, mu)

    assert math.isclose(eta, h0, rel_tol=1e-12)
    assert_target_side_endpoint(eta, terms, mu)


def test_plateau_on_the_negative_side_returns_its_end_nearest_zero():
    # The mirror image: row 0 falls to its lower bound 0.4 at h0 = h(0.5, 0.4) < 0; row 1
    # (g above its upper bound 0.5) stays at 0.5 down to h1 = h(0.7, 0.5) < h0.
    terms = _terms([0.5, 0.7], [0.4, 0.1], [0.9, 0.5])
    h0, h1 = multiplier_of(terms.g, terms.lower)[0], multiplier_of(terms.g, terms.upper)[1]
    mu = float(np.mean([0.4, 0.5]))
    assert h1 / 1.5 < h0 < 0
    assert _mean(0.0, terms) > mu == _mean(0.5 * (h0 + h1), terms) == _mean(h1, terms)

    eta = nearest_zero_multiplier(terms, mu)

    assert math.isclose(eta, h0, rel_tol=1e-12)
    assert_target_side_endpoint(eta, terms, mu)


@st.composite
def repair_problems(draw, side: int):
    """Rows with lower < g < upper, and a mu strictly between the mean at eta = 0 and the
    attainable end on ``side`` (+1: the mean of the upper bounds, -1: of the lower)."""
    n = draw(st.integers(1, 12))

    def column(lo, hi):
        return np.array(draw(st.lists(st.floats(lo, hi), min_size=n, max_size=n)))

    g = column(0.02, 0.98)
    lower, upper = g * column(0.1, 0.9), g + (1.0 - g) * column(0.1, 0.9)
    terms = _terms(g, lower, upper)
    start = _mean(0.0, terms)
    end = float(np.mean(upper if side > 0 else lower))
    mu = start + draw(st.floats(0.01, 0.99)) * (end - start)
    return terms, mu


@settings(max_examples=60, deadline=None)
@given(repair_problems(+1))
def test_eta_above_zero_is_the_target_side_end_of_the_bracket_bit_for_bit(problem):
    terms, mu = problem
    assert _mean(0.0, terms) < mu
    eta = nearest_zero_multiplier(terms, mu)
    assert eta > 0
    assert_target_side_endpoint(eta, terms, mu)


@settings(max_examples=60, deadline=None)
@given(repair_problems(-1))
def test_eta_below_zero_is_the_target_side_end_of_the_bracket_bit_for_bit(problem):
    terms, mu = problem
    assert _mean(0.0, terms) > mu
    eta = nearest_zero_multiplier(terms, mu)
    assert eta < 0
    assert_target_side_endpoint(eta, terms, mu)


def test_a_target_met_at_zero_gives_zero():
    terms = _terms([0.5, 0.3], [0.1, 0.2], [0.9, 0.9])
    assert nearest_zero_multiplier(terms, _mean(0.0, terms)) == 0.0


