"""recalibrate, monitor and predict (the CLI) on Parquet files: the same runs, registry
entries and validation as with .npz, through the real flows and MLflow store."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cord_ops import data
from flows.monitor.labelled import monitor
from flows.recalibrate.flow import RecalibrationError, recalibrate

pytestmark = pytest.mark.usefixtures("prefect_harness")


def test_recalibrate_and_monitor_read_parquet(store, tmp_path, digits):
    from mlflow import MlflowClient

    from flows.cli import main as cli

    source = data.save_parquet(tmp_path / "d.parquet", digits.scores, digits.labels, "logits",
                               layout="columns")
    first = recalibrate(data=str(source), model_name="m")
    as_npz = data.load_npz(data.save_npz(tmp_path / "d.npz", digits.scores, digits.labels,
                                         "logits"))
    client = MlflowClient()
    run = client.get_run(first.run_id).data
    assert run.tags["data.sha256"] == data.load(source).sha256 != as_npz.sha256
    assert first.reports["cord"]["tpcr"] == 0.0

    steady = monitor(data=str(data.save_parquet(tmp_path / "batch.parquet", digits.scores,
                                                digits.labels, "logits")), model_name="m")
    assert steady.champion_version == first.version and not steady.degraded

    # predict through the CLI: registry model in, Parquet out, every top-1 kept.
    scores = np.asarray(digits.scores[:50])
    pq.write_table(pa.table({"key": np.arange(50), "logits": list(scores)}),
                   tmp_path / "in.parquet")
    assert cli.main(["predict", "--model", "models:/m@champion", "--input",
                     str(tmp_path / "in.parquet"), "--output", str(tmp_path / "out.pq")]) == 0
    out = pq.read_table(tmp_path / "out.pq")
    assert out.column("key").to_pylist() == list(range(50))
    repaired = np.stack(out.column("repaired").to_numpy(zero_copy_only=False))
    assert np.array_equal(repaired.argmax(axis=1), scores.argmax(axis=1))


def test_bad_parquet_fails_before_any_run_exists(store, tmp_path, digits):
    from mlflow import MlflowClient

    labels = np.array(digits.labels)
    labels[11] = 10
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"logits": list(digits.scores), "labels": labels}), bad)
    with pytest.raises(RecalibrationError,
                       match=r"load_dataset.*bad\.parquet: column 'labels': row 11 is 10"):
        recalibrate(data=str(bad), model_name="m")
    client = MlflowClient()
    assert client.get_experiment_by_name("m") is None


def test_cli_refuses_bad_parquet_before_any_store_or_server(mlflow_uri, tmp_path, digits,
                                                            capsys):
    from flows import inputs
    from flows.cli import main as cli

    assert inputs.PARQUET_SUFFIXES == data.PARQUET_SUFFIXES
    (tmp_path / "junk.parquet").write_bytes(b"PAR1 but not really")
    assert cli.main(["recalibrate", "--data", "junk.parquet"]) == 1
    assert "junk.parquet: not a Parquet file" in capsys.readouterr().err
    labels = np.array(digits.labels)
    labels[11] = 10
    pq.write_table(pa.table({"logits": list(digits.scores), "labels": labels}),
                   tmp_path / "bad.parquet")
    assert cli.main(["recalibrate", "--data", "bad.parquet"]) == 1
    assert "bad.parquet: column 'labels': row 11 is 10" in capsys.readouterr().err
    assert cli.main(["predict", "--model", "models:/m@champion", "--input",
                     str(tmp_path / "nothing-*.parquet"), "--output", "out"]) == 1
    assert "matches no .parquet/.pq file" in capsys.readouterr().err
    assert not (tmp_path / "mlruns" / "mlflow.db").exists()
