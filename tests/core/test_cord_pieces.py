"""CORD's solver (cord_solve), kernels (cord_kernels) and estimator (cord), one piece at a
time: the screen margin, the mean response, the screen, the bisection, the target mean,
the kernels bit for bit, and the estimator's records.

Expected values are written out by hand or computed here with plain numpy from the
equations (Section 3, Appendix A), never by the code under test.
"""

from __future__ import annotations

import json
import re
import warnings

import numpy as np
import pytest
from core import cord_listing as listing
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.exceptions import NotFittedError

from cord_ops import CORD, cord_kernels, minimal_repair
from cord_ops.cord_kernels import RepairTerms, interior_response, row_terms, stabilize, sweep
from cord_ops.cord_solve import _MeanResponse, bisect_multiplier, screen_margin, target_mean

U = 2.0**-53


def _terms(g, lower, upper, b=None) -> RepairTerms:
    g, lower, upper = (np.asarray(v, dtype=np.float64) for v in (g, lower, upper))
    b = g.copy() if b is None else np.asarray(b, dtype=np.float64)
    return RepairTerms(label=None, b=b, tail=None, rest=None, lower=lower, upper=upper, g=g)


def _hypot_mean(eta: float, g, lower, upper) -> float:
    """mean psi(eta) with the hypot form of R and the eta <= 1 branch (eqs. 16, 19-20)."""
    r = np.hypot(eta + (2.0 * g - 1.0), 2.0 * np.sqrt(g * (1.0 - g)))
    s = 2.0 * g / ((1.0 - eta) + r) if eta <= 1.0 else ((eta - 1.0) + r) / (2.0 * eta)
    return float(np.mean(np.clip(s, lower, upper)))


def _sqrt_mean(eta: float, g, lower, upper) -> float:
    """The same with R = sqrt(x^2 + y^2), the screen's cheaper form."""
    y = 2.0 * np.sqrt(g * (1.0 - g))
    x = eta + (2.0 * g - 1.0)
    r = np.sqrt(x * x + y * y)
    s = 2.0 * g / ((1.0 - eta) + r) if eta <= 1.0 else ((eta - 1.0) + r) / (2.0 * eta)
    return float(np.mean(np.clip(s, lower, upper)))


RNG = np.random.default_rng(9)
G = RNG.uniform(0.01, 0.99, size=257)
LOWER = G * RNG.uniform(0.2, 0.95, size=G.size)
UPPER = G + (1.0 - G) * RNG.uniform(0.05, 0.8, size=G.size)


# ------------------------------------------------------------------ screen_margin
@pytest.mark.parametrize("n, units", [(0, 190.0), (1, 190.0), (2, 198.0), (1024, 270.0)])
def test_screen_margin_is_four_times_the_stated_bound(n, units):
    # 4 (7.5 + 2 (20 + log2 max(n, 1))) u: n = 0 and 1 give log2 1 = 0, 2 gives 1, 1024
    # gives 10; every step is exact in binary64.
    assert screen_margin(n) == units * U


def test_screen_margin_at_five_thousand_rows_is_the_documented_three_e_minus_fourteen():
    expected = 4.0 * (7.5 + 2.0 * (20.0 + np.log2(5000.0))) * U
    assert screen_margin(5000) == expected
    assert 3.1e-14 < expected < 3.3e-14


# ------------------------------------------------------------------ the mean response
@pytest.mark.parametrize("eta", [-7.25, -0.5, 0.375, 0.999, 1.0, 1.5, 12.0])
def test_exact_mean_is_the_hypot_response_bit_for_bit(eta):
    mean = _MeanResponse(_terms(G, LOWER, UPPER))
    assert mean.exact(eta) == _hypot_mean(eta, G, LOWER, UPPER)


@pytest.mark.parametrize("eta", [-7.25, -0.5, 0.375, 0.999, 1.0, 1.5, 12.0])
def test_approximate_mean_is_the_sqrt_response_bit_for_bit(eta):
    mean = _MeanResponse(_terms(G, LOWER, UPPER))
    assert mean.approximate(eta) == _sqrt_mean(eta, G, LOWER, UPPER)


