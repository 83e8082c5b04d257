"""cord_ops.validation, function by function: each refusal's whole message (array, first
offending row, expectation), the boundaries of every rule, and the values the loaders
return, written out by hand or computed with plain numpy in the test."""

from __future__ import annotations

import re

import numpy as np
import pytest

from cord_ops import validation as v

EPS16 = float(np.finfo(np.float16).eps)
EPS32 = float(np.finfo(np.float32).eps)
EPS64 = float(np.finfo(np.float64).eps)


def _raises(error, message: str):
    """The whole one-line message, not a prefix or a fragment."""
    return pytest.raises(error, match="^" + re.escape(message) + "$")


# ---------------------------------------------------------------- layout and values
@pytest.mark.parametrize(("array", "dtype"), [
    (np.array([[1, 2]], dtype=object), "object"), (np.array([[True, False]]), "bool"),
    (np.array([[1j, 2]]), "complex128"), (np.array([["a", "b"]]), "<U1"),
])
def test_a_non_real_dtype_is_a_type_error_naming_it(array, dtype):
    with _raises(TypeError, f"scores: expected a real numeric array, got dtype {dtype}"):
        v.check_layout(array)
    with _raises(TypeError, f"x: expected a real numeric array, got dtype {dtype}"):
        v.check_scores(array, "x")


def test_layout_refusals_name_the_shape():
    with _raises(ValueError, "scores: expected a 2-D array (n, K), got shape (3,)"):
        v.check_layout(np.zeros(3))
    with _raises(ValueError, "scores: expected a 2-D array (n, K), got shape (1, 2, 2)"):
        v.check_layout(np.zeros((1, 2, 2)))
    with _raises(ValueError, "scores: expected at least one row, got shape (0, 3)"):
        v.check_layout(np.zeros((0, 3)))
    with _raises(ValueError, "scores: expected K >= 2 classes, got shape (4, 1)"):
        v.check_layout(np.zeros((4, 1)))
    with _raises(ValueError, "s: expected 4 classes (columns), got 3"):
        v.check_layout(np.zeros((2, 3)), "s", n_classes=4)


def test_layout_passes_the_array_through_untouched():
    for array in (np.zeros((1, 2), dtype=np.int8), np.zeros((2, 3), dtype=np.float32),
                  np.zeros((1, 2), dtype=np.uint16)):
        assert v.check_layout(array) is array
        assert v.check_layout(array, n_classes=array.shape[1]) is array


def test_scores_come_back_as_float64_without_copying_float64():
    ints = np.array([[1, 2], [3, 4]], dtype=np.int32)
    out = v.check_scores(ints)
    assert out.dtype == np.float64 and out.tolist() == [[1.0, 2.0], [3.0, 4.0]]
    wide = np.array([[0.5, -2.0]])
    # a loader passes n x K arrays of hundreds of MB: float64 input is not copied
    assert v.check_scores(wide) is wide
    with _raises(ValueError, "scores: expected 3 classes (columns), got 2"):
        v.check_scores(wide, n_classes=3)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_the_first_non_finite_row_is_named(bad):
    # finite rows around it, and a second bad row after it: the first is named
    scores = np.array([[0.0, 1.0], [2.0, -3.0], [4.0, 5.0], [6.0, 7.0]])
    scores[2, 1] = bad
    scores[3, 0] = bad
    with _raises(ValueError, "z: row 2 contains NaN or inf; expected finite values"):
        v.check_scores(scores, "z")


def test_a_negative_entry_is_named_with_its_row_and_value():
    p = np.array([[1.0, 0.0], [0.75, 0.25], [1.25, -0.25], [1.5, -0.5]])
    with _raises(ValueError, "probabilities: row 2 has a negative entry (-0.25); expected "
                             "probabilities >= 0"):
        v.check_probabilities(p)
    # exact zeros are probabilities
    np.testing.assert_array_equal(v.check_probabilities(p[:2]), p[:2])


