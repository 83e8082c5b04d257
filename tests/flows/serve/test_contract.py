"""flows.serve.contract refusal by refusal: each reason code with its whole
one-line message, the contract's own checks, and the MLflow payload shapes, on tiny
hand-written inputs (no graph, no server)."""

from __future__ import annotations

import re
import sys
import warnings

import numpy as np
import pandas as pd
import pytest

from flows.errors import CordOpsError
from flows.serve.contract import (
    REASONS,
    InputContract,
    ScoringInputError,
    from_payload,
    score_matrix,
)

LOGITS3 = InputContract(3, "logits", "float32")
PROBS3 = InputContract(3, "probs", "float64")
BINARY = InputContract(2, "probs", "float32")


def _refused(reason: str, message: str):
    """The refusal with this reason code and exactly this message."""
    class Check:
        def __enter__(self):
            self.raises = pytest.raises(ScoringInputError, match="^" + re.escape(message) + "$")
            self.info = self.raises.__enter__()
            return self.info

        def __exit__(self, *exc):
            handled = self.raises.__exit__(*exc)
            assert self.info.value.reason == reason, (reason, str(self.info.value))
            return handled

    return Check()


# ---------------------------------------------------------------- the error and the contract
def test_the_error_is_a_cord_ops_value_error_with_a_known_reason():
    error = ScoringInputError("wrong_width", "input: wrong")
    assert isinstance(error, CordOpsError) and isinstance(error, ValueError)
    assert (error.reason, str(error)) == ("wrong_width", "input: wrong")
    for reason in REASONS:
        assert ScoringInputError(reason, "m").reason == reason
    with pytest.raises(ValueError, match=re.escape(
            f"reason: expected one of {REASONS}, got 'oops'")):
        ScoringInputError("oops", "m")


def test_the_contract_checks_its_fields():
    contract = InputContract(2, "probs", "float32")
    assert contract.dtype == np.dtype(np.float32) and isinstance(contract.dtype, np.dtype)
    assert InputContract(2, "logits", np.float64).dtype == np.float64
    with pytest.raises(ValueError, match=re.escape(
            "input_kind: expected one of ('logits', 'probs'), got 'logprobs'")):
        InputContract(3, "logprobs", "float32")
    with pytest.raises(ValueError, match="^n_classes: expected an integer >= 2, got 1$"):
        InputContract(1, "logits", "float32")
    with pytest.raises(ValueError, match="^dtype: expected float32 or float64, got float16$"):
        InputContract(3, "logits", "float16")


def test_widths_of_a_binary_and_a_multiclass_model():
    assert InputContract(2, "probs", "float32").widths == (1, 2)
    assert InputContract(3, "probs", "float32").widths == (3,)


def test_the_contract_is_read_from_graph_metadata():
    contract = InputContract.from_metadata(
        {"cord.n_classes": "10", "cord.input_kind": "probs", "cord.dtype": "float64",
         "other": "x"})
    assert contract == InputContract(10, "probs", np.dtype(np.float64))
    with pytest.raises(ValueError, match=r"^not a cord-ops pipeline graph \(metadata: "
                                         r"'cord.dtype'\)$"):
        InputContract.from_metadata({"cord.n_classes": "10", "cord.input_kind": "probs"})
    with pytest.raises(ValueError, match=r"^not a cord-ops pipeline graph \(metadata: "
                                         r"invalid literal for int"):
        InputContract.from_metadata({"cord.n_classes": "ten", "cord.input_kind": "probs",
                                     "cord.dtype": "float32"})
    with pytest.raises(ValueError, match=r"^not a cord-ops pipeline graph \(metadata: "
                                         r"n_classes: expected an integer >= 2, got 1\)$"):
        InputContract.from_metadata({"cord.n_classes": "1", "cord.input_kind": "probs",
                                     "cord.dtype": "float32"})
    with pytest.raises(ValueError, match=r"^not a cord-ops pipeline graph \(metadata: "):
        InputContract.from_metadata({"cord.n_classes": None, "cord.input_kind": "probs",
                                     "cord.dtype": "float32"})


# ---------------------------------------------------------------- score_matrix: accepted
def test_a_float32_contract_gets_a_c_contiguous_float32_matrix():
    rows = np.asfortranarray([[1.0, -2.0, 0.5], [3.0, 0.0, -1.5]])
    out = score_matrix(rows, LOGITS3)
    assert out.dtype == np.float32 and out.flags.c_contiguous
    assert out.tolist() == [[1.0, -2.0, 0.5], [3.0, 0.0, -1.5]]
    assert score_matrix([[1, 2, 3]], LOGITS3).tolist() == [[1.0, 2.0, 3.0]]
    series = pd.Series([[1.0, 2.0, 3.0], [0.0, 0.0, 1.0]], name="scores")
    assert score_matrix(series, LOGITS3).tolist() == [[1.0, 2.0, 3.0], [0.0, 0.0, 1.0]]