def test_at_eta_one_both_means_take_the_first_branch():
    # At eta = 1 both branches are sqrt(g) in exact arithmetic; in floats 2g / r and r / 2
    # differ for these rows, so only the eta <= 1 branch gives the listing's value.
    g = np.array([0.3, 0.7, 0.11, 0.52, 0.93])
    lower, upper = np.zeros(5), np.ones(5)
    r = np.hypot(2.0 * g, 2.0 * np.sqrt(g * (1.0 - g)))
    first, second = float(np.mean(2.0 * g / r)), float(np.mean(r / 2.0))
    assert first != second
    mean = _MeanResponse(_terms(g, lower, upper))
    assert mean.exact(1.0) == first


def test_exact_mean_at_zero_is_the_clipped_reference_itself():
    # psi(0) = Pi_I(g) (H(g, 0) = g): rows below, inside and above their interval.
    g = np.array([0.1, 0.3, 0.7, 0.95])
    lower, upper = np.full(4, 0.2), np.full(4, 0.9)
    mean = _MeanResponse(_terms(g, lower, upper))
    assert mean.exact(0.0) == float(np.mean([0.2, 0.3, 0.7, 0.9]))


# ------------------------------------------------------------------ the screen
def test_the_screen_answers_far_from_mu_and_stops_at_the_first_step_near_it():
    mean = _MeanResponse(_terms(G, LOWER, UPPER))
    eta = 0.375
    approx = _sqrt_mean(eta, G, LOWER, UPPER)
    margin = screen_margin(G.size)
    # far from mu: the approximate mean itself, and the screen stays on
    assert mean._screened(eta, approx + 2.0 * margin) == approx
    assert mean._screened(eta, approx - 2.0 * margin) == approx
    # within the margin (here at it exactly): no answer, and none for any later step
    assert mean._screened(eta, approx + margin) is None
    assert mean._screened(eta, approx + 2.0 * margin) is None


def test_a_step_exactly_at_the_margin_is_left_to_the_exact_mean():
    # Every row clipped to 2^-20, so the approximate mean is 2^-20 exactly; with n = 4 the
    # margin is 206 u, and 2^-20 + 206 u is exact, so |approx - mu| equals the margin.
    tiny = np.full(4, 2.0**-20)
    mean = _MeanResponse(_terms([0.3, 0.5, 0.6, 0.9], tiny, tiny))
    assert mean.margin == 206.0 * U
    assert mean.approximate(0.75) == 2.0**-20
    mu = 2.0**-20 + 206.0 * U
    assert mu - 2.0**-20 == mean.margin
    assert mean._screened(0.75, mu) is None
    assert mean.screening is False


def test_screened_decisions_are_strict_comparisons_of_the_approximate_mean():
    mean = _MeanResponse(_terms(G, LOWER, UPPER))
    eta = -0.5
    approx = _sqrt_mean(eta, G, LOWER, UPPER)
    far = 4.0 * screen_margin(G.size)
    assert mean.at_least(eta, approx - far) is True
    assert mean.at_least(eta, approx + far) is False
    assert mean.at_most(eta, approx + far) is True
    assert mean.at_most(eta, approx - far) is False
    assert mean.screening is True


def test_near_mu_the_exact_mean_decides_with_equality_counting():
    eta = 0.375
    exact = _hypot_mean(eta, G, LOWER, UPPER)
    mean = _MeanResponse(_terms(G, LOWER, UPPER))
    assert mean.at_least(eta, exact) is True
    mean = _MeanResponse(_terms(G, LOWER, UPPER))
    assert mean.at_most(eta, exact) is True
    mean = _MeanResponse(_terms(G, LOWER, UPPER))
    assert mean.at_least(eta, float(np.nextafter(exact, 1.0))) is False
    mean = _MeanResponse(_terms(G, LOWER, UPPER))
    assert mean.at_most(eta, float(np.nextafter(exact, 0.0))) is False


