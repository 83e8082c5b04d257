"""Dir-ODIR as Kull et al. tune it: their grid, the unnormalised ODIR penalty, 5-fold CV
selection, a warm-started path search that finds the grid's optimum, converged fits, and
capped fits reported in ``warnings_``."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.model_selection import StratifiedKFold

from cord_ops.calibrators import ConvergenceWarning, make_calibrator
from cord_ops.calibrators.dirichlet import (
    STOP_MARGIN,
    DirichletODIR,
    _Search,
    kull_grid,
)
from cord_ops.metrics import PROB_FLOOR
from cord_ops.softmax import softmax


def _features(z, floor=PROB_FLOOR):
    sh = z - z.max(axis=1, keepdims=True)
    return np.maximum(sh - np.log(np.exp(sh).sum(axis=1, keepdims=True)), np.log(floor))


def _nll(f, w, b, y):
    return -np.mean(np.log(softmax(f @ w.T + b)[np.arange(len(y)), y]))


def test_the_grid_is_kull_et_als():
    lambdas, mus = kull_grid(100)
    assert len(lambdas) == 27 and len(mus) == 9
    assert lambdas[0] == pytest.approx(0.25e-2) and lambdas[-1] == 1e6
    assert mus == tuple(10.0 ** e for e in range(-2, 7))
    lambdas, mus = kull_grid(10)
    assert len(lambdas) == 36 and mus[0] == pytest.approx(1e-5)
    assert set(np.round(np.array(lambdas) / 10.0 ** np.floor(np.log10(lambdas)), 6)) == {
        1.0, 2.5, 5.0}


def test_a_fit_is_stationary_for_the_unnormalised_odir_objective(make_miscalibrated):
    z, y = make_miscalibrated(3, 1500, 12)  # K (K + 1) = 156 parameters: the Newton path
    lam, mu = 0.05, 0.02
    cal = make_calibrator("dir-odir", reg_lambdas=[lam], reg_mus=[mu]).fit(z, y)
    assert cal.converged_ and cal.warnings_ == []
    f = _features(z)
    w, b = cal.weights_, cal.bias_
    q = softmax(f @ w.T + b)
    d = q.copy()
    d[np.arange(len(y)), y] -= 1.0
    d /= len(y)
    grad_w = d.T @ f + 2.0 * lam * (w - np.diag(np.diag(w)))  # the diagonal is free
    grad_b = d.sum(axis=0) + 2.0 * mu * b
    assert np.max(np.abs(grad_w)) < 1e-5 and np.max(np.abs(grad_b)) < 1e-5
    # Normalising the penalty by K (K - 1) (the paper's form) gives another map.
    normalised = make_calibrator("dir-odir", reg_lambdas=[lam / (12 * 11)],
                                 reg_mus=[mu / 12]).fit(z, y)
    assert np.max(np.abs(normalised.weights_ - w)) > 1e-3


def test_the_path_search_finds_the_grids_cross_validated_optimum(make_miscalibrated):
    z, y = make_miscalibrated(4, 600, 4)
    lambdas = [f * 10.0 ** e for e in range(-3, 4) for f in (0.25, 0.5, 1.0)]
    mus = [10.0 ** e for e in range(-3, 4)]
    path = make_calibrator("dir-odir", reg_lambdas=lambdas, reg_mus=mus).fit(z, y)
    grid = make_calibrator("dir-odir", reg_lambdas=lambdas, reg_mus=mus,
                           search="grid").fit(z, y)
    assert len(grid.cv_path_) == len(lambdas) * len(mus)
    assert len(path.cv_path_) < len(grid.cv_path_) / 2
    # The same optimum (pairs on a flat stretch of mu may differ by rounding-level CV).
    best = grid.cv_path_[:, 2].min()
    assert path.cv_path_[:, 2].min() == pytest.approx(best, abs=1e-7)
    chosen = (grid.cv_path_[:, 0] == path.reg_lambda_) & (grid.cv_path_[:, 1] == path.reg_mu_)
    assert grid.cv_path_[chosen, 2][0] <= best + 1e-7
    assert path.reg_lambda_ == grid.reg_lambda_


def test_the_cv_score_is_the_mean_held_out_nll_over_stratified_folds(make_miscalibrated):
    z, y = make_miscalibrated(5, 900, 5)
    cal = make_calibrator("dir-odir").fit(z, y)
    lam, mu, cv = cal.cv_path_[np.argmin(cal.cv_path_[:, 2])]
    assert (lam, mu) == (cal.reg_lambda_, cal.reg_mu_)
    f = _features(z)
    held_out = []
    for train, test in StratifiedKFold(5, shuffle=True, random_state=0).split(f, y):
        one = make_calibrator("dir-odir", reg_lambdas=[lam], reg_mus=[mu])
        one.fit(z[train], y[train])  # cold start: the convex optimum is the same
        held_out.append(_nll(f[test], one.weights_, one.bias_, y[test]))
    assert cv == pytest.approx(np.mean(held_out), abs=1e-6)
    # The refit on all rows is the selected pair's optimum there.
    full = make_calibrator("dir-odir", reg_lambdas=[lam], reg_mus=[mu]).fit(z, y)
    assert np.max(np.abs(full.weights_ - cal.weights_)) < 1e-4


def test_capped_fits_are_reported_in_warnings_(make_miscalibrated):
    z, y = make_miscalibrated(6, 600, 4)
    with pytest.warns(ConvergenceWarning, match="cross-validation fits stopped"):
        cal = make_calibrator("dir-odir", max_iter=1).fit(z, y)
    assert not cal.converged_
    assert any("cross-validation fits" in w for w in cal.warnings_)
    with pytest.warns(ConvergenceWarning, match="refit stopped"):
        single = make_calibrator("dir-odir", reg_lambdas=[1e-3], reg_mus=[1e-3], max_iter=1)
        single.fit(z, y)
    assert single.warnings_ and not single.converged_
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        again = make_calibrator("dir-odir").fit(z, y)
    assert again.converged_ and again.warnings_ == []


class _TabulatedSearch(_Search):
    """The real walk over a given CV surface: ``score`` reads the table instead of fitting
    folds, everything else (path, stops, coordinate walks, selection) is the search's."""

    def __init__(self, table, lambdas, mus):
        super().__init__(None, None, None, [], lambdas, mus)
        self.table = table

    def score(self, pair, start=None):
        return self.cv.setdefault(pair, float(self.table[pair]))


