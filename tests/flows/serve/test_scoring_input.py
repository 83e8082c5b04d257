"""The input rules shared by the pyfunc flavour and ``cord-ops serve``, and the server's
micro-batcher on real onnxruntime sessions (in-process, no HTTP)."""

from __future__ import annotations

import asyncio

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from scipy.special import softmax

from cord_ops import CORD
from cord_ops.calibrators import make_calibrator
from flows.serve.batcher import MicroBatcher
from flows.serve.contract import InputContract, ScoringInputError, from_payload, score_matrix
from flows.serve.metrics import Metrics
from flows.serve.served_model import OUTPUTS, ServedModel, verify
from onnx_export import export_onnx, open_session

finite = st.floats(-1e6, 1e6, allow_nan=False, width=64)


@st.composite
def score_rows(draw, min_k: int = 2):
    k = draw(st.integers(min_k, 12))
    n = draw(st.integers(1, 20))
    return draw(arrays(np.float64, (n, k), elements=finite))


@given(score_rows(), st.sampled_from(["float32", "float64"]))
def test_every_accepted_form_gives_the_same_matrix(rows, dtype):
    n, k = rows.shape
    contract = InputContract(k, "logits", dtype)
    expected = rows.astype(dtype)
    columns = [f"c{j}" for j in range(k)]
    forms = {
        "float64 array": rows,
        "float32 array": rows.astype(np.float32),
        "lists": rows.tolist(),
        "frame of K columns": pd.DataFrame(rows, columns=columns),
        "frame of one array column": pd.DataFrame({"scores": list(rows)}),
        "named input": {"scores": rows},
        "inputs payload": from_payload({"inputs": rows.tolist()}),
        "instances payload": from_payload({"instances": [{"scores": r} for r in rows.tolist()]}),
        "dataframe_split": from_payload({"dataframe_split": {"columns": columns,
                                                             "data": rows.tolist()}}),
        "dataframe_split, array column": from_payload({"dataframe_split": {
            "columns": ["scores"], "data": [[r] for r in rows.tolist()]}}),
        "dataframe_records": from_payload({"dataframe_records": [
            dict(zip(columns, r, strict=True)) for r in rows.tolist()]}),
    }
    for form, value in forms.items():
        out = score_matrix(value, contract)
        assert out.dtype == np.dtype(dtype) and out.flags.c_contiguous, form
        if form == "float32 array":
            np.testing.assert_array_equal(out, rows.astype(np.float32).astype(dtype))
        else:
            np.testing.assert_array_equal(out, expected, err_msg=form)


@given(score_rows(), st.data(), st.sampled_from([np.nan, np.inf, -np.inf]))
def test_the_first_non_finite_row_is_named(rows, data, bad):
    n, k = rows.shape
    marked = data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=3))
    rows = rows.copy()
    for row in marked:
        rows[row, data.draw(st.integers(0, k - 1))] = bad
    with pytest.raises(ScoringInputError, match=rf"^input: row {min(marked)} contains NaN or inf") \
            as caught:
        score_matrix(rows.tolist(), InputContract(k, "logits", "float32"))
    assert caught.value.reason == "non_finite"


@given(score_rows(min_k=4), st.integers(-2, 2).filter(bool))
def test_a_wrong_width_is_refused(rows, delta):
    contract = InputContract(rows.shape[1] + delta, "logits", "float64")
    with pytest.raises(ScoringInputError, match="classes \\(columns\\)") as caught:
        score_matrix(pd.DataFrame(rows), contract)
    assert caught.value.reason == "wrong_width"


@given(arrays(np.float64, (6, 4), elements=st.floats(-5, 5)), st.integers(0, 5),
       st.floats(0.01, 0.5))
def test_probability_rows_must_sum_to_one(logits, row, excess):
    probs = softmax(logits, axis=1)
    contract = InputContract(4, "probs", "float32")
    np.testing.assert_allclose(score_matrix(probs, contract), probs, rtol=1e-6)
    probs[row] *= 1 + excess
    with pytest.raises(ScoringInputError, match=rf"row {row} sums to") as caught:
        score_matrix(probs, contract)
    assert caught.value.reason == "not_probabilities"


