"""Classifier outputs as pipelines write them: a binary model's
one score column, probability rows that sum to 1 only to float32/float16 rounding, exact
zeros and ones, top-1 probabilities of exactly 1 or a rounding above it, and top-1 ties.

Every expected value here is written out or computed from the file's own numbers with
plain numpy, never by the loader under test.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from cord_ops import data, metrics
from cord_ops.validation import (
    PROBABILITY_SUM_ATOL,
    normalised_probabilities,
    stored_scores,
    sum_tolerance,
)

EPS32 = float(np.finfo(np.float32).eps)
EPS16 = float(np.finfo(np.float16).eps)


# ---------------------------------------------------------------- the 16-bin crash
def _binary_float32_rows() -> tuple[np.ndarray, np.ndarray]:
    """Float32 binary rows as a pipeline stores them: the first row's top-1 is one float32
    ulp above 1 (its row sums to 1 + 1.2e-7, well within any tolerance)."""
    probs = np.array([[0.0, 1.0 + EPS32], [0.25, 0.75], [0.55, 0.45], [0.0, 1.0]],
                     dtype=np.float32)
    return probs, np.array([1, 1, 0, 0])


def test_reliability_diagram_keeps_fifteen_bins_for_a_top1_above_one():
    probs, labels = _binary_float32_rows()
    assert probs[0, 1] > 1.0  # the pathology itself, as stored
    diagram = metrics.reliability_diagram(probs, labels)
    assert diagram["count"].shape == (15,)
    assert diagram["confidence"].shape == (15,)
    # rows 0 and 3 (top-1 1+eps and 1.0) fall in the last bin (14/15, 1]; 0.75 in (11/15,
    # 12/15] = bin 11; 0.55 in (8/15, 9/15] = bin 8.
    expected = np.zeros(15, dtype=np.int64)
    expected[[14, 11, 8]] = [2, 1, 1]
    assert np.array_equal(diagram["count"], expected)


def test_ece_counts_a_top1_above_one_in_the_last_bin():
    # row 0: top-1 one float32 ulp above 1, wrong; row 1: 0.95, right. Both belong to the
    # last bin (14/15, 1], where their gaps (-1 - eps and +0.05) partly cancel.
    probs = np.array([[0.0, 1.0 + EPS32], [0.05, 0.95], [0.25, 0.75]], dtype=np.float32)
    labels = np.array([0, 1, 1])
    conf = probs.astype(np.float64).max(axis=1)
    last = abs(np.mean([0.0, 1.0]) - np.mean(conf[:2])) * 2
    expected = (last + abs(1.0 - conf[2])) / 3
    assert metrics.ece(probs, labels) == pytest.approx(expected, abs=1e-15)


@settings(max_examples=60, deadline=None)
@given(hnp.arrays(np.float64, st.integers(1, 40),
                  elements=st.floats(0.0, 1.0 + PROBABILITY_SUM_ATOL)),
       st.integers(1, 30))
def test_every_bin_index_is_in_range(confidence, n_bins):
    edges, bins = metrics._equal_width_bins(confidence, n_bins)
    assert bins.min() >= 0 and bins.max() <= n_bins - 1
    inside = (confidence > 0) & (confidence <= 1)
    # inside [0, 1] the (l, u] rule holds exactly
    assert np.all(edges[bins[inside]] < confidence[inside])
    assert np.all(confidence[inside] <= edges[bins[inside] + 1])
    assert np.all(bins[confidence > 1] == n_bins - 1)


# ---------------------------------------------------------------- one score column
def test_one_column_npz_probabilities_and_margins(tmp_path):
    p = np.array([0.0, 0.25, 0.5, 1.0], dtype=np.float32)
    labels = np.array([0, 1, 0, 1])
    for shape in [(4,), (4, 1)]:
        np.savez(tmp_path / "p.npz", probs=p.reshape(shape), labels=labels)
        loaded = data.load_npz(tmp_path / "p.npz")
        assert loaded.width == 1 and loaded.n_classes == 2 and loaded.sum_error == 0.0
        assert np.array_equal(loaded.scores, [[1.0, 0.0], [0.75, 0.25], [0.5, 0.5],
                                              [0.0, 1.0]])
    margin = np.array([-3.5, 0.0, 2.25])
    np.savez(tmp_path / "m.npz", logits=margin, labels=np.array([0, 1, 1]))
    loaded = data.load_npz(tmp_path / "m.npz")
    assert loaded.width == 1 and loaded.input_kind == "logits"
    assert np.array_equal(loaded.scores, [[0.0, -3.5], [0.0, 0.0], [0.0, 2.25]])
    # the margin's softmax is the sigmoid pair, and m = 0 ties to class 0
    assert np.allclose(loaded.probabilities()[:, 1], 1 / (1 + np.exp(-margin)), atol=1e-15)
    assert "one score column (margin) read as two" in loaded.load_note()


def test_one_column_parquet_as_a_number_column_or_one_element_lists(tmp_path):
    p = [0.9, 0.1, 0.5]
    pq.write_table(pa.table({"probs": pa.array(p, pa.float32()), "labels": [1, 0, 0]}),
                   tmp_path / "a.parquet")
    pq.write_table(pa.table({"probs": [[v] for v in p], "labels": [1, 0, 0]}),
                   tmp_path / "b.parquet")
    expected = np.column_stack([1 - np.float32(p).astype(np.float64),
                                np.float32(p).astype(np.float64)])
    first = data.load(tmp_path / "a.parquet")
    assert first.width == 1 and np.array_equal(first.scores, expected)
    second = data.load(tmp_path / "b.parquet")
    assert second.width == 1
    assert np.array_equal(second.scores, np.column_stack([1 - np.array(p), p]))


@pytest.mark.parametrize("content, message", [
    ({"probs": np.array([0.5, 1.5])}, r"probs: row 1 is 1\.5; expected a positive-class "
                                      r"probability in \[0, 1\]"),
    ({"probs": np.array([0.5, -0.01])}, r"probs: row 1 is -0\.01"),
    ({"logits": np.array([0.5, np.nan])}, r"logits: row 1 contains NaN or inf"),
])
def test_one_column_bad_values_name_file_array_and_row(tmp_path, content, message):
    np.savez(tmp_path / "f.npz", labels=np.array([0, 1]), **content)
    with pytest.raises(ValueError, match=rf"^{tmp_path / 'f.npz'}: {message}"):
        data.load_npz(tmp_path / "f.npz")


def test_one_column_labels_must_be_binary(tmp_path):
    np.savez(tmp_path / "f.npz", probs=np.array([0.5, 0.7]), labels=np.array([0, 2]))
    with pytest.raises(ValueError, match=r"labels: row 1 is 2; expected a class in \[0, 2\)"):
        data.load_npz(tmp_path / "f.npz")


# ---------------------------------------------------------------- renormalisation
def test_tolerance_follows_the_storage_dtype():
    assert sum_tolerance(np.float64, 10) == PROBABILITY_SUM_ATOL
    assert sum_tolerance(np.float32, 10) == PROBABILITY_SUM_ATOL
    assert sum_tolerance(np.float32, 1000) == pytest.approx(8 * 1000 * EPS32)
    assert sum_tolerance(np.float16, 2) == pytest.approx(16 * EPS16)
    assert sum_tolerance(np.int64, 3) == PROBABILITY_SUM_ATOL


def test_float32_rows_off_by_rounding_are_renormalised_and_the_worst_reported(tmp_path):
    probs = np.array([[0.3, 0.7], [0.5, 0.50002], [1.0, 0.0], [0.25, 0.75]], dtype=np.float32)
    np.savez(tmp_path / "f.npz", probs=probs, labels=np.array([1, 1, 0, 1]))
    loaded = data.load_npz(tmp_path / "f.npz")
    stored = probs.astype(np.float64)
    offs = np.abs(stored.sum(axis=1) - 1)
    assert loaded.sum_error == offs.max() and loaded.sum_error_row == 1
    assert np.all(np.abs(loaded.scores.sum(axis=1) - 1) <= 2 * np.finfo(np.float64).eps)
    assert np.array_equal(loaded.scores[1], stored[1] / stored[1].sum())
    assert np.array_equal(loaded.scores[2], [1.0, 0.0])  # exact 1 and 0 stay exact
    assert "worst row 1 summed to 1 +- 2e-05" in loaded.load_note()


def test_rows_beyond_the_tolerance_are_refused_naming_the_row(tmp_path):
    probs = np.array([[0.3, 0.7], [0.4, 0.59]], dtype=np.float32)
    np.savez(tmp_path / "f.npz", probs=probs, labels=np.array([1, 1]))
    with pytest.raises(ValueError, match=rf"^{tmp_path / 'f.npz'}: probs: row 1 sums to "
                                         r"0\.98\d*; expected rows summing to 1 within "
                                         r"0\.0001 \(8 x K x eps\(float32\)"):
        data.load_npz(tmp_path / "f.npz")


def test_float16_rows_get_float16_room_and_float32_rows_do_not(tmp_path):
    row = [[0.5, 0.5 + 4e-3]]  # 4e-3 off: 4 float16 ulps, 34,000 float32 ulps
    for dtype, accepted in [(np.float16, True), (np.float32, False)]:
        np.savez(tmp_path / "f.npz", probs=np.array(row, dtype=dtype), labels=np.array([1]))
        if accepted:
            stored = np.array(row, dtype=dtype).astype(np.float64)
            assert data.load_npz(tmp_path / "f.npz").sum_error == abs(stored.sum() - 1)
        else:
            with pytest.raises(ValueError, match="row 0 sums to"):
                data.load_npz(tmp_path / "f.npz")


def test_parquet_rows_are_renormalised_like_npz(tmp_path):
    probs = np.array([[0.1, 0.2, 0.70003], [0.2, 0.3, 0.5]], dtype=np.float32)
    pq.write_table(pa.table({"probs": list(probs), "labels": [2, 2]}), tmp_path / "f.parquet")
    np.savez(tmp_path / "f.npz", probs=probs, labels=np.array([2, 2]))
    a, b = data.load(tmp_path / "f.parquet"), data.load(tmp_path / "f.npz")
    assert np.array_equal(a.scores, b.scores) and a.sum_error == b.sum_error > 0


# rows with zeros, exact ones, ties at the top (multiples of 1/k, as kNN and random
# forests give) and entries jittered by a few float32 ulps
@st.composite
def pipeline_rows(draw):
    k = draw(st.integers(2, 6))
    n = draw(st.integers(1, 12))
    votes = draw(st.sampled_from([2, 3, 5, 10]))
    counts = draw(hnp.arrays(np.int64, (n, k), elements=st.integers(0, votes)))
    counts[counts.sum(axis=1) == 0, 0] = 1
    rows = counts / counts.sum(axis=1, keepdims=True)
    jitter = draw(hnp.arrays(np.int64, (n, k), elements=st.integers(-4, 4)))
    stored = rows.astype(np.float32)
    stored = np.where(stored > 0, stored * (1 + jitter * EPS32).astype(np.float32), 0)
    return stored.astype(np.float32)


@settings(max_examples=80, deadline=None)
@given(pipeline_rows())
def test_loaded_rows_are_distributions_with_the_stored_zeros_and_top1(stored):
    scores, worst, _ = normalised_probabilities(stored, "probs")
    wide = stored.astype(np.float64)
    assert worst == np.abs(wide.sum(axis=1) - 1).max()
    # every row is renormalised, or kept as stored where renormalising would tie its top
    # two in float32 (a float32 graph's input); either way the float32 order is the stored
    kept = np.all(scores == wide, axis=1)
    assert np.all(kept | (np.abs(scores.sum(axis=1) - 1) <= 4 * np.finfo(np.float64).eps))
    assert np.array_equal(np.argmax(scores.astype(np.float32), axis=1),
                          np.argmax(wide, axis=1))
    assert scores.max() <= 1.0 and scores.min() >= 0.0
    assert np.array_equal(scores == 0, stored == 0)
    assert np.array_equal(np.argmax(scores, axis=1), np.argmax(wide, axis=1))
    # equal stored entries stay equal, so a tie keeps its smallest index on top
    first, second = np.sort(wide, axis=1)[:, -1], np.sort(wide, axis=1)[:, -2]
    tied = first == second
    top = np.max(scores, axis=1)
    assert np.all(np.sum(scores[tied] == top[tied, None], axis=1) >= 2)


@settings(max_examples=40, deadline=None)
@given(hnp.arrays(np.float32, st.integers(1, 20), elements=st.floats(0, 1, width=32)),
       st.sampled_from(["probs", "logits"]))
def test_one_column_loads_as_two_columns_that_collapse_back(column, kind):
    stored = stored_scores(column, kind, "x")
    wide = column.astype(np.float64)
    assert stored.width == 1 and stored.scores.shape == (column.size, 2)
    assert np.array_equal(stored.scores[:, 1], wide)  # the stored score, untouched
    if kind == "probs":
        assert np.all(np.abs(stored.scores.sum(axis=1) - 1) <= np.finfo(np.float64).eps)
        assert np.array_equal(np.argmax(stored.scores, axis=1), (wide > 0.5).astype(int))
    else:
        assert np.array_equal(stored.scores[:, 0], np.zeros(column.size))


def test_a_binary_width_other_than_one_or_two_is_refused():
    with pytest.raises(ValueError, match=r"^x: expected 2 classes \(columns\), or one "
                                         r"score column for this binary model, got 3$"):
        stored_scores(np.full((2, 3), 1 / 3), "probs", "x", n_classes=2)


# ---------------------------------------------------------------- the corpus of real outputs
def test_every_corpus_entry_loads_as_the_rows_it_stores(tmp_path):
    """Every stored form of tests/corpus.py (binary in one column and two, float32 and
    float64, exact zeros, ties, saturated rows) loads from .npz and from Parquet to its
    two-or-more-column float64 rows, renormalised within the dtype's tolerance."""
    import corpus

    for entry in corpus.build(include_one_column=True):
        stored = entry.cal_scores
        wide = stored.astype(np.float64)
        if entry.columns == 1:  # by hand: p -> [1 - p, p], m -> [0, m]
            s = wide[:, 0]
            expected = (np.stack([1 - s, s], axis=1) if entry.kind == "probs"
                        else np.stack([np.zeros_like(s), s], axis=1))
            error = 0.0
        elif entry.kind == "probs":
            sums = wide.sum(axis=1)
            error = np.abs(sums - 1).max()
            assert error <= sum_tolerance(stored.dtype, entry.n_classes), entry.name
            expected = wide / sums[:, None] if error > 0 else wide
        else:
            expected, error = wide, 0.0
        np.savez(tmp_path / "e.npz", labels=entry.cal_labels, **{entry.kind: stored})
        column = (pa.array(stored[:, 0]) if entry.columns == 1
                  else pa.FixedSizeListArray.from_arrays(pa.array(stored.reshape(-1)),
                                                         stored.shape[1]))
        pq.write_table(pa.table({entry.kind: column, "labels": entry.cal_labels}),
                       tmp_path / "e.parquet")
        for path in (tmp_path / "e.npz", tmp_path / "e.parquet"):
            loaded = data.load(path)
            assert loaded.width == entry.columns, (entry.name, path.suffix)
            assert loaded.sum_error == error, (entry.name, path.suffix)
            assert np.array_equal(loaded.scores, expected), (entry.name, path.suffix)
            assert np.array_equal(np.argmax(loaded.scores, axis=1),
                                  np.argmax(expected, axis=1))


def test_renormalising_never_makes_a_float32_near_tie_a_tie():
    # 0.4202351 and the next float32 up: divided by the row's sum (1 + 6.9e-5) both round
    # to one float32, which a float32 graph would give to class 0. Class 1 is the top-1.
    row = np.array([[0.4202351, 0.42023513, 0.15959924]], dtype=np.float32)
    assert row[0, 1] == np.nextafter(row[0, 0], np.float32(1))
    wide = row.astype(np.float64)
    naive = (wide / wide.sum()).astype(np.float32)
    assert naive[0, 0] == naive[0, 1]  # the hazard, by plain numpy
    scores, worst, _ = normalised_probabilities(row, "probs")
    assert worst == abs(wide.sum() - 1) and np.array_equal(scores, wide)  # kept as stored
    assert np.argmax(scores.astype(np.float32), axis=1) == [1]
