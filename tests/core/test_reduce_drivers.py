"""cord_ops.reduce's drivers one function at a time: row splits, the temperature and VS
fits from reduced sums (L-BFGS pieces) and CORD from sums. Expectations are written out,
computed here with numpy / fractions, or taken from the single-machine path. Stand-in
``reduce`` callables feed the drivers an objective with a known optimum; they are the
drivers' input, not the code under test.
"""

from __future__ import annotations

import math
import warnings
from fractions import Fraction

import numpy as np
import pytest
from core.sums_reference import (
    SCALE,
    fraction_sum,
    logit_rows,
    metrics_from,
    part_scalars,
    response_terms,
    units,
    vs_reference,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.linalg import cho_factor

from cord_ops import CORD, metrics
from cord_ops.calibrators import make_calibrator
from cord_ops.calibrators.temperature import BETA_BOUNDS, BETA_RTOL
from cord_ops.partition_sums import (
    cord_response_estimate,
    cord_response_sum,
    ts_moment_sums,
    vs_newton_sums,
    vs_value_grad_sums,
)
from cord_ops.reduce import (
    LBFGS_MEMORY,
    _halley,
    _preconditioned,
    _ReducedMean,
    _sample_factor,
    _two_loop,
    _vs_start,
    calibrator_state,
    fit_calibrator_from_sums,
    fit_cord_from_sums,
    fit_temperature,
    fit_vector,
    local_reduce,
    split_rows,
    temperature_step,
)
from cord_ops.softmax import softmax

# --------------------------------------------------------------------- reduce: split_rows


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 200), st.integers(0, 2**32 - 1), st.integers(0, 10**6),
       st.floats(0.0, 1.0))
def test_split_rows_are_the_seeded_draws(n, seed, shard, fraction):
    mask, keys = split_rows(n, seed, fraction, shard)
    rng = np.random.default_rng([seed, shard])
    u = rng.random(n)
    np.testing.assert_array_equal(mask, u < fraction)
    np.testing.assert_array_equal(keys, rng.random(n))
    assert mask.dtype == bool and mask.shape == keys.shape == (n,)


def test_split_rows_fraction_ends_and_a_draw_exactly_at_the_fraction():
    mask, _ = split_rows(500, 3, 1.0, 7)
    assert mask.all()
    mask, _ = split_rows(500, 3, 0.0, 7)
    assert not mask.any()
    u = np.random.default_rng([3, 7]).random(500)
    mask, _ = split_rows(500, 3, float(u[10]), 7)
    assert not mask[10] and mask[u < u[10]].all() and mask.sum() == np.sum(u < u[10])
    # numpy integers and the seed's own shard key give the same rows
    a, ka = split_rows(50, np.int64(3), 0.5, np.int32(7))
    b, kb = split_rows(50, 3, 0.5, 7)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(ka, kb)
    # seed and shard key are not interchangeable
    assert not np.array_equal(ka, split_rows(50, 7, 0.5, 3)[1])


# ------------------------------------------------------------------ reduce: temperature


def test_temperature_step_cases():
    assert temperature_step(2.0, (units(-1.5, 2), units(0.5, 2)), 2) == 1.5
    assert temperature_step(0.5, (units(0.25, 3), units(2.0, 3)), 3) == 0.25
    assert temperature_step(1.0, (units(1.0), 0), 1) == math.inf
    assert temperature_step(1.0, (units(1.0), units(-1.0)), 1) == math.inf
    assert temperature_step(1.0, (0, 0), 1) == 0.0
    assert temperature_step(1.0, (0, units(-1.0)), 1) == 0.0


class SlopeSums:
    """A stand-in ``reduce`` for _halley / fit_temperature: the slope g(beta) =
    log(beta / root) (increasing, g' = 1 / beta, g'' = -1 / beta^2) returned as the exact
    sums ts_moment_sums gives (mean z_y = ``zy``, one row), recording every call."""

    def __init__(self, root, zy=0.0, n=1):
        self.root, self.zy, self.n, self.calls = root, zy, n, []

    def __call__(self, fn, beta, input_kind, floor, labels=False):
        self.calls.append((fn, beta, input_kind, floor, labels))
        g = math.log(beta / self.root)
        out = (units(g + self.zy, self.n), units(1.0 / beta, self.n),
               units(-1.0 / beta**2, self.n))
        return [out + (units(self.zy, self.n),)] if labels else [out]


def _halley_iterates(beta, root, tol):
    """Halley's method on g = log(beta / root), written out: the betas it probes."""
    probes = [beta]
    while True:
        g, g1, g2 = math.log(beta / root), 1.0 / beta, -1.0 / beta**2
        new = beta - 2.0 * g * g1 / (2.0 * g1 * g1 - g * g2)
        if abs(new - beta) <= tol * beta:
            return probes, new
        beta = new
        probes.append(beta)


@pytest.mark.parametrize("start", [1.5, 2.5, 3.0])
def test_halley_probes_halley_iterates_and_returns_the_converged_step(start):
    reduce = SlopeSums(2.0, zy=0.75, n=3)
    got = _halley(reduce, 3, "logits", 1e-4, start, 100, None)
    probes, want = _halley_iterates(start, 2.0, BETA_RTOL)
    # one pass per probe, each with the label sum (labels=True)
    assert [c[1] for c in reduce.calls] == probes
    assert all(c[0] is ts_moment_sums and c[2:] == ("logits", 1e-4, True)
               for c in reduce.calls)
    assert got == want
    assert abs(got - 2.0) <= 1e-12


def test_halley_settles_at_the_given_tolerance_and_never_below_beta_rtol():
    coarse = SlopeSums(2.0)
    got = _halley(coarse, 1, "probs", 1e-3, 3.0, 100, 1e-3)
    probes, want = _halley_iterates(3.0, 2.0, 1e-3)
    assert got == want and [c[1] for c in coarse.calls] == probes
    fine = SlopeSums(2.0)
    assert _halley(fine, 1, "probs", 1e-3, 3.0, 100, 1e-30) == _halley_iterates(
        3.0, 2.0, BETA_RTOL)[1]


