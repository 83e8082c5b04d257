"""A fraud-like binary model through ``cord-ops recalibrate`` and ``predict`` as production
logs it: 2.8 % positives, one float32 score column with a value 1.2e-6 above 1,
trained with balanced class weights (its 0.5 decision flags far more rows than are
positive), operated at the threshold 0.1. One flow run (slow: the Prefect harness).

Expected decisions are written here as the comparison ``(1 - t) p1 > t p0``, not through
the code under test.
"""

from __future__ import annotations

import corpus
import numpy as np
import pytest

from flows.cli.main import main

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]

T = 0.1


def _at(p1: np.ndarray) -> np.ndarray:
    p1 = np.clip(p1.astype(np.float64), 0.0, 1.0)
    return ((1 - T) * p1 > T * (1.0 - p1)).astype(np.int64)


def test_rare_positives_in_one_column_at_the_operators_threshold(store, tmp_path, capsys):
    from mlflow import MlflowClient

    e = corpus.rare_binary("2.8", "logreg_balanced", kind="probs", dtype="float32", columns=1)
    cal, ev = e.cal_scores[:, 0].copy(), e.eval_scores[:, 0].copy()
    top = int(np.argmax(cal))
    cal[top] = np.float32(1) + 10 * np.finfo(np.float32).eps  # 1.0000011920928955
    np.savez(tmp_path / "cal.npz", probs=cal, labels=e.cal_labels)
    np.savez(tmp_path / "eval.npz", probs=ev, labels=e.eval_labels)

    assert main(["recalibrate", "--data", str(tmp_path / "cal.npz"), "--eval-data",
                 str(tmp_path / "eval.npz"), "--model-name", "fraud", "--calibrator", "vs",
                 "--decision-threshold", str(T)]) == 0
    out = capsys.readouterr().out
    # the column over 1 by its rounding was read, and said so
    assert (f"positive-class probabilities clipped to [0, 1], worst row {top} was 1.19e-06 "
            "outside") in out
    # 84 positives of 3,000 pass the rarer-class rule with the default options
    assert "v1 promoted -> fraud@champion" in out and "not enough evidence" not in out
    assert "decisions kept at p1 >= 0.1" in out
    assert "onto the threshold p1 = 0.1" in out and "AUC " in out
    assert "FlatRepairWarning: CORD repaired " in out

    client = MlflowClient()
    version = client.get_model_version("fraud", "1")
    assert version.tags["cord.decision_threshold"] == "0.1"
    run = client.get_run(version.run_id)
    assert run.data.params["decision_threshold"] == "0.1"
    logged = run.data.metrics
    assert logged["cord.tpcr"] == 0.0 and logged["onnx.argmax_agreement"] == 1.0
    assert logged["base.tpcr"] > 0.1  # VS alone moves many decisions at 0.1
    assert logged["cord.boundary_share"] > 0.1 and logged["cord.flat_share"] > 0.1
    assert logged["uncal.auc"] > logged["cord.auc"]
    assert run.data.tags["cord.repair.warning"].startswith("FlatRepairWarning")

    # predict from the registry: the label is the decision at 0.1, and so is the repaired p1
    assert main(["predict", "--model", "models:/fraud@champion", "--input",
                 str(tmp_path / "eval.npz"), "--output", str(tmp_path / "out.npz")]) == 0
    with np.load(tmp_path / "out.npz") as scored:
        label, repaired = scored["label"], scored["repaired"].astype(np.float64)
    np.testing.assert_array_equal(label, _at(ev))
    np.testing.assert_array_equal(
        ((1 - T) * repaired[:, 1] > T * repaired[:, 0]).astype(np.int64), _at(ev))

    # a later recalibration given no threshold keeps the champion's, never the argmax
    assert main(["recalibrate", "--data", str(tmp_path / "cal.npz"), "--eval-data",
                 str(tmp_path / "eval.npz"), "--model-name", "fraud", "--calibrator",
                 "ts"]) == 0
    second = client.get_model_version("fraud", "2")
    assert second.tags["cord.decision_threshold"] == "0.1"
    assert client.get_run(second.run_id).data.params["decision_threshold"] == "0.1"
    assert "decides at" not in second.tags["cord.gate.reason"]
