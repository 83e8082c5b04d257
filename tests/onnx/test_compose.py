"""End-to-end graph: a real small classifier (an MLP trained on scikit-learn's digits,
written out as MatMul/Add/Relu) composed with an exported pipeline."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from sklearn.datasets import load_digits
from sklearn.neural_network import MLPClassifier

from cord_ops import CORD
from cord_ops.calibrators import make_calibrator
from cord_ops.softmax import softmax
from onnx_export import compose_with_classifier, export_onnx, open_session


def mlp_logits(mlp: MLPClassifier, x: np.ndarray) -> np.ndarray:
    """The MLP's output-layer pre-activations (predict_proba is their softmax)."""
    h = np.maximum(x @ mlp.coefs_[0] + mlp.intercepts_[0], 0.0)
    return h @ mlp.coefs_[1] + mlp.intercepts_[1]


def run_classifier(model: onnx.ModelProto, pixels: np.ndarray) -> np.ndarray:
    return open_session(model, provider="cpu").run(["logits"], {"pixels": pixels})[0]


def mlp_graph(mlp: MLPClassifier, opset: int = 13, ir_version: int = 7) -> onnx.ModelProto:
    """The MLP's forward pass as an ONNX graph with input 'pixels' and output 'logits'
    (an older opset and IR version than the pipeline's, as a user's model may have)."""
    weights = [numpy_helper.from_array(a.astype(np.float32), name) for a, name in (
        (mlp.coefs_[0], "w1"), (mlp.intercepts_[0], "b1"),
        (mlp.coefs_[1], "w2"), (mlp.intercepts_[1], "b2"))]
    nodes = [
        helper.make_node("MatMul", ["pixels", "w1"], ["h_pre"]),
        helper.make_node("Add", ["h_pre", "b1"], ["h_lin"]),
        helper.make_node("Relu", ["h_lin"], ["hidden"]),
        helper.make_node("MatMul", ["hidden", "w2"], ["o_pre"]),
        # A tensor named like a pipeline output, to prove the prefixes keep them apart.
        helper.make_node("Add", ["o_pre", "b2"], ["label"]),
        helper.make_node("Identity", ["label"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes, "digits_mlp",
        [helper.make_tensor_value_info("pixels", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
        initializer=weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=ir_version)


@pytest.fixture(scope="module")
def digits_pipeline():
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    rng = np.random.default_rng(0)
    order = rng.permutation(len(y))
    train, calib, test = order[:900], order[900:1350], order[1350:]
    mlp = MLPClassifier(hidden_layer_sizes=(32,), max_iter=1000, random_state=0)
    mlp.fit(x[train], y[train])
    logits = mlp_logits(mlp, x.astype(np.float64))
    cal = make_calibrator("vs").fit(logits[calib], y[calib])
    cord = CORD().fit(softmax(logits[calib]), cal.predict_proba(logits[calib]))
    return mlp, cal, cord, x[test]


def test_classifier_graph_is_the_mlp(digits_pipeline):
    mlp, _, _, pixels = digits_pipeline
    session_logits = run_classifier(mlp_graph(mlp), pixels)
    np.testing.assert_allclose(softmax(session_logits.astype(np.float64)),
                               mlp.predict_proba(pixels), atol=1e-5)


def test_composed_graph_equals_classifier_then_pipeline(digits_pipeline, run_model, cases):
    mlp, cal, cord, pixels = digits_pipeline
    classifier = mlp_graph(mlp)
    pipeline = export_onnx(cal, cord, 10, dtype="float32")
    composed = compose_with_classifier(classifier, pipeline, logits_output="logits")
    onnx.checker.check_model(composed, full_check=True)
    assert [i.name for i in composed.graph.input] == ["pixels"]
    assert [o.name for o in composed.graph.output] == [
        "repaired", "calibrated", "original", "label", "confidence"]
    assert {p.key: p.value for p in composed.metadata_props}["cord.calibrator"] == "vs"

    session = open_session(composed, provider="cpu")
    names = [o.name for o in session.get_outputs()]
    end_to_end = dict(zip(names, session.run(names, {"pixels": pixels}), strict=True))
    logits = run_classifier(classifier, pixels)
    staged = run_model(pipeline, logits)
    for name in names:
        np.testing.assert_array_equal(end_to_end[name], staged[name])
    # And against cord_ops on the classifier's float32 logits.
    cases.assert_parity(end_to_end, cases.reference(cal, cord, logits), "float32")
    np.testing.assert_array_equal(end_to_end["label"], mlp_logits(
        mlp, pixels.astype(np.float64)).argmax(axis=1))


def test_compose_rejects_mismatched_graphs(digits_pipeline, cases):
    mlp, cal, cord, _ = digits_pipeline
    classifier = mlp_graph(mlp)
    with pytest.raises(ValueError, match="not a classifier output"):
        compose_with_classifier(classifier, export_onnx(cal, cord, 10), logits_output="nope")
    with pytest.raises(ValueError, match="element type"):
        compose_with_classifier(classifier, export_onnx(cal, cord, 10, dtype="float64"))
    logits, labels = cases.synthetic_split(11, 300, seed=1)
    eleven = make_calibrator("ts").fit(logits, labels)
    cord11 = CORD().fit(softmax(logits), eleven.predict_proba(logits))
    with pytest.raises(ValueError, match="10 classes"):
        compose_with_classifier(classifier, export_onnx(eleven, cord11, 11))
