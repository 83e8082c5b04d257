"""The quick sweep through a real Dask scheduler and worker started as processes on
127.0.0.1, with the Prefect test server and a fresh MLflow store."""

from __future__ import annotations

import socket

import pandas as pd
import pytest
import servers

pytestmark = pytest.mark.slow



@pytest.fixture
def dask_cluster(tmp_path):
    """`dask scheduler` + one `dask worker` (no nanny, so the worker runs in the process we
    started and its PID is known); yields (address, worker PID)."""
    logs = tmp_path / "dask-logs"
    logs.mkdir()
    with servers.dask_cluster(logs, workers=1, timeout=60) as (address, pids):
        yield address, pids[0]


def test_quick_sweep_runs_on_an_external_scheduler(dask_cluster, synthetic_dir, tmp_path,
                                                   prefect_harness, mlflow_uri):
    from mlflow import MlflowClient

    from flows.reproduce import flow as reproduce

    address, worker_pid = dask_cluster
    out = tmp_path / "report"
    flow_fn = reproduce.reproduce.with_options(task_runner=reproduce.task_runner(address))
    summary = flow_fn(data_dir=str(synthetic_dir), out_dir=str(out), quick=True,
                      n_bootstrap=200)

    assert summary["failures"] == []
    assert summary["cells"] == 6  # 2 files (one per dataset) x vs, svs, irova x 1 seed
    table7 = (out / "table7_toya.md").read_text()
    assert "| vs |" in table7 and "| irova |" in table7
    assert {p.name for p in out.glob("*.png")} >= {"figure2_tradeoff.png", "figure4_size.png"}

    client = MlflowClient(mlflow_uri)
    parent = client.get_run(summary["parent_run_id"])
    assert parent.info.status == "FINISHED"
    assert parent.data.params["calibrators"] == "vs,svs,irova"
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"table1_paired_reductions.md", "figure2_tradeoff.png", "results.csv"} <= artifacts
    children = client.search_runs(
        [parent.info.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert len(children) == 6
    for child in children:
        assert child.info.status == "FINISHED"
        assert child.data.metrics["cord.tpcr"] == 0.0
        assert child.data.metrics["cord.accuracy"] == child.data.metrics["uncal.accuracy"]
        history = client.get_metric_history(child.info.run_id, "size.cord.tpcr")
        assert sorted(m.step for m in history) == list(range(10, 101, 10))
    # every task ran in the worker process this test started, not in the test process
    workers = pd.read_csv(out / "workers.csv")
    assert list(workers["worker"]) == [f"{socket.gethostname()}:{worker_pid}"]
    assert list(workers["tasks"]) == [6]
