"""Parquet classifier outputs: both documented layouts load exactly like .npz, and every bad
file is refused with a message naming the file, the column and the row."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from cord_ops import data


def _write(path, columns):
    pq.write_table(pa.table(columns), path)
    return path


@settings(max_examples=12, deadline=None)
@given(scores=hnp.arrays(np.float64, st.tuples(st.integers(1, 30), st.integers(2, 6)),
                         elements=st.floats(-1e6, 1e6, allow_nan=False)),
       layout=st.sampled_from(["list", "columns"]), seed=st.integers(0, 2**16))
def test_both_layouts_round_trip_bit_for_bit(tmp_path_factory, scores, layout, seed):
    labels = np.random.default_rng(seed).integers(0, scores.shape[1], scores.shape[0])
    path = tmp_path_factory.mktemp("pq") / "x.parquet"
    data.save_parquet(path, scores, labels, "logits", layout=layout)
    loaded = data.load(path)
    assert loaded.input_kind == "logits" and loaded.path == str(path)
    assert np.array_equal(loaded.scores, scores) and np.array_equal(loaded.labels, labels)
    assert loaded.scores.dtype == np.float64 and loaded.labels.dtype == np.int64


def test_parquet_and_npz_of_the_same_outputs_give_the_same_dataset(tmp_path):
    digits = data.digits_dataset(0)
    probs = digits.probabilities()
    npz = data.load(data.save_npz(tmp_path / "d.npz", probs, digits.labels, "probs"))
    # float32 columns written by another tool: read as float64 like an .npz of float32.
    columns = {f"probs_{j}": probs[:, j].astype(np.float32) for j in range(10)}
    columns["labels"] = digits.labels.astype(np.int32)
    columns["id"] = [f"img-{i}" for i in range(digits.n)]
    table = data.load(_write(tmp_path / "d.parquet", columns), input_kind="probs")
    assert table.input_kind == npz.input_kind == "probs"
    assert np.allclose(table.scores, npz.scores, atol=1e-7)
    assert np.array_equal(table.labels, npz.labels)


GOOD = np.array([[2.0, 1.0, 0.0], [0.0, 3.0, 1.0], [1.0, 1.0, 4.0], [0.5, 0.0, 0.0]])


@pytest.mark.parametrize(("columns", "error", "message"), [
    ({"logits": [list(r) for r in GOOD], "labels": [0, 1, 2, 3]}, ValueError,
     r"x.parquet: column 'labels': row 3 is 3; expected a class in \[0, 3\)"),
    ({"logits": [[2.0, 1.0, 0.0], [0.0, float("nan"), 1.0], [1.0, 1.0, 4.0]],
      "labels": [0, 1, 2]}, ValueError, "x.parquet: logits: row 1 contains NaN or inf"),
    ({"logits": [[2.0, 1.0, 0.0], None, [1.0, 1.0, 4.0]], "labels": [0, 1, 2]}, ValueError,
     "column 'logits': row 1 is null"),
    ({"logits": [[2.0, 1.0, 0.0], [0.0, 1.0], [1.0, 1.0, 4.0]], "labels": [0, 1, 2]},
     ValueError, "column 'logits': row 1 has 2 scores; expected 3"),
    ({"logits_0": [1.0, 2.0], "logits_1": [0.0, float("inf")], "labels": [0, 1]}, ValueError,
     "column 'logits_1': row 1 is inf"),
    ({"logits_0": [1.0, 2.0], "logits_2": [0.0, 1.0], "labels": [0, 1]}, ValueError,
     "missing logits_1"),
    ({"logits_0": ["a", "b"], "logits_1": [0.0, 1.0], "labels": [0, 1]}, TypeError,
     "column 'logits_0' holds string"),
    ({"probs_0": [0.5, 0.9], "probs_1": [0.5, 0.3], "labels": [0, 1]}, ValueError,
     "probs: row 1 sums to 1.2"),
    ({"probs_0": [0.5, -0.1], "probs_1": [0.5, 1.1], "labels": [0, 1]}, ValueError,
     "probs: row 1 has a negative entry"),
    ({"logits": [list(r) for r in GOOD]}, ValueError, "missing column 'labels'"),
    ({"scores": [list(r) for r in GOOD], "labels": [0, 1, 2, 0]}, ValueError,
     "holds neither of 'logits' and 'probs'"),
    ({"logits": [list(r) for r in GOOD], "probs": [list(r) for r in GOOD],
      "labels": [0, 1, 2, 0]}, ValueError, "holds both"),
    ({"logits": [list(r) for r in GOOD], "labels": [0, 1, None, 0]}, ValueError,
     "column 'labels': row 2 is null"),
    ({"logits": [list(r) for r in GOOD], "labels": [0.0, 1.5, 2.0, 0.0]}, ValueError,
     "column 'labels': row 1 is 1.5; expected an integer"),
])
def test_bad_files_name_the_file_column_and_row(tmp_path, columns, error, message):
    path = _write(tmp_path / "x.parquet", columns)
    with pytest.raises(error, match=message):
        data.load(path)


def test_missing_corrupt_and_mismatched_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.parquet: no such file"):
        data.load(tmp_path / "nope.parquet")
    (tmp_path / "junk.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(ValueError, match="junk.parquet: not a readable Parquet file"):
        data.load(tmp_path / "junk.parquet")
    path = data.save_parquet(tmp_path / "p.parquet", GOOD, [0, 1, 2, 0], "logits")
    with pytest.raises(ValueError, match="input_kind='probs' but the file holds 'logits'"):
        data.load(path, input_kind="probs")
    empty = _write(tmp_path / "e.parquet", {"logits": pa.array([], pa.list_(pa.float64())),
                                           "labels": pa.array([], pa.int64())})
    with pytest.raises(ValueError, match="e.parquet: has no rows"):
        data.load(empty)


def test_save_parquet_validates_first_and_writes_nothing_on_failure(tmp_path):
    target = tmp_path / "out.parquet"
    with pytest.raises(ValueError, match="logits: row 1 contains NaN"):
        data.save_parquet(target, [[0.0, 1.0], [np.nan, 0.0]], [0, 1], "logits")
    assert list(tmp_path.iterdir()) == []