def test_probability_rows_are_renormalised_in_the_model_dtype():
    rows = [[0.5, 0.25, 0.25005], [0.2, 0.3, 0.5]]
    out = score_matrix(rows, PROBS3)
    wide = np.array(rows)
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out, wide / wide.sum(axis=1, keepdims=True))


def test_a_binary_column_becomes_two_columns():
    out = score_matrix(np.array([0.25, 1.0]), BINARY)
    assert out.dtype == np.float32 and out.tolist() == [[0.75, 0.25], [0.0, 1.0]]
    out = score_matrix({"p": [0.5]}, BINARY)
    assert out.tolist() == [[0.5, 0.5]]
    margins = score_matrix([[2.0], [-1.0]], InputContract(2, "logits", "float64"))
    assert margins.tolist() == [[0.0, 2.0], [0.0, -1.0]]


# ---------------------------------------------------------------- score_matrix: refused
def test_shape_refusals():
    with _refused("bad_shape", "input: expected a 2-D array (n, K), got shape (3,)"):
        score_matrix(np.zeros(3), LOGITS3)
    with _refused("bad_shape", "input: expected a 2-D array (n, K), got shape (1, 1, 3)"):
        score_matrix(np.zeros((1, 1, 3)), LOGITS3)
    with _refused("bad_shape", "input: expected at least one row, got shape (0, 3)"):
        score_matrix(np.zeros((0, 3)), LOGITS3)
    with _refused("bad_shape", "input: expected at least one row, got shape (0,)"):
        score_matrix([], BINARY)
    with _refused("bad_shape", "input: expected a 2-D array (n, K), got shape (0,)"):
        score_matrix([], LOGITS3)


def test_width_refusals():
    with _refused("wrong_width", "input: expected 3 classes (columns), got 4"):
        score_matrix(np.zeros((2, 4)), LOGITS3)
    with _refused("wrong_width", "input: expected 3 classes (columns), got 2"):
        score_matrix([[0.5, 0.5]], PROBS3)
    with _refused("wrong_width", "input: expected 3 classes (columns), got 1"):
        score_matrix([[0.5], [0.5]], PROBS3)
    with _refused("wrong_width", "input: expected 2 classes (columns), or one score column "
                                 "for this binary model, got 4"):
        score_matrix(np.full((1, 4), 0.25), BINARY)


def test_value_refusals_name_the_first_row():
    with _refused("non_finite", "input: row 1 contains NaN or inf; expected finite values"):
        score_matrix([[0.0, 1.0, 2.0], [np.inf, 0.0, 0.0], [np.nan, 0.0, 0.0]], LOGITS3)
    # a null entry of a JSON row is NaN, refused with its row
    with _refused("non_finite", "input: row 1 contains NaN or inf; expected finite values"):
        score_matrix([[0.0, 1.0, 2.0], [1.0, None, 2.0]], LOGITS3)
    with _refused("non_finite", "input: row 0 contains NaN or inf; expected finite values"):
        score_matrix(np.array([np.nan, 0.5]), BINARY)
    with _refused("not_probabilities", "input: row 1 sums to 1.5; expected rows summing to 1 "
                                       "within 0.0001 (8 x K x eps(float64), at least 0.0001)"):
        score_matrix([[0.5, 0.25, 0.25], [0.5, 0.5, 0.5]], PROBS3)
    with _refused("not_probabilities", "input: row 0 has a negative entry (-0.5); expected "
                                       "probabilities >= 0"):
        score_matrix([[1.0, 0.5, -0.5]], PROBS3)
    with _refused("not_probabilities", "input: row 1 is -0.25; expected a positive-class "
                                       "probability in [0, 1] (one score column)"):
        score_matrix([0.5, -0.25], BINARY)


