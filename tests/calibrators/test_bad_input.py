"""Every bad input raises a ValueError/TypeError naming the problem, before any state."""

from __future__ import annotations

import re

import numpy as np
import pytest

from cord_ops.calibrators import (
    CALIBRATOR_NAMES,
    NotFittedError,
    calibrator_from_dict,
    make_calibrator,
)

NAMES = list(CALIBRATOR_NAMES)
Z = np.random.default_rng(0).normal(size=(40, 3))
Y = np.arange(40) % 3
Z[np.arange(40), Y] += 1.0  # informative but not separable: no fit warns


def test_unknown_name_lists_the_valid_ones():
    # in the paper's order, as cord_ops.names lists them
    with pytest.raises(ValueError, match="unknown calibrator 'platt'; expected one of vs, svs, "
                       "ms, sms, dir-odir, irova, irova-ts, ts, irm, ts-tva, mcct-i, identity$"):
        make_calibrator("platt")
    with pytest.raises(ValueError, match="unknown calibrator"):
        make_calibrator(None)


def test_unknown_option_and_bad_input_kind_are_rejected():
    with pytest.raises(TypeError):
        make_calibrator("ts", temperature=2.0)
    with pytest.raises(ValueError, match="input_kind"):
        make_calibrator("vs", input_kind="logprobs")
    with pytest.raises(ValueError, match="prob_floor"):
        make_calibrator("ts", prob_floor=0.0)


@pytest.mark.parametrize(("name", "option", "value"), [
    ("ts", "max_iter", 0), ("vs", "max_iter", 2.5), ("ms", "gtol", -1e-6),
    ("svs", "reg_lambda_bias", -1.0), ("sms", "rho", float("nan")),
    ("dir-odir", "n_folds", 1), ("dir-odir", "reg_lambdas", []),
    ("dir-odir", "search", "all"), ("dir-odir", "reg_mus", [0.0]),
    ("mcct-i", "max_iter", 0), ("mcct-i", "gtol", 0.0), ("irova", "tie_eps", -1e-9),
    ("irm", "tie_eps", "1e-9"),
])
def test_bad_options_are_rejected(name, option, value):
    with pytest.raises(ValueError, match=option):
        make_calibrator(name, **{option: value})


def _nan(z):
    z = z.copy()
    z[7, 1] = np.nan
    return z


def _inf(z):
    z = z.copy()
    z[5, 0] = np.inf
    return z


FIT_CASES = {
    "nan scores": (lambda: (_nan(Z), Y), ValueError, "row 7 contains NaN"),
    "inf scores": (lambda: (_inf(Z), Y), ValueError, "row 5 contains NaN or inf"),
    "rank 1 scores": (lambda: (Z[:, 0], Y), ValueError, "2-D array"),
    "rank 3 scores": (lambda: (Z[None], Y), ValueError, "2-D array"),
    "no rows": (lambda: (Z[:0], Y[:0]), ValueError, "at least one row"),
    "one class": (lambda: (Z[:, :1], Y * 0), ValueError, "K >= 2"),
    "object scores": (lambda: (Z.astype(object), Y), TypeError, "real numeric"),
    "label count": (lambda: (Z, Y[:-1]), ValueError, "expected 40 labels"),
    "label out of range": (lambda: (Z, np.where(np.arange(40) == 9, 3, Y)), ValueError,
                           "row 9 is 3; expected a class in"),
    "negative label": (lambda: (Z, np.where(np.arange(40) == 2, -1, Y)), ValueError,
                       "row 2 is -1"),
    "fractional label": (lambda: (Z, np.where(np.arange(40) == 4, 0.5, Y)), ValueError,
                         "row 4 is 0.5; expected an integer"),
    "too few string labels": (lambda: (Z, np.where(Y == 2, "a", "b")), ValueError,
                              "2 distinct labels for 3 score columns"),
    "mixed label types": (lambda: (Z, np.array(["a", "b", "c", 1] * 10, dtype=object)),
                          TypeError, "row 3 is 1 \\(int\\)"),
    "complex labels": (lambda: (Z, Y.astype(complex)), TypeError, "expected class labels"),
    "2-D labels": (lambda: (Z, Y[:, None]), ValueError, "1-D array"),
}


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("case", list(FIT_CASES))
def test_fit_rejects(name, case):
    make, error, message = FIT_CASES[case]
    scores, labels = make()
    cal = make_calibrator(name)
    with pytest.raises(error, match=message):
        cal.fit(scores, labels)
    assert not hasattr(cal, "n_classes_")