def test_halley_start_is_clamped_into_the_beta_bounds():
    for start, end in ((1e9, BETA_BOUNDS[1]), (1e-9, BETA_BOUNDS[0])):
        reduce = SlopeSums(2.0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _halley(reduce, 1, "logits", 1e-4, start, 1, None)
        assert reduce.calls[0][1] == end


def test_halley_replaces_a_step_with_no_positive_curvature_by_the_midpoint():
    """A slope whose curvature is 0 at the start: Halley's step is undefined (NaN), the
    bracketed iteration takes the midpoint of the bracket instead."""

    class Flat(SlopeSums):
        def __call__(self, fn, beta, input_kind, floor, labels=False):
            out = super().__call__(fn, beta, input_kind, floor, labels)
            if beta == 3.0:
                return [(out[0][0], 0, *out[0][2:])]
            return out

    reduce = Flat(2.0)
    _halley(reduce, 1, "logits", 1e-4, 3.0, 100, None)
    # g(3) > 0: the bracket is (lo, 3), more than 4 apart: its geometric midpoint
    assert reduce.calls[1][1] == math.sqrt(BETA_BOUNDS[0] * 3.0)


def test_halley_denominator_must_be_positive():
    """g g'' > 2 g'^2: the Halley denominator is negative and the step is replaced."""

    class Bent(SlopeSums):
        def __call__(self, fn, beta, input_kind, floor, labels=False):
            out = super().__call__(fn, beta, input_kind, floor, labels)
            if beta == 0.5:  # g < 0, g'' < 0 here: make g g'' > 2 g'^2
                return [(out[0][0], out[0][1], units(-100.0), *out[0][3:])]
            return out

    reduce = Bent(2.0)
    _halley(reduce, 1, "logits", 1e-4, 0.5, 100, None)
    assert reduce.calls[1][1] == math.sqrt(0.5 * BETA_BOUNDS[1])


def test_halley_with_a_zero_denominator_takes_the_midpoint():
    """g = 1/2, g' = 1/2, g'' = 1 at the start: 2 g'^2 - g g'' = 0 exactly."""

    class Zero(SlopeSums):
        def __call__(self, fn, beta, input_kind, floor, labels=False):
            out = super().__call__(fn, beta, input_kind, floor, labels)
            if beta == 3.0:
                return [(units(0.5), units(0.5), units(1.0), *out[0][3:])]
            return out

    reduce = Zero(2.0)
    _halley(reduce, 1, "logits", 1e-4, 3.0, 100, None)
    assert reduce.calls[1][1] == math.sqrt(BETA_BOUNDS[0] * 3.0)


class Creep(SlopeSums):
    """g = 1, g' = 1 / (3e-12 beta), g'' = 0 everywhere: every Halley step moves beta down
    by 3e-12 relative, just over BETA_RTOL, inside the bracket: it never converges."""

    def __call__(self, fn, beta, input_kind, floor, labels=False):
        self.calls.append((fn, beta, input_kind, floor, labels))
        out = (units(1.0), units(1.0 / (3e-12 * beta)), 0)
        return [out + (0,)] if labels else [out]


def test_fit_temperature_stops_at_its_default_max_iter():
    with pytest.warns(Warning, match=r"\(100 Halley steps, max_iter=100\)"):
        fit_temperature(Creep(1.0), 1, start=2.0)


def test_halley_stops_at_max_iter_with_the_warning():
    reduce = SlopeSums(2.0)
    with pytest.warns(Warning, match=r"^ts: optimiser stopped before convergence \(2 Halley "
                                     r"steps, max_iter=2\)"):
        _halley(reduce, 1, "logits", 1e-4, 3.0, 2, None)
    assert len(reduce.calls) == 3


def test_fit_temperature_forwards_kind_floor_and_limits():
    reduce = SlopeSums(2.0, zy=0.5, n=2)
    params, floor = fit_temperature(reduce, 2, input_kind="probs", prob_floor=1e-3, start=2.5)
    assert floor == 1e-3
    assert params["beta"] == _halley_iterates(2.5, 2.0, BETA_RTOL)[1]
    assert {c[2:4] for c in reduce.calls} == {("probs", 1e-3)}
    default = make_calibrator("ts", input_kind="probs").prob_floor
    reduce = SlopeSums(2.0)
    _, floor = fit_temperature(reduce, 1, input_kind="probs", start=2.5)
    assert floor == default and reduce.calls[0][3] == default
    reduce = SlopeSums(2.0)
    with pytest.warns(Warning, match=r"max_iter=1\b"):
        fit_temperature(reduce, 1, start=3.0, max_iter=1)


def test_fit_temperature_without_start_asks_for_the_labels_once():
    reduce = SlopeSums(2.0, zy=0.25, n=4)
    params, floor = fit_temperature(reduce, 4, input_kind="logits", prob_floor=1e-5)
    assert abs(params["beta"] - 2.0) <= 1e-11
    assert isinstance(params["beta"], float) and floor == 1e-5
    assert [c[4] for c in reduce.calls] == [True] + [False] * (len(reduce.calls) - 1)
    assert all(c[0] is ts_moment_sums and c[2:4] == ("logits", 1e-5) for c in reduce.calls)
    reduce = SlopeSums(2.0)
    with pytest.warns(Warning, match=r"^ts: optimiser stopped before convergence \(2 "
                                     r"Newton/bisection steps, max_iter=2\);"):
        fit_temperature(reduce, 1, max_iter=2)


def test_fit_temperature_on_rows_matches_the_in_memory_fit_for_probabilities():
    z, y = logit_rows(9, 2000, 5)
    p = softmax(z)
    ref = make_calibrator("ts", input_kind="probs").fit(p, y)
    parts = [{"scores": p[:700], "labels": y[:700]}, {"scores": p[700:], "labels": y[700:]}]
    for start in (None, ref.beta_ * 1.05):
        params, floor = fit_temperature(local_reduce(parts), 2000, input_kind="probs",
                                        start=start)
        assert floor == ref.prob_floor
        assert abs(params["beta"] - ref.beta_) <= 1e-10 * ref.beta_


# --------------------------------------------------------------- reduce: VS, L-BFGS pieces


def _bfgs_inverse(h0_inv, pairs):
    """The L-BFGS inverse Hessian, written as its matrix recursion (oldest pair first):
    H <- (I - rho s y^T) H (I - rho y s^T) + rho s s^T."""
    h = h0_inv.copy()
    eye = np.eye(h.shape[0])
    for s, y in pairs:
        rho = 1.0 / (y @ s)
        h = (eye - rho * np.outer(s, y)) @ h @ (eye - rho * np.outer(y, s)) + rho * np.outer(s, s)
    return h


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(0, 3))
def test_two_loop_is_the_lbfgs_inverse_hessian_product(seed, n_pairs):
    rng = np.random.default_rng(seed)
    d = 6
    m = rng.normal(size=(d, d))
    b0 = m @ m.T + d * np.eye(d)
    pairs = []
    for _ in range(n_pairs):
        s = rng.normal(size=d)
        y = b0 @ s + 0.1 * rng.normal(size=d)
        pairs.append((s, y if y @ s > 0 else -y))
    grad = rng.normal(size=d)
    before = grad.copy()
    memory = [(s, y, 1.0 / float(y @ s)) for s, y in pairs]
    got = _two_loop(grad, memory, cho_factor(b0))
    np.testing.assert_allclose(got, _bfgs_inverse(np.linalg.inv(b0), pairs) @ grad,
                               rtol=1e-9, atol=1e-12)
    np.testing.assert_array_equal(grad, before)


