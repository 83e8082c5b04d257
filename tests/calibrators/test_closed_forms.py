"""Each predict_proba equals its documented closed form evaluated from ``to_dict()`` alone,
the contract the ONNX exporter rebuilds; and the fitted maps match their references."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from sklearn.isotonic import IsotonicRegression

from cord_ops.calibrators import CALIBRATOR_NAMES, ConvergenceWarning, make_calibrator
from cord_ops.calibrators.isotonic import normalise
from cord_ops.softmax import softmax


def _sm(s):
    e = np.exp(s - s.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def closed_form(state: dict, scores: np.ndarray) -> np.ndarray:
    """An independent evaluation of every calibrator's documented predict path."""
    prm, name, k = state["params"], state["name"], state["n_classes"]
    floor = state["prob_floor"]
    probs_in = state["input_kind"] == "probs"
    z = np.log(np.maximum(scores, floor)) if probs_in else scores
    arr = {key: np.array(v) for key, v in prm.items() if not isinstance(v, list)
           or not v or not isinstance(v[0], dict)}

    def isotonic(p, knots):
        r = np.column_stack([np.interp(p[:, j], np.array(knots[j % len(knots)]["x"]),
                                       np.array(knots[j % len(knots)]["y"]))
                             for j in range(k)])
        r = r + state["options"]["tie_eps"] * p
        s = r.sum(axis=1, keepdims=True)
        return np.where(s > 0, r / np.where(s > 0, s, 1), 1.0 / k)

    if name == "ts":
        return _sm(prm["beta"] * z)
    if name == "vs":
        return _sm(z * arr["weights"] + arr["bias"])
    if name == "ms":
        return _sm(z @ arr["weights"].T + arr["bias"])
    if name in ("svs", "sms"):
        x = np.log((1 - prm["mix_eps"]) * _sm(prm["mix_beta"] * z) + prm["mix_eps"] / k)
        w = arr["weights"]
        return _sm(x * w + arr["bias"] if w.ndim == 1 else x @ w.T + arr["bias"])
    if name == "dir-odir":
        if probs_in:
            x = np.log(np.maximum(scores, floor))
        else:
            sh = z - z.max(axis=1, keepdims=True)
            x = np.maximum(sh - np.log(np.exp(sh).sum(axis=1, keepdims=True)), np.log(floor))
        return _sm(x @ arr["weights"].T + arr["bias"])
    if name == "ts-tva":
        return _sm(prm["beta"] * z)
    if name == "mcct-i":
        # Rank each row (larger first, smaller index first on ties), shift by the row
        # minimum, apply the per-rank inverse scale and bias, put back, softmax.
        s = np.empty_like(z)
        for i, row in enumerate(z):
            order = sorted(range(k), key=lambda j: (-row[j], j))
            for r, j in enumerate(order):
                s[i, j] = arr["inv_scales"][r] * (row[j] - row.min()) + arr["biases"][r]
        return _sm(s)
    if name == "irova-ts":
        return isotonic(_sm(prm["beta"] * z), prm["knots"])
    p = scores if probs_in else _sm(scores)
    return isotonic(p, prm["knots"])


@pytest.mark.parametrize("name", list(CALIBRATOR_NAMES))
@pytest.mark.parametrize("input_kind", ["logits", "probs"])
def test_predict_is_the_documented_closed_form(name, input_kind, synthetic):
    zc, yc, ze, _ = synthetic
    to_input = softmax if input_kind == "probs" else np.asarray
    cal = make_calibrator(name, input_kind=input_kind).fit(to_input(zc), yc)
    expected = closed_form(cal.to_dict(), to_input(ze))
    np.testing.assert_allclose(cal.predict_proba(to_input(ze)), expected, rtol=0, atol=1e-12)


def test_irova_knots_are_sklearns_isotonic_regression(synthetic):
    zc, yc, ze, _ = synthetic
    cal = make_calibrator("irova").fit(zc, yc)
    p_cal, p_eval = softmax(zc), softmax(ze)
    r = np.column_stack([
        IsotonicRegression(out_of_bounds="clip").fit(p_cal[:, k], yc == k).predict(p_eval[:, k])
        for k in range(4)
    ]) + 1e-9 * p_eval
    np.testing.assert_allclose(cal.predict_proba(ze), r / r.sum(axis=1, keepdims=True),
                               rtol=0, atol=1e-12)