def test_a_row_off_one_is_named_with_its_sum_and_the_tolerance():
    p = np.array([[0.5, 0.5], [0.5, 0.75], [2.0, 0.0]])
    with _raises(ValueError, "probs: row 1 sums to 1.25; expected rows summing to 1 within "
                             "0.0001"):
        v.check_probabilities(p, "probs")
    with _raises(ValueError, "probs: row 0 sums to 0.5; expected rows summing to 1 within "
                             "0.0001"):
        v.check_probabilities(np.array([[0.25, 0.25]]), "probs")
    # the tolerance is inclusive: exactly atol off passes, beyond it does not
    assert v.check_probabilities(p[:2], atol=0.25).tolist() == [[0.5, 0.5], [0.5, 0.75]]
    with _raises(ValueError, "probabilities: row 1 sums to 1.25; expected rows summing to 1 "
                             "within 0.125"):
        v.check_probabilities(p[:2], atol=0.125)
    with _raises(ValueError, "probabilities: expected 3 classes (columns), got 2"):
        v.check_probabilities(p[:1], n_classes=3)


def test_the_default_sum_tolerance_is_1e_4():
    inside = np.array([[0.5, 0.5 + 0.9e-4], [0.5, 0.5 - 0.9e-4]])
    np.testing.assert_array_equal(v.check_probabilities(inside), inside)
    with pytest.raises(ValueError, match="row 0 sums to"):
        v.check_probabilities(np.array([[0.5, 0.5 + 1.1e-4]]))


# ---------------------------------------------------------------- stored probability rows
def test_sum_tolerance_by_storage_dtype():
    assert v.sum_tolerance(np.float64, 10) == 1e-4
    assert v.sum_tolerance("float32", 2) == 1e-4
    assert v.sum_tolerance(np.float32, 1000) == 8 * 1000 * EPS32
    assert v.sum_tolerance(np.float16, 2) == 16 * EPS16 == 2.0**-6
    assert v.sum_tolerance(np.float16, 10) == 80 * EPS16
    # integer rows are held to float64's epsilon (a K this large shows which one is used)
    assert v.sum_tolerance(np.int64, 10**12) == 8 * 10**12 * EPS64
    assert v.sum_tolerance(np.uint8, 3) == 1e-4


def test_renormalised_rows_the_worst_error_and_its_row():
    p = np.array([[0.5, 0.50002], [0.25, 0.75], [0.2, 0.79994], [0.6, 0.4]])
    out, worst, row = v.normalised_probabilities(p)
    np.testing.assert_array_equal(out, p / p.sum(axis=1, keepdims=True))
    assert row == 2
    assert worst == abs(0.2 + 0.79994 - 1.0)
    assert worst == pytest.approx(6e-5, rel=1e-9)


def test_rows_summing_to_one_come_back_unchanged():
    p = np.array([[0.25, 0.75], [1.0, 0.0]], dtype=np.float32)
    out, worst, row = v.normalised_probabilities(p)
    assert (worst, row) == (0.0, 0)
    assert out.dtype == np.float64 and out.tolist() == [[0.25, 0.75], [1.0, 0.0]]
    # float64 rows that need nothing are not copied (a file of hundreds of MB)
    wide = p.astype(np.float64)
    assert v.normalised_probabilities(wide)[0] is wide


def test_a_stored_refusal_names_the_first_bad_row_and_the_dtype_rule():
    # rows 1 and 3 are beyond 1e-4; row 3 is the worse one, row 1 is named
    p = np.array([[0.5, 0.5], [0.5, 0.5002], [0.5, 0.50005], [0.5, 0.75]])
    with _raises(ValueError, "probs: row 1 sums to 1.0002; expected rows summing to 1 within "
                             "0.0001 (8 x K x eps(float64), at least 0.0001)"):
        v.normalised_probabilities(p, "probs")
    with _raises(ValueError, "probs: expected 3 classes (columns), got 2"):
        v.normalised_probabilities(p, "probs", n_classes=3)
    with _raises(ValueError, "probabilities: row 0 has a negative entry (-0.5); expected "
                             "probabilities >= 0"):
        v.normalised_probabilities(np.array([[1.5, -0.5]]))