# ------------------------------------------------------------------ the bisection
class _Identity:
    """A stand-in mean response psi(eta) = eta, recording every midpoint asked."""

    def __init__(self):
        self.asked = []

    def exact(self, eta):
        return eta

    def at_least(self, eta, mu):
        self.asked.append(eta)
        return eta >= mu

    def at_most(self, eta, mu):
        self.asked.append(eta)
        return eta <= mu


def _never():
    raise AssertionError("this side's bracket end was asked for")


def test_positive_side_bisects_zero_to_highest_and_returns_the_first_float_reaching_mu():
    mean = _Identity()
    eta = bisect_multiplier(mean, 0.3, lambda: 0.5, _never)
    # the smallest float >= 0.3 is 0.3 itself; the probes halve [0, 0.5]
    assert eta == 0.3
    assert mean.asked[:4] == [0.25, 0.375, 0.3125, 0.28125]


def test_negative_side_bisects_lowest_to_zero_and_returns_the_first_float_reaching_mu():
    mean = _Identity()
    eta = bisect_multiplier(mean, -0.3, _never, lambda: -0.5)
    assert eta == -0.3
    assert mean.asked[:4] == [-0.25, -0.375, -0.3125, -0.28125]


def test_a_bracket_end_on_the_wrong_side_of_zero_is_clamped_to_zero():
    # max(0, highest()) / min(0, lowest()): a degenerate bracket [0, 0] returns 0 at once
    mean = _Identity()
    assert bisect_multiplier(mean, 0.3, lambda: -0.5, _never) == 0.0
    assert bisect_multiplier(mean, -0.3, _never, lambda: 0.5) == 0.0
    assert mean.asked == []


def test_a_target_met_at_zero_asks_for_no_bracket():
    mean = _Identity()
    assert bisect_multiplier(mean, 0.0, _never, _never) == 0.0
    assert mean.asked == []


@settings(max_examples=50, deadline=None)
@given(st.floats(1e-6, 0.999), st.floats(1.0, 8.0))
def test_the_bisection_ends_on_the_adjacent_float_pair_around_mu(mu, scale):
    # psi(eta) = eta: eta* is the smallest float >= mu, i.e. mu; from either side
    mean = _Identity()
    assert bisect_multiplier(mean, mu, lambda: scale, _never) == mu
    assert bisect_multiplier(mean, -mu, _never, lambda: -scale) == -mu


# ------------------------------------------------------------------ the target mean
def test_target_means_are_eq_6_and_the_ablations_projected_onto_the_mean_interval():
    g = np.array([0.2, 0.6, 0.9])
    b = np.array([0.1, 0.65, 0.99])
    lower = np.array([0.3, 0.5, 0.5])
    upper = np.array([0.8, 0.9, 0.95])
    terms = _terms(g, lower, upper, b=b)
    # inherited: mean b = 0.58 inside [mean lower, mean upper] = [0.4333.., 0.8833..]
    assert target_mean(terms, "inherited") == pytest.approx(1.74 / 3, abs=1e-15)
    assert target_mean(terms, "local") == pytest.approx(1.7 / 3, abs=1e-15)
    # pointwise: mean of Pi_I(b) = mean [0.3, 0.65, 0.95]
    assert target_mean(terms, "pointwise") == pytest.approx(1.9 / 3, abs=1e-15)


@pytest.mark.parametrize("target", ["inherited", "local", "pointwise"])
def test_target_means_outside_the_interval_are_projected_onto_its_ends(target):
    low = _terms([0.1, 0.1], [0.4, 0.6], [0.8, 0.9], b=[0.1, 0.1])
    high = _terms([0.95, 0.99], [0.4, 0.6], [0.8, 0.9], b=[0.95, 0.99])
    assert target_mean(low, target) == pytest.approx(0.5, abs=1e-15)
    assert target_mean(high, target) == pytest.approx(0.85, abs=1e-15)


