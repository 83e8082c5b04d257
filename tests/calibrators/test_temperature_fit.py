"""Temperature scaling's safeguarded Newton iteration: few slope evaluations (a wrong step,
which the bisection safeguard would silently absorb, costs ~40), its bracket search, its
bound and iteration-limit warnings, and its convergence test.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from scipy.optimize import brentq

from cord_ops.calibrators import temperature


# ------------------------------------------------------- temperature: cost of the fit
def _slope_kernel(z: np.ndarray, y: np.ndarray):
    """g(beta) = mean_i [E_q z_i - z_{i,y_i}] and g'(beta) = mean_i Var_q(z_i) (the
    module docstring's formulas, written here independently), counting evaluations."""
    z = z - z.max(axis=1, keepdims=True)
    calls = []

    def slope_and_curvature(beta: float):
        calls.append(beta)
        e = np.exp(beta * z)
        q = e / e.sum(axis=1, keepdims=True)
        mean_z = (q * z).sum(axis=1)
        var_z = (q * z * z).sum(axis=1) - mean_z**2
        return float(np.mean(mean_z - z[np.arange(len(y)), y])), float(np.mean(var_z))

    return slope_and_curvature, calls


def _logits(seed: int, n: int, k: int, true_beta: float):
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, k)) * 3.0
    p = np.exp(true_beta * (z - z.max(axis=1, keepdims=True)))
    p /= p.sum(axis=1, keepdims=True)
    y = (p.cumsum(axis=1) < rng.uniform(size=(n, 1))).sum(axis=1)
    return z, np.minimum(y, k - 1)


@pytest.mark.parametrize("seed, true_beta", [(0, 0.4), (1, 1.7), (2, 5.0), (3, 0.8), (4, 3.0)])
def test_temperature_fit_takes_few_slope_evaluations_and_finds_the_root(seed, true_beta):
    """Two or three bracket evaluations plus a few Newton steps (the module docstring:
    a third of bisection's softmax passes). A step in the wrong direction still converges
    (the safeguard bisects) but after ~40 evaluations, and so would a converged step that
    rounded onto beta itself; the evaluation count tells them apart."""
    z, y = _logits(seed, 2000, 10, true_beta)
    kernel, calls = _slope_kernel(z, y)

    beta = temperature.solve_inverse_temperature(kernel, max_iter=100)

    assert len(calls) <= 10, calls
    plain, _ = _slope_kernel(z, y)
    root = brentq(lambda b: plain(b)[0], 1e-3, 1e3, xtol=1e-14, rtol=1e-14)
    assert math.isclose(beta, root, rel_tol=1e-9)


def _counted(kernel):
    calls = []

    def counted(beta):
        calls.append(beta)
        return kernel(beta)

    return counted, calls


@pytest.mark.parametrize("seed, true_beta", [(1, 1.7), (2, 5.0), (5, 0.3)])
def test_temperature_kernel_is_the_slope_and_curvature_and_its_fit_is_cheap(seed, true_beta):
    z, y = _logits(seed, 1500, 7, true_beta)
    mine, _ = _slope_kernel(z, y)
    theirs = temperature.slope_kernel(z + 3.0, y)  # a shift of every logit changes nothing
    for beta in (0.05, 0.7, 2.0, 9.0):
        np.testing.assert_allclose(theirs(beta), mine(beta), rtol=1e-9, atol=1e-12)
    counted, calls = _counted(temperature.slope_kernel(z, y))
    beta = temperature.solve_inverse_temperature(counted)
    assert len(calls) <= 10, calls
    assert beta == temperature.fit_inverse_temperature(z, y)
    model = temperature.TemperatureScaling().fit(z, y)
    assert model.beta_ == beta
    q = np.exp(beta * (z - z.max(axis=1, keepdims=True)))
    np.testing.assert_allclose(model.predict_proba(z), q / q.sum(axis=1, keepdims=True),
                               rtol=1e-12)
    np.testing.assert_array_equal(z, _logits(seed, 1500, 7, true_beta)[0])  # input untouched