def test_the_stored_tolerance_is_inclusive_at_its_exact_value():
    # float16, K = 2: the tolerance is 2**-6 exactly, and 1 + 2**-6 is a float16 row sum
    edge = np.array([[0.5, 0.5 + 2.0**-6]], dtype=np.float16)
    out, worst, row = v.normalised_probabilities(edge)
    assert (worst, row) == (2.0**-6, 0)
    np.testing.assert_array_equal(out, [[0.5 / (1 + 2.0**-6), (0.5 + 2.0**-6) / (1 + 2.0**-6)]])
    beyond = np.array([[0.5, 0.5 + 2.0**-6], [0.5, 0.5 + 2.0**-5]], dtype=np.float16)
    # row 0, exactly at the tolerance, is fine: row 1 is named
    with _raises(ValueError, "probabilities: row 1 sums to 1.03125; expected rows summing to "
                             "1 within 0.0156 (8 x K x eps(float16), at least 0.0001)"):
        v.normalised_probabilities(beyond)


def test_a_float32_near_tie_keeps_its_stored_row_and_other_rows_are_renormalised():
    # entries one float32 ulp apart at the top, the row off 1 by 6.9e-5: divided by its sum
    # and cast back to float32 the two would tie (class 0 on top instead of class 1)
    stored = np.array([[0.4202351, 0.42023513, 0.15959924], [0.5, 0.25, 0.2501]],
                      dtype=np.float32)
    wide = stored.astype(np.float64)
    divided = wide / wide.sum(axis=1, keepdims=True)
    assert np.argmax(divided.astype(np.float32)[0]) == 0  # the tie a cast would make
    out, _, _ = v.normalised_probabilities(stored)
    np.testing.assert_array_equal(out[0], wide[0])
    np.testing.assert_array_equal(out[1], divided[1])


# ---------------------------------------------------------------- one score column
def test_one_column_shapes():
    assert v.is_one_column(np.zeros(3)) and v.is_one_column(np.zeros((3, 1)))
    assert v.is_one_column([0.5, 0.25])
    assert not v.is_one_column(np.zeros((3, 2)))
    assert not v.is_one_column(np.zeros((3, 1, 1)))
    assert not v.is_one_column(0.5)


def test_two_columns_of_probabilities_and_margins():
    p = np.array([0.0, 0.25, 1.0])
    expected = [[1.0, 0.0], [0.75, 0.25], [0.0, 1.0]]
    assert v.two_columns(p, "probs").tolist() == expected
    assert v.two_columns(p[:, None], "probs").tolist() == expected
    assert v.two_columns([1, 0], "probs").tolist() == [[0.0, 1.0], [1.0, 0.0]]
    margins = np.array([[-2.5], [0.0], [40.0]], dtype=np.float32)
    out = v.two_columns(margins, "logits")
    assert out.dtype == np.float64 and out.tolist() == [[0.0, -2.5], [0.0, 0.0], [0.0, 40.0]]


@pytest.mark.parametrize(("column", "row", "value"), [
    ([0.5, 1.25, -1.0], 1, "1.25"), ([0.5, 0.0, -0.5], 2, "-0.5"),
    ([1.001, 0.5], 0, "1.001"), ([0.5, -0.00011], 1, "-0.00011")])
def test_a_probability_outside_the_unit_interval_is_named(column, row, value):
    with _raises(ValueError, f"scores: row {row} is {value}; expected a positive-class "
                             "probability in [0, 1] (one score column)"):
        v.two_columns(np.array(column), "probs")


