"""The monitoring flow: a steady batch is logged and left alone; a drifted batch triggers a
recalibration subflow whose gate records its decision."""

from __future__ import annotations

import pytest

from cord_ops import data
from flows.monitor.labelled import monitor
from flows.recalibrate.flow import recalibrate
from flows.store import registry

pytestmark = pytest.mark.usefixtures("prefect_harness")


def test_monitor_logs_steady_batches_and_recalibrates_on_drift(store, tmp_path, digits):
    from mlflow import MlflowClient

    first = recalibrate(data=str(data.save_npz(tmp_path / "d.npz", digits.scores,
                                               digits.labels, "logits")), model_name="m")
    client = MlflowClient()

    steady = monitor(data=str(tmp_path / "d.npz"), model_name="m")
    assert steady.champion_version == first.version and not steady.degraded
    assert steady.recalibration is None
    logged = client.get_run(steady.run_id).data
    assert logged.tags["cord.kind"] == "monitor" and logged.tags["cord.drift"] == "none"
    assert logged.metrics["monitor.ece"] == steady.metrics["ece"]
    assert logged.metrics["baseline.nll"] == client.get_run(first.run_id).data.metrics["cord.nll"]
    assert steady.metrics["tpcr"] == 0.0

    # Sharper logits: the same classifier grown overconfident, so its NLL and ECE rise.
    drifted = data.save_npz(tmp_path / "drifted.npz", 4.0 * digits.scores, digits.labels,
                            "logits")
    alarm = monitor(data=str(drifted), model_name="m", dtype="float64")
    assert alarm.degraded and alarm.drift["nll"] > 0.05
    assert alarm.recalibration is not None
    assert alarm.recalibration.version == "2"
    assert alarm.recalibration.onnx_max_abs_diff <= 1e-12  # the float64 graph's tolerance
    assert client.get_run(alarm.recalibration.run_id).info.status == "FINISHED"
    # On the drifted split v2 beats v1, but the gate also scores v2 on v1's pinned
    # reference split (the undrifted digits): v2 was calibrated for logits four times as
    # sharp, so its NLL there is far worse and v1 stays.
    decision = alarm.recalibration.decision
    assert not decision.promote and decision.champion_version == first.version
    assert decision.candidate_nll < decision.champion_nll  # on the drifted split
    assert "reference split is worse than" in decision.reason
    tags = client.get_model_version("m", "2").tags
    assert tags[registry.DECISION_TAG] == "rejected"
    assert str(client.get_model_version_by_alias("m", registry.CHAMPION).version) == first.version
    assert "nll rose" in client.get_run(alarm.run_id).data.tags["cord.drift"]
