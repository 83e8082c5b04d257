"""Binary graphs that take one score column, and top-1 ties as k-NN and random forests
produce them, in float32 and float64 graphs.

The reference is cord_ops on the same inputs (conftest ``reference``); the one-column form
is expanded by hand here (p -> [1 - p, p], m -> [0, m]), not by the code under test.
"""

from __future__ import annotations

import warnings

import corpus
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cord_ops import CORD
from cord_ops.calibrators import ConvergenceWarning, make_calibrator
from cord_ops.names import CALIBRATOR_NAMES
from cord_ops.validation import top1
from onnx_export import export_onnx
from onnx_export.export import input_widths, model_metadata
from onnx_export.runtime import open_session

DTYPES = ("float32", "float64")


def _one_column(kind: str) -> np.ndarray:
    """Binary scores with the pathologies of real files, as float32 (how they are logged):
    exact 0 and 1, the tie p = 1/2 (m = 0), multiples of 1/5 (a 5-NN), p one ulp from
    1/2 and from 1, saturated margins, and ordinary values."""
    rng = np.random.default_rng(23)
    if kind == "probs":
        special = [0.0, 1.0, 0.5, 0.2, 0.4, 0.6, 0.8, np.nextafter(np.float32(0.5), 1),
                   np.nextafter(np.float32(0.5), 0), np.nextafter(np.float32(1), 0), 1e-30]
        column = np.concatenate([special, rng.uniform(0, 1, 40)])
    else:
        special = [0.0, -0.0, 1e-9, -1e-9, 40.0, -40.0, 1e4, -1e4, 0.5, -0.5]
        column = np.concatenate([special, rng.normal(0, 3, 40)])
    return column.astype(np.float32)


def _by_hand(column: np.ndarray, kind: str) -> np.ndarray:
    wide = column.astype(np.float64)
    first = 1.0 - wide if kind == "probs" else np.zeros_like(wide)
    return np.stack([first, wide], axis=1)


def _run(model, scores) -> dict[str, np.ndarray]:
    session = open_session(model, provider="cpu", threads=1)
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, {"scores": scores}), strict=True))


@pytest.mark.parametrize("kind", ["logits", "probs"])
@pytest.mark.parametrize("name", CALIBRATOR_NAMES)
def test_a_binary_graph_reads_one_score_column_as_its_two(name, kind, cases):
    cal, cord = cases.fitted(name, 2, kind)
    column = _one_column(kind)
    two = _by_hand(column, kind)
    expected = cases.reference(cal, cord, two)
    assert np.array_equal(expected["label"][:4 if kind == "probs" else 2],
                          [0, 1, 0, 0] if kind == "probs" else [0, 0])  # ties -> class 0
    for dtype in DTYPES:
        model = export_onnx(cal, cord, 2, input_kind=kind, dtype=dtype)
        assert input_widths(model_metadata(model)) == (1, 2)
        one = _run(model, column[:, None].astype(dtype))
        cases.assert_parity(one, expected, dtype)
        # the same graph fed the two columns in its own dtype answers bit for bit alike
        both = _run(model, two.astype(dtype))
        for key, value in one.items():
            assert np.array_equal(value, both[key]), (dtype, key)


def test_a_binary_graph_refuses_a_third_column(cases):
    cal, cord = cases.fitted("ts", 2, "logits")
    model = export_onnx(cal, cord, 2, dtype="float32")
    with pytest.raises(Exception, match="out of data bounds"):
        _run(model, np.zeros((2, 3), dtype=np.float32))


def _vote_probabilities(k: int, votes: int, n: int, seed: int) -> np.ndarray:
    """k-NN style rows: counts of ``votes`` neighbours over k classes, divided by votes,
    so most rows tie at the top; plus one-hot rows and a row tied in every class."""
    rng = np.random.default_rng(seed)
    counts = np.zeros((n, k))
    for i in range(n):
        np.add.at(counts[i], rng.integers(0, k, votes), 1)
    rows = np.concatenate([counts / votes, np.eye(k)[[k - 1, 0]], np.full((1, k), 1 / k)])
    return rows


