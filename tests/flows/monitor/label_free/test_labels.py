"""Labels that arrive on their own, keyed by row (``cord-ops monitor --data BATCH --labels
LABELS``): joined to a batch an earlier label-free run logged, they are logged on that run
as a labelled batch's would be; a bad key set is one error line and nothing written."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cord_ops import data
from flows.cli.main import main
from flows.monitor.label_free import records
from flows.monitor.label_free.flow import monitor_label_free
from flows.monitor.label_free.labels import batch_keys, join_labels


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 60).flatmap(lambda n: st.tuples(
    st.permutations(range(n)), st.lists(st.integers(0, 2), min_size=n, max_size=n),
    st.sampled_from(["int", "str"]))))
def test_join_puts_each_label_on_its_keyed_row(tmp_path_factory, case):
    order, labels, kind = case
    n = len(order)
    keys = np.arange(100, 100 + n) if kind == "int" else np.array([f"tx-{i}" for i in range(n)])
    path = tmp_path_factory.mktemp("labels") / "labels.npz"
    # the labels file lists the rows in another order: row j of it is batch row order[j]
    np.savez(path, labels=np.array(labels)[list(order)], row_id=keys[list(order)])
    assert join_labels(path, "batch.npz", keys, 3).tolist() == labels


def test_bad_key_sets_are_refused_naming_file_array_and_row(tmp_path):
    keys = np.arange(5)
    cases = {
        "missing": ({"labels": [0, 1, 2, 0], "row_id": [0, 1, 2, 3]},
                    "no label for 1 of the 5 rows of batch.npz (first: row 4, key 4)"),
        "repeated": ({"labels": [0, 1, 2, 0, 1], "row_id": [0, 1, 2, 2, 4]},
                     "['row_id']: row 3 repeats key 2 of row 2"),
        "extra": ({"labels": [0, 1, 2, 0, 1, 1], "row_id": [0, 1, 2, 3, 4, 9]},
                  "['row_id']: row 5 has key 9, which is not a row of batch.npz"),
        "other-k": ({"labels": [0, 1, 2, 7, 1], "row_id": [0, 1, 2, 3, 4]},
                    "['labels']: row 3 is 7, expected a class in [0, 3)"),
        "no-key": ({"labels": [0, 1, 2, 0, 1]}, "expected an array 'row_id'"),
        "float-labels": ({"labels": [0.0, 1, 2, 0, 1], "row_id": [0, 1, 2, 3, 4]},
                         "expected integer class indices"),
        "empty": ({"labels": np.array([], dtype=int), "row_id": np.array([], dtype=int)},
                  "holds no rows"),
    }
    for name, (arrays, expected) in cases.items():
        path = tmp_path / f"{name}.npz"
        np.savez(path, **{k: np.asarray(v) for k, v in arrays.items()})
        with pytest.raises((ValueError, TypeError)) as caught:
            join_labels(path, "batch.npz", keys, 3)
        assert str(path) in str(caught.value) and expected in str(caught.value), name
    batch = tmp_path / "dup-batch.parquet"
    pq.write_table(pa.table({"probs": [[0.5, 0.5]] * 3, "row_id": ["a", "b", "a"]}), batch)
    with pytest.raises(ValueError, match=r"\['row_id'\]: row 2 repeats key 'a' of row 0"):
        batch_keys(batch, 3)


def test_labels_only_file_meets_the_earlier_estimates(prefect_harness, store, tmp_path,
                                                      digits, capsys):
    from mlflow import MlflowClient

    from flows.recalibrate.flow import recalibrate

    client = MlflowClient()
    recalibrate(data=str(data.save_npz(tmp_path / "d.npz", digits.scores, digits.labels,
                                       "logits")), model_name="lk")
    rows = np.arange(200, 600)
    ids = np.array([f"tx-{r:05d}" for r in rows])
    # a Parquet batch keyed by its own row_id column, and an .npz keyed by position
    keyed = tmp_path / "keyed.parquet"
    pq.write_table(pa.table({"logits": list(digits.scores[rows]), "row_id": ids}), keyed)
    plain = tmp_path / "plain.npz"
    np.savez(plain, logits=digits.scores[rows])
    result = monitor_label_free(data=[str(keyed), str(plain)], model_name="lk")
    by_name = {r.path: r for r in result.reports}
    truth = float(np.mean(digits.scores[rows].argmax(1) == digits.labels[rows]))

    shuffle = np.random.default_rng(1).permutation(len(rows))
    labels_file = tmp_path / "arrived.parquet"
    pq.write_table(pa.table({"row_id": ids[shuffle], "labels": digits.labels[rows][shuffle],
                             "note": ["chargeback"] * len(rows)}), labels_file)
    bad = tmp_path / "partial.npz"  # by position, one row missing
    np.savez(bad, labels=digits.labels[rows][:-1], row_id=np.arange(len(rows) - 1))
    other_k = tmp_path / "other-k.npz"
    np.savez(other_k, labels=np.where(shuffle == 0, 10, digits.labels[rows][shuffle]),
             row_id=shuffle)
    never = tmp_path / "never-monitored.npz"
    np.savez(never, logits=digits.scores[:50])
    np.savez(tmp_path / "never-labels.npz", labels=digits.labels[:50], row_id=np.arange(50))

    capsys.readouterr()
    refusals = [(plain, bad, "no label for 1 of the 400 rows"),
                (plain, other_k, "expected a class in [0, 10)"),
                (plain, labels_file, "keys of dtype <U8"),  # string keys for a positional batch
                (never, tmp_path / "never-labels.npz", "no finished label-free run of 'lk'"),
                (tmp_path, labels_file, "expected --data to name the one batch file")]
    for batch, labels, expected in refusals:
        assert main(["monitor", "--data", str(batch), "--labels", str(labels),
                     "--model-name", "lk"]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and expected in err[0], err
    for report in result.reports:  # nothing was written on the earlier runs
        assert client.get_run(report.run_id).data.tags[records.LABELS_TAG] == "pending"

    assert main(["monitor", "--data", str(keyed), "--labels", str(labels_file),
                 "--model-name", "lk"]) == 0
    assert "met label-free run " + by_name[str(keyed)].run_id in capsys.readouterr().out
    # the two batches hold the same scores (one digest), so both runs meet these labels
    positional = tmp_path / "by-position.npz"
    np.savez(positional, labels=digits.labels[rows][shuffle], row_id=shuffle)
    assert main(["monitor", "--data", str(plain), "--labels", str(positional),
                 "--model-name", "lk"]) == 0
    for report in result.reports:
        settled = client.get_run(report.run_id).data
        assert settled.tags[records.LABELS_TAG] == "arrived"
        assert settled.metrics["realised.accuracy"] == pytest.approx(truth, abs=1e-12)
        assert settled.metrics["error.cbpe"] == pytest.approx(report.estimates.cbpe - truth,
                                                              abs=1e-12)
        assert settled.metrics["error.doc"] == pytest.approx(report.estimates.doc - truth,
                                                             abs=1e-12)