@settings(max_examples=60, deadline=None)
@given(bump=st.floats(5e-4, 0.9 * STOP_MARGIN), local=st.integers(14, 20),
       width=st.integers(1, 4), gap=st.integers(2, 6), depth=st.floats(2e-3, 5e-2),
       climb=st.floats(1.2 * STOP_MARGIN, 5e-2), mu_slope=st.floats(0.0, 2e-4))
def test_the_path_walks_past_a_false_turn_to_the_global_minimum(bump, local, width, gap,
                                                                 depth, climb, mu_slope):
    """The CIFAR-100 shape (module docstring): the CV NLL falls from the strong-lambda
    plateau to a local minimum, rises by ``bump`` (< STOP_MARGIN), falls to the global
    minimum ``depth`` lower, then climbs by ``climb`` per grid step. The walk must select
    the global minimum's lambda, and stop on the climb instead of scoring the whole grid."""
    lambdas, mus = kull_grid(100)
    n = len(lambdas)
    curve = np.zeros(n)  # index 0 = weakest lambda
    peak, minimum = local - width, local - width - gap
    assert minimum >= 3
    for i in range(n):
        if i >= local:                       # plateau down to the local minimum
            curve[i] = 1e-3 * (i - local) / (n - local)
        elif i >= peak:                      # the false turn: up by `bump`
            curve[i] = bump * (local - i) / width
        elif i >= minimum:                   # down to the global minimum
            curve[i] = bump - (bump + depth) * (peak - i) / gap
        else:                                # over-fitting climb
            curve[i] = -depth + climb * (minimum - i)
    table = {(i, j): 1.0 + curve[i] + mu_slope * j for i in range(n) for j in range(len(mus))}
    search = _TabulatedSearch(table, lambdas, mus)
    DirichletODIR._walk(search)
    assert search.best()[0] == minimum
    assert min(i for i, _ in search.cv) >= minimum - 2  # stopped on the climb
    assert len(search.cv) < n * len(mus) / 4
