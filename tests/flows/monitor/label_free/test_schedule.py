"""``cord-ops schedule --label-free-data GLOB``: the label-free monitor's cron deployment and
its entry flow, which monitors only the batches no finished label-free run has logged.
(Firing a cron is covered by test_schedule.py; this calls the scheduled flow directly.)"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from cord_ops import data
from flows.cli import label_free as label_free_cli
from flows.cli.main import build_parser
from flows.inputs import InputError
from flows.monitor.label_free import records
from flows.monitor.label_free.flow import monitor_label_free
from flows.monitor.label_free.schedule import LABEL_FREE_DEPLOYMENT, monitor_new_batches
from flows.schedule import MONITOR_DEPLOYMENT, build_deployments


def _schedule_args(*extra: str):
    return build_parser().parse_args(["schedule", "--cron", "0 3 * * *", "--data", "d.npz",
                                      "--model-name", "lf", *extra])


def _label_free_schedule(args):
    """The label-free part of ``schedule``'s request; "30 3 * * *": the monitoring cron
    the command checked before."""
    return label_free_cli.schedule(args, "30 3 * * *", "sqlite:///store.db")


def test_schedule_options_and_the_label_free_deployment(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = _schedule_args("--label-free-data", "incoming/*.parquet", "--alpha", "0.001",
                          "--emit-event")
    checked = _label_free_schedule(args)
    assert checked.cron == "30 3 * * *"  # the monitoring schedule by default
    parameters = checked.parameters()
    assert parameters["data"] == str(tmp_path / "incoming" / "*.parquet")  # absolute
    assert (parameters["alpha"], parameters["emit_events"], parameters["model_name"]) == \
        (0.001, True, "lf")
    assert parameters["register_candidates"] is False
    assert parameters["tracking_uri"] == "sqlite:///store.db"
    assert _label_free_schedule(_schedule_args()) is None
    registering = _schedule_args("--label-free-data", "in/*.npz", "--register-candidate")
    assert _label_free_schedule(registering).parameters()["register_candidates"] is True

    refusals = {("--label-free-data", "one.npz"): "expected a glob pattern or a folder",
                ("--label-free-cron", "0 * * * *"): "--label-free-cron: needs --label-free-data",
                ("--label-free-data", "in/*", "--max-prior-shift", "2"): "--max-prior-shift",
                ("--label-free-data", "in/*", "--label-free-cron", "61 * * * *"):
                    "--label-free-cron"}
    for extra, expected in refusals.items():
        with pytest.raises(InputError, match=expected):
            _label_free_schedule(_schedule_args(*extra))

    deployments = build_deployments("0 3 * * *", {"data": "d.npz", "model_name": "lf"},
                                    {"data": "d.npz", "model_name": "lf"}, None,
                                    parameters, "*/10 * * * *")
    by_name = {d.name: d for d in deployments}
    assert set(by_name) >= {MONITOR_DEPLOYMENT, LABEL_FREE_DEPLOYMENT}
    scheduled = by_name[LABEL_FREE_DEPLOYMENT]
    assert [s.schedule.cron for s in scheduled.schedules] == ["*/10 * * * *"]
    assert scheduled.parameters == parameters
    assert scheduled.entrypoint == \
        "flows.monitor.label_free.schedule.monitor_new_batches"
    assert scheduled.concurrency_limit == 1
    # without its own cron: the monitoring one
    fallback = build_deployments("0 3 * * *", {}, None, "45 * * * *", parameters)
    assert [s.schedule.cron for s in fallback[-1].schedules] == ["45 * * * *"]


def test_scheduled_label_free_monitor_logs_only_new_batches(prefect_harness, store, tmp_path,
                                                            digits):
    from mlflow import MlflowClient

    from flows.recalibrate.flow import recalibrate

    client = MlflowClient()
    incoming = tmp_path / "incoming"
    incoming.mkdir()
    pattern = str(incoming / "*.npz")
    np.savez(incoming / "a.npz", logits=digits.scores[:300])
    # no champion yet, then no batch yet: nothing to do, no error, nothing logged
    assert monitor_new_batches(data=pattern, model_name="lf") is None
    recalibrate(data=str(data.save_npz(tmp_path / "d.npz", digits.scores, digits.labels,
                                       "logits")), model_name="lf")
    assert monitor_new_batches(data=str(tmp_path / "none-yet" / "*.npz"),
                               model_name="lf") is None
    assert client.get_experiment_by_name(records.monitoring_experiment("lf")) is None

    by_hand = monitor_label_free(data=str(incoming / "a.npz"), model_name="lf")
    np.savez(incoming / "b.npz", logits=digits.scores[300:700])
    shutil.copy(incoming / "a.npz", incoming / "c-copy-of-a.npz")  # same bytes: monitored
    (incoming / "notes.txt").write_text("not a batch")

    result = monitor_new_batches(data=pattern, model_name="lf")
    assert [Path(r.path).name for r in result.reports] == ["b.npz"]
    assert result.reports[0].n == 400
    assert monitor_new_batches(data=pattern, model_name="lf") is None  # nothing new now
    runs = client.search_runs(
        [client.get_experiment_by_name(records.monitoring_experiment("lf")).experiment_id])
    assert sorted(Path(r.data.tags["data.path"]).name for r in runs) == ["a.npz", "b.npz"]
    assert {r.info.run_id for r in runs} == {by_hand.reports[0].run_id,
                                             result.reports[0].run_id}
    assert all(r.data.tags["cord.kind"] == records.KIND for r in runs)

    # -------- registering candidates on the schedule: a shifted new batch gets a version
    from flows.store import registry

    champion = str(registry.champion_version(client, "lf").version)
    np.savez(incoming / "d-shifted.npz", logits=digits.scores[digits.labels <= 2])
    result = monitor_new_batches(data=pattern, model_name="lf", register_candidates=True)
    (report,) = result.reports
    assert Path(report.path).name == "d-shifted.npz"
    assert report.candidate_version == str(int(champion) + 1)
    mv = client.get_model_version("lf", report.candidate_version)
    assert mv.tags[registry.LABEL_FREE_TAG] == "true"
    assert mv.tags[registry.LABEL_FREE_SOURCE_TAG] == champion
    assert mv.tags[registry.REGISTRATION_TAG] == registry.COMPLETE
    assert str(registry.champion_version(client, "lf").version) == champion
    # the next tick finds nothing new and registers nothing more
    assert monitor_new_batches(data=pattern, model_name="lf", register_candidates=True) is None
    assert len(client.search_model_versions("name = 'lf'")) == 2