@pytest.mark.parametrize("name", NAMES)
def test_probability_input_must_be_probabilities(name):
    p = np.full((40, 3), 1.0 / 3.0)
    cal = make_calibrator(name, input_kind="probs")
    with pytest.raises(ValueError, match="row 0 sums to"):
        cal.fit(p * 2, Y)
    bad = p.copy()
    bad[3] = [1.2, -0.1, -0.1]
    with pytest.raises(ValueError, match="row 3 has a negative entry"):
        cal.fit(bad, Y)


@pytest.fixture(scope="module")
def fitted():
    return {name: make_calibrator(name).fit(Z, Y) for name in NAMES}


@pytest.mark.parametrize("name", NAMES)
def test_predict_before_fit_is_a_clear_error(name):
    with pytest.raises(NotFittedError, match="not fitted"):
        make_calibrator(name).predict_proba(Z)
    with pytest.raises(NotFittedError, match="not fitted"):
        make_calibrator(name).to_dict()


@pytest.mark.parametrize("name", NAMES)
def test_predict_rejects_another_k_and_bad_scores(name, fitted):
    cal = fitted[name]
    with pytest.raises(ValueError, match="expected 3 classes"):
        cal.predict_proba(np.zeros((5, 4)))
    with pytest.raises(ValueError, match="row 7 contains NaN"):
        cal.predict_proba(_nan(Z))
    with pytest.raises(ValueError, match="2-D array"):
        cal.predict_proba(Z[0])
    with pytest.raises(ValueError, match="at least one row"):
        cal.predict_proba(Z[:0])


@pytest.mark.parametrize("name", NAMES)
def test_corrupt_state_is_rejected(name, fitted):
    good = fitted[name].to_dict()
    key = next(iter(good["params"]))

    def corrupt(change):
        state = {**good, "params": dict(good["params"]), "options": dict(good["options"])}
        change(state)
        return state

    other = "ts" if name != "ts" else "vs"
    other_options = sorted(make_calibrator(other).fit(Z, Y).to_dict()["options"])
    poisoned = (rf"{key}\[0\]\.x must be strictly increasing" if key == "knots"
                else rf"{key} contains NaN or inf")
    # each corruption with the message that names it, not one shared prefix
    cases = {
        "missing params": (lambda s: s.pop("params"), r"missing keys \['params'\]"),
        "other name": (lambda s: s.update(name=other),
                       "options must have exactly the keys " + re.escape(str(other_options))),
        "bad n_classes": (lambda s: s.update(n_classes=1),
                          "n_classes must be an integer >= 2, got 1"),
        "extra option": (lambda s: s["options"].update(bogus=1),
                         "options must have exactly the keys " +
                         re.escape(str(sorted(good["options"])))),
        "missing param": (lambda s: s["params"].pop(key),
                          "params must have exactly the keys " +
                          re.escape(str(sorted(good["params"])))),
        "nan param": (lambda s: s["params"].update({key: _poison(s["params"][key])}),
                      poisoned),
    }
    for change, message in cases.values():
        with pytest.raises(ValueError, match="^calibrator state: " + message):
            calibrator_from_dict(corrupt(change))
    with pytest.raises(ValueError, match="unknown calibrator"):
        calibrator_from_dict({**good, "name": "nope"})
    with pytest.raises(ValueError, match="calibrator state"):
        calibrator_from_dict([good])


def _poison(value):
    """The same parameter with one entry replaced by NaN (or x knots made unsorted)."""
    if isinstance(value, float):
        return float("nan")
    if value and isinstance(value[0], dict):
        x = list(value[0]["x"])
        return [{"x": x[::-1] if len(x) > 1 else [float("nan")], "y": value[0]["y"]}]
    flat = np.array(value, dtype=float)
    flat.flat[0] = np.nan
    return flat.tolist()


@pytest.mark.parametrize("name", ["vs", "ms", "sms"])
def test_wrong_parameter_shape_is_rejected(name, fitted):
    state = fitted[name].to_dict()
    state["params"]["bias"] = state["params"]["bias"][:-1]
    with pytest.raises(ValueError, match=r"bias must have shape \(3,\)"):
        calibrator_from_dict(state)
