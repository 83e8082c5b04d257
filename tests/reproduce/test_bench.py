"""`cord-ops bench` on small synthetic data: one table with every row kind, on disk and in
MLflow."""

from __future__ import annotations

import argparse

import pandas as pd
import pytest

from flows.reproduce import bench as reproduce_bench
from flows.reproduce.defaults import BENCH_EXPERIMENT

pytestmark = pytest.mark.slow


def test_bench_prints_writes_and_logs_one_table(synthetic_dir, tmp_path, prefect_harness,
                                                mlflow_uri, capsys):
    from mlflow import MlflowClient

    args = argparse.Namespace(data=synthetic_dir, calibrators=["ts", "vs"],
                              onnx_calibrator="vs", out=tmp_path / "bench")
    assert reproduce_bench.run_bench(args) == 0

    table = pd.read_csv(tmp_path / "bench" / "bench.csv")
    printed = capsys.readouterr().out
    assert printed.startswith("| measure | dataset | ours | paper |")
    for dataset in ("toya", "toyb"):
        measures = set(table[table["dataset"] == dataset]["measure"])
        assert {"fit ts (s)", "fit vs (s)", "CORD construction (s), median [Q1, Q3]",
                "CORD repair (us/example), median [Q1, Q3]",
                "ONNX vs+CORD float32 (examples/s)",
                "ONNX vs+CORD float64 (examples/s)"} <= measures
    flow = table[table["measure"].str.startswith("end-to-end recalibrate flow")]
    assert len(flow) == 1 and float(flow["ours"].iloc[0]) > 0

    client = MlflowClient(mlflow_uri)
    experiment = client.get_experiment_by_name(BENCH_EXPERIMENT)
    (run,) = client.search_runs([experiment.experiment_id],
                                filter_string="tags.`mlflow.runName` = 'bench'")
    assert run.data.metrics["toya.fit_vs"] > 0
    assert run.data.metrics["bench_seconds"] > 0
    assert {a.path for a in client.list_artifacts(run.info.run_id)} == {"bench.md", "bench.csv"}