@pytest.mark.parametrize("name", ["ts", "vs", "ms", "irova-ts", "irm"])
def test_ties_go_to_the_smallest_index_in_numpy_and_in_both_graph_dtypes(name):
    k, votes = 4, 6
    train = _vote_probabilities(k, votes, 300, seed=1)
    labels = np.random.default_rng(2).integers(0, k, train.shape[0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        cal = make_calibrator(name, input_kind="probs").fit(train, labels)
    cord = CORD().fit(train, cal.predict_proba(train))
    rows = _vote_probabilities(k, votes, 60, seed=3)
    # the smallest index attaining the maximum, found without argmax
    top = rows.max(axis=1, keepdims=True)
    smallest = np.array([int(np.flatnonzero(r == t)[0]) for r, t in zip(rows, top[:, 0],
                                                                        strict=True)])
    tied = (rows == top).sum(axis=1) > 1
    assert tied.sum() >= 20  # the fixture really is full of ties
    assert np.array_equal(top1(rows), smallest)
    repaired = cord.transform(rows, cal.predict_proba(rows))
    assert np.array_equal(top1(repaired), smallest)
    for dtype in DTYPES:
        out = _run(export_onnx(cal, cord, k, input_kind="probs", dtype=dtype),
                   rows.astype(dtype))
        assert np.array_equal(out["label"], smallest), dtype
        assert np.array_equal(np.argmax(out["repaired"], axis=1), smallest), dtype
        assert np.abs(out["repaired"].astype(np.float64) - repaired).max() <= (
            1e-5 if dtype == "float32" else 1e-12)


@pytest.mark.parametrize("name", ["ts", "vs", "irova"])
def test_a_graph_clips_a_column_over_one_by_its_rounding_as_the_loaders_do(name, cases):
    # p a few float32 ulps above 1 and a rounded 1 - p just below 0, fed to the graph raw
    # (as a server's payload can be): the graph's rows are [0, 1] and [1, 0], the loaders'
    cal, cord = cases.fitted(name, 2, "probs")
    column = np.array([1 + 10 * np.finfo(np.float32).eps, -2e-7, 0.3, 1.0],
                      dtype=np.float32)
    clipped = np.array([[0.0, 1.0], [1.0, 0.0], [0.7, 0.3], [0.0, 1.0]])
    clipped[2] = [1.0 - np.float64(column[2]), np.float64(column[2])]
    expected = cases.reference(cal, cord, clipped)
    for dtype in DTYPES:
        model = export_onnx(cal, cord, 2, input_kind="probs", dtype=dtype)
        out = _run(model, column[:, None].astype(dtype))
        assert np.isfinite(out["repaired"]).all()
        cases.assert_parity(out, expected, dtype)
        assert out["original"][:2].tolist() == [[0.0, 1.0], [1.0, 0.0]]


# ---------------------------------------------------------------- decision threshold
THRESHOLDS = (0.1, 0.8)


def _fitted_at(name: str, kind: str, t: float, cases):
    """The conftest's binary fit, its CORD refitted to keep the decision at ``t``."""
    cal, cord = cases.fitted(name, 2, kind)
    logits, _ = cases.synthetic_split(2, 1200, seed=2)
    return cal, CORD(decision_threshold=t).fit(
        cases.softmax(logits), cal.predict_proba(cases.scores_of(logits, kind)))


def _at(probs: np.ndarray, t: float) -> np.ndarray:
    """The decision at t written as an operator writes it (ties at exactly t to class 0)."""
    return ((1 - t) * probs[:, 1] > t * probs[:, 0]).astype(np.int64)


@pytest.mark.parametrize("t", THRESHOLDS)
@pytest.mark.parametrize("kind", ["logits", "probs"])
@pytest.mark.parametrize("name", ["vs", "ts", "irova", "dir-odir"])
def test_a_thresholded_graph_keeps_the_decisions_at_t_with_parity(name, kind, t, cases):
    cal, cord = _fitted_at(name, kind, t, cases)
    column = _one_column(kind)
    two = _by_hand(column, kind)
    x = two.astype(np.float64)
    original = cases.softmax(x) if kind == "logits" else x
    repaired = cord.transform(original, cal.predict_proba(x))
    expected_label = _at(original, t)
    np.testing.assert_array_equal(_at(repaired, t), expected_label)
    for dtype in DTYPES:
        model = export_onnx(cal, cord, 2, input_kind=kind, dtype=dtype)
        assert model_metadata(model)["cord.decision_threshold"] == repr(t)
        for scores in (column[:, None].astype(dtype), two.astype(dtype)):
            out = _run(model, scores)
            np.testing.assert_array_equal(out["label"], expected_label)
            got = out["repaired"].astype(np.float64)
            np.testing.assert_array_equal(_at(got, t), expected_label)
            assert np.max(np.abs(got - repaired)) <= (1e-12 if dtype == "float64" else 1e-5)
            np.testing.assert_array_equal(
                out["confidence"], out["repaired"][np.arange(len(got)), out["label"]])


@settings(max_examples=60, deadline=None)
@given(rows=corpus.probability_rows(k=2, n_rows=(1, 40), dtype="float32"),
       t=st.sampled_from(THRESHOLDS), name=st.sampled_from(["vs", "irova"]))
def test_no_decision_at_t_flips_in_either_graph_dtype(rows, t, name, cases):
    cal, cord = _fitted_at(name, "probs", t, cases)
    expected = _at(rows, t)
    for dtype in DTYPES:
        model = _threshold_models(cal, cord, dtype)
        out = _run(model, rows.astype(dtype))
        np.testing.assert_array_equal(out["label"], expected)
        np.testing.assert_array_equal(_at(out["repaired"].astype(np.float64), t), expected)


_MODELS: dict = {}


def _threshold_models(cal, cord, dtype):
    key = (cal.name, cord.decision_threshold, dtype)
    if key not in _MODELS:
        _MODELS[key] = export_onnx(cal, cord, 2, input_kind="probs", dtype=dtype)
    return _MODELS[key]


def test_threshold_one_half_exports_todays_graph(cases):
    cal, cord = cases.fitted("vs", 2, "logits")
    half = CORD.from_dict({**cord.to_dict(), "decision_threshold": 0.5})
    plain = export_onnx(cal, cord, 2, dtype="float32")
    graph = export_onnx(cal, half, 2, dtype="float32")
    assert graph.graph == plain.graph
    assert model_metadata(graph)["cord.decision_threshold"] == "0.5"
    assert "cord.decision_threshold" not in model_metadata(plain)


@pytest.mark.parametrize("t", THRESHOLDS)
def test_rows_pinned_next_to_t_keep_their_decision_after_the_float32_cast(t, cases):
    # thousands of rows pinned 1e-12 from t: a plain cast to float32 moves every one of
    # them onto float32(t) and half of them across t; the graph's fix-up moves them back
    cal, cord = _fitted_at("vs", "probs", t, cases)
    p = np.random.default_rng(7).uniform(0, 1, 20000).astype(np.float32)
    rows = np.stack([1 - p.astype(np.float64), p.astype(np.float64)], axis=1)
    repaired = cord.transform(rows, cal.predict_proba(rows))
    expected = _at(rows, t)
    pinned = np.abs(repaired[:, 1] - t) < 1e-9
    assert pinned.sum() > 200
    assert (_at(repaired.astype(np.float32).astype(np.float64), t) != expected).sum() > 100
    out = _run(_threshold_models(cal, cord, "float32"), p[:, None])
    np.testing.assert_array_equal(out["label"], expected)
    got = out["repaired"].astype(np.float64)
    np.testing.assert_array_equal(_at(got, t), expected)
    assert np.max(np.abs(got - repaired)) <= 1e-6