def test_temperature_fit_warns_at_each_bound_and_names_the_calibrator():
    z = np.array([[4.0, 0.0, -1.0], [0.0, 3.0, 1.0], [1.0, 0.0, 5.0], [2.0, 6.0, 0.0]])
    separable = z.argmax(axis=1)  # every label the top logit: optimum beta -> infinity
    # At beta = 4^5 every softmax is one-hot to float64: slope and curvature exactly 0.
    with pytest.warns(temperature.ConvergenceWarning, match=r"^mine: .* beyond 1024, "):
        assert temperature.fit_inverse_temperature(z, separable, name="mine") == 4.0**5
    close = np.array([[1e-7, 0.0], [0.0, 1e-7]])  # separable by a hair: never one-hot
    with pytest.warns(temperature.ConvergenceWarning, match=r"^ts: .* beyond 8\.88611e\+06,"):
        assert temperature.fit_inverse_temperature(close, np.array([0, 1])) == (
            temperature.BETA_BOUNDS[1])
    against = z.argmin(axis=1)  # every label the lowest logit: optimum beta -> 0
    with pytest.warns(temperature.ConvergenceWarning, match=r"^ts: .*1\.12535e-07"):
        assert temperature.fit_inverse_temperature(z, against) == temperature.BETA_BOUNDS[0]
    with pytest.warns(temperature.ConvergenceWarning, match="^ts: .*or unrelated to them"):
        temperature.TemperatureScaling().fit(z, against)


def test_temperature_fit_stops_at_max_iter_with_a_warning_naming_it():
    z, y = _logits(3, 500, 5, 0.8)
    counted, calls = _counted(temperature.slope_kernel(z, y))
    with pytest.warns(temperature.ConvergenceWarning,
                      match=r"^cal: optimiser stopped .*\(1 Newton/bisection steps, max_iter=1\)"):
        temperature.solve_inverse_temperature(counted, max_iter=1, name="cal")
    with pytest.warns(temperature.ConvergenceWarning, match=r"max_iter=2\)"):
        temperature.TemperatureScaling(max_iter=2).fit(z, y)


def test_temperature_slope_exactly_zero_at_a_bracket_end_returns_that_end():
    """A kernel whose slope is 0 at beta = 1 (first evaluation), or at 4 (second)."""
    for root in (1.0, 4.0, 0.25):
        counted, calls = _counted(lambda b, r=root: (b - r, 1.0))
        assert temperature.solve_inverse_temperature(counted) == root
        assert len(calls) <= 3
    # Linear slope with its root inside the bracket: one Newton step lands on it.
    counted, calls = _counted(lambda b: (b - 2.5, 1.0))
    assert temperature.solve_inverse_temperature(counted) == 2.5


def _cubic(root: float):
    """g(beta) = beta^3 - root^3 (increasing, convex): Newton from the left overshoots."""
    return lambda b: (b**3 - root**3, 3.0 * b * b)


