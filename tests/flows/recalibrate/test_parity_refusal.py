"""A graph that does not compute what cord_ops computes is never registered: the parity
check of the recalibration flow (flows.recalibrate.compute.verify_parity, Parity.ok) and the
registry step that refuses it, on a real exported graph whose calibrator was perturbed,
run with onnxruntime, against the real sqlite store. The task bodies are called directly
(``.fn``): the refusal happens before any Prefect or store machinery is needed."""

from __future__ import annotations

import copy

import pytest

from cord_ops import CORD, data
from cord_ops.calibrators import make_calibrator
from flows.promotion import rules
from flows.recalibrate import compute, store_steps


@pytest.fixture(scope="module")
def fitted(digits):
    calibration, evaluation = data.split(digits, 0, 0.5)
    ts = make_calibrator("ts").fit(calibration.scores, calibration.labels)
    repair = CORD().fit(calibration.probabilities(), ts.predict_proba(calibration.scores))
    report = compute.evaluate_reports.fn(evaluation, ts, repair)
    return calibration, evaluation, ts, repair, report


def test_a_perturbed_graph_fails_parity_registers_nothing_and_is_not_promoted(fitted, store):
    from mlflow import MlflowClient

    calibration, evaluation, ts, repair, report = fitted
    honest = compute.export_model.fn(ts, repair, 10, "logits", "float32")
    assert compute.verify_parity.fn(honest, evaluation, report, "float32", ts, repair).ok

    # The same family with beta off by 0.1 %: every top-1 is kept (beta > 0 and the
    # repair preserve it), the probabilities move far beyond float32 rounding.
    wrong = copy.deepcopy(ts)
    wrong.beta_ = ts.beta_ * 1.001
    parity = compute.verify_parity.fn(compute.export_model.fn(wrong, repair, 10, "logits",
                                                              "float32"),
                                    evaluation, report, "float32", ts, repair)
    assert parity.argmax_agreement == 1.0
    assert parity.max_abs_diff > 1e-4 > parity.tolerance and parity.ok is False

    client = MlflowClient(store)
    client.create_registered_model("m")
    with pytest.raises(ValueError, match=r"ONNX parity failed: .* nothing registered"):
        store_steps.register.fn(store, "run-never-used", "0", "m", None, parity,
                                evaluation, repair, "ts")
    assert client.search_model_versions("name = 'm'") == []

    policy = rules.Policy.for_classes(10)
    counts = (rules.label_counts(calibration.labels, 10),
              rules.label_counts(evaluation.labels, 10))
    decision = rules.decide(0.1, 0.0, parity.ok, None, uncalibrated_nll=1.0,
                             evidence=rules.Evidence(*counts), policy=policy)
    assert not decision.promote and decision.reason.startswith("ONNX parity check failed")