class Quadratic:
    """A stand-in ``reduce`` for _preconditioned: f(theta) = 1/2 d^T A d + c^T exp(d),
    d = theta - target (theta raveled, rows (w_k, b_k)), as partition sums of n rows
    (value and gradient times n, split over two partitions), recording every call."""

    def __init__(self, a, target, n=4, c=None):
        self.a, self.target, self.n, self.calls = a, target, n, []
        self.c = np.zeros(target.size) if c is None else c

    def value_grad(self, theta):
        d = theta.ravel() - self.target
        e = np.exp(d)
        return 0.5 * d @ self.a @ d + self.c @ e, self.a @ d + self.c * e

    def __call__(self, fn, w, b, input_kind, floor):
        self.calls.append((fn, input_kind, floor))
        f, grad = self.value_grad(np.column_stack([w, b]))
        half = grad.reshape(-1, 2) * (self.n / 2)
        return [(f * self.n / 2, half), (f * self.n / 2, half)]


def _spd(seed, d):
    m = np.random.default_rng(seed).normal(size=(d, d))
    return m @ m.T + 0.5 * np.eye(d)


def _lbfgs_reference(f, theta, h0_inv, max_iter, gtol, memory=LBFGS_MEMORY):
    """L-BFGS with Armijo backtracking (c = 1e-4, halving from t = 1), the inverse Hessian
    built as a matrix from the last ``memory`` pairs: (theta, steps)."""
    x = theta.ravel().copy()
    loss, grad = f(x)
    pairs = []
    for it in range(1, max_iter + 1):
        if np.max(np.abs(grad)) <= gtol:
            return x, it - 1
        step = -_bfgs_inverse(h0_inv, pairs[-memory:]) @ grad
        t, slope = 1.0, grad @ step
        while True:
            new_loss, new_grad = f(x + t * step)
            if new_loss <= loss + 1e-4 * t * slope:
                break
            t *= 0.5
        s, y = t * step, new_grad - grad
        if y @ s > 1e-12 * np.linalg.norm(s) * np.linalg.norm(y):
            pairs.append((s, y))
        x, loss, grad = x + s, new_loss, new_grad
    return x, max_iter


def test_preconditioned_with_the_exact_hessian_takes_one_newton_step():
    a = _spd(1, 6)
    target = np.linspace(-1.0, 1.0, 6)
    reduce = Quadratic(a, target)
    theta0 = np.zeros((3, 2))
    theta, passes, converged, message = _preconditioned(reduce, 4, theta0, cho_factor(a),
                                                        "probs", 1e-3, 50, 1e-8)
    np.testing.assert_allclose(theta.ravel(), target, atol=1e-12)
    assert (passes, converged, message) == (1, True, "gradient below gtol")
    assert len(reduce.calls) == 2  # the start, then one line-search trial at t = 1
    assert all(c == (vs_value_grad_sums, "probs", 1e-3) for c in reduce.calls)
    np.testing.assert_array_equal(theta0, 0.0)


def test_preconditioned_at_the_optimum_takes_no_step():
    a = _spd(2, 4)
    reduce = Quadratic(a, np.zeros(4))
    theta = np.zeros((2, 2))
    got = _preconditioned(reduce, 4, theta, cho_factor(a), "logits", 1e-4, 50, 0.0)
    assert got[1:] == (0, True, "gradient below gtol") and got[0] is theta
    assert len(reduce.calls) == 1


def test_preconditioned_stops_at_a_gradient_of_exactly_gtol():
    """f = 1/2 |d|^2 with d = theta - target: the gradient at 0 is -target exactly."""
    target = np.array([0.25, -0.125, 0.0, 0.0])
    reduce = Quadratic(np.eye(4), target)
    got = _preconditioned(reduce, 4, np.zeros((2, 2)), cho_factor(np.eye(4)), "logits", 1e-4,
                          50, 0.25)
    assert got[1:] == (0, True, "gradient below gtol")