def test_a_value_beyond_float32_is_out_of_range_naming_its_row():
    rows = np.array([[1.0, 0.0, 0.0], [0.0, 1e39, 0.0], [-1e39, 0.0, 0.0]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the overflowing cast is expected: a refusal, no warning
        with _refused("out_of_range", "input: row 1 has a value outside the float32 range of "
                                      "this model (|x| <= 3.4e+38)"):
            score_matrix(rows, LOGITS3)
    # one overflow to +inf alone (the row's minimum stays finite) is refused too
    with _refused("out_of_range", "input: row 0 has a value outside the float32 range of this "
                                  "model (|x| <= 3.4e+38)"):
        score_matrix([[0.0, 1e39, 0.0]], LOGITS3)
    # the largest float32 itself is in range; float64 models take 1e39 as it is
    top = float(np.finfo(np.float32).max)
    assert score_matrix([[top, -top, 0.0]], LOGITS3).tolist() == [[top, -top, 0.0]]
    wide = InputContract(3, "logits", "float64")
    assert score_matrix(rows, wide).tolist() == rows.tolist()


# ---------------------------------------------------------------- the forms of a batch
def test_a_dict_holds_exactly_one_named_input():
    # the key is named where the form is read; the value rules name the input itself
    with _refused("bad_shape", "input['scores']: expected numbers, got <U1 values"):
        score_matrix({"scores": [["a", "b", "c"]]}, LOGITS3)
    with _refused("non_finite", "input: row 0 contains NaN or inf; expected finite values"):
        score_matrix({"scores": [[np.nan, 0.0, 0.0]]}, LOGITS3)
    with _refused("bad_shape", "input: expected one input (the scores), got 2: ['a', 'b']"):
        score_matrix({"b": [[0.0, 0.0, 1.0]], "a": [[0.0, 0.0, 1.0]]}, LOGITS3)
    with _refused("bad_shape", "input: expected one input (the scores), got 0: []"):
        score_matrix({}, LOGITS3)
    with _refused("wrong_width", "batch: expected 3 classes (columns), got 2"):
        score_matrix({1: [[0.0, 1.0]]}, LOGITS3, "batch")


def test_frame_refusals_name_the_column():
    with _refused("bad_shape", "input: column 'name' has dtype object; expected numeric "
                               "columns (one per class) or one column of arrays"):
        score_matrix(pd.DataFrame({"x": [1.0], "name": pd.Series(["a"], dtype=object),
                                  "y": [2.0]}), LOGITS3)
    # also as the first of several columns (not read as a one-column frame of arrays)
    with _refused("bad_shape", "input: column 'name' has dtype object; expected numeric "
                               "columns (one per class) or one column of arrays"):
        score_matrix(pd.DataFrame({"name": pd.Series(["a"], dtype=object), "x": [1.0],
                                   "y": [2.0]}), LOGITS3)
    with _refused("bad_shape", "input column 'label': expected numbers, got <U1 values"):
        score_matrix(pd.DataFrame({"label": ["a", "b"]}), LOGITS3)
    with _refused("bad_shape", "input column 'cells': row 1 has 2 values but row 0 has 3; "
                               "expected rows of equal length"):
        score_matrix(pd.DataFrame({"cells": [[1.0, 2.0, 3.0], [1.0, 2.0]]}), LOGITS3)


def test_list_refusals():
    with _refused("bad_shape", "input: expected numbers, got <U1 values"):
        score_matrix([["a", "b", "c"]], LOGITS3)
    with _refused("bad_shape", "input: expected numbers, got <U1 values"):
        score_matrix(np.array([["a", "b", "c"]]), LOGITS3)
    with _refused("bad_shape", "input: expected numbers, got bool values"):
        score_matrix(np.array([[True, False, True]]), LOGITS3)
    with _refused("bad_shape", "input: expected numbers, got <U6 values"):
        score_matrix("scores", LOGITS3)
    with _refused("bad_shape", "input: expected a 2-D array (n, K) of numbers, got NoneType"):
        score_matrix(None, LOGITS3)
    with _refused("bad_shape", "input: row 2 has 2 values but row 0 has 3; expected rows of "
                               "equal length"):
        score_matrix([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0], [1.0, 2.0]], LOGITS3)
    with _refused("bad_shape", "input: row 1 has -1 values but row 0 has 3; expected rows of "
                               "equal length"):
        score_matrix([[1.0, 2.0, 3.0], None], LOGITS3)
    # an entry numpy cannot read as a number: numpy's own words follow
    with pytest.raises(ScoringInputError, match=r"^input: expected numbers \(") as caught:
        score_matrix([[1.0, {}, 3.0], [1.0, 2.0, 3.0]], LOGITS3)
    assert caught.value.reason == "bad_shape"
    # ragged deeper than one level: numpy cannot build it, the rows are read one by one
    with _refused("bad_shape", "input: row 1 has 2 values but row 0 has 3; expected rows of "
                               "equal length"):
        score_matrix([[1.0, 2.0, 3.0], [[1.0, 2.0]]], LOGITS3)


def test_an_empty_object_array_is_a_bad_shape():
    with _refused("bad_shape", "input: expected 2 classes (columns), or one score column for "
                               "this binary model, got 0"):
        score_matrix(np.empty(0, dtype=object), BINARY)


# ---------------------------------------------------------------- MLflow payloads
KEYS = "inputs, instances, dataframe_split, dataframe_records"


def test_payload_refusals():
    with _refused("bad_payload", f"request body: expected a JSON object with one of {KEYS}, "
                                 "got list"):
        from_payload([[1, 2, 3]])
    with _refused("bad_payload", f"request body: expected exactly one of {KEYS}, got keys []"):
        from_payload({})
    with _refused("bad_payload", f"request body: expected exactly one of {KEYS}, got keys "
                                 "['inputs', 'instances']"):
        from_payload({"instances": [[1]], "inputs": [[1]]})
    with _refused("bad_payload", f"request body: expected exactly one of {KEYS}, got keys "
                                 "['extra', 'inputs']"):
        from_payload({"inputs": [[1]], "extra": 1})
    with _refused("bad_payload", "inputs: expected a list of rows, got int"):
        from_payload({"inputs": 5})
    with _refused("bad_payload", "instances: expected a list of rows, got dict"):
        from_payload({"instances": {"a": [1], "b": [2]}})
    with _refused("bad_payload", "dataframe_split: expected an object with 'columns' and a "
                                 "'data' list of rows"):
        from_payload({"dataframe_split": [[1, 2]]})
    with _refused("bad_payload", "dataframe_split: expected an object with 'columns' and a "
                                 "'data' list of rows"):
        from_payload({"dataframe_split": {"columns": ["a"], "data": "x"}})
    with _refused("bad_payload", "dataframe_records: expected a list of row objects"):
        from_payload({"dataframe_records": {"a": 1}})
    with _refused("bad_payload", "dataframe_records: expected a list of row objects"):
        from_payload({"dataframe_records": [{"a": 1}, [2]]})
    with _refused("bad_payload", "dataframe_records: row 2 has fields ['b', 'a']; expected "
                                 "['a', 'b'] as in row 0"):
        from_payload({"dataframe_records": [{"a": 1, "b": 2}, {"a": 3, "b": 4},
                                            {"b": 5, "a": 6}]})
    with _refused("bad_payload", "instances: row 1 has fields ['a']; expected ['a', 'b'] as "
                                 "in row 0"):
        from_payload({"instances": [{"a": 1, "b": 2}, {"a": 3}]})


def test_payload_rows():
    rows = [[1.0, 2.0], [3.0, 4.0]]
    assert from_payload({"inputs": rows, "params": {}}) is rows
    assert from_payload({"instances": rows}) is rows
    assert from_payload({"inputs": []}) == []
    assert from_payload({"inputs": {"scores": rows}}) == {"scores": rows}
    assert from_payload({"dataframe_split": {"columns": ["a", "b"], "data": rows}}) == rows
    assert from_payload({"dataframe_split": {"data": rows}}) == rows
    # a one-column frame of arrays: the cells themselves
    assert from_payload({"dataframe_split": {"columns": ["s"], "data": [[[1, 2]], [[3, 4]]]}}
                        ) == [[1, 2], [3, 4]]
    assert from_payload({"dataframe_split": {"columns": ["s"], "data": [[0.5], [0.25]]}}) == [
        [0.5], [0.25]]
    assert from_payload({"dataframe_split": {"columns": ["s"], "data": [[], []]}}) == [[], []]
    assert from_payload({"dataframe_split": {"columns": ["s"], "data": [[[1, 2]]]}}) == [[1, 2]]
    assert from_payload({"dataframe_split": {"columns": ["s"], "data": []}}) == []
    assert from_payload({"dataframe_records": [{"b": 1, "a": 2}, {"b": 3, "a": 4}]}) == [
        [1, 2], [3, 4]]
    assert from_payload({"dataframe_records": []}) == []
    assert from_payload({"dataframe_records": [{"s": [1, 2]}, {"s": [3, 4]}]}) == [
        [1, 2], [3, 4]]
    assert from_payload({"instances": [{"s": [1, 2]}, {"s": [3, 4]}]}) == [[1, 2], [3, 4]]
    assert from_payload({"instances": [{"a": 1, "b": 2}]}) == [[1, 2]]
    # a one-column frame whose row is not a one-element list keeps that row
    assert from_payload({"dataframe_split": {"columns": ["s"], "data": [[[1, 2]], [3, 4]]}}
                        ) == [[1, 2], [3, 4]]
    assert from_payload({"dataframe_split": {"columns": ["s"], "data": [[[1, 2]], [[3], [4]]]}}
                        ) == [[1, 2], [[3], [4]]]


def test_lists_are_read_without_pandas_imported(monkeypatch):
    # a server that never imported pandas gets no DataFrame: the form check must not need it
    monkeypatch.delitem(sys.modules, "pandas")
    assert score_matrix([[1.0, 2.0, 3.0]], LOGITS3).tolist() == [[1.0, 2.0, 3.0]]