F32_ABOVE_ONE = float(np.float32(1) + 10 * np.finfo(np.float32).eps)  # 1.0000011920928955


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_column_over_one_by_its_rounding_loads_as_the_two_column_form(dtype):
    # a text classifier's float32 predict_proba(X)[:, 1]: up to 1.2e-6 above 1, and a
    # producer's 1 - p rounded below 0
    column = np.array([0.25, F32_ABOVE_ONE, 1.0, -2e-7, 0.5], dtype=dtype)
    excess = float(column.astype(np.float64)[1]) - 1.0
    loaded = v.stored_scores(column, "probs", "p")
    assert loaded.scores.tolist() == [[0.75, 0.25], [0.0, 1.0], [0.0, 1.0], [1.0, 0.0],
                                      [0.5, 0.5]]
    assert (loaded.width, loaded.sum_error_row) == (1, 1)
    assert loaded.sum_error == excess and excess > 1e-6
    # the two-column form of the same outputs ([0, p] for p > 1) renormalises to the
    # same bits, so the uncalibrated NLL is the same whichever form was logged
    two = np.array([[0.75, 0.25], [0.0, column[1]], [0.0, 1.0], [1.0, 0.0],
                    [0.5, 0.5]], dtype=dtype)
    assert np.array_equal(v.stored_scores(two, "probs").scores, loaded.scores)
    assert v.two_columns(column, "probs").tolist() == loaded.scores.tolist()


@pytest.mark.parametrize(("dtype", "value", "accepted"), [
    (np.float64, 1.0 + 0.99e-4, True), (np.float64, 1.0 + 1.01e-4, False),
    (np.float32, -1e-4 * 0.99, True), (np.float32, 1.0002, False),
    (np.float16, 1.0 + 0.0078125, True), (np.float16, -0.0234375, False)])
def test_the_column_tolerance_is_the_row_sum_tolerance_of_its_dtype(dtype, value, accepted):
    # float16: 8 x 2 x eps(float16) = 0.0156; float32 and float64: 1e-4
    column = np.array([0.5, value], dtype=dtype)
    assert v.one_column_tolerance(dtype) == v.sum_tolerance(dtype, 2)
    if accepted:
        assert v.stored_scores(column, "probs").scores[1].tolist() == (
            [0.0, 1.0] if value > 1 else [1.0, 0.0])
    else:
        with _raises(ValueError, f"s: row 1 is {column[1].item()!r}; expected a "
                                 "positive-class probability in [0, 1] (one score column)"):
            v.stored_scores(column, "probs", "s")


def test_one_column_refusals():
    with _raises(TypeError, "p: expected a real numeric array, got dtype bool"):
        v.two_columns(np.array([True, False]), "probs", "p")
    with _raises(TypeError, "p: expected a real numeric array, got dtype object"):
        v.two_columns(np.array([0.5, None]), "logits", "p")
    with _raises(ValueError, "p: expected at least one row, got shape (0,)"):
        v.two_columns(np.zeros(0), "logits", "p")
    for bad in (np.nan, np.inf, -np.inf):
        with _raises(ValueError, "p: row 1 contains NaN or inf; expected finite values"):
            v.two_columns(np.array([[0.5], [bad], [bad]]), "logits", "p")


# ---------------------------------------------------------------- the load rule
def test_stored_scores_of_each_form():
    column = np.array([0.25, 0.5])
    loaded = v.stored_scores(column, "probs")
    assert loaded.scores.tolist() == [[0.75, 0.25], [0.5, 0.5]]
    assert (loaded.width, loaded.sum_error, loaded.sum_error_row) == (1, 0.0, 0)
    assert loaded.stored is column
    assert v.stored_scores(column[:, None], "logits", n_classes=2).scores.tolist() == [
        [0.0, 0.25], [0.0, 0.5]]
    probs = np.array([[0.5, 0.5], [0.25, 0.75001]])
    loaded = v.stored_scores(probs, "probs")
    np.testing.assert_array_equal(loaded.scores, probs / probs.sum(axis=1, keepdims=True))
    assert (loaded.width, loaded.sum_error_row) == (2, 1)
    assert loaded.sum_error == abs(0.25 + 0.75001 - 1.0)
    assert loaded.stored is probs
    logits = np.array([[1, -2, 3]], dtype=np.int16)
    loaded = v.stored_scores(logits, "logits", n_classes=3)
    assert loaded.scores.dtype == np.float64 and loaded.scores.tolist() == [[1.0, -2.0, 3.0]]
    assert (loaded.width, loaded.sum_error, loaded.sum_error_row) == (3, 0.0, 0)
    assert loaded.stored is logits


