"""``cord-ops schedule`` serves cron deployments; a run triggered through Prefect's API
completes and registers a model; a run whose parameters are not its deployment's is refused
(whoever may create a flow run must not choose what the owner's process reads,
writes or loads)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from cord_ops import data
from flows.monitor.label_free.schedule import LABEL_FREE_DEPLOYMENT
from flows.schedule import MONITOR_DEPLOYMENT, RECALIBRATE_DEPLOYMENT


def _wait_for_deployment(client, name: str, process: subprocess.Popen, log: Path,
                         timeout: float = 90):
    from prefect.exceptions import ObjectNotFound

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, log.read_text()[-3000:]
        try:
            return client.read_deployment_by_name(name)
        except ObjectNotFound:
            time.sleep(0.5)
    pytest.fail(f"deployment {name} not served after {timeout} s")


@pytest.mark.slow
def test_schedule_serves_cron_deployments_and_a_triggered_run_completes(
        store, digits, digits_file, tmp_path, cli_env, cord_ops_command):
    import numpy as np
    from mlflow import MlflowClient
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment

    log = tmp_path / "serve.log"
    incoming = tmp_path / "incoming"
    incoming.mkdir()
    with np.load(digits_file) as arrays:  # a batch of 5 columns for a 10-class model
        np.savez(incoming / "bad.npz", logits=arrays["logits"][:50, :5])
    with open(log, "w") as sink:
        process = subprocess.Popen(
            [*cord_ops_command, "schedule", "--cron", "0 3 * * *", "--data", str(digits_file),
             "--model-name", "scheduled", "--label-free-data", str(incoming / "*.npz")],
            cwd=tmp_path, env={**cli_env, "PREFECT_RUNNER_POLL_FREQUENCY": "1"},  # default 10 s
            stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        with get_client(sync_client=True) as client:
            recal = _wait_for_deployment(client, f"recalibrate/{RECALIBRATE_DEPLOYMENT}",
                                         process, log)
            watch = _wait_for_deployment(client, f"monitor/{MONITOR_DEPLOYMENT}", process, log)
        assert [s.schedule.cron for s in recal.schedules] == ["0 3 * * *"]
        assert [s.schedule.cron for s in watch.schedules] == ["30 3 * * *"]  # offset
        assert recal.parameters["model_name"] == "scheduled"
        assert recal.global_concurrency_limit.limit == 1

        # another file in `data`, as POST /deployments/{id}/create_flow_run allows: refused
        other = data.save_npz(tmp_path / "other.npz", digits.scores[:400], digits.labels[:400],
                              "logits")
        steered = run_deployment(f"recalibrate/{RECALIBRATE_DEPLOYMENT}", timeout=240,
                                 poll_interval=1, parameters={"data": str(other)})
        assert steered.state.is_failed(), (steered.state, log.read_text()[-3000:])
        assert "sets data otherwise than the deployment" in steered.state.message
        assert MlflowClient().get_experiment_by_name("scheduled") is None  # nothing ran

        flow_run = run_deployment(f"recalibrate/{RECALIBRATE_DEPLOYMENT}", timeout=240,
                                  poll_interval=1)
        assert flow_run.state.is_completed(), (flow_run.state, log.read_text()[-3000:])
        # Ticks speak in lines: a result line per finished run, one error line
        # per failed one, no traceback on this console (it stays in the run's log).
        watched = run_deployment(f"monitor/{MONITOR_DEPLOYMENT}", timeout=240, poll_interval=1)
        assert watched.state.is_completed(), (watched.state, log.read_text()[-3000:])
        failed = run_deployment(f"monitor-label-free-new/{LABEL_FREE_DEPLOYMENT}", timeout=240,
                                poll_interval=1)
        assert failed.state.is_failed(), (failed.state, log.read_text()[-3000:])
        time.sleep(2)  # the run processes' last lines reach the log
        lines = log.read_text().splitlines()
        assert "Traceback" not in log.read_text(), log.read_text()[-4000:]
        assert len([x for x in lines if x.startswith("recalibrate: v1 promoted: ")]) == 1, lines
        (result,) = [x for x in lines if x.startswith("monitor: champion v1 on ")]
        assert "ece " in result and "drift: none" in result, result
        errors = [x for x in lines if x.startswith("error: ")]
        assert len(errors) == 2, errors
        refused, error = errors  # the steered run's, then the label-free one's
        assert refused.startswith(f"error: recalibrate run '{steered.name}' failed at ")
        assert refused.endswith(f": flow run '{steered.name}' of deployment "
                                f"'{RECALIBRATE_DEPLOYMENT}' sets data otherwise than the "
                                "deployment does; a run of a cord-ops deployment takes the "
                                "deployment's parameters only (refused before anything was "
                                "read; change the schedule with `cord-ops schedule` instead)"
                                ), refused
        assert error.startswith(f"error: monitor-label-free-new run '{failed.name}' failed at ")
        assert "bad.npz" in error and "Error" not in error, error
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    champion = MlflowClient().get_model_version_by_alias("scheduled", "champion")
    assert str(champion.version) == "1"


def test_deploy_to_a_work_pool_registers_both_cron_deployments(prefect_harness, tmp_path):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate

    from flows.schedule import deploy_to_work_pool

    with get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name="cord-ops-pool", type="process"))
    parameters = {"data": str(tmp_path / "batch.npz"), "model_name": "pooled"}
    label_free = {"data": str(tmp_path / "incoming" / "*.npz"), "model_name": "pooled"}
    ids = deploy_to_work_pool("cord-ops-pool", "15 2 * * 1", parameters, parameters,
                              monitor_cron="0 * * * *", label_free_parameters=label_free)

    with get_client(sync_client=True) as client:
        recal = client.read_deployment_by_name(f"recalibrate/{RECALIBRATE_DEPLOYMENT}")
        watch = client.read_deployment_by_name(f"monitor/{MONITOR_DEPLOYMENT}")
        unlabelled = client.read_deployment_by_name(
            f"monitor-label-free-new/{LABEL_FREE_DEPLOYMENT}")
    assert sorted(ids) == sorted([str(recal.id), str(watch.id), str(unlabelled.id)])
    # the label-free monitor of new batches: on the monitoring schedule, from this checkout
    assert unlabelled.entrypoint == \
        "flows/monitor/label_free/schedule.py:monitor_new_batches"
    assert [s.schedule.cron for s in unlabelled.schedules] == ["0 * * * *"]
    assert unlabelled.parameters == label_free
    assert unlabelled.global_concurrency_limit.limit == 1
    assert (recal.work_pool_name, watch.work_pool_name) == ("cord-ops-pool", "cord-ops-pool")
    assert [s.schedule.cron for s in recal.schedules] == ["15 2 * * 1"]
    assert [s.schedule.cron for s in watch.schedules] == ["0 * * * *"]
    assert recal.entrypoint == "flows/recalibrate/flow.py:recalibrate"
    assert recal.global_concurrency_limit.limit == watch.global_concurrency_limit.limit == 1
    # a tick that finds the previous run still going is dropped, not queued
    assert recal.concurrency_options.collision_strategy == "CANCEL_NEW"
    assert watch.concurrency_options.collision_strategy == "CANCEL_NEW"
    assert recal.parameters == parameters


def test_scheduled_monitoring_skips_while_there_is_no_champion(prefect_harness, store,
                                                               digits_file, caplog):
    """Also a flow run outside any deployment: flows.platform.pinned has nothing to compare
    and lets it run."""
    from mlflow import MlflowClient

    from flows.monitor.labelled import monitor

    with caplog.at_level("INFO"):
        result = monitor(data=str(digits_file), model_name="fresh", tracking_uri=store,
                         skip_without_champion=True)
    assert result is None
    assert any("no @champion" in r.getMessage() and "skipping" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]
    assert MlflowClient(store).get_experiment_by_name("fresh") is None  # nothing logged
    with pytest.raises(LookupError, match="no @champion"):  # unscheduled: still an error
        monitor(data=str(digits_file), model_name="fresh", tracking_uri=store)


def test_a_flow_run_with_other_parameters_than_its_deployment_is_refused(
        prefect_harness, store, digits, digits_file, tmp_path):
    """The deployments ``cord-ops schedule`` builds, registered on a real server; flow runs
    created from them through the API, as any caller of it may, and executed by Prefect's
    engine (in this process, as the served runner's subprocess would). A changed or added
    parameter that chooses what is read or written is refused before anything is read; a
    run with the deployment's own parameters goes ahead."""
    from mlflow import MlflowClient
    from prefect.client.orchestration import get_client
    from prefect.flow_engine import run_flow

    from flows.monitor.label_free.schedule import monitor_new_batches
    from flows.monitor.labelled import monitor
    from flows.recalibrate.flow import recalibrate
    from flows.schedule import build_deployments

    other = data.save_npz(tmp_path / "theirs.npz", digits.scores[:300], digits.labels[:300],
                          "logits")
    theirs = f"sqlite:///{tmp_path / 'theirs' / 'mlflow.db'}"
    recal = {"data": str(digits_file), "tracking_uri": store, "model_name": "pinned"}
    mon = {"data": str(digits_file), "tracking_uri": store, "model_name": "pinned",
           "skip_without_champion": True}
    unlabelled = {"data": str(tmp_path / "incoming" / "*.npz"), "tracking_uri": store,
                  "model_name": "pinned"}
    deployments = build_deployments("0 3 * * *", recal, mon, label_free_parameters=unlabelled)
    flows = {"recalibrate": recalibrate, "monitor": monitor,
             "monitor-label-free-new": monitor_new_batches}
    assert [d.flow_name for d in deployments] == list(flows)
    ids = {d.flow_name: d.apply() for d in deployments}

    def run(name: str, parameters: dict | None = None):
        with get_client(sync_client=True) as client:
            flow_run = client.create_flow_run_from_deployment(ids[name], parameters=parameters)
        return run_flow(flows[name], flow_run=flow_run, return_type="state"), flow_run.name

    state, run_name = run("recalibrate", {"data": str(other)})
    assert (f"OverriddenParameters: flow run {run_name!r} of deployment "
            f"'{RECALIBRATE_DEPLOYMENT}' sets data otherwise than the deployment does; a run "
            "of a cord-ops deployment takes the deployment's parameters only (refused before "
            "anything was read; change the schedule with `cord-ops schedule` instead)"
            ) in state.message
    for name, override, what in [
            ("recalibrate", {"data": str(other)}, "data"),
            ("recalibrate", {"dask_address": "tcp://127.0.0.1:1"}, "dask_address"),
            ("monitor", {"tracking_uri": theirs, "model_name": "other"},
             "model_name, tracking_uri"),
            ("monitor-label-free-new", {"data": str(other)}, "data")]:
        state, _ = run(name, override)
        assert state.is_failed(), (name, override, state)
        assert f"sets {what} otherwise than the deployment does" in state.message, state.message
    assert MlflowClient(store).get_experiment_by_name("pinned") is None  # nothing was read
    assert not (tmp_path / "theirs").exists()  # nor written

    # the deployment's own parameters: past the check (no champion yet, so both skip)
    for name in ("monitor", "monitor-label-free-new"):
        state, _ = run(name)
        assert state.is_completed(), (name, state)


def test_differences_name_every_parameter_changed_added_or_left_out():
    from flows.platform.pinned import differences

    deployment = {"data": "/d/a.npz", "tracking_uri": "sqlite:///s.db", "eval_data": None,
                  "fraction": 0.5}
    assert differences(dict(deployment), deployment) == []
    assert differences({**deployment, "fraction": 0.5000001}, deployment) == ["fraction"]
    # None set is not the same as not set: the flow's default could differ
    assert differences({k: v for k, v in deployment.items() if k != "eval_data"},
                       deployment) == ["eval_data"]
    assert differences({**deployment, "dask_address": "tcp://h:1", "data": "/x"},
                       deployment) == ["dask_address", "data"]
    assert differences({}, {}) == []
    assert differences({"data": "/x"}, {}) == ["data"]
    assert differences({"eval_data": None}, {}) == ["eval_data"]  # added, even as None


def test_outside_a_flow_run_there_is_nothing_to_check():
    from flows.platform.pinned import check

    assert check() is None
