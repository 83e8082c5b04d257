"""TS's bounded refit (``temperature.bounded_refit``) and the reported NLL it minimises
(``temperature.reported_nll``), as units: every expected value below is written out by
hand (a closed form or a constant of float64), not computed by the code under test.

The data sets are built so the answer is known in closed form: ``_group(n)`` is 10n rows
of logits (0, -2), 9n labelled 0 and n labelled 1. On those alone the NLL of
softmax(beta * z) is minimised where sigmoid(2 beta) = 0.9, i.e. beta = ln(9) / 2. A
"hopeless" row adds a label the logits put 40 nats below the other class: the smooth
objective charges it 40 beta for ever, the reported NLL at most -ln(eps) = 36.04 nats
(reached at beta = 0.9), so on the reported NLL the minimiser is ln(9) / 2 again while
the smooth (Newton) fit is pulled below it.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from cord_ops.calibrators import temperature

EPS = 2.220446049250313e-16            # float64 machine epsilon = PROB_FLOOR
CAP = 36.04365338911715                # -ln(EPS): the most one row can cost
LEAST = 2.220446049250313e-16          # -ln(1 - EPS): the least one row can cost
GROUP_BETA = 1.0986122886681098        # ln(9) / 2
#: The rule that a row is "at the floor": its label's log-probability at beta = 1 is at
#: most ln(EPS) + 1e-12.
AT_FLOOR = -36.04365338911615


def _group(n: int) -> tuple[list[list[float]], list[int]]:
    return [[0.0, -2.0]] * (10 * n), [0] * (9 * n) + [1] * n


def _with(row: list[float], label: int, n: int = 100) -> tuple[np.ndarray, np.ndarray]:
    z, y = _group(n)
    return np.array([*z, row]), np.array([*y, label])


# ---------------------------------------------------------------- reported_nll
def test_reported_nll_is_the_mean_log_loss_of_the_tempered_softmax():
    # softmax(2 * (0, ln 3)) = (1/10, 9/10): label 0 costs ln 10, label 1 ln(10/9)
    z = np.array([[0.0, math.log(3.0)], [0.0, math.log(3.0)]])
    assert temperature.reported_nll(z[:1], np.array([0]), 2.0) == pytest.approx(
        2.302585092994046, rel=1e-15)
    assert temperature.reported_nll(z, np.array([0, 1]), 2.0) == pytest.approx(
        (2.302585092994046 + 0.10536051565782635) / 2, rel=1e-15)


def test_reported_nll_is_clipped_at_both_ends_of_the_probability_floor():
    assert temperature.reported_nll(np.array([[0.0, 100.0]]), np.array([0]), 1.0) == CAP
    assert temperature.reported_nll(np.array([[0.0, -100.0]]), np.array([0]), 1.0) == LEAST
    # one row at each end: their mean
    both = temperature.reported_nll(np.array([[0.0, 100.0], [0.0, -100.0]]),
                                    np.array([0, 0]), 1.0)
    assert both == pytest.approx((CAP + LEAST) / 2, rel=1e-15)


def test_reported_nll_does_not_overflow_on_large_logits():
    # exp(800) overflows: only the max-shifted log-sum-exp gives ln 2 here
    assert temperature.reported_nll(np.array([[800.0, 800.0]]), np.array([1]),
                                    1.0) == pytest.approx(0.6931471805599453, rel=1e-15)
    assert temperature.reported_nll(np.array([[-800.0, -800.0 - math.log(3.0)]]),
                                    np.array([1]), 1.0) == pytest.approx(
        1.3862943611198906, rel=1e-15)  # ln 4: softmax = (3/4, 1/4)


# ---------------------------------------------------------------- bounded_refit
def test_without_a_row_at_the_floor_the_given_beta_is_returned_as_it_is():
    # 0.5 is far from this data's optimum (ln 9 / 2); with no row at the floor the refit
    # is not attempted at all
    z, y = _group(10)
    assert temperature.bounded_refit(np.array(z), np.array(y), 0.5) == 0.5
    # a row 35.5 nats down is bad but above the floor (rules out a threshold near -35)
    z, y = _with([-35.5, 0.0], 0)
    assert temperature.bounded_refit(z, y, 0.5) == 0.5


def test_a_hopeless_row_makes_the_refit_find_the_reported_nll_minimiser():
    z, y = _with([-40.0, 0.0], 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        newton = temperature.fit_inverse_temperature(z, y)
    assert newton < 1.0  # the smooth objective is pulled down by the 40 beta charge
    for start in (newton, 0.5, 3.0):
        beta = temperature.bounded_refit(z, y, start)
        assert beta == pytest.approx(GROUP_BETA, rel=1e-7), start


def test_the_floor_rule_includes_its_boundary_and_nothing_above():
    # a row (g, 0) labelled 0 has log-probability g - ln(1 + e^g) = g in float64 for
    # g <= -36 (e^g is below half an ulp of 1)
    at = temperature.bounded_refit(*_with([AT_FLOOR, 0.0], 0), 0.5)
    assert at == pytest.approx(GROUP_BETA, rel=1e-7)
    above = np.nextafter(AT_FLOOR, 0.0)
    assert temperature.bounded_refit(*_with([above, 0.0], 0), 0.5) == 0.5
    # a label probability of exactly 0 (log-probability -inf) is at the floor too
    z, y = _with([-np.inf, 0.0], 0)
    assert temperature.bounded_refit(z, y, 0.5) == pytest.approx(GROUP_BETA, rel=1e-7)


def test_the_refit_uses_each_rows_own_label():
    # the same row labelled 1 is the confident class: no row at the floor
    z, y = _with([-40.0, 0.0], 1)
    assert temperature.bounded_refit(z, y, 0.5) == 0.5


def test_a_refit_gaining_less_than_one_in_a_billion_keeps_the_given_beta():
    z, y = _with([-40.0, 0.0], 0)
    # at the closed-form minimiser any candidate the search finds gains ~0: kept bit
    # for bit; a start off by 1e-3 relative loses ~1e-7 relative: refitted
    assert temperature.bounded_refit(z, y, GROUP_BETA) == GROUP_BETA
    moved = temperature.bounded_refit(z, y, GROUP_BETA * 1.001)
    assert moved != GROUP_BETA * 1.001
    assert moved == pytest.approx(GROUP_BETA, rel=1e-7)


def test_the_refit_stays_inside_the_beta_bounds_at_both_ends():
    # labels unrelated to the logits below the hopeless row's cap: the reported NLL
    # falls all the way down to beta -> 0 (every row -> ln 2): the lower bound e^-16
    z = np.array([[0.0, -1.0], [-40.0, 0.0]])
    low = temperature.bounded_refit(z, np.array([0, 0]), 1.0)
    assert -16.0 <= math.log(low) < -16.0 + 1e-6
    # 100 rows with a correct margin of 1e-6 keep falling up to beta = e^16 (8.9 nats of
    # margin there: 1.4e-4 each) while the hopeless row is capped, (100 * 1.4e-4 + 36.04)
    # / 101 = 0.36 < ln 2 at beta -> 0: the upper bound e^16
    z = np.array([[0.0, -1e-6]] * 100 + [[-1000.0, 0.0]])
    high = temperature.bounded_refit(z, np.array([0] * 101), 1.0)
    assert 16.0 - 1e-6 < math.log(high) <= 16.0


def test_the_refit_searches_between_the_grid_points():
    # a margin of ln(9) / sqrt(e) puts the minimiser at beta = sqrt(e), log beta = 0.5:
    # midway between two points of a grid by 1 (a coarser grid's window of +-0.25 around
    # its best point would miss it), on the 0.25 grid itself
    d = math.log(9.0) / math.exp(0.5)
    z = np.array([[0.0, -d]] * 1000 + [[-40.0, 0.0]])
    y = np.array([0] * 900 + [1] * 100 + [0])
    assert temperature.bounded_refit(z, y, 0.5) == pytest.approx(1.6487212707001282, rel=1e-7)


def test_the_floor_rule_counts_every_class_of_the_row():
    # label logit 35.5 below two classes at 0: log-probability -35.5 - ln 2 = -36.19, at the
    # floor (without the log-sum over the classes it would be -35.5, above it); the third
    # class of the other rows (50 nats down) moves their optimum by ~1e-24 only
    z = np.array([[0.0, -2.0, -50.0]] * 1000 + [[-35.5, 0.0, 0.0]])
    y = np.array([0] * 900 + [1] * 100 + [0])
    assert temperature.bounded_refit(z, y, 0.5) == pytest.approx(GROUP_BETA, rel=1e-7)


# ---------------------------------------------------------------- the MSE fit of IROvA-TS
def test_the_mse_fit_has_the_closed_form_minimiser_and_stops_at_its_bound():
    # 9 of 10 rows (0, -2) labelled 0: the squared error p (1 - s)^2 + (1 - p) s^2 with
    # s = sigmoid(2 / T) is least at s = p = 0.9, i.e. 1 / T = ln(9) / 2
    z, y = _group(1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an unknown solver option would warn
        assert temperature.fit_inverse_temperature_mse(np.array(z), np.array(y)) == \
            pytest.approx(GROUP_BETA, rel=1e-8)
        # a margin of 0.01 wants T = 0.01 / ln 9 = 0.0046, below the bound 0.05: 1 / 0.05
        flat = np.array([[0.0, -0.01]] * 10)
        assert temperature.fit_inverse_temperature_mse(flat, np.array(y)) == \
            pytest.approx(20.0, rel=1e-6)


def test_ts_options_keep_their_documented_defaults_and_given_floor():
    assert temperature.TemperatureScaling().max_iter == 100
    ts = temperature.TemperatureScaling(input_kind="probs", prob_floor=1e-6)
    assert (ts.input_kind, ts.prob_floor) == ("probs", 1e-6)
