"""A fitted CORDCalibratedClassifier as one ONNX graph (skl2onnx classifier + calibrator +
CORD): parity with predict_proba and no flipped prediction, on real scikit-learn models."""

from __future__ import annotations

import functools
import json
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sklearn.datasets import load_digits, make_classification
from sklearn.exceptions import NotFittedError
from sklearn.frozen import FrozenEstimator
from sklearn.linear_model import LogisticRegression
from sklearn.neural_network import MLPClassifier
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from cord_ops import CORDCalibratedClassifier
from cord_ops.calibrators import ConvergenceWarning, make_calibrator
from onnx_export import export_calibrated_classifier, model_metadata, open_session
from onnx_export.classifier import TOLERANCE


@functools.cache
def _digits():
    x, y = load_digits(return_X_y=True)
    order = np.random.default_rng(0).permutation(len(y))
    return x[order] / 16.0, y[order]


@pytest.fixture
def digits():
    return _digits()


def _run(graph, x, dtype):
    session = open_session(graph, provider="cpu")
    return session.run(["repaired", "label"], {"X": np.asarray(x, dtype=dtype)})


CLASSIFIERS = {
    "logreg": lambda: LogisticRegression(C=1e4, max_iter=5000),
    "mlp": lambda: MLPClassifier(hidden_layer_sizes=(32,), max_iter=200, random_state=0),
    "scaler+logreg": lambda: make_pipeline(StandardScaler(), LogisticRegression(max_iter=3000)),
}
CASES = [("logreg", "vs", False), ("logreg", "dir-odir", False), ("logreg", "irova-ts", True),
         ("mlp", "vs", False), ("mlp", "irova-ts", True),
         ("scaler+logreg", "ms", False), ("scaler+logreg", "vs", True)]


@functools.cache
def _classifier(name: str, binary: bool):
    """One fit per (classifier, label set), shared by the calibrators that wrap it."""
    x, y = _digits()
    y = np.array(["even", "odd"])[y % 2] if binary else y
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return CLASSIFIERS[name]().fit(x[:900], y[:900]), y


@pytest.mark.parametrize(("name", "calibrator", "binary"), CASES)
def test_graph_matches_predict_proba_and_keeps_every_prediction(digits, name, calibrator,
                                                                binary):
    x, _ = digits
    clf, y = _classifier(name, binary)
    options = {"reg_lambdas": (1e-2,), "reg_mus": (1e-2,)} if calibrator == "dir-odir" else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model = CORDCalibratedClassifier(FrozenEstimator(clf),
                                         make_calibrator(calibrator, **options))
        model.fit(x[900:1350], y[900:1350])
    test = x[1350:]
    for dtype in ("float32", "float64"):
        graph = export_calibrated_classifier(model, test, dtype=dtype)
        meta = model_metadata(graph)
        assert json.loads(meta["cord.classes"]) == model.classes_.tolist()
        assert meta["cord.method"] == model.method_
        repaired, label = _run(graph, test, dtype)
        assert repaired.dtype == np.dtype(dtype)
        assert np.array_equal(np.argmax(repaired, axis=1), label)
        assert np.array_equal(model.classes_[label], clf.predict(test))
        assert np.max(np.abs(repaired - model.predict_proba(test))) <= TOLERANCE[dtype]


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), n_classes=st.integers(2, 6),
       calibrator=st.sampled_from(["ts", "vs", "ms", "irm", "irova"]),
       method=st.sampled_from(["decision_function", "predict_proba"]))
def test_random_problems_export_with_zero_flips(seed, n_classes, calibrator, method):
    x, y = make_classification(n_samples=400, n_features=8, n_informative=5,
                               n_classes=n_classes, random_state=seed)
    clf = LogisticRegression(max_iter=2000).fit(x[:150], y[:150])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model = CORDCalibratedClassifier(clf, calibrator, method=method).fit(x[150:300],
                                                                            y[150:300])
    graph = export_calibrated_classifier(model, x[300:], dtype="float64")
    repaired, label = _run(graph, x[300:], "float64")
    assert np.array_equal(label, np.argmax(repaired, axis=1))
    assert np.array_equal(model.classes_[label], clf.predict(x[300:]))
    assert np.max(np.abs(repaired - model.predict_proba(x[300:]))) <= TOLERANCE["float64"]


def test_export_refuses_unfitted_models_and_bad_dtypes(digits):
    x, y = digits
    with pytest.raises(NotFittedError):
        export_calibrated_classifier(CORDCalibratedClassifier(LogisticRegression()), x[:5])
    clf = LogisticRegression(max_iter=2000).fit(x[:300], y[:300])
    model = CORDCalibratedClassifier(clf, "ts").fit(x[300:600], y[300:600])
    with pytest.raises(ValueError, match="dtype"):
        export_calibrated_classifier(model, x[:5], dtype="float16")