@pytest.mark.parametrize("seed", [3, 5])
def test_preconditioned_follows_lbfgs_from_a_poor_preconditioner(seed):
    """The identity as the initial inverse Hessian on an ill-conditioned objective (not
    quadratic): the same steps and iterate as L-BFGS written as matrices, past the
    10-pair memory."""
    d = 12
    a = _spd(seed, d) + np.diag(np.linspace(0.0, 5.0, d))
    target = np.random.default_rng(seed).normal(size=d)
    c = np.full(d, 0.5)
    reduce = Quadratic(a, target, c=c)
    theta0 = np.zeros((d // 2, 2))
    theta, passes, converged, message = _preconditioned(reduce, 4, theta0,
                                                        cho_factor(np.eye(d)), "logits",
                                                        1e-4, 200, 1e-5)
    want, steps = _lbfgs_reference(reduce.value_grad, theta0, np.eye(d), 200, 1e-5)
    assert steps > LBFGS_MEMORY + 2
    assert (passes, converged, message) == (steps, True, "gradient below gtol")
    np.testing.assert_allclose(theta.ravel(), want, atol=1e-8)
    assert np.max(np.abs(reduce.value_grad(theta)[1])) <= 1e-5


def test_preconditioned_stops_at_max_iter():
    d = 8
    a = _spd(5, d) + np.diag(np.linspace(0.0, 30.0, d))
    target = np.ones(d)
    reduce = Quadratic(a, target)
    got = _preconditioned(reduce, 4, np.zeros((4, 2)), cho_factor(np.eye(d)), "logits", 1e-4,
                          3, 1e-12)
    want, steps = _lbfgs_reference(reduce.value_grad, np.zeros(d), np.eye(d), 3, 1e-12)
    assert got[1:] == (3, False, "max_iter reached")
    np.testing.assert_allclose(got[0].ravel(), want, atol=1e-12)
    exact = _preconditioned(Quadratic(a, target), 4, np.zeros((4, 2)), cho_factor(a),
                            "logits", 1e-4, 1, 1e-8)
    assert exact[1:] == (1, True, "gradient below gtol")


class Rising:
    """A stand-in whose value rises everywhere off the start (the gradient says down):
    the line search stalls."""

    def __init__(self, grad):
        self.grad, self.calls = grad, 0

    def __call__(self, fn, w, b, input_kind, floor):
        self.calls += 1
        at_start = not np.any(w) and not np.any(b)
        return [(0.0 if at_start else 1e-300, np.full((w.size, 2), self.grad))]


@pytest.mark.parametrize("grad, converged", [(5 * 2.0**-20, True), (10 * 2.0**-20, True),
                                             (11 * 2.0**-20, False)])
def test_preconditioned_line_search_stalls_after_40_halvings(grad, converged):
    reduce = Rising(grad)
    theta0 = np.zeros((2, 2))
    got = _preconditioned(reduce, 1, theta0, cho_factor(np.eye(4)), "logits", 1e-4, 50, 2.0**-20)
    assert got[1:] == (1, converged, "line search stalled") and got[0] is theta0
    assert reduce.calls == 41


class Flat:
    """A stand-in whose value falls by ``drop`` per step from ``loss``: a decrease at
    float64 resolution ends the fit."""

    def __init__(self, loss, drop):
        self.loss, self.drop, self.calls = loss, drop, 0

    def __call__(self, fn, w, b, input_kind, floor):
        value = self.loss - self.drop * self.calls
        self.calls += 1
        return [(value, np.full((w.size, 2), 1e-9))]


FLAT = (1, True, "objective decrease at float64 resolution")
NOT_FLAT = (2, False, "max_iter reached")


@pytest.mark.parametrize("loss, drop, expected", [
    (0.5, 5e-16, FLAT), (0.5, 1.5e-15, NOT_FLAT),  # below 1: 1e-15 absolute
    (8.0, 4e-15, FLAT), (8.0, 1.6e-14, NOT_FLAT),  # above: 1e-15 relative
    (-8.0, 4e-15, FLAT), (-8.0, 1.6e-14, NOT_FLAT)])
def test_preconditioned_stops_on_a_decrease_at_float64_resolution(loss, drop, expected):
    reduce = Flat(loss, drop)
    got = _preconditioned(reduce, 1, np.zeros((2, 2)), cho_factor(np.eye(4)), "logits", 1e-4,
                          2, 1e-12)
    assert got[1:] == expected


class Dip:
    """A stand-in with value ``start`` at theta0 = 0, ``value(theta)`` elsewhere and the
    constant gradient ``grad`` (sums of n rows), recording every theta it is asked at."""

    def __init__(self, grad, value, start=0.0, n=1):
        self.grad, self.value, self.start, self.n, self.thetas = grad, value, start, n, []

    def __call__(self, fn, w, b, input_kind, floor):
        theta = np.column_stack([w, b])
        self.thetas.append(theta)
        f = self.start if not np.any(theta) else self.value(theta)
        return [(f * self.n, np.asarray(self.grad, dtype=np.float64).reshape(-1, 2) * self.n)]


def test_preconditioned_falls_back_to_the_gradient_when_the_slope_underflows():
    """A preconditioner of 1e-308 (cho_factor of 1e308 I) and a gradient of 1e-10: the
    L-BFGS slope -g H g underflows to -0.0, not a descent direction, so the step is -g
    with the slope -|g|^2 (the Armijo test at t = 1 accepts a decrease of 1e-10)."""
    g = np.array([[1e-10, 2e-10]])
    reduce = Dip(g, lambda theta: -1e-10)
    got = _preconditioned(reduce, 1, np.zeros((1, 2)), cho_factor(1e308 * np.eye(2)),
                          "logits", 1e-4, 1, 1e-12)
    np.testing.assert_array_equal(got[0], -g)
    assert got[1:] == (1, False, "max_iter reached")
    # a rise of 1e-30 is refused at every t: the fallback's slope is negative
    reduce = Dip(g, lambda theta: 1e-30)
    got = _preconditioned(reduce, 1, np.zeros((1, 2)), cho_factor(1e308 * np.eye(2)),
                          "logits", 1e-4, 5, 1e-12)
    assert got[1:] == (1, False, "line search stalled") and len(reduce.thetas) == 41
    # the fallback's slope is -|g|^2, not -sum(g / g): a dip of 1e-10 passes Armijo at t = 1
    np.testing.assert_array_equal(reduce.thetas[1], -g)


def test_preconditioned_armijo_test_is_inclusive_and_scales_with_t():
    g = np.array([[1.0, 0.0]])
    # slope -1 at t = 1: a decrease of exactly 1e-4 is enough
    reduce = Dip(g, lambda theta: -1e-4)
    got = _preconditioned(reduce, 1, np.zeros((1, 2)), cho_factor(np.eye(2)), "logits", 1e-4,
                          1, 1e-12)
    np.testing.assert_array_equal(got[0], -g)
    assert len(reduce.thetas) == 2
    # refused at t = 1 (a rise), accepted at t = 1/2 (needs 0.5e-4, gets 1e-4)
    reduce = Dip(g, lambda theta: 1.0 if theta[0, 0] < -0.75 else -1e-4)
    got = _preconditioned(reduce, 1, np.zeros((1, 2)), cho_factor(np.eye(2)), "logits", 1e-4,
                          1, 1e-12)
    np.testing.assert_array_equal(got[0], -0.5 * g)
    assert len(reduce.thetas) == 3


def test_preconditioned_divides_the_value_by_n():
    """Sums of 10 rows: a mean decrease of 5e-5 at slope -1 fails Armijo at t = 1 (needs
    1e-4) and passes at t = 1/2, where a value 10 times too large would pass at t = 1.
    The second step finds no decrease and stalls."""
    g = np.array([[1.0, 0.0]])
    reduce = Dip(g, lambda theta: 1.0 - 5e-5, start=1.0, n=10)
    got = _preconditioned(reduce, 10, np.zeros((1, 2)), cho_factor(np.eye(2)), "logits", 1e-4,
                          3, 1e-12)
    np.testing.assert_array_equal(got[0], -0.5 * g)
    assert got[1:] == (2, False, "line search stalled")


def test_preconditioned_flatness_is_inclusive():
    """A decrease of exactly rtol (2^-40 at a loss of 1) is flat."""
    g = np.array([[1e-9, 0.0]])
    reduce = Dip(g, lambda theta: 1.0 - 2.0**-40, start=1.0)
    got = _preconditioned(reduce, 1, np.zeros((1, 2)), cho_factor(np.eye(2)), "logits", 1e-4,
                          5, 1e-12, rtol=2.0**-40)
    assert got[1:] == (1, True, "objective decrease at float64 resolution")


class Script:
    """A stand-in returning the given (value, gradient) per call, recording thetas."""

    def __init__(self, *answers):
        self.answers, self.thetas = list(answers), []

    def __call__(self, fn, w, b, input_kind, floor):
        self.thetas.append(np.column_stack([w, b]))
        value, grad = self.answers[len(self.thetas) - 1]
        return [(value, np.asarray(grad, dtype=np.float64).reshape(-1, 2))]


def test_preconditioned_at_max_iter_a_gradient_of_exactly_gtol_has_converged():
    reduce = Script((0.0, [1.0, 1.0]), (-1.0, [0.25, 0.0]))
    got = _preconditioned(reduce, 1, np.zeros((1, 2)), cho_factor(np.eye(2)), "logits", 1e-4,
                          1, 0.25)
    assert got[1:] == (1, True, "gradient below gtol")


def test_preconditioned_keeps_a_pair_only_with_enough_curvature():
    """Step s = (-1, 0), then y = g1 - g0 = (-1e-13, 1000): y.s = 1e-13 is below
    1e-12 |s| |y| = 1e-9, so the pair is dropped and the next step is -g1 again (kept,
    rho = 1e13 would send it elsewhere)."""
    g0, g1 = np.array([1.0, 0.0]), np.array([1.0 - 1e-13, 1000.0])
    reduce = Script((0.0, g0), (-1.0, g1), (-1e9, [0.0, 0.0]))
    got = _preconditioned(reduce, 1, np.zeros((1, 2)), cho_factor(np.eye(2)), "logits", 1e-4,
                          5, 1e-12)
    theta1 = np.zeros(2) - g0
    np.testing.assert_array_equal(reduce.thetas[1].ravel(), theta1)
    np.testing.assert_array_equal(got[0].ravel(), theta1 - g1)
    assert got[1:] == (2, True, "gradient below gtol")


def test_sample_factor_is_the_mean_hessian_with_a_tiny_ridge():
    z, y = logit_rows(10, 60, 3)
    y[:] = np.where(y == 2, 0, y)  # class 2 never the label
    theta = np.column_stack([[1.0, 0.8, 1.2], [0.0, 0.1, -0.1]])
    factor = _sample_factor({"scores": z, "labels": y}, theta, "logits", 1e-4)
    c, lower = factor
    u = np.tril(c) if lower else np.triu(c)
    got = u @ u.T if lower else u.T @ u
    h = vs_reference(z, y, theta[:, 0], theta[:, 1])[2] / 60
    h[np.diag_indices_from(h)] += 1e-10 * max(1.0, float(np.max(np.diag(h))))
    np.testing.assert_allclose(got, h, rtol=1e-10, atol=1e-15)
    big = _sample_factor({"scores": 5.0 * z, "labels": y}, theta, "logits", 1e-4)[0]
    plain = vs_reference(5.0 * z, y, theta[:, 0], theta[:, 1])[2] / 60
    assert np.max(np.diag(plain)) > 2.0  # the ridge scales with the largest diagonal entry
    np.testing.assert_allclose(np.diag(np.triu(big).T @ np.triu(big)) - np.diag(plain),
                               1e-10 * np.max(np.diag(plain)), rtol=1e-3)
    tiny = _sample_factor({"scores": z * 1e-3, "labels": y}, theta * 1e-3, "logits", 1e-4)
    u = np.triu(tiny[0])
    h = vs_reference(z * 1e-3, y, theta[:, 0] * 1e-3, theta[:, 1] * 1e-3)[2] / 60
    # every diagonal entry below 1: the ridge is 1e-10 itself
    assert np.max(np.diag(h)) < 1.0
    np.testing.assert_allclose(np.diag(u.T @ u), np.diag(h) + 1e-10, rtol=1e-9, atol=1e-18)


def test_sample_factor_and_vs_start_of_probabilities_use_the_floor():
    z, y = logit_rows(25, 200, 3)
    p = softmax(z * 3.0)
    p[:20, 0] = 0.0  # entries the floor lifts
    p /= p.sum(axis=1, keepdims=True)
    x = np.log(np.maximum(p, 1e-3))
    theta = np.column_stack([[1.0, 0.8, 1.2], [0.0, 0.1, -0.1]])
    c = np.triu(_sample_factor({"scores": p, "labels": y}, theta, "probs", 1e-3)[0])
    h = vs_reference(x, y, theta[:, 0], theta[:, 1])[2] / 200
    np.testing.assert_allclose(c.T @ c, h, rtol=1e-8, atol=1e-9)
    ref = make_calibrator("vs", input_kind="probs", prob_floor=1e-3).fit(p, y)
    theta, factor = _vs_start((p, y), 3, "probs", 1e-3, 1e-6)
    np.testing.assert_array_equal(theta, np.column_stack([ref.weights_, ref.bias_]))
    want = _sample_factor({"scores": p, "labels": y}, theta, "probs", 1e-3)
    np.testing.assert_array_equal(factor[0], want[0])


def test_vs_start_refines_a_larger_sample_of_probabilities(monkeypatch):
    import cord_ops.reduce as reduce_module

    monkeypatch.setattr(reduce_module, "START_ROWS", 100)
    z, y = logit_rows(26, 600, 3)
    p = softmax(z * 3.0)
    whole = make_calibrator("vs", input_kind="probs", prob_floor=1e-3).fit(p, y)
    theta, factor = _vs_start((p, y), 3, "probs", 1e-3, 1e-8)
    np.testing.assert_allclose(theta[:, 0], whole.weights_, atol=1e-6)
    want = _sample_factor({"scores": p, "labels": y}, theta, "probs", 1e-3)
    np.testing.assert_array_equal(factor[0], want[0])


def test_vs_start_on_exactly_start_rows_is_not_refined(monkeypatch):
    """A sample of START_ROWS rows is the in-memory fit itself, bit for bit, even with a
    gtol the in-memory fit did not reach."""
    import cord_ops.reduce as reduce_module

    monkeypatch.setattr(reduce_module, "START_ROWS", 300)
    z, y = logit_rows(27, 300, 4)
    ref = make_calibrator("vs", prob_floor=1e-4).fit(z, y)
    theta, _ = _vs_start((z, y), 4, "logits", 1e-4, 0.0)
    np.testing.assert_array_equal(theta, np.column_stack([ref.weights_, ref.bias_]))


def test_vs_start_on_a_small_sample_is_the_in_memory_fit():
    z, y = logit_rows(11, 300, 4)
    ref = make_calibrator("vs", input_kind="logits", prob_floor=1e-4).fit(z, y)
    theta, factor = _vs_start((z, y), 4, "logits", 1e-4, 1e-6)
    np.testing.assert_array_equal(theta, np.column_stack([ref.weights_, ref.bias_]))
    want = _sample_factor({"scores": z, "labels": y}, theta, "logits", 1e-4)
    np.testing.assert_array_equal(factor[0], want[0])


def test_vs_start_refines_a_larger_sample_on_all_of_it(monkeypatch):
    import cord_ops.reduce as reduce_module

    monkeypatch.setattr(reduce_module, "START_ROWS", 100)
    z, y = logit_rows(12, 600, 4)
    first = make_calibrator("vs", prob_floor=1e-4).fit(z[:100], y[:100])
    whole = make_calibrator("vs", prob_floor=1e-4).fit(z, y)
    theta, factor = _vs_start((z, y), 4, "logits", 1e-4, 1e-7)
    w0 = np.column_stack([first.weights_, first.bias_])
    w1 = np.column_stack([whole.weights_, whole.bias_])
    assert np.max(np.abs(w1 - w0)) > 1e-2
    np.testing.assert_allclose(theta[:, 0], w1[:, 0], atol=1e-6)
    np.testing.assert_allclose(theta[:, 1] - theta[:, 1].mean(), w1[:, 1] - w1[:, 1].mean(),
                               atol=1e-6)
    want = _sample_factor({"scores": z, "labels": y}, theta, "logits", 1e-4)
    np.testing.assert_array_equal(factor[0], want[0])


@pytest.mark.parametrize("sample", [False, True])
def test_fit_vector_reaches_the_in_memory_optimum_for_probabilities(sample):
    z, y = logit_rows(13, 1500, 4)
    p = softmax(z)
    ref = make_calibrator("vs", input_kind="probs").fit(p, y)
    parts = [{"scores": p[:500], "labels": y[:500]}, {"scores": p[500:], "labels": y[500:]}]
    params, floor = fit_vector(local_reduce(parts), 1500, 4, input_kind="probs",
                               sample=(p[:300], y[:300]) if sample else None)
    assert floor == ref.prob_floor
    np.testing.assert_allclose(params["weights"], ref.weights_, atol=1e-5)
    bias = np.asarray(params["bias"])
    np.testing.assert_allclose(bias - bias.mean(), ref.bias_ - ref.bias_.mean(), atol=1e-5)
    assert isinstance(params["weights"], list) and isinstance(params["bias"], list)
    params, floor = fit_vector(local_reduce(parts), 1500, 4, input_kind="probs",
                               prob_floor=1e-3, sample=(p[:300], y[:300]) if sample else None)
    assert floor == 1e-3
    ref = make_calibrator("vs", input_kind="probs", prob_floor=1e-3).fit(p, y)
    np.testing.assert_allclose(params["weights"], ref.weights_, atol=1e-5)


@pytest.mark.parametrize("sample", [False, True])
def test_fit_vector_warns_at_max_iter_naming_passes_and_limit(sample):
    z, y = logit_rows(14, 400, 3)
    parts = [{"scores": z, "labels": y}]
    with pytest.warns(Warning, match=r"^vs: optimiser stopped before convergence \(max_iter "
                                     r"reached; 1 iterations, max_iter=1\); the returned map "
                                     r"is the last iterate, not an optimum\. Raise max_iter "
                                     r"to fit further\.$"):
        fit_vector(local_reduce(parts), 400, 3, max_iter=1, gtol=1e-14,
                   sample=(z[:50], y[:50]) if sample else None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        params, _ = fit_vector(local_reduce(parts), 400, 3, gtol=1e-1,
                               sample=(z[:50], y[:50]) if sample else None)
    assert len(params["weights"]) == len(params["bias"]) == 3


def test_reduced_vector_problem_sums_partitions_and_splits_theta():
    from cord_ops.reduce import _ReducedVectorProblem

    z, y = logit_rows(24, 90, 3)
    parts = [{"scores": z[:30], "labels": y[:30]}, {"scores": z[30:], "labels": y[30:]}]
    problem = _ReducedVectorProblem(local_reduce(parts), 90, "logits", 1e-4)
    theta = np.column_stack([[1.0, 0.9, 1.1], [0.0, 0.2, -0.1]])
    nll, grad, h = vs_reference(z, y, theta[:, 0], theta[:, 1])
    loss, g, d = problem.value_grad(theta)
    assert loss == pytest.approx(nll / 90, rel=1e-13)
    np.testing.assert_allclose(g, grad / 90, rtol=1e-11, atol=1e-14)
    np.testing.assert_allclose(d, h / 90, rtol=1e-11, atol=1e-14)
    copy = problem.hessian(d)
    np.testing.assert_array_equal(copy, d)
    assert copy is not d and problem.full is False
    w, b = problem.split(theta)
    np.testing.assert_array_equal(w, [1.0, 0.9, 1.1])
    np.testing.assert_array_equal(b, [0.0, 0.2, -0.1])


class RisingNewton:
    """A stand-in for the Newton path's sums (NLL, gradient, Hessian): the value rises
    everywhere off the identity start, so the line search stalls at the first step."""

    def __call__(self, fn, w, b, input_kind, floor):
        assert fn is vs_newton_sums
        at_start = np.all(w == 1.0) and not np.any(b)
        k = w.size
        return [(0.0 if at_start else 1.0, np.ones((k, 2)), np.eye(2 * k))]


def test_fit_vector_reports_the_default_max_iter():
    with pytest.warns(Warning, match=r"^vs: optimiser stopped before convergence \(line search "
                                     r"stalled; 1 iterations, max_iter=1000\);"):
        params, _ = fit_vector(RisingNewton(), 10, 2)
    assert params == {"weights": [1.0, 1.0], "bias": [0.0, 0.0]}


def test_fit_vector_without_sample_starts_from_the_identity():
    z, y = logit_rows(15, 300, 3)
    params, _ = fit_vector(local_reduce([{"scores": z, "labels": y}]), 300, 3, gtol=1e3)
    assert params == {"weights": [1.0, 1.0, 1.0], "bias": [0.0, 0.0, 0.0]}


def test_calibrators_from_sums_refuse_others_in_one_line():
    with pytest.raises(ValueError, match=r"^calibrator 'isotonic' cannot be fitted over "
                                         r"partitions \(it needs every row at once\); "
                                         r"expected one of ts, vs$"):
        fit_calibrator_from_sums("isotonic", local_reduce([]), 1, 2)


@pytest.mark.parametrize("name", ["ts", "vs"])
def test_calibrator_from_sums_keeps_kind_classes_and_the_sample_start(name):
    z, y = logit_rows(16, 1200, 4)
    p = softmax(z)
    parts = [{"scores": p[:600], "labels": y[:600]}, {"scores": p[600:], "labels": y[600:]}]
    ref = make_calibrator(name, input_kind="probs").fit(p, y)
    for sample in (None, (p[:400], y[:400])):
        cal = fit_calibrator_from_sums(name, local_reduce(parts), 1200, 4, input_kind="probs",
                                       sample=sample)
        assert cal.input_kind == "probs" and cal.prob_floor == ref.prob_floor
        np.testing.assert_array_equal(cal.classes_, [0, 1, 2, 3])
        assert cal.to_dict()["n_classes"] == 4
        assert abs(metrics.nll(cal.predict_proba(p), y) - metrics.nll(ref.predict_proba(p), y)) \
            <= 1e-9 * metrics.nll(ref.predict_proba(p), y)


@pytest.mark.parametrize("kind", ["logits", "probs"])
def test_ts_from_sums_with_a_sample_and_settle_stops_after_one_step(kind):
    """settle = 0.5: the sample's beta is within 50 % of the optimum, so the first Halley
    step (written out with numpy's moments) is returned."""
    z, y = logit_rows(17, 3000, 5)
    scores = softmax(z) if kind == "probs" else z
    parts = [{"scores": scores[:1000], "labels": y[:1000]},
             {"scores": scores[1000:], "labels": y[1000:]}]
    ref = make_calibrator("ts", input_kind=kind).fit(scores, y)
    start = make_calibrator("ts", input_kind=kind).fit(scores[:300], y[:300]).beta_
    loose = fit_calibrator_from_sums("ts", local_reduce(parts), 3000, 5, input_kind=kind,
                                     sample=(scores[:300], y[:300]), settle=0.5)
    x = np.log(np.maximum(scores, ref.prob_floor)) if kind == "probs" else scores
    zs = x - x.max(axis=1, keepdims=True)
    q = softmax(start * zs)
    m1 = np.sum(q * zs, 1)
    c = zs - m1[:, None]
    g = np.mean(m1 - zs[np.arange(3000), y])
    g1, g2 = np.mean(np.sum(q * c * c, 1)), np.mean(np.sum(q * c**3, 1))
    step = start - 2.0 * g * g1 / (2.0 * g1 * g1 - g * g2)
    assert abs(start - ref.beta_) > 1e-6 * ref.beta_
    assert loose.beta_ == pytest.approx(step, rel=1e-12)
    tight = fit_calibrator_from_sums("ts", local_reduce(parts), 3000, 5, input_kind=kind,
                                     sample=(scores[:300], y[:300]))
    assert abs(tight.beta_ - ref.beta_) <= 1e-10 * ref.beta_
    assert abs(loose.beta_ - ref.beta_) > 1e-10 * ref.beta_


def test_vs_from_sums_with_a_sample_takes_gradient_passes_only():
    """The sample's warm start replaces the Newton passes (NLL, gradient and Hessian sums)
    by L-BFGS value-and-gradient passes, fewer of them."""
    z, y = logit_rows(29, 2000, 4)
    parts = [{"scores": z[:1000], "labels": y[:1000]}, {"scores": z[1000:], "labels": y[1000:]}]
    used = {True: [], False: []}
    for warm in (True, False):
        def reduce(fn, *args, warm=warm):
            used[warm].append(fn)
            return local_reduce(parts)(fn, *args)

        fit_calibrator_from_sums("vs", reduce, 2000, 4, sample=(z[:500], y[:500]) if warm
                                 else None)
    assert set(used[True]) == {vs_value_grad_sums}
    assert set(used[False]) == {vs_newton_sums}


def test_calibrator_state_layout():
    state = calibrator_state("ts", {"beta": 2.0}, 3, "probs", np.float32(0.5))
    assert state == {"name": "ts", "version": 2, "input_kind": "probs", "prob_floor": 0.5,
                     "n_classes": 3, "classes": [0, 1, 2],
                     "options": {k: v for k, v in make_calibrator("ts").get_params().items()
                                 if k not in ("input_kind", "prob_floor")},
                     "params": {"beta": 2.0}}
    assert type(state["prob_floor"]) is float
    assert calibrator_state("vs", {}, 2, "logits", 1e-4, classes=("a", "b"))["classes"] == ["a",
                                                                                           "b"]


def test_metrics_from_sums_of_hand_made_partitions():
    """Two partitions, three bins: ECE = sum over filled bins of |acc - conf| / n."""
    first = {"n": 2, "counts": np.array([1, 1, 0]), "acc": np.array([0, 1, 0]),
             "conf": [units(0.25), units(0.75), 0], "nll": units(1.5), "brier": units(0.5),
             "changed": 1, "c_plus": 1, "c_minus": 0, "c_zero": 0}
    second = {"n": 2, "counts": np.array([0, 1, 1]), "acc": np.array([0, 0, 1]),
              "conf": [0, units(0.5), units(1.0)], "nll": units(0.5), "brier": units(0.25),
              "changed": 2, "c_plus": 0, "c_minus": 1, "c_zero": 1}
    assert metrics_from(first)["tpcr"] == 0.5
    from cord_ops.reduce import metrics_from_sums

    got = metrics_from_sums([first, second])
    assert got == {"n": 4, "ece": (0.25 + 0.25 + 0.0) / 4, "nll": 0.5, "brier": 0.1875,
                   "accuracy": 0.5, "tpcr": 0.75,
                   "changes": {"c_plus": 1, "c_minus": 1, "c_zero": 1}}
    plain = metrics_from_sums([{k: v for k, v in first.items()
                                if k not in ("changed", "c_plus", "c_minus", "c_zero")}])
    assert sorted(plain) == ["accuracy", "brier", "ece", "n", "nll"]


# ----------------------------------------------------------------- reduce: CORD from sums


def _response_mean(eta, part):
    return float(Fraction(fraction_sum(response_terms(eta, part)), part["g"].shape[0] * SCALE))


@pytest.mark.parametrize("eta", [0.8, 3.0, -0.6])
def test_reduced_mean_decides_on_both_sides_of_mu(eta):
    part = part_scalars(18, 500, 4)
    halves = [{k: v[:200] for k, v in part.items()}, {k: v[200:] for k, v in part.items()}]
    mean = _response_mean(eta, part)
    far = _ReducedMean(local_reduce(halves), 500)
    assert far.exact(eta) == mean
    # mu 1e-3 away: the estimate decides and screening stays on
    assert far.at_least(eta, mean - 1e-3) and not far.at_least(eta, mean + 1e-3)
    assert far.at_most(eta, mean + 1e-3) and not far.at_most(eta, mean - 1e-3)
    assert far.screening
    # mu at the exact mean: too close for the estimate; the exact mean decides (>=, <=)
    near = _ReducedMean(local_reduce(halves), 500)
    assert near.at_least(eta, mean) and not near.screening
    assert near.at_most(eta, mean)
    assert not near.at_least(eta, math.nextafter(mean, 2.0))
    assert not near.at_most(eta, math.nextafter(mean, -1.0))
    near = _ReducedMean(local_reduce(halves), 500)
    assert not near.at_most(eta, math.nextafter(mean, -1.0)) and not near.screening


def test_a_far_step_reads_only_the_estimate_and_a_near_one_the_exact_sum():
    part = part_scalars(28, 200, 4)
    calls = []

    def reduce(fn, *args):
        calls.append(fn)
        return local_reduce([part])(fn, *args)

    mean = _response_mean(1.5, part)
    reduced = _ReducedMean(reduce, 200)
    assert reduced.at_least(1.5, mean - 1e-3) and not reduced.at_most(1.5, mean - 1e-3)
    assert calls == [cord_response_estimate, cord_response_estimate]
    calls.clear()
    assert reduced.at_least(1.5, mean)
    assert calls == [cord_response_estimate, cord_response_sum]
    calls.clear()
    assert reduced.at_most(1.5, mean)  # screening is off now: the exact sum alone
    assert calls == [cord_response_sum]


def test_reduced_mean_never_screens_at_eta_zero():
    part = part_scalars(19, 100, 3)
    mean = _ReducedMean(local_reduce([part]), 100)
    mu = _response_mean(0.0, part)
    assert mean.at_least(0.0, mu) and mean.at_most(0.0, mu) and mean.screening
    assert not mean.at_least(0.0, math.nextafter(mu, 2.0)) and mean.screening


def test_reduced_mean_margin_is_the_screen_margin_of_n():
    from cord_ops.cord_solve import screen_margin

    assert _ReducedMean(local_reduce([]), 5000).margin == screen_margin(5000)
    assert _ReducedMean(local_reduce([]), 5000).screening is True


def test_reduced_mean_screens_strictly_outside_the_margin():
    """An estimate exactly screen_margin from mu: not decided by the estimate."""
    part = {"g": np.array([0.5]), "lower": np.array([0.0])}
    est = cord_response_estimate(part, 2.0)
    mean = _ReducedMean(local_reduce([part]), 1)
    mu = est + mean.margin
    assert abs(est - mu) == mean.margin
    mean.at_least(2.0, mu)
    assert not mean.screening


@pytest.mark.parametrize("target", ["inherited", "local", "pointwise"])
def test_cord_from_sums_mu_is_the_exact_mean_of_its_target(target):
    part = part_scalars(20, 300, 4, lam=0.4)
    parts = [{k: v[:100] for k, v in part.items()}, {k: v[100:] for k, v in part.items()}]
    cord = fit_cord_from_sums(local_reduce(parts), 300, 4, CORD(mean_target=target,
                                                                local_weight=0.4))
    b, lower, g = part["b"], part["lower"], part["g"]
    source = {"inherited": b, "local": g, "pointwise": np.clip(b, lower, 1 - 1e-12)}[target]
    mean = float(Fraction(fraction_sum(source), 300 * SCALE))
    lo = float(Fraction(fraction_sum(lower), 300 * SCALE))
    assert cord.mu_ == min(max(mean, lo), 1.0 - 1e-12)
    assert cord.eta_ != 0.0 and cord.n_features_in_ == 4


def test_cord_from_sums_without_a_target_keeps_eta_zero_and_the_mean_of_psi_0():
    part = part_scalars(20, 300, 4, lam=0.4)
    cord = fit_cord_from_sums(local_reduce([part]), 300, 4, CORD(mean_target="none",
                                                                local_weight=0.4))
    assert cord.eta_ == 0.0 and cord.mu_ == _response_mean(0.0, part)


def _scalars_off_by(seed, n, shift):
    """Per-row scalars whose mean b is ``shift`` above the mean g: shift > 0 asks for more
    mass on the top-1 than psi(0) gives (eta* > 0), shift < 0 for less (eta* < 0)."""
    g = np.random.default_rng(seed).uniform(0.35, 0.65, size=n)
    return {"b": g + shift, "lower": np.full(n, 0.25), "g": g}


@pytest.mark.parametrize("shift, side", [(0.1, 1.0), (-0.05, -1.0)])
def test_cord_from_sums_eta_reaches_mu_and_the_next_float_toward_zero_does_not(shift, side):
    part = _scalars_off_by(21, 400, shift)
    parts = [{k: v[:150] for k, v in part.items()}, {k: v[150:] for k, v in part.items()}]
    cord = fit_cord_from_sums(local_reduce(parts), 400, 5)
    mu, eta = cord.mu_, cord.eta_
    assert math.copysign(1.0, eta) == side and eta != 0.0
    assert side * (_response_mean(eta, part) - mu) >= 0.0
    assert side * (_response_mean(math.nextafter(eta, 0.0), part) - mu) < 0.0


def test_cord_from_sums_mu_is_clipped_down_to_the_interval():
    part = {"b": np.array([1.0, 1.0]), "lower": np.array([0.3, 0.3]),
            "g": np.array([0.9, 0.95])}
    cord = fit_cord_from_sums(local_reduce([part]), 2, 3)
    assert cord.mu_ == 1.0 - 1e-12


def test_cord_from_sums_mu_is_clipped_up_to_the_interval():
    part = {"b": np.array([0.2, 0.3]), "lower": np.array([0.5, 0.75]), "g": np.array([0.6, 0.8])}
    cord = fit_cord_from_sums(local_reduce([part]), 2, 3)
    assert cord.mu_ == 0.625


def test_cord_from_sums_refuses_bad_parameters_and_defaults_to_cord():
    part = part_scalars(22, 50, 3)
    with pytest.raises(ValueError, match=r"mean_target"):
        fit_cord_from_sums(local_reduce([part]), 50, 3, CORD(mean_target="mode"))
    with pytest.raises(ValueError, match=r"mean_target"):
        fit_cord_from_sums(local_reduce([part]), 50, 3, CORD(mean_target="mode"), gather=True)
    got = fit_cord_from_sums(local_reduce([part]), 50, 3)
    want = CORD()
    assert isinstance(got, CORD) and got.mean_target == want.mean_target
    gathered = fit_cord_from_sums(local_reduce([part, part]), 100, 3, gather=True)
    ref = CORD()
    from cord_ops.cord import fit_from_row_scalars

    fit_from_row_scalars(ref, *(np.concatenate([part[k], part[k]]) for k in ("b", "lower", "g")),
                         3)
    assert gathered.eta_.hex() == ref.eta_.hex() and gathered.mu_ == ref.mu_