def test_stored_scores_refusals():
    with _raises(ValueError, "kind: expected 'logits' or 'probs', got 'logprobs'"):
        v.stored_scores(np.zeros((1, 2)), "logprobs")
    with _raises(ValueError, "s: expected 2 classes (columns), or one score column for this "
                             "binary model, got 3"):
        v.stored_scores(np.full((2, 3), 1 / 3), "probs", "s", n_classes=2)
    # one column for a model of three classes is a one-class matrix, not a binary column
    with _raises(ValueError, "s: expected K >= 2 classes, got shape (2, 1)"):
        v.stored_scores(np.full((2, 1), 0.5), "logits", "s", n_classes=3)
    with _raises(ValueError, "s: expected 3 classes (columns), got 4"):
        v.stored_scores(np.full((2, 4), 0.25), "probs", "s", n_classes=3)
    with _raises(ValueError, "s: row 0 sums to 2.0; expected rows summing to 1 within 0.0001 "
                             "(8 x K x eps(float64), at least 0.0001)"):
        v.stored_scores(np.ones((1, 2)), "probs", "s")
    with _raises(ValueError, "s: row 0 contains NaN or inf; expected finite values"):
        v.stored_scores(np.array([[np.inf, 0.0]]), "logits", "s")
    with _raises(ValueError, "scores: row 1 contains NaN or inf; expected finite values"):
        v.stored_scores(np.array([0.5, np.nan]), "logits")
    with _raises(ValueError, "s: row 1 is 1.5; expected a positive-class probability in [0, 1] "
                             "(one score column)"):
        v.stored_scores(np.array([0.5, 1.5]), "probs", "s")
    with _raises(ValueError, "s: expected 3 classes (columns), got 4"):
        v.stored_scores(np.zeros((2, 4)), "logits", "s", n_classes=3)


def test_narrowed_keeps_the_stored_row_where_the_cast_would_tie():
    stored = np.array([[0.4202351, 0.42023513, 0.15959924], [0.5, 0.25, 0.2501]],
                      dtype=np.float32)
    scores = stored.astype(np.float64)
    scores /= scores.sum(axis=1, keepdims=True)  # as a float64 loader renormalises
    loaded = v.StoredScores(scores, 3, 0.0, 0, stored)
    out = v.narrowed(loaded, np.float32)
    assert out.dtype == np.float32 and out.flags.c_contiguous
    np.testing.assert_array_equal(out[0], stored[0])
    np.testing.assert_array_equal(out[1], scores[1].astype(np.float32))
    # without the stored rows (or with a stored column of another shape) the cast stands
    cast = scores.astype(np.float32)
    np.testing.assert_array_equal(v.narrowed(v.StoredScores(scores, 3, 0.0, 0), np.float32),
                                  cast)
    np.testing.assert_array_equal(
        v.narrowed(v.StoredScores(scores, 3, 0.0, 0, stored[:, :1]), np.float32), cast)
    # in its own dtype the scores come back as they are, made C-contiguous
    fortran = np.asfortranarray(scores)
    same = v.narrowed(v.StoredScores(fortran, 3, 0.0, 0, stored), np.float64)
    assert same.flags.c_contiguous
    np.testing.assert_array_equal(same, scores)


