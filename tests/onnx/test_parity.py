"""Parity of every exported pipeline with cord_ops (docs/contract.md, "The ONNX graph"): all nine
calibrator families x {float32, float64} x {logits, probs} on adversarial synthetic inputs
with K = 2, 10 and 1,000, and on real CIFAR logits."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from conftest import load_shared, requires_shared

from cord_ops import CORD
from cord_ops.calibrators import (
    CALIBRATOR_NAMES,
    ConvergenceWarning,
    calibrator_from_dict,
    make_calibrator,
)
from cord_ops.cord_kernels import repair_terms, response
from cord_ops.softmax import softmax
from onnx_export import export_onnx, model_metadata
from onnx_export.builder import OPSET

KINDS = ("logits", "probs")
DTYPES = ("float32", "float64")


@pytest.mark.parametrize("k", [2, 10, 1000])
@pytest.mark.parametrize("input_kind", KINDS)
@pytest.mark.parametrize("name", CALIBRATOR_NAMES)
def test_every_family_matches_cord_ops_on_adversarial_inputs(name, input_kind, k, cases,
                                                             run_model):
    cal, cord = cases.fitted(name, k, input_kind)
    scores = cases.adversarial_scores(k, input_kind, seed=k + 1)
    expected = cases.reference(cal, cord, scores)
    for dtype in DTYPES:
        model = export_onnx(cal, cord, k, input_kind=input_kind, dtype=dtype)
        cases.assert_parity(run_model(model, scores.astype(dtype)), expected, dtype)


@pytest.mark.parametrize("name", ["ts", "vs", "svs", "irm"])
@pytest.mark.parametrize("eta", [0.0, -0.3, 0.6, 1.0, 2.5, -2.0])
def test_every_branch_of_the_closed_form(name, eta, cases, run_model):
    """eta* = 0 (H = g), eta* <= 1, eta* > 1 (eqs. 19-20) and eta* < -1/2, where float32
    graphs compute q and the repair in float64; local_weight != 1/2 exercises eq. 25."""
    k = 10
    cal, fitted_cord = cases.fitted(name, k, "logits")
    cord = cases.with_eta(fitted_cord, eta, local_weight=0.3)
    scores = cases.adversarial_scores(k, "logits", seed=3)
    expected = cases.reference(cal, cord, scores)
    # The chosen eta* must move rows off the identity, or the branch would go untested.
    assert eta == 0.0 or not np.allclose(expected["repaired"], cases.reference(
        cal, cases.with_eta(fitted_cord, 0.0, 0.3), scores)["repaired"])
    for dtype in DTYPES:
        model = export_onnx(cal, cord, k, dtype=dtype)
        cases.assert_parity(run_model(model, scores.astype(dtype)), expected, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_model_contract(dtype, cases):
    cal, cord = cases.fitted("vs", 10, "logits")
    model = export_onnx(cal, cord, 10, dtype=dtype)
    onnx.checker.check_model(model, full_check=True)
    # One default-domain opset, the one the builder declares; every op has a schema there.
    assert [(op.domain or "ai.onnx", op.version) for op in model.opset_import] == \
        [("ai.onnx", OPSET)]
    ops = {node.op_type for node in model.graph.node}
    assert all(onnx.defs.get_schema(op, OPSET, "").since_version <= OPSET for op in ops)
    # onnxruntime's CPU provider has no float64 kernel for these: a float64 graph using one
    # would load and then fail at run time.
    if dtype == "float64":
        assert not ops & {"OneHot", "Erf", "Hardmax"}
    assert {node.domain for node in model.graph.node} <= {""}
    meta = model_metadata(model)
    assert float(meta["cord.eta_star"]) == cord.eta_  # repr round-trips exactly
    assert meta["cord.calibrator"] == "vs" and meta["cord.n_classes"] == "10"
    assert meta["cord.version"]
    [scores] = model.graph.input
    assert scores.name == "scores"
    assert [d.dim_param or d.dim_value for d in scores.type.tensor_type.shape.dim] == ["N", 10]
    assert [o.name for o in model.graph.output] == [
        "repaired", "calibrated", "original", "label", "confidence"]
    names = {init.name for init in model.graph.initializer}
    assert any(name.startswith("weights") for name in names)


def test_export_rejects_mismatches(cases):
    cal, cord = cases.fitted("vs", 10, "logits")
    with pytest.raises(ValueError, match="n_classes"):
        export_onnx(cal, cord, 9)
    with pytest.raises(ValueError, match="input_kind"):
        export_onnx(cal, cord, 10, input_kind="probs")
    with pytest.raises(ValueError, match="dtype"):
        export_onnx(cal, cord, 10, dtype="float16")
    with pytest.raises(ValueError, match="not fitted"):
        export_onnx(cal, CORD(), 10)
    with pytest.raises(ValueError, match="not fitted"):
        export_onnx(make_calibrator("vs"), cord, 10)


@requires_shared
@pytest.mark.parametrize("input_kind", KINDS)
@pytest.mark.parametrize("name", CALIBRATOR_NAMES)
def test_parity_on_cifar_logits(name, input_kind, cases, run_model):
    """Fit on half of a real CIFAR-10 test set, compare on the other half; K = 100 on the
    ShuffleNetV2 file for the families cheap enough to fit there."""
    for stem in ("cifar10_resnet56", "cifar100_shufflenetv2_x1_0"):
        logits, labels = load_shared(stem)
        if logits.shape[1] == 100 and name in ("ms", "sms", "dir-odir"):
            continue
        scores = cases.scores_of(logits, input_kind)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            cal = make_calibrator(name, input_kind=input_kind, **cases.FAST.get(name, {}))
            cal.fit(scores[:2000], labels[:2000])
        cord = CORD().fit(softmax(logits[:2000]), cal.predict_proba(scores[:2000]))
        held_out = scores[5000:7000].astype(np.float32)
        expected = cases.reference(cal, cord, held_out)
        for dtype in DTYPES:
            model = export_onnx(cal, cord, logits.shape[1], input_kind=input_kind, dtype=dtype)
            cases.assert_parity(run_model(model, held_out.astype(dtype)), expected, dtype)


@pytest.mark.parametrize("name", ["vs", "svs"])
def test_exact_tie_in_q_keeps_the_original_class(name, cases, run_model):
    """Two classes with identical parameters tie exactly in q whenever their logits tie;
    the smallest-index rule then makes the original class q's top-1, so g = b (eq. 5), which
    the float32 graph's q_a < max_{j != a} q_j test must reproduce. With eta* > 0 and
    p0_a != b the other branch, g = (b + p0_a) / 2, would give a different repair."""
    k = 10
    cal, fitted_cord = cases.fitted(name, k, "logits")
    cord = cases.with_eta(fitted_cord, 0.5)
    state = cal.to_dict()
    for key in ("weights", "bias"):
        state["params"][key][1] = state["params"][key][0]
    tied = calibrator_from_dict(state)
    scores = cases.adversarial_logits(k, seed=4)[:24]
    scores[:, 1] = scores[:, 0] = scores.max(axis=1) + 1.0
    expected = cases.reference(tied, cord, scores)
    q = expected["calibrated"]
    assert (q[:, 0] == q[:, 1]).all() and (np.argmax(q, axis=1) == 0).all()
    assert (expected["label"] == 0).all()
    assert (np.abs(expected["original"][:, 0] - q[:, 0]) > 1e-3).all()
    for dtype in DTYPES:
        outputs = run_model(export_onnx(tied, cord, k, dtype=dtype), scores.astype(dtype))
        cases.assert_parity(outputs, expected, dtype)


@pytest.mark.parametrize("eta, gap", [(-2.0, 725.0), (-3.0, 725.0), (-6.0, 742.5)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_subnormal_tails_stay_finite(dtype, eta, gap, cases, run_model):
    """Rows whose other classes all sit near exp(-gap) in float64 (subnormal, not zero, so
    no stabilisation) with eta* < -1, where s stays well below 1: the repair is eq. 2 with
    alpha = q / tail. (1 - s) / tail overflows there, and tail / (1 - s) rounds to the
    subnormal grid, far enough off eq. 2 for this test to see it at eta* = -3 and a tail
    of 1e-314, and at eta* = -6 and a tail of 3e-322 (float32 too); at eta* = -2, 1 - s is
    ~1/2 and that quotient happens to be exact."""
    k = 10
    cal, fitted_cord = cases.fitted("ts", k, "logits")
    cord = cases.with_eta(fitted_cord, eta)
    rng = np.random.default_rng(8)
    logits = rng.normal(0.0, 0.1, (6, k))
    logits[np.arange(6), rng.integers(0, k, 6)] += gap / cal.beta_
    logits = logits.astype(np.float32)
    x = logits.astype(np.float64)
    original, calibrated = softmax(x), cal.predict_proba(x)
    assert (calibrated > 0).all() and (np.sort(calibrated, axis=1)[:, -2] < 1e-307).all()
    terms = repair_terms(original, calibrated, cord.local_weight)
    assert terms.tail.max() < (1e-313 if gap < 740 else 1e-321)
    s = response(cord.eta_, terms)
    repaired = (1.0 - s)[:, None] * (terms.rest / terms.tail[:, None])
    repaired[np.arange(6), terms.label] = s
    expected = {"original": original, "calibrated": calibrated, "repaired": repaired,
                "label": terms.label, "confidence": s}
    assert (s < 0.9).all()
    outputs = run_model(export_onnx(cal, cord, k, dtype=dtype), logits.astype(dtype))
    cases.assert_parity(outputs, expected, dtype)
    sums = outputs["repaired"].astype(np.float64).sum(axis=1)
    assert np.abs(sums - 1.0).max() <= 10 * k * np.finfo(dtype).eps


@pytest.mark.parametrize("name", ["irova", "irm"])
def test_isotonic_rows_summing_to_zero_become_uniform(name, cases, run_model):
    """With tie_eps = 0 a row whose entries all map to 0 sums to 0 and is calibrated to the
    uniform row (the graph's (r + e/K) / (sum r + e) form); other rows are untouched."""
    # every map is 0 up to 0.45 and 1 from 0.55 on
    train = np.array([[0.55, 0.45, 0.0], [0.0, 0.55, 0.45], [0.45, 0.0, 0.55]])
    cal = make_calibrator(name, input_kind="probs", tie_eps=0.0).fit(train, [0, 1, 2])
    cord = CORD().fit(train, cal.predict_proba(train))
    scores = np.array([[1 / 3, 1 / 3, 1 / 3], [0.4, 0.35, 0.25], [0.5, 0.3, 0.2],
                       [0.8, 0.1, 0.1]])
    expected = cases.reference(cal, cord, scores)
    assert np.all(expected["calibrated"][:2] == 1 / 3)  # the case under test happens
    assert not np.all(expected["calibrated"][2:] == 1 / 3)
    for dtype in DTYPES:
        got = run_model(export_onnx(cal, cord, 3, input_kind="probs", dtype=dtype),
                        scores.astype(dtype))
        cases.assert_parity(got, expected, dtype)
        assert np.all(got["calibrated"][:2] == np.asarray(1 / 3, dtype=dtype))