def test_malformed_inputs_get_their_own_reason():
    contract = InputContract(3, "logits", "float32")
    cases = {
        "bad_shape": [[1.0, 2.0, 3.0], [1.0, 2.0]],
        "out_of_range": np.array([[1e39, 0.0, 0.0]]),
    }
    for reason, value in cases.items():
        with pytest.raises(ScoringInputError) as caught:
            score_matrix(value, contract)
        assert caught.value.reason == reason, (reason, str(caught.value))
    for body in ({}, {"inputs": [[1, 2, 3]], "instances": [[1, 2, 3]]}, [1, 2],
                 {"dataframe_records": [{"a": 1}, {"b": 2}]}):
        with pytest.raises(ScoringInputError) as caught:
            from_payload(body)
        assert caught.value.reason == "bad_payload"
    with pytest.raises(ScoringInputError, match="column 'name' has dtype"):
        score_matrix(pd.DataFrame({"name": ["a"], "x": [1.0], "y": [2.0]}), contract)


# ---------------------------------------------------------------- micro-batching
def _served(version: str, calibrator: str, digits) -> ServedModel:
    fitted = make_calibrator(calibrator).fit(digits.scores, digits.labels)
    cord = CORD().fit(softmax(digits.scores, axis=1), fitted.predict_proba(digits.scores))
    graph = export_onnx(fitted, cord, 10, input_kind="logits", dtype="float32")
    session = open_session(graph, provider="cpu")
    contract = InputContract(10, "logits", "float32")
    report = verify(session, contract, (fitted, cord))
    return ServedModel("m", version, None, contract, repr(cord.eta_), calibrator, session,
                       tuple(session.get_providers()), report)


def test_concurrent_requests_share_runs_but_never_mix_versions(digits):
    one, two = _served("1", "vs", digits), _served("2", "ts", digits)
    rng = np.random.default_rng(0)
    requests = [(one if i % 3 else two, digits.scores[rng.integers(0, digits.n, 1 + i % 5)]
                 .astype(np.float32)) for i in range(60)]
    metrics = Metrics()

    async def scenario():
        batcher = MicroBatcher(window=0.005, max_rows=64, metrics=metrics)
        batcher.start()
        batcher.arriving = 1  # as if more requests were being read: the window applies
        try:
            return await asyncio.gather(*(batcher.score(m, s) for m, s in requests))
        finally:
            await batcher.stop()

    results = asyncio.run(scenario())
    routed = 0
    for (model, scores), result in zip(requests, results, strict=True):
        # The same version alone on these rows; batched float32 kernels may differ in the
        # last ulp, far below the two versions' difference.
        alone, other = ({name: value for name, value in zip(
            OUTPUTS, m.session.run(list(OUTPUTS), {"scores": scores}), strict=True)}
            for m in (model, two if model is one else one))
        np.testing.assert_array_equal(result["label"], alone["label"])
        np.testing.assert_allclose(result["repaired"], alone["repaired"], rtol=0, atol=1e-6)
        if np.max(np.abs(alone["repaired"] - other["repaired"])) > 1e-4:
            routed += 1
    assert routed > len(requests) / 2  # the check above tells the versions apart
    runs = metrics.registry.get_sample_value("cord_serve_batch_rows_count")
    assert runs < len(requests) / 4, f"{runs} onnxruntime runs for {len(requests)} requests"
    assert sum(len(s) for _, s in requests) == metrics.registry.get_sample_value(
        "cord_serve_batch_rows_sum")


def test_a_graph_that_disagrees_with_its_logged_state_is_rejected(digits):
    from flows.serve.served_model import VersionRejected

    fitted = make_calibrator("vs").fit(digits.scores, digits.labels)
    cord = CORD().fit(softmax(digits.scores, axis=1), fitted.predict_proba(digits.scores))
    session = open_session(export_onnx(fitted, cord, 10, input_kind="logits"), provider="cpu")
    contract = InputContract(10, "logits", "float32")
    assert verify(session, contract, (fitted, cord))["max_abs_diff"] <= 1e-5
    # The state of another fit (different eta*): a graph that is not what its run logged.
    other = CORD().fit(softmax(digits.scores[:300], axis=1),
                       make_calibrator("ts").fit(digits.scores[:300], digits.labels[:300])
                       .predict_proba(digits.scores[:300]))
    with pytest.raises(VersionRejected, match="exceeds the parity tolerance"):
        verify(session, contract, (fitted, other))