def test_a_newton_step_out_of_the_bracket_is_replaced_by_its_arithmetic_midpoint():
    # Bracket [1, 4] (the factor-4 search's): from 1 the step lands at 4.216 > 4, so the
    # next beta is (1 + 4) / 2; ends a factor 4 apart are not "more than 4".
    counted, calls = _counted(_cubic(2.2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        beta = temperature.solve_inverse_temperature(counted)
    assert calls[:3] == [1.0, 4.0, 2.5]
    assert math.isclose(beta, 2.2, rel_tol=1e-14)
    assert len(calls) <= 10


def test_ends_more_than_four_apart_are_bisected_geometrically():
    kernel = _cubic(2.2)
    counted, calls = _counted(kernel)
    beta = temperature.bracketed_iteration(
        counted, 0.1, kernel(0.1), 0.1, 10.0, lambda b, d: b - d[0] / d[1],
        tolerance=1e-12, max_iter=50, name="x", what="Newton")
    assert calls[0] == math.sqrt(0.1 * 10.0)  # the step to 355 left the bracket
    assert math.isclose(beta, 2.2, rel_tol=1e-14)
    # A step of nan (no curvature) is a step out of the bracket too.
    counted, calls = _counted(kernel)
    with pytest.warns(temperature.ConvergenceWarning, match=r"^x: .*\(3 w steps, max_iter=3"):
        last = temperature.bracketed_iteration(counted, 1.0, kernel(1.0), 1.0, 4.0,
                                               lambda b, d: math.nan, tolerance=1e-12,
                                               max_iter=3, name="x", what="w")
    assert calls == [2.5, 1.75, 2.125] and last == 2.125  # bisection: 1-4, 2.5 > 2.2, ...


def test_a_root_far_from_one_converges_without_running_to_max_iter():
    """The stopping test is relative (|step| <= tol * beta): at beta ~ 3e3 an absolute or
    inverse test would wait for steps below the float spacing."""
    for root in (3000.3, 7.7e-4):
        counted, calls = _counted(_cubic(root))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            beta = temperature.solve_inverse_temperature(counted)
        assert math.isclose(beta, root, rel_tol=1e-14)
        assert len(calls) <= 25, len(calls)


def test_temperature_edge_cases_of_the_bracket_search():
    # Zero curvature inside the bracket: no Newton step (nan), the safeguard bisects.
    counted, calls = _counted(lambda b: (b - 2.2, 0.0))
    assert math.isclose(temperature.solve_inverse_temperature(counted), 2.2, rel_tol=1e-11)
    # Ends 4.5 apart (more than 4): the midpoint is geometric.
    counted, calls = _counted(_cubic(2.2))
    with pytest.warns(temperature.ConvergenceWarning):
        temperature.bracketed_iteration(counted, 1.0, _cubic(2.2)(1.0), 1.0, 4.5,
                                        lambda b, d: math.nan, tolerance=1e-12, max_iter=1,
                                        name="x", what="w")
    assert calls == [math.sqrt(4.5)]
    # Logits that make every softmax one-hot already at beta = 1: returned quietly.
    z = np.array([[2000.0, 0.0], [0.0, 2000.0]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert temperature.fit_inverse_temperature(z, np.array([0, 1])) == 1.0
    # At the lower bound with a slope below 1: still the bound, with the warning, "ts:".
    flat = np.array([[0.01, 0.0], [0.0, 0.01]])
    with pytest.warns(temperature.ConvergenceWarning, match=r"^ts: .* beyond 1\.12535e-07,"):
        assert temperature.solve_inverse_temperature(
            temperature.slope_kernel(flat, np.array([1, 0]))) == temperature.BETA_BOUNDS[0]


def test_exact_zero_slopes_at_bracket_ends_give_no_warning():
    for root in (1.0, 4.0, 0.25):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert temperature.solve_inverse_temperature(lambda b, r=root: (b - r, 1.0)) == root


def test_the_bound_warning_points_at_the_caller_of_fit():
    z = np.array([[4.0, 0.0, -1.0], [0.0, 3.0, 1.0], [1.0, 0.0, 5.0]])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        temperature.TemperatureScaling().fit(z, z.argmin(axis=1))
    assert [w.filename for w in caught] == [__file__]


def test_the_convergence_test_scales_the_tolerance_by_beta():
    """|new - beta| <= tolerance * beta, relative (module docstring): with scripted steps
    the iteration stops at the first step within tol * beta, and not before, at a beta far
    above 1 and at one far below (where tol / beta or an absolute tol would decide the
    other way)."""
    tol = 1e-3

    def scripted(relative_steps):
        steps = iter(relative_steps)
        return lambda b, d: b * (1.0 + next(steps))

    def run(beta, relative_steps):
        calls = []

        def derivatives(b):
            calls.append(b)
            return (-1.0, 1.0)  # g < 0: beta is the bracket's new lower end

        with warnings.catch_warnings():
            warnings.simplefilter("error")
            out = temperature.bracketed_iteration(
                derivatives, beta, (-1.0, 1.0), beta / 2, beta * 2, scripted(relative_steps),
                tolerance=tol, max_iter=5, name="x", what="scripted")
        return out, calls

    # beta = 100: a step of 0.5 tol relative is 0.05 <= tol * beta = 0.1 -> converged.
    out, calls = run(100.0, [0.5 * tol])
    assert out == 100.0 * (1.0 + 0.5 * tol) and calls == []
    # beta = 0.01: a step of 2 tol relative (2e-5) is above tol * beta (1e-5); the next, of
    # 0.5 tol relative, is within it.
    out, calls = run(0.01, [2 * tol, 0.5 * tol])
    assert calls == [0.01 * (1.0 + 2 * tol)]
    assert out == calls[0] * (1.0 + 0.5 * tol)
    # A step within tol * beta that leaves the bracket is kept, not replaced by a midpoint.
    steps = iter([0.0009])
    edge = temperature.bracketed_iteration(
        lambda b: (-1.0, 1.0), 100.0, (-1.0, 1.0), 50.0, 100.05,
        lambda b, d: b * (1.0 + next(steps)), tolerance=tol, max_iter=5, name="x",
        what="scripted")
    assert edge == 100.0 * 1.0009  # beyond hi = 100.05, but within tol * beta of beta


def test_a_step_of_exactly_the_tolerance_has_converged():
    """"<= tolerance * beta" includes equality: at beta = 1 and tol = 2^-10 the step to
    1 + 2^-10 is exactly tol * beta in floats. Out of the bracket (hi = 1.0005) it is kept,
    not replaced by the midpoint, and returned without another evaluation."""
    tol = 2.0**-10
    calls = []

    def derivatives(b):
        calls.append(b)
        return (-1.0, 1.0)

    steps = iter([tol, 0.0, 0.0])
    out = temperature.bracketed_iteration(
        derivatives, 1.0, (-1.0, 1.0), 0.5, 1.0005, lambda b, d: b + next(steps),
        tolerance=tol, max_iter=3, name="x", what="scripted")
    assert out == 1.0 + tol and calls == []