# ---------------------------------------------------------------- labels
def test_label_refusals_name_the_row():
    with _raises(TypeError, "labels: expected integer class labels, got dtype complex128"):
        v.check_labels(np.array([1j]), 1, 2)
    with _raises(TypeError, "y: expected integer class labels, got dtype object"):
        v.check_labels(np.array([0, None]), 2, 2, "y")
    with _raises(TypeError, "labels: expected integer class labels, got dtype bool"):
        v.check_labels(np.array([True, False]), 2, 2)
    with _raises(ValueError, "labels: expected a 1-D array (n,), got shape (2, 1)"):
        v.check_labels(np.zeros((2, 1), dtype=int), 2, 2)
    with _raises(ValueError, "labels: expected 3 labels (one per row), got 2"):
        v.check_labels(np.zeros(2, dtype=int), 3, 2)
    with _raises(ValueError, "labels: row 1 is 0.5; expected an integer class label"):
        v.check_labels(np.array([1.0, 0.5, 0.25]), 3, 2)
    with _raises(ValueError, "labels: row 2 is inf; expected an integer class label"):
        v.check_labels(np.array([1.0, 0.0, np.inf]), 3, 2)
    with _raises(ValueError, "labels: row 0 is nan; expected an integer class label"):
        v.check_labels(np.array([np.nan, 0.0]), 2, 2)
    with _raises(ValueError, "labels: row 1 is 3; expected a class in [0, 3)"):
        v.check_labels(np.array([2, 3, 4]), 3, 3)
    with _raises(ValueError, "labels: row 1 is -1; expected a class in [0, 3)"):
        v.check_labels(np.array([0, -1]), 2, 3)
    with _raises(ValueError, "labels: row 0 is 2.0; expected a class in [0, 2)"):
        v.check_labels(np.array([2.0]), 1, 2)


def test_labels_come_back_as_int64():
    for labels in (np.array([0, 2, 1], dtype=np.uint8), np.array([0.0, 2.0, 1.0]), [0, 2, 1]):
        out = v.check_labels(labels, 3, 3)
        assert out.dtype == np.int64 and out.tolist() == [0, 2, 1]


def test_class_labels_numeric_strings_and_booleans():
    classes, codes = v.check_class_labels(np.array([2, 0, 0]), 3, 3)
    assert classes.tolist() == [0, 1, 2] and codes.tolist() == [2, 0, 0]
    assert codes.dtype == np.int64
    classes, codes = v.check_class_labels(np.array(["dog", "cat", "dog"]), 3, 2)
    assert classes.tolist() == ["cat", "dog"] and codes.tolist() == [1, 0, 1]
    assert codes.dtype == np.int64
    classes, codes = v.check_class_labels(np.array(["b", "a"], dtype=object), 2, 2)
    assert classes.tolist() == ["a", "b"] and codes.tolist() == [1, 0]
    classes, codes = v.check_class_labels(np.array([True, False, True]), 3, 2)
    assert classes.tolist() == [False, True] and codes.tolist() == [1, 0, 1]
    classes, codes = v.check_class_labels(np.array([np.True_, np.False_], dtype=object), 2, 2)
    assert codes.tolist() == [1, 0]
    classes, codes = v.check_class_labels(np.array([b"y", b"x"]), 2, 2)
    assert codes.tolist() == [1, 0]
    with _raises(ValueError, "y: row 0 is 3; expected a class in [0, 3)"):
        v.check_class_labels(np.array([3, 0]), 2, 3, "y")


def test_class_label_refusals():
    with _raises(ValueError, "labels: expected a 1-D array (n,), got shape (1, 2)"):
        v.check_class_labels(np.array([["a", "b"]]), 1, 2)
    with _raises(ValueError, "y: expected 3 labels (one per row), got 2"):
        v.check_class_labels(np.array(["a", "b"]), 3, 2, "y")
    with _raises(TypeError, "labels: expected class labels (integers or strings), got dtype "
                            "complex128"):
        v.check_class_labels(np.array([1j, 2j]), 2, 2)
    with _raises(TypeError, "labels: row 2 is 1 (int); expected labels of one type, all "
                            "strings or all booleans (row 0 is str)"):
        v.check_class_labels(np.array(["a", "b", 1], dtype=object), 3, 3)
    with _raises(TypeError, "labels: row 1 is 'a' (str); expected labels of one type, all "
                            "strings or all booleans (row 0 is bool)"):
        v.check_class_labels(np.array([True, "a"], dtype=object), 2, 2)
    # one type throughout, but not one of the orderable label types
    with _raises(TypeError, "labels: row 0 is 1.5 (float); expected labels of one type, all "
                            "strings or all booleans (row 0 is float)"):
        v.check_class_labels(np.array([1.5, 2.5], dtype=object), 2, 2)
    with _raises(ValueError, "labels: 1 distinct labels for 2 score columns; non-integer "
                             "labels are matched to the columns in sorted order, so exactly 2 "
                             "must appear (or pass integer labels in [0, 2))"):
        v.check_class_labels(np.array(["a", "a"]), 2, 2)
    with _raises(ValueError, "labels: 3 distinct labels for 2 score columns; non-integer "
                             "labels are matched to the columns in sorted order, so exactly 2 "
                             "must appear (or pass integer labels in [0, 2))"):
        v.check_class_labels(np.array(["a", "b", "c"]), 3, 2)