# ---------------------------------------------------------------- binary one-column form
@pytest.mark.parametrize("kind", ["probs", "logits"])
def test_a_binary_model_takes_one_score_column_in_every_form(kind):
    contract = InputContract(2, kind, "float32")
    column = [0.0, 0.5, 0.75, 1.0] if kind == "probs" else [-2.0, 0.0, 3.5, 40.0]
    wide = np.array(column)
    expected = (np.stack([1 - wide, wide], axis=1) if kind == "probs"
                else np.stack([np.zeros(4), wide], axis=1)).astype(np.float32)
    forms = [column, [[v] for v in column], np.float32(column), wide[:, None],
             pd.DataFrame({"p": column}), {"scores": column},
             from_payload({"inputs": column}),
             from_payload({"dataframe_split": {"columns": ["p"], "data": [[v] for v in column]}}),
             from_payload({"dataframe_records": [{"p": v} for v in column]})]
    for form in forms:
        out = score_matrix(form, contract)
        assert out.dtype == np.float32 and np.array_equal(out, expected), form


@pytest.mark.parametrize("k, rows, reason, message", [
    (2, np.full((2, 3), 1 / 3), "wrong_width",
     r"^input: expected 2 classes \(columns\), or one score column for this binary "
     r"model, got 3$"),
    (3, np.full((2, 1), 0.5), "wrong_width", r"^input: expected 3 classes \(columns\), got 1$"),
    (3, np.full(2, 0.5), "bad_shape", r"^input: expected a 2-D array \(n, K\)"),
    (2, np.array([0.5, 1.25]), "not_probabilities",
     r"^input: row 1 is 1\.25; expected a positive-class probability in \[0, 1\]"),
    (2, np.array([[0.5], [np.nan]]), "non_finite", r"^input: row 1 contains NaN or inf"),
])
def test_a_wrong_width_or_value_is_refused_in_one_line(k, rows, reason, message):
    with pytest.raises(ScoringInputError, match=message) as info:
        score_matrix(rows, InputContract(k, "probs", "float64"))
    assert info.value.reason == reason and "\n" not in str(info.value)


def test_float32_rows_are_renormalised_before_scoring():
    rows = np.array([[0.3, 0.70003], [0.5, 0.5]], dtype=np.float32)
    out = score_matrix(rows, InputContract(2, "probs", "float64"))
    wide = rows.astype(np.float64)
    assert np.array_equal(out, wide / wide.sum(axis=1, keepdims=True))
    with pytest.raises(ScoringInputError, match=r"row 0 sums to 1\.000299") as info:
        score_matrix(np.array([[0.3, 0.7003]], np.float32), InputContract(2, "probs",
                                                                          "float64"))
    assert info.value.reason == "not_probabilities"


def test_a_float32_graph_gets_the_stored_order_of_a_renormalised_near_tie():
    # a payload (float64 from JSON) holding float32 values one ulp apart at the top, its
    # row off 1 by 6.9e-5: renormalised then cast to float32 they would tie (class 0)
    row = np.array([[0.4202351, 0.42023513, 0.15959924]], dtype=np.float32)
    wide = row.astype(np.float64)
    assert (wide / wide.sum()).astype(np.float32)[0, 0] == (wide / wide.sum()).astype(
        np.float32)[0, 1]
    served = score_matrix(wide.tolist(), InputContract(3, "probs", "float32"))
    assert np.array_equal(served, row)  # the stored row itself, class 1 on top


def test_params_that_would_be_ignored_are_refused():
    """``params: {"outputs": ["all"]}`` is refused, not ignored: ignoring it would answer
    a question the caller did not ask. An empty ``params`` is MLflow's default."""
    rows = [[0.1, 0.9]]
    assert from_payload({"inputs": rows, "params": {}}) == rows
    for params, named in (({"outputs": ["all"]}, "['outputs']"), ([1], "list")):
        with pytest.raises(ScoringInputError) as refused:
            from_payload({"inputs": rows, "params": params})
        assert refused.value.reason == "unsupported_params"
        assert str(refused.value) == (
            f"request body: params {named} are not supported (the served graph takes none; "
            "every answer holds the repaired probabilities, the label and the confidence)")