def test_irm_fits_one_map_on_all_pairs(synthetic):
    zc, yc, ze, _ = synthetic
    cal = make_calibrator("irm").fit(zc, yc)
    assert len(cal.knots_) == 1
    onehot = np.eye(4)[yc]
    iso = IsotonicRegression(out_of_bounds="clip").fit(softmax(zc).ravel(), onehot.ravel())
    p = softmax(ze)
    r = iso.predict(p.ravel()).reshape(p.shape) + 1e-9 * p
    np.testing.assert_allclose(cal.predict_proba(ze), r / r.sum(axis=1, keepdims=True),
                               rtol=0, atol=1e-12)


def test_isotonic_maps_clip_outside_their_knots():
    p = np.array([[0.6, 0.4], [0.8, 0.2], [0.3, 0.7]])
    cal = make_calibrator("irova", input_kind="probs", tie_eps=0.0).fit(p, np.array([0, 0, 1]))
    far = np.array([[1.0, 0.0], [0.0, 1.0]])
    (x0, y0), (x1, y1) = cal.knots_
    expected = np.array([[y0[-1], y1[0]], [y0[0], y1[-1]]])
    np.testing.assert_allclose(cal.predict_proba(far),
                               normalise(expected), rtol=0, atol=1e-15)


def test_zero_rows_fall_back_to_uniform():
    r = np.array([[0.0, 0.0, 0.0], [0.2, 0.0, 0.6]])
    np.testing.assert_allclose(normalise(r), [[1 / 3, 1 / 3, 1 / 3], [0.25, 0.0, 0.75]],
                               rtol=0, atol=1e-15)


def test_structured_maps_use_the_reference_ridge_and_mixture(synthetic):
    zc, yc, _, _ = synthetic
    sms = make_calibrator("sms").fit(zc, yc)
    assert sms.mix_eps_ == 1.0 / (zc.shape[0] + 1)
    assert sms.mix_beta_ == make_calibrator("ts").fit(zc, yc).beta_
    pen = sms.penalty(1500, 4)
    assert (pen.diag, pen.bias, pen.offdiag) == pytest.approx((4 / 1500, 4 / 1500, 12 / 1500))
    # A huge ridge leaves only ts-mix: every delta shrinks to zero.
    stiff = make_calibrator("sms", reg_lambda_bias=1e9, reg_lambda_diag=1e9,
                            reg_lambda_offdiag=1e9).fit(zc, yc)
    np.testing.assert_allclose(stiff.weights_, np.eye(4), atol=1e-6)
    np.testing.assert_allclose(stiff.bias_, 0.0, atol=1e-6)


def test_vector_and_matrix_scaling_reach_a_stationary_point(synthetic):
    zc, yc, _, _ = synthetic
    onehot = np.eye(4)[yc]
    for name in ("vs", "ms"):
        cal = make_calibrator(name).fit(zc, yc)
        d = (cal.predict_proba(zc) - onehot) / zc.shape[0]
        grad_w = d.T @ zc if name == "ms" else np.einsum("ik,ik->k", d, zc)
        assert np.max(np.abs(grad_w)) < 1e-6 and np.max(np.abs(d.sum(axis=0))) < 1e-6


def test_temperature_solves_the_first_order_condition(synthetic):
    zc, yc, _, _ = synthetic
    cal = make_calibrator("ts").fit(zc, yc)
    q = cal.predict_proba(zc)
    slope = np.mean(np.sum(q * zc, axis=1) - zc[np.arange(zc.shape[0]), yc])
    assert abs(slope) < 1e-10
    assert 0.2 < cal.beta_ < 0.5  # the synthetic model is 3x overconfident


def test_vector_scaling_above_the_dense_newton_size_still_converges(make_miscalibrated):
    z, y = make_miscalibrated(5, 4000, 300)  # 600 parameters: the conjugate-gradient Newton path
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        cal = make_calibrator("vs").fit(z, y)
    d = (cal.predict_proba(z) - np.eye(300)[y]) / z.shape[0]
    assert np.max(np.abs(np.einsum("ik,ik->k", d, z))) < 1e-6
    assert np.max(np.abs(d.sum(axis=0))) < 1e-6