# ------------------------------------------------------------------ kernels, bit for bit
def _pairs(k: int, n: int = 120, seed: int = 3):
    """p0 and q with flipped rows and boundary rows (exact zeros) in both."""
    rng = np.random.default_rng(seed + k)
    z = rng.normal(size=(n, k)) * 3.0
    p0 = np.exp(z - z.max(axis=1, keepdims=True))
    zq = z * rng.uniform(0.3, 1.5, size=k) + rng.normal(size=(n, k))
    q = np.exp(zq - zq.max(axis=1, keepdims=True))
    q[::5, -1] = 0.0
    q[1::7, :k // 2] = 0.0
    p0[2::6, -2] = 0.0
    p0 /= p0.sum(axis=1, keepdims=True)
    q /= q.sum(axis=1, keepdims=True)
    return p0, q


# 4 and 32 take the column-wise block kernel, 33 and 40 the row-wise one
@pytest.mark.parametrize("k", [4, 32, 33, 40])
@pytest.mark.parametrize("lam", [0.5, 0.2])
def test_sweep_terms_are_the_listings_bit_for_bit(k, lam):
    p0, q = _pairs(k)
    a, b, alpha, lower, upper, g = listing.terms(p0, q, lam)
    assert (q.min(axis=1) <= 0).any() and (p0.min(axis=1) <= 0).any()
    assert (np.argmax(q, axis=1) != a).any()
    terms = sweep(p0, q, lam, keep_rest=True)
    np.testing.assert_array_equal(terms.label, a)
    np.testing.assert_array_equal(terms.b, b)
    np.testing.assert_array_equal(terms.lower, lower)
    np.testing.assert_array_equal(terms.upper, np.full(len(a), 1.0 - 1e-12))
    np.testing.assert_array_equal(terms.g, g)
    qs = np.where((q <= 0).any(axis=1)[:, None], (1 - 1e-10) * q + 1e-10 / k, q)
    rest = qs.copy()
    rest[np.arange(len(a)), a] = 0.0
    np.testing.assert_array_equal(terms.rest, rest)
    np.testing.assert_array_equal(terms.tail, rest.sum(axis=1))
    np.testing.assert_array_equal(terms.changed, np.argmax(q, axis=1) != a)
    np.testing.assert_array_equal(terms.calibrated_top, np.argmax(q, axis=1))


@pytest.mark.parametrize("k", [4, 40])
def test_a_fit_keeps_no_rest_and_row_terms_keeps_it_only_when_asked(k):
    p0, q = _pairs(k)
    assert sweep(p0, q, 0.5).rest is None
    assert row_terms(p0, q, 0.5).rest is None
    assert row_terms(p0, q, 0.5, keep_rest=True).rest.shape == (len(p0), k)


@pytest.mark.parametrize("k", [4, 32, 33, 40])
@pytest.mark.parametrize("eta", [-1.5, 0.0, 0.7, 3.0, 1e14])
def test_transform_is_the_rebuilt_vector_bit_for_bit(k, eta):
    p0, q = _pairs(k)
    a, b, _, lower, upper, g = listing.terms(p0, q, 0.5)
    rows = np.arange(len(a))
    qs = np.where((q <= 0).any(axis=1)[:, None], (1 - 1e-10) * q + 1e-10 / k, q)
    rest = qs.copy()
    rest[rows, a] = 0.0
    tail = rest.sum(axis=1)
    h = _interior(eta, g)
    s = np.clip(h, lower, 1.0 - 1e-12)
    expected = rest * ((1.0 - s) / tail)[:, None]
    same = s == b
    expected[same] = qs[same]
    expected[rows, a] = s
    out = sweep(p0, q, 0.5, eta=eta).rest
    np.testing.assert_array_equal(out, expected)


def _interior(eta: float, g: np.ndarray) -> np.ndarray:
    """H(g, eta) of eqs. 19-20 with the hypot form of R; H(g, 0) = g."""
    if eta == 0.0:
        return g.copy()
    r = np.hypot(eta + (2.0 * g - 1.0), 2.0 * np.sqrt(g * (1.0 - g)))
    return 2.0 * g / ((1.0 - eta) + r) if eta <= 1.0 else ((eta - 1.0) + r) / (2.0 * eta)


@pytest.mark.parametrize("eta", [-4.0, -0.25, 0.5, 1.0, 1.0 + 2.0**-52, 6.0])
def test_interior_response_is_eqs_19_20_bit_for_bit(eta):
    np.testing.assert_array_equal(interior_response(eta, G), _interior(eta, G))


def test_interior_response_at_one_takes_the_first_branch():
    # both branches are sqrt(g) at eta = 1 in exact arithmetic, not in floats
    g = np.array([0.3, 0.7, 0.11, 0.52, 0.93])
    r = np.hypot(2.0 * g, 2.0 * np.sqrt(g * (1.0 - g)))
    assert (2.0 * g / r != r / 2.0).any()
    np.testing.assert_array_equal(interior_response(1.0, g), 2.0 * g / r)


def test_interior_response_at_zero_is_g_in_a_new_array():
    out = interior_response(0.0, G)
    np.testing.assert_array_equal(out, G)
    assert out is not G


def test_stabilize_mixes_in_delta_over_k_per_row():
    # K = 4 rows of a 2 x 4 array: the delta / K term uses the row length, not the count
    u = np.array([[1.0, 0.0, 0.0, 0.0], [0.5, 0.5, 0.0, 0.0]])
    expected = (1 - 1e-10) * u + 1e-10 / 4
    np.testing.assert_array_equal(stabilize(u), expected)
    np.testing.assert_array_equal(stabilize(u[:1]), expected[:1])


def test_on_boundary_marks_rows_with_a_zero_entry():
    u = np.array([[0.5, 0.5], [1.0, 0.0], [0.0, 1.0], [1e-300, 1.0]])
    np.testing.assert_array_equal(cord_kernels.on_boundary(u), [False, True, True, False])


# ------------------------------------------------------------------ the estimator
P0, Q = _pairs(4, n=30)


def _full(message: str) -> str:
    """A pattern matching exactly ``message`` (a mutated prefix or suffix fails)."""
    return "^" + re.escape(message) + "$"


@pytest.mark.parametrize("options, message", [
    ({"mean_target": "median"},
     "mean_target: expected one of ('inherited', 'none', 'local', 'pointwise'), got 'median'"),
    ({"mean_target": 3},
     "mean_target: expected one of ('inherited', 'none', 'local', 'pointwise'), got 3"),
    ({"local_weight": 1.5}, "local_weight: expected a number in [0, 1], got 1.5"),
    ({"local_weight": -0.0001}, "local_weight: expected a number in [0, 1], got -0.0001"),
    ({"local_weight": True}, "local_weight: expected a number in [0, 1], got True"),
    ({"local_weight": "0.5"}, "local_weight: expected a number in [0, 1], got '0.5'"),
])
def test_bad_options_get_their_whole_message(options, message):
    with pytest.raises(ValueError, match=_full(message)):
        CORD(**options).fit(P0, Q)


@pytest.mark.parametrize("weight", [0, 1, 0.0, 1.0, np.float32(0.25)])
def test_local_weight_ends_and_numpy_floats_are_accepted(weight):
    assert CORD(local_weight=weight).fit(P0, Q).n_fit_ == 30


def test_no_blocks_and_transform_before_fit_get_their_whole_message():
    with pytest.raises(ValueError, match=_full(
            "blocks: expected at least one (original, calibrated) block")):
        CORD().fit_blocks([])
    with pytest.raises(NotFittedError, match=_full(
            "CORD: call fit(original, calibrated) before transform")):
        CORD().transform(P0, Q)
    with pytest.raises(NotFittedError):
        CORD().to_dict()


def test_fitted_attributes_of_fit_and_fit_blocks():
    for model in (CORD().fit(P0, Q), CORD().fit_blocks([(P0[:10], Q[:10]), (P0[10:], Q[10:])])):
        assert (model.n_classes_, model.n_features_in_, model.n_fit_) == (4, 4, 30)
        assert type(model.eta_) is float and type(model.mu_) is float
        assert type(model.n_classes_) is int and type(model.n_fit_) is int


def test_the_none_target_fits_eta_zero_and_the_mean_of_the_clipped_reference():
    _, _, _, lower, upper, g = listing.terms(P0, Q)
    model = CORD(mean_target="none").fit(P0, Q)
    assert model.eta_ == 0.0
    assert model.mu_ == float(np.mean(np.clip(g, lower, upper)))


def test_sklearn_tags_say_positive_inputs_and_a_required_second_array():
    tags = CORD().__sklearn_tags__()
    assert tags.input_tags.positive_only is True
    assert tags.target_tags.required is True


def test_fit_transform_is_fit_then_transform():
    model = CORD(mean_target="local")
    out = model.fit_transform(P0, Q)
    np.testing.assert_array_equal(out, CORD(mean_target="local").fit(P0, Q).transform(P0, Q))
    assert model.n_fit_ == 30


def test_to_dict_is_the_whole_state_written_out():
    model = CORD(mean_target="pointwise", local_weight=0.25).fit(P0, Q)
    assert model.to_dict() == {
        "kind": "cord", "version": 1, "eta_star": model.eta_,
        "eta_star_repr": repr(model.eta_), "mu": model.mu_, "n_classes": 4, "n_fit": 30,
        "mean_target": "pointwise", "local_weight": 0.25, "eps_num": 1e-12,
        "delta_stab": 1e-10}
    assert type(model.to_dict()["local_weight"]) is float


def _state(**changes):
    state = CORD(mean_target="local", local_weight=0.3).fit(P0, Q).to_dict()
    state.update(changes)
    return state


def test_from_dict_restores_every_attribute():
    state = _state(eta_star_repr="0.125", mu="0.5", n_fit=30.0, n_classes=2)
    model = CORD.from_dict(state)
    assert (model.eta_, model.mu_, model.n_classes_, model.n_features_in_, model.n_fit_) == (
        0.125, 0.5, 2, 2, 30)
    assert type(model.mu_) is float and type(model.n_fit_) is int
    assert (model.mean_target, model.local_weight) == ("local", 0.3)


@pytest.mark.parametrize("key", ["version", "eta_star_repr", "mu", "n_classes", "n_fit",
                                 "mean_target", "local_weight", "eps_num", "delta_stab"])
def test_each_required_key_is_named_when_missing(key):
    state = _state()
    del state[key]
    with pytest.raises(ValueError, match=_full(f"CORD state: missing keys ['{key}']")):
        CORD.from_dict(state)


def test_eta_star_alone_is_not_required():
    state = _state()
    del state["eta_star"]
    assert CORD.from_dict(state).eta_ == float(state["eta_star_repr"])


@pytest.mark.parametrize("state, message", [
    ([1, 2], "CORD state: expected a dict with kind 'cord'"),
    ({"kind": "other"}, "CORD state: expected a dict with kind 'cord'"),
    ({}, "CORD state: expected a dict with kind 'cord'"),
    (_state(version=2), "CORD state: expected version 1, got 2"),
    (_state(version="1"), "CORD state: expected version 1, got '1'"),
    (_state(eps_num=1e-9), "CORD state: eps_num/delta_stab differ from this build's "
                           "constants (1e-12, 1e-10)"),
    (_state(delta_stab=1e-9), "CORD state: eps_num/delta_stab differ from this build's "
                              "constants (1e-12, 1e-10)"),
    (_state(eta_star_repr="abc"), "CORD state: eta_star_repr 'abc' is not a float"),
    (_state(eta_star_repr=None), "CORD state: eta_star_repr None is not a float"),
    (_state(eta_star_repr="inf"), "CORD state: eta_star must be finite, got inf"),
    (_state(eta_star_repr="nan"), "CORD state: eta_star must be finite, got nan"),
    (_state(n_classes=1), "CORD state: n_classes must be an integer >= 2, got 1"),
    (_state(n_classes=3.0), "CORD state: n_classes must be an integer >= 2, got 3.0"),
    (_state(mean_target="median"), "mean_target: expected one of ('inherited', 'none', "
                                   "'local', 'pointwise'), got 'median'"),
])
def test_bad_states_get_their_whole_message(state, message):
    with pytest.raises(ValueError, match=_full(message)):
        CORD.from_dict(state)


def test_save_and_load_round_trip_and_name_the_file(tmp_path):
    model = CORD(mean_target="local", local_weight=0.3).fit(P0, Q)
    path = tmp_path / "cord.json"
    model.save(path)
    assert json.loads(path.read_text()) == model.to_dict()
    loaded = CORD.load(str(path))
    assert (loaded.eta_, loaded.mu_) == (model.eta_, model.mu_)
    path.write_text('{"kind": "other"}')
    with pytest.raises(ValueError, match=_full(
            f"{path}: CORD state: expected a dict with kind 'cord'")):
        CORD.load(path)


@pytest.mark.parametrize("content", [b"{not json", b"\xff\xfe\x00", None])
def test_unreadable_state_files_are_named(tmp_path, content):
    path = tmp_path / "cord.json"
    if content is None:
        path.mkdir()  # reading a directory is an OSError
    else:
        path.write_bytes(content)
    with pytest.raises(ValueError, match="^" + re.escape(f"{path}: not a readable CORD "
                                                         "state file (") + r".+\)$"):
        CORD.load(path)


def test_minimal_repair_keeps_agreeing_rows_and_projects_b_elsewhere():
    a, b, _, lower, upper, _ = listing.terms(P0, Q)
    rows = np.arange(len(a))
    kept = np.argmax(Q, axis=1) == a
    assert kept.any() and (~kept).any()
    out = minimal_repair(P0, Q)
    np.testing.assert_array_equal(out[kept], Q[kept])
    qs = np.where((Q <= 0).any(axis=1)[:, None], (1 - 1e-10) * Q + 1e-10 / 4, Q)
    rest = qs.copy()
    rest[rows, a] = 0.0
    s = np.clip(b, lower, upper)
    expected = rest * ((1.0 - s) / rest.sum(axis=1))[:, None]
    expected[s == b] = qs[s == b]
    expected[rows, a] = s
    np.testing.assert_array_equal(out[~kept], expected[~kept])


@pytest.mark.parametrize("k", [4, 40])
def test_float32_inputs_give_the_terms_of_their_float64_values(k):
    p0, q = _pairs(k)
    p32, q32 = p0.astype(np.float32), q.astype(np.float32)
    p32 /= p32.sum(axis=1, keepdims=True)
    q32 /= q32.sum(axis=1, keepdims=True)
    got = sweep(p32, q32, 0.5, keep_rest=True)
    _, b, _, lower, _, g = listing.terms(p32.astype(np.float64), q32.astype(np.float64))
    np.testing.assert_array_equal(got.b, b)
    np.testing.assert_array_equal(got.lower, lower)
    np.testing.assert_array_equal(got.g, g)


@pytest.mark.parametrize("k", [4, 40])
@pytest.mark.parametrize("which, row, value, message", [
    ("calibrated", 7, np.nan, "calibrated: row 7 contains NaN or inf"),
    ("original", 11, -0.25, "original: row 11 has a negative entry"),
])
def test_a_bad_value_is_refused_on_either_block_kernel(k, which, row, value, message):
    p0, q = _pairs(k, n=20)
    bad = (q if which == "calibrated" else p0).copy()
    bad[row, 0] = value
    args = (p0, bad) if which == "calibrated" else (bad, q)
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        sweep(*args, 0.5)


def test_a_wrong_calibrated_width_is_named_as_the_calibrated_arrays():
    p0, q = _pairs(4, n=5)
    _, wide = _pairs(5, n=5)
    # the count check's own wording, not check_pair's "to match original"
    with pytest.raises(ValueError, match=_full("calibrated: expected 4 classes (columns), got 5")):
        sweep(p0, wide, 0.5, n_classes=4)


def test_row_terms_names_block_rows_from_zero_by_default():
    p0, q = _pairs(4, n=6)
    q[3, 0] = np.nan
    with pytest.raises(ValueError, match="^" + re.escape("calibrated: row 3 contains")):
        row_terms(p0, q, 0.5)
    with pytest.raises(ValueError, match="^" + re.escape("calibrated: row 3 contains")):
        cord_kernels.row_scalars(p0, q, 0.5)
    with pytest.raises(ValueError, match="^" + re.escape("calibrated: row 13 contains")):
        cord_kernels.row_scalars(p0, q, 0.5, first_row=10)


def test_repair_terms_and_reconstruct_at_s_equal_b_give_q_back_bit_for_bit():
    p0, q = _pairs(4)
    terms = cord_kernels.repair_terms(p0, q, 0.5)
    _, b, _, lower, _, g = listing.terms(p0, q, 0.5)
    np.testing.assert_array_equal(terms.g, g)
    qs = np.where((q <= 0).any(axis=1)[:, None], (1 - 1e-10) * q + 1e-10 / 4, q)
    np.testing.assert_array_equal(cord_kernels.reconstruct(terms, b.copy()), qs)


def test_a_subnormal_tail_overflows_silently():
    # (1 - s) / tail overflows for tail 1e-310; the rows are rebuilt another way, no warning
    model = CORD.from_dict({**CORD().fit(P0, Q).to_dict(), "eta_star_repr": "-2.0",
                            "n_classes": 2})
    p0 = np.array([[0.6, 0.4], [0.7, 0.3]])
    q = np.array([[1.0, 1e-310], [0.6, 0.4]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = model.transform(p0, q)
    assert np.isfinite(out).all()



def test_a_tail_of_a_few_subnormal_units_is_rebuilt_summing_to_one():
    # tail = 2e-322 is ~40 units of the subnormal grid: (1 - s) / tail overflows, and
    # alpha must come out as rest / tail = (1/2, 1/2), not rounded on that grid
    model = CORD.from_dict({**CORD().fit(P0, Q).to_dict(), "eta_star_repr": "-3.0",
                            "n_classes": 3})
    p0 = np.array([[0.5, 0.3, 0.2], [0.2, 0.5, 0.3]])
    q = np.array([[1.0 - 2e-322, 1e-322, 1e-322], [0.2, 0.5, 0.3]])
    out = model.transform(p0, q)
    s = out[0, 0]
    assert s < 1.0 - 1e-3  # the repair moved mass into the tail: the overflow branch ran
    assert out[0, 1] == out[0, 2] == pytest.approx((1.0 - s) / 2, rel=1e-15, abs=0)
    assert out[0].sum() == pytest.approx(1.0, rel=1e-15, abs=0)


@pytest.mark.parametrize("which", ["original", "calibrated"])
def test_rows_off_one_whose_columns_sum_to_one_are_refused(which):
    # the block check sums rows, not columns: here each column sums to 1, each row does not
    bad = np.array([[0.5, 0.6], [0.5, 0.4]])
    good = np.array([[0.7, 0.3], [0.6, 0.4]])
    args = (bad, good) if which == "original" else (good, bad)
    with pytest.raises(ValueError, match="^" + re.escape(f"{which}: row 0 sums to")):
        sweep(*args, 0.5)


def test_arrays_of_another_width_than_the_fit_are_refused_with_a_value_error():
    _, wide = _pairs(5, n=3)
    with pytest.raises(ValueError, match=_full("original: expected 4 classes (columns), got 5")):
        sweep(wide, wide, 0.5, n_classes=4)
