"""The prior-shift candidate graph (onnx_export.prior_shift) against
cord_ops.prior_shift.PriorShiftRepair in numpy: parity within the project's fixed parity
tolerance, and every top-1 the classifier's, on random logits and priors with exact zeros."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cord_ops import CORD
from cord_ops.calibrators import make_calibrator
from cord_ops.prior_shift import PriorShiftRepair
from onnx_export import export_onnx
from onnx_export.parity import FIXED_PARITY_TOLERANCE
from onnx_export.prior_shift import (
    ETA_KEY,
    PRIOR_SHIFT_KEY,
    SOURCE_VERSION_KEY,
    export_prior_shift,
    priors_digest,
)
from onnx_export.runtime import open_session


def _champion(scores, labels, kind, calibrator, dtype):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cal = make_calibrator(calibrator, input_kind=kind).fit(scores, labels)
        uncal = scores if kind == "probs" else np.exp(scores - scores.max(1, keepdims=True))
        uncal = uncal / uncal.sum(1, keepdims=True)
        cord = CORD().fit(uncal, cal.predict_proba(scores))
    return export_onnx(cal, cord, scores.shape[1], input_kind=kind, dtype=dtype)


def _run(model, scores, dtype):
    names = [o.name for o in model.graph.output]
    return dict(zip(names, open_session(model, provider="cpu").run(
        names, {"scores": scores.astype(dtype)}), strict=True))


@st.composite
def cases(draw):
    k = draw(st.integers(2, 6))
    n = draw(st.integers(8, 40))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    kind = draw(st.sampled_from(["logits", "probs"]))
    scale = draw(st.sampled_from([0.5, 3.0, 20.0]))
    z = rng.normal(size=(n, k)) * scale
    labels = rng.integers(0, k, n)
    labels[:k] = np.arange(k)  # every class seen
    if kind == "probs":
        p = np.exp(z - z.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        # exact zeros in the classifier's probabilities (never the row's maximum)
        zero = (rng.random((n, k)) < 0.2) & (p < p.max(1, keepdims=True))
        p[zero] = 0.0
        scores = p / p.sum(1, keepdims=True)
    else:
        scores = z
    target = rng.dirichlet(np.full(k, draw(st.sampled_from([0.3, 1.0, 5.0]))))
    # exact zeros in the target priors, hence in the weights
    if draw(st.booleans()):
        target[rng.integers(0, k)] = 0.0
        target = target / target.sum() if target.sum() > 0 else np.full(k, 1.0 / k)
    return dict(scores=scores, labels=labels, kind=kind, target=target,
                dtype=draw(st.sampled_from(["float32", "float64"])),
                calibrator=draw(st.sampled_from(["ts", "vs"])))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_candidate_graph_matches_numpy_and_keeps_every_top1(case):
    dtype = case["dtype"]
    champion = _champion(case["scores"], case["labels"], case["kind"], case["calibrator"],
                         dtype)
    out = _run(champion, case["scores"], dtype)
    original = out["original"].astype(np.float64)
    repaired = out["repaired"].astype(np.float64)
    source = repaired.mean(axis=0)
    source /= source.sum()
    fitted = PriorShiftRepair().fit(original, repaired, source, case["target"])
    expected = fitted.transform(original, repaired)

    candidate = export_prior_shift(champion, fitted, source, "7")
    got = _run(candidate, case["scores"], dtype)

    assert got["repaired"].dtype == np.dtype(dtype)
    diff = np.abs(got["repaired"].astype(np.float64) - expected).max()
    assert diff <= FIXED_PARITY_TOLERANCE[dtype]
    top = np.argmax(out["original"], axis=1)
    # the original's top-1 on every row, strictly (argmax takes the first of a tie)
    assert np.array_equal(np.argmax(got["repaired"], axis=1), top)
    assert np.array_equal(got["label"], out["label"])
    assert np.array_equal(got["original"], out["original"])
    rows = np.arange(len(top))
    assert np.array_equal(got["confidence"], got["repaired"][rows, top])
    runner_up = np.where(np.arange(got["repaired"].shape[1]) == top[:, None], -np.inf,
                         got["repaired"]).max(axis=1)
    assert (got["repaired"][rows, top] > runner_up).all()


def test_calibrated_output_is_the_reweighted_rows_and_metadata_names_the_candidate():
    rng = np.random.default_rng(3)
    z = rng.normal(size=(60, 4)) * 2
    labels = np.arange(60) % 4
    champion = _champion(z, labels, "logits", "ts", "float64")
    out = _run(champion, z, "float64")
    source = out["repaired"].mean(axis=0)
    target = np.array([0.5, 0.3, 0.2, 0.0])
    fitted = PriorShiftRepair().fit(out["original"], out["repaired"], source, target)
    candidate = export_prior_shift(champion, fitted, source, "3")
    got = _run(candidate, z, "float64")
    w = target / source
    q = out["repaired"] * w
    np.testing.assert_allclose(got["calibrated"], q / q.sum(1, keepdims=True), atol=1e-15)
    meta = {p.key: p.value for p in candidate.metadata_props}
    assert meta[PRIOR_SHIFT_KEY] == "label-free candidate"
    assert meta[SOURCE_VERSION_KEY] == "3"
    assert float(meta[ETA_KEY]) == fitted.cord_.eta_
    assert meta["cord.prior_shift.priors_sha256"] == priors_digest(source, target)
    assert meta["cord.n_classes"] == "4" and meta["cord.eta_star"] == repr(
        float(next(p.value for p in champion.metadata_props if p.key == "cord.eta_star")))


def test_bad_inputs_are_refused():
    rng = np.random.default_rng(0)
    z = rng.normal(size=(30, 3))
    champion = _champion(z, np.arange(30) % 3, "logits", "ts", "float32")
    out = _run(champion, z, "float32")
    source = np.full(3, 1 / 3)
    fitted = PriorShiftRepair().fit(out["original"].astype(np.float64),
                                    out["repaired"].astype(np.float64), source,
                                    np.array([0.6, 0.3, 0.1]))
    with pytest.raises(ValueError, match="source_priors"):
        export_prior_shift(champion, fitted, np.array([0.5, 0.25, 0.25]), "1")
    with pytest.raises(ValueError, match="not fitted"):
        export_prior_shift(champion, PriorShiftRepair(), source, "1")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cal = make_calibrator("ts").fit(z, np.arange(30) % 3)
    lean = export_onnx(cal, CORD().fit(out["original"].astype(np.float64),
                                       out["repaired"].astype(np.float64)), 3, outputs="lean")
    with pytest.raises(ValueError, match="'original'"):
        export_prior_shift(lean, fitted, source, "1")
    twice = export_prior_shift(champion, fitted, source, "1")
    with pytest.raises(ValueError, match="prior-shift candidate"):
        export_prior_shift(twice, fitted, source, "2")


def _pass_through_champion(k: int):
    """A stand-in champion whose ``repaired`` and ``original`` are its probability input,
    so a row can put all its mass on a class whose weight is 0 (no fitted champion does)."""
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Identity", ["scores"], ["repaired"]),
             helper.make_node("Identity", ["scores"], ["original"]),
             helper.make_node("ArgMax", ["scores"], ["label"], axis=1, keepdims=0,
                              select_last_index=0)]
    graph = helper.make_graph(
        nodes, "pass", [helper.make_tensor_value_info("scores", TensorProto.DOUBLE, ["N", k])],
        [helper.make_tensor_value_info("repaired", TensorProto.DOUBLE, ["N", k]),
         helper.make_tensor_value_info("original", TensorProto.DOUBLE, ["N", k]),
         helper.make_tensor_value_info("label", TensorProto.INT64, ["N"])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)


def test_a_row_the_weights_send_to_zero_is_kept_as_it_was():
    rows = np.array([[0.0, 1.0, 0.0], [0.2, 0.5, 0.3], [0.6, 0.1, 0.3], [0.1, 0.2, 0.7]])
    source, target = np.full(3, 1 / 3), np.array([0.5, 0.0, 0.5])
    fitted = PriorShiftRepair().fit(rows, rows, source, target)
    expected = fitted.transform(rows, rows)
    got = _run(export_prior_shift(_pass_through_champion(3), fitted, source, "1"), rows,
               "float64")
    np.testing.assert_allclose(got["repaired"], expected, atol=FIXED_PARITY_TOLERANCE["float64"])
    assert np.array_equal(got["repaired"].argmax(1), rows.argmax(1))
    # the dead row kept its mass on class 1 (a plain division would give NaN)
    assert np.isfinite(got["repaired"]).all() and got["repaired"][0].argmax() == 1


def test_a_binary_champion_of_one_score_column_gives_a_candidate_of_one_column_too():
    """A binary classifier's file of P(class 1) alone, with exact 0, 1, 0.5 and float32 values:
    the candidate takes the one column as the champion does, answers as for the two-column
    rows, and keeps every decision."""
    rng = np.random.default_rng(3)
    p1 = rng.beta(0.7, 0.7, 200).astype(np.float32)
    p1[:10], p1[10:20], p1[20:25] = 0.0, 1.0, 0.5  # exact ends and ties at the top
    labels = (rng.random(200) < p1).astype(np.int64)
    labels[:2] = [0, 1]
    two = np.stack([1 - p1, p1], axis=1).astype(np.float64)
    champion = _champion(two, labels, "probs", "ts", "float32")
    out = _run(champion, p1[:, None], "float32")
    original, repaired = out["original"].astype(np.float64), out["repaired"].astype(np.float64)
    fitted = PriorShiftRepair().fit(original, repaired, np.array([0.5, 0.5]),
                                    np.array([0.8, 0.2]))
    candidate = export_prior_shift(champion, fitted, np.array([0.5, 0.5]), "3")

    one_column = _run(candidate, p1[:, None], "float32")
    two_columns = _run(candidate, two, "float32")
    np.testing.assert_array_equal(one_column["repaired"], two_columns["repaired"])
    assert one_column["repaired"].shape == (200, 2)
    expected = fitted.transform(original, repaired)
    assert np.abs(one_column["repaired"] - expected).max() <= FIXED_PARITY_TOLERANCE["float32"]
    assert np.array_equal(one_column["label"], out["label"])
    # 0.8 / 0.2 priors pull mass to class 0; rows the classifier gave class 1 keep it.
    assert np.array_equal(np.argmax(one_column["repaired"], axis=1), out["label"])
    assert (out["label"] == 1).sum() > 20
