"""One ONNX graph for a fitted ``cord_ops.CORDCalibratedClassifier``: the classifier's
features in, the repaired probabilities out.

The classifier part is skl2onnx's conversion of ``estimator_`` (unwrapped from
``FrozenEstimator``; a scikit-learn ``Pipeline`` converts as a whole) with ZipMap off and,
when the composite uses ``decision_function``, ``raw_scores`` on, so its ``probabilities``
output carries the scores the calibrator was fitted on. The calibrator + CORD part is
``export_onnx``'s graph; ``compose_with_classifier`` joins them. The graph's input is
``X`` [N, n_features] in the export dtype and its outputs are the pipeline's five
(``repaired``, ``calibrated``, ``original``, ``label``, ``confidence``); ``label`` indexes
``classes_``, which the metadata key ``cord.classes`` lists as JSON.

Binary classifiers: skl2onnx writes the raw scores of a one-column ``decision_function``
d as [-d, d], while the composite fits on the logits [0, d] (``cord_ops.calibrated``). A
Mul by [0, 1] in front of the pipeline turns one into the other exactly.

``export_calibrated_classifier`` runs the finished graph on the rows ``X`` it is given and
refuses to return one whose ``repaired`` differs from ``model.predict_proba`` by more than
the dtype's tolerance or whose ``label`` is not the argmax of ``repaired`` on some row
(the same guarantees as the pipeline graphs; docs in ``onnx_export.export``). Which
estimators skl2onnx converts is its own list; anything else raises its error.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnx_export.compose import compose_with_classifier
from onnx_export.export import export_onnx
from onnx_export.runtime import open_session

#: ``repaired`` of the composed graph against ``model.predict_proba`` on the same rows. The
#: classifier part is skl2onnx's, whose float32 arithmetic differs from scikit-learn's
#: float64 by far more than the pipeline graphs' own 1e-5.
TOLERANCE = {"float32": 1e-4, "float64": 1e-9}
SCORES_OUTPUT = "probabilities"
BINARY_OUTPUT = "cord_binary_logits"
INPUT_NAME = "X"


def _final_step(estimator):
    """The classifier whose options skl2onnx must see: the last step of a Pipeline."""
    steps = getattr(estimator, "steps", None)
    return steps[-1][1] if steps else estimator


def _unfrozen(estimator):
    from sklearn.frozen import FrozenEstimator

    return estimator.estimator if isinstance(estimator, FrozenEstimator) else estimator


def _binary_logits(classifier: onnx.ModelProto) -> onnx.ModelProto:
    """The classifier graph with one more output, [-d, d] * [0, 1] = [0, d]."""
    graph = classifier.graph
    source = next(o for o in graph.output if o.name == SCORES_OUTPUT)
    elem = source.type.tensor_type.elem_type
    mask = np.array([0.0, 1.0], dtype=helper.tensor_dtype_to_np_dtype(elem))
    graph.initializer.append(numpy_helper.from_array(mask, "cord_binary_mask"))
    graph.node.append(helper.make_node("Mul", [SCORES_OUTPUT, "cord_binary_mask"],
                                       [BINARY_OUTPUT]))
    graph.output.append(helper.make_tensor_value_info(BINARY_OUTPUT, elem, [None, 2]))
    return classifier


def classifier_graph(model, dtype: str) -> tuple[onnx.ModelProto, str]:
    """(skl2onnx graph of ``model.estimator_``, name of the output holding its scores)."""
    from skl2onnx import to_onnx

    estimator = _unfrozen(model.estimator_)
    n_features = getattr(model, "n_features_in_", None)
    if n_features is None:
        raise ValueError("model: the classifier has no n_features_in_; it cannot be exported")
    options = {"zipmap": False}
    if model.method_ == "decision_function":
        options["raw_scores"] = True
    sample = np.zeros((1, n_features), dtype=np.dtype(dtype))
    graph = to_onnx(estimator, sample, options={id(_final_step(estimator)): options},
                    target_opset={"": 18, "ai.onnx.ml": 3})
    graph.graph.input[0].name, old = INPUT_NAME, graph.graph.input[0].name
    for node in graph.graph.node:
        node.input[:] = [INPUT_NAME if name == old else name for name in node.input]
    if model.method_ == "decision_function" and len(model.classes_) == 2:
        return _binary_logits(graph), BINARY_OUTPUT
    return graph, SCORES_OUTPUT


def export_calibrated_classifier(model, X, dtype: str = "float32") -> onnx.ModelProto:
    """The end-to-end graph of a fitted ``CORDCalibratedClassifier`` (module docstring).

    ``X``: rows of features (a few hundred representative ones) on which the graph is
    verified against ``model.predict_proba`` before it is returned. Raises ValueError for
    an unfitted model, a failed verification, or (skl2onnx's errors) an estimator it
    cannot convert.
    """
    from sklearn.utils.validation import check_is_fitted

    check_is_fitted(model)
    if dtype not in TOLERANCE:
        raise ValueError(f"dtype: expected one of {tuple(TOLERANCE)}, got {dtype!r}")
    classifier, scores_output = classifier_graph(model, dtype)
    pipeline = export_onnx(model.calibrator_, model.cord_, n_classes=len(model.classes_),
                           input_kind=model.calibrator_.input_kind, dtype=dtype)
    merged = compose_with_classifier(classifier, pipeline, logits_output=scores_output)
    helper.set_model_props(merged, {
        **{prop.key: prop.value for prop in merged.metadata_props},
        "cord.classes": json.dumps(np.asarray(model.classes_).tolist()),
        "cord.n_features": str(model.n_features_in_),
        "cord.method": model.method_,
    })
    verify(merged, model, X, dtype)
    return merged


def verify(graph: onnx.ModelProto, model, X, dtype: str) -> float:
    """Run ``graph`` on X; raise unless every row keeps ``label`` on top of ``repaired`` and
    ``repaired`` is within the dtype's tolerance of ``model.predict_proba(X)``. Returns the
    largest absolute difference."""
    x = np.asarray(X, dtype=np.dtype(dtype))
    session = open_session(graph, provider="cpu")
    repaired, label = session.run(["repaired", "label"], {INPUT_NAME: x})
    flipped = np.argmax(repaired, axis=1) != label
    if flipped.any():
        row = int(np.flatnonzero(flipped)[0])
        raise ValueError(f"export: row {row} of X: argmax(repaired) is not label; the graph "
                         "breaks the prediction-preserving guarantee")
    expected = model.predict_proba(X)
    diff = float(np.max(np.abs(repaired.astype(np.float64) - expected)))
    if diff > TOLERANCE[dtype]:
        row = int(np.argmax(np.abs(repaired - expected).max(axis=1)))
        raise ValueError(f"export: row {row} of X: the graph's repaired differs from "
                         f"predict_proba by {diff:.3g} (> {TOLERANCE[dtype]:g} for {dtype})")
    return diff
