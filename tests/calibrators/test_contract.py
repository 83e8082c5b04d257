"""The calibrator contract: names, fit/predict shapes, simplex rows, K from the input width,
probabilities input, state round-trip, determinism and early-stop warnings."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

from cord_ops.calibrators import (
    CALIBRATOR_NAMES,
    CALIBRATORS,
    FAMILY_NAMES,
    REGISTRY,
    ConvergenceWarning,
    calibrator_from_dict,
    make_calibrator,
)
from cord_ops.metrics import nll
from cord_ops.softmax import softmax

NAMES = list(FAMILY_NAMES)  # the paper's families and identity


def test_every_listed_name_builds_the_family_of_that_name():
    """cord_ops.names is the one list: each name builds a calibrator that calls itself so
    and reads logits by default, and the registry has no family the list lacks."""
    for name in NAMES:
        cal = make_calibrator(name)
        assert cal.name == name and cal.input_kind == "logits"
    assert [cls.name for cls in REGISTRY.values()] == NAMES
    assert list(CALIBRATORS) == list(CALIBRATOR_NAMES) == NAMES[:-1]
    assert len(set(NAMES)) == len(NAMES)


def test_the_command_line_offers_exactly_the_registry():
    from flows.cli.main import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    recalibrate = sub.choices["recalibrate"]
    option = next(a for a in recalibrate._actions if a.dest == "calibrator")
    assert list(option.choices) == ["auto", *NAMES]
    # The reproduction runs the paper's families only.
    reproduce = next(a for a in sub.choices["reproduce"]._actions if a.dest == "calibrators")
    assert list(reproduce.choices) == list(CALIBRATOR_NAMES)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("input_kind", ["logits", "probs"])
def test_predictions_are_float64_simplex_rows(name, input_kind, synthetic):
    zc, yc, ze, _ = synthetic
    to_input = softmax if input_kind == "probs" else np.asarray
    cal = make_calibrator(name, input_kind=input_kind)
    assert cal.fit(to_input(zc), yc) is cal
    q = cal.predict_proba(to_input(ze))
    assert q.dtype == np.float64 and q.shape == ze.shape
    assert np.all(q >= 0) and np.all(q <= 1)
    assert np.max(np.abs(q.sum(axis=1) - 1.0)) <= 1e-12
    assert cal.n_classes_ == 4


def test_identity_is_the_classifiers_own_probabilities(synthetic):
    zc, yc, ze, _ = synthetic
    e = np.exp(ze - ze.max(axis=1, keepdims=True))
    assert np.array_equal(make_calibrator("identity").fit(zc, yc).predict_proba(ze),
                          e / e.sum(axis=1, keepdims=True))
    p = np.array([[0.0, 0.25, 0.75, 0.0], [0.5, 0.5, 0.0, 0.0]], dtype=np.float32) * 1.00001
    got = make_calibrator("identity", input_kind="probs").fit(p, [2, 0]).predict_proba(p)
    assert np.array_equal(got, p.astype(np.float64) / p.astype(np.float64).sum(
        axis=1, keepdims=True))
    assert got[0, 0] == 0.0  # no floor: an exact zero stays zero


@pytest.mark.parametrize("name", CALIBRATOR_NAMES)
def test_each_calibrator_lowers_nll_on_miscalibrated_synthetic_logits(name, synthetic):
    zc, yc, ze, ye = synthetic
    q = make_calibrator(name).fit(zc, yc).predict_proba(ze)
    assert nll(q, ye) < nll(softmax(ze), ye) - 0.05


@pytest.mark.parametrize("name", NAMES)
def test_k_comes_from_the_width_not_the_labels(name, synthetic):
    zc, yc, ze, _ = synthetic
    keep = yc != 3  # class 3 never appears in the calibration labels
    cal = make_calibrator(name).fit(zc[keep], yc[keep])
    assert cal.n_classes_ == 4
    q = cal.predict_proba(ze)
    assert q.shape == (ze.shape[0], 4)
    assert np.max(np.abs(q.sum(axis=1) - 1.0)) <= 1e-12


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("input_kind", ["logits", "probs"])
def test_state_round_trips_through_json_bit_for_bit(name, input_kind, synthetic):
    zc, yc, ze, _ = synthetic
    to_input = softmax if input_kind == "probs" else np.asarray
    cal = make_calibrator(name, input_kind=input_kind).fit(to_input(zc), yc)
    state = json.loads(json.dumps(cal.to_dict()))
    assert state["name"] == name and state["input_kind"] == input_kind
    assert state["n_classes"] == 4 and state["prob_floor"] == cal.prob_floor
    rebuilt = calibrator_from_dict(state)
    assert type(rebuilt) is type(cal)
    assert np.array_equal(rebuilt.predict_proba(to_input(ze)), cal.predict_proba(to_input(ze)))
    assert rebuilt.to_dict() == cal.to_dict()


@pytest.mark.parametrize("name", NAMES)
def test_fit_is_deterministic(name, synthetic):
    zc, yc, ze, _ = synthetic
    first = make_calibrator(name).fit(zc, yc).to_dict()
    second = make_calibrator(name).fit(zc, yc).to_dict()
    assert first == second


def test_probability_input_uses_the_documented_log_floor(synthetic):
    zc, yc, ze, _ = synthetic
    from_logits = make_calibrator("ts").fit(zc, yc)
    from_probs = make_calibrator("ts", input_kind="probs").fit(softmax(zc), yc)
    # No probability here is below the float32-tiny floor, so both see the same logits up
    # to a row shift, which temperature scaling ignores.
    assert from_probs.beta_ == pytest.approx(from_logits.beta_, rel=1e-9)
    rng = np.random.default_rng(3)
    p = rng.dirichlet(np.ones(3), size=50)
    p[::5, 2] = 0.0  # exact zeros, which only the floor makes finite
    p /= p.sum(axis=1, keepdims=True)
    cal = make_calibrator("ts", input_kind="probs", prob_floor=1e-6)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        cal.fit(p, (p.cumsum(axis=1) > rng.random((50, 1))).argmax(axis=1))
    expected = softmax(cal.beta_ * np.log(np.maximum(p, 1e-6)))
    assert np.array_equal(cal.predict_proba(p), expected)
    assert cal.to_dict()["prob_floor"] == 1e-6


def test_capped_matrix_scaling_warns_instead_of_returning_silently(synthetic):
    zc, yc, _, _ = synthetic
    # 21 x 21 + 21 = 462 parameters is the Newton path, 30 x 31 the L-BFGS-B path.
    for k, solver_iters in ((4, 1), (30, 2)):
        rng = np.random.default_rng(k)
        z = rng.normal(size=(300, k)) * 3
        y = rng.integers(0, k, 300)
        with pytest.warns(ConvergenceWarning, match="ms: optimiser stopped"):
            cal = make_calibrator("ms", max_iter=solver_iters).fit(z, y)
        assert not np.array_equal(cal.weights_, np.eye(k))


def test_separable_labels_warn_that_the_temperature_hit_its_bound():
    z = np.array([[3.0, 0.0], [0.0, 2.0], [4.0, 1.0], [1.0, 5.0]])
    with pytest.warns(ConvergenceWarning, match="at or beyond"):
        separable = make_calibrator("ts").fit(z, np.array([0, 1, 0, 1]))
    assert separable.beta_ > 10
    with pytest.warns(ConvergenceWarning, match="at or beyond"):
        unrelated = make_calibrator("ts").fit(z, np.array([1, 0, 1, 0]))
    assert unrelated.beta_ < 1e-6


def test_dirichlet_search_reports_capped_fits(synthetic):
    zc, yc, _, _ = synthetic
    with pytest.warns(ConvergenceWarning, match="cross-validation fits stopped"):
        cal = make_calibrator("dir-odir", max_iter=1).fit(zc, yc)
    assert cal.reg_lambda_ in cal.cv_path_[:, 0] and cal.reg_mu_ in cal.cv_path_[:, 1]
    assert not cal.converged_


def test_dirichlet_search_picks_the_lowest_cross_validated_nll(synthetic):
    zc, yc, _, _ = synthetic
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        cal = make_calibrator("dir-odir", reg_lambdas=[1e-1, 1e2], reg_mus=[1e-3]).fit(zc, yc)
    assert cal.cv_path_.shape == (2, 3)
    best = int(np.argmin(cal.cv_path_[:, 2]))
    assert cal.reg_lambda_ == cal.cv_path_[best, 0]
