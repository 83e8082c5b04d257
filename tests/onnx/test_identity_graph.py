"""The identity calibrator's graph: the classifier's own probabilities, CORD's
eta* exactly 0, in both graph dtypes, for logits and probabilities, and in the one-column
binary form. The expected values are written out here (softmax by hand, p / sum p), not
taken from the calibrator under test."""

from __future__ import annotations

import numpy as np
import pytest

from cord_ops import CORD
from cord_ops.calibrators import make_calibrator
from onnx_export import export_onnx
from onnx_export.export import input_widths, model_metadata

DTYPES = ("float32", "float64")


def _by_hand(scores: np.ndarray, kind: str) -> np.ndarray:
    x = scores.astype(np.float64)
    if kind == "probs":
        return x / x.sum(axis=1, keepdims=True)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _fitted(k: int, kind: str, cases):
    logits, labels = cases.synthetic_split(k, 400, seed=k)
    scores = cases.scores_of(logits, kind)
    cal = make_calibrator("identity", input_kind=kind).fit(scores, labels)
    original = cases.scores_of(logits, "probs")
    cord = CORD().fit(original, cal.predict_proba(scores))
    return cal, cord


@pytest.mark.parametrize("k", [2, 10, 1000])
@pytest.mark.parametrize("kind", ["logits", "probs"])
def test_identity_graph_serves_the_classifiers_own_probabilities(k, kind, cases, run_model):
    cal, cord = _fitted(k, kind, cases)
    assert cord.eta_ == 0.0 and cal.to_dict()["params"] == {}
    scores = cases.adversarial_scores(k, kind, seed=k + 7)
    own = _by_hand(scores, kind)
    assert np.max(np.abs(cal.predict_proba(scores.astype(np.float64)) - own)) <= 1e-15
    expected = cases.reference(cal, cord, scores)
    # eta* = 0 returns q except on boundary rows, which CORD's stabilisation (Appendix A,
    # DELTA_STAB = 1e-10) moves off exact 0 and 1.
    assert np.max(np.abs(expected["repaired"] - own)) <= 1e-9
    for dtype in DTYPES:
        model = export_onnx(cal, cord, k, input_kind=kind, dtype=dtype)
        assert model_metadata(model)["cord.calibrator"] == "identity"
        out = run_model(model, scores.astype(dtype))
        cases.assert_parity(out, expected, dtype)
        assert np.max(np.abs(out["repaired"].astype(np.float64) - own)) <= (
            1e-9 if dtype == "float64" else 1e-6)


@pytest.mark.parametrize("kind", ["logits", "probs"])
def test_identity_binary_graph_reads_one_score_column(kind, cases, run_model):
    cal, cord = _fitted(2, kind, cases)
    rng = np.random.default_rng(41)
    if kind == "probs":
        column = np.concatenate([[0.0, 1.0, 0.5], rng.uniform(0, 1, 30)])
        two = np.stack([1.0 - column, column], axis=1)
    else:
        column = np.concatenate([[0.0, 40.0, -40.0], rng.normal(0, 3, 30)])
        two = np.stack([np.zeros_like(column), column], axis=1)
    own = _by_hand(two, kind)
    for dtype in DTYPES:
        model = export_onnx(cal, cord, 2, input_kind=kind, dtype=dtype)
        assert input_widths(model_metadata(model)) == (1, 2)
        one = run_model(model, column[:, None].astype(dtype))
        assert np.array_equal(one["label"], np.argmax(own, axis=1))
        assert np.max(np.abs(one["repaired"].astype(np.float64) - own)) <= (
            1e-9 if dtype == "float64" else 1e-6)