# ---------------------------------------------------------------- pairs, top-1, blocks
def test_pair_refusals_name_both_arrays():
    a = np.zeros((2, 3))
    v.check_pair(a, np.ones((2, 3)), ("ref", "new"))
    with _raises(ValueError, "new: expected 2 rows to match ref, got 1"):
        v.check_pair(a, np.zeros((1, 3)), ("ref", "new"))
    with _raises(ValueError, "new: expected 3 classes to match ref, got 4"):
        v.check_pair(a, np.zeros((2, 4)), ("ref", "new"))


def test_top1_takes_the_smallest_maximising_index():
    probs = np.array([[0.2, 0.4, 0.4], [0.5, 0.1, 0.4], [0.1, 0.1, 0.8], [1 / 3] * 3])
    assert v.top1(probs).tolist() == [1, 0, 2, 0]


def test_row_blocks_cover_the_rows_in_order():
    def spans(*args):
        return [(s.start, s.stop) for s in v.row_blocks(*args)]

    # 2 rows of 2 float64 in 32 bytes; the last block is cut at n
    assert spans(5, 2, 32) == [(0, 2), (2, 4), (4, 5)]
    assert spans(4, 2, 32) == [(0, 2), (2, 4)]
    assert spans(3, 4, 8) == [(0, 1), (1, 2), (2, 3)]  # a row larger than a block: one row
    assert spans(0, 2, 32) == []
    # the default: 2**19 bytes, i.e. 2 rows of 2**15 float64 and 1 row of 2**16
    assert spans(5, 2**15) == [(0, 2), (2, 4), (4, 5)]
    assert spans(2, 2**16) == [(0, 1), (1, 2)]
    assert spans(3, 2**16 + 1) == [(0, 1), (1, 2), (2, 3)]
    assert spans(3, 2) == [(0, 3)]


def test_probability_rows_ok_is_the_check_probabilities_test():
    def ok(block, **kwargs):
        return v.probability_rows_ok(block, block.min(axis=1), block.max(axis=1), **kwargs)

    assert ok(np.array([[1.0, 0.0], [0.5, 0.5]]))
    assert not ok(np.array([[0.5, 0.5], [np.nan, 1.0]]))
    assert not ok(np.array([[0.5, 0.5], [np.inf, 0.0]]))
    block = np.array([[0.5, 0.5], [0.0, 1.0]])
    assert not v.probability_rows_ok(block, np.array([0.5, -np.inf]), np.array([0.5, 1.0]))
    assert not v.probability_rows_ok(block, np.array([0.5, 0.0]), np.array([0.5, np.inf]))
    assert not ok(np.array([[1.25, -0.25]]))
    assert not ok(np.array([[0.5, 0.75]]))
    assert not ok(np.array([[0.25, 0.5]]))
    # the tolerance: 1e-4 by default, inclusive at an exactly representable atol
    assert ok(np.array([[0.5, 0.5 + 0.9e-4]]))
    assert not ok(np.array([[0.5, 0.5 + 1.1e-4]]))
    assert ok(np.array([[0.5, 0.75]]), atol=0.25)
    assert not ok(np.array([[0.5, 0.75]]), atol=0.125)
    # given sums are used instead of the block's own
    assert not ok(block, sums=np.array([1.0, 1.5]))
    assert ok(np.array([[0.5, 0.75]]), sums=np.array([1.0]))
