"""The float32 strict-top-1 fix-up (``onnx_export.repair`` docstring) on rows built to hit
it: a vector-scaling map whose bias pushes class 0 far above the original top-1, so that
most rows are repaired to the lower end of their interval, s = rho / (1 + rho) + 1e-12,
where the repaired top-1 mass sits 1e-12 above the runner-up and float32 cannot tell them
apart."""

from __future__ import annotations

import numpy as np
import pytest

from cord_ops.calibrators import calibrator_from_dict
from onnx_export import export_onnx
from onnx_export.export import WIDE_REPAIR_BELOW_ETA


@pytest.fixture(scope="module")
def lower_end_rows(cases):
    k = 10
    fitted_vs, cord = cases.fitted("vs", k, "logits")
    state = fitted_vs.to_dict()
    state["params"]["bias"][0] += 6.0
    vs = calibrator_from_dict(state)
    rng = np.random.default_rng(5)
    n = 2000
    logits = rng.normal(0.0, 1.0, (n, k))
    top = rng.integers(1, k, n)
    logits[np.arange(n), top] += rng.uniform(0.5, 3.0, n)
    return vs, cord, logits.astype(np.float32)


# 0.0 and -0.2 keep the repair in float32; -2.0 runs it in float64 and casts the result.
@pytest.mark.parametrize("eta", [0.0, -0.2, -2.0])
def test_original_class_stays_strictly_on_top_in_float32(eta, lower_end_rows, cases,
                                                         run_model):
    vs, fitted_cord, logits = lower_end_rows
    cord = cases.with_eta(fitted_cord, eta)
    expected = cases.reference(vs, cord, logits)
    label = expected["label"]
    # The hazard is real: rounding cord_ops' float64 repair to float32 loses the top-1.
    cast = expected["repaired"].astype(np.float32)
    flipped = np.argmax(cast, axis=1) != label
    assert flipped.sum() > len(label) // 4

    outputs = run_model(export_onnx(vs, cord, 10, dtype="float32"), logits)
    cases.assert_parity(outputs, expected, "float32")
    repaired = outputs["repaired"]
    rows = np.arange(len(label))
    runner_up = np.max(np.where(np.eye(10, dtype=bool)[label], -np.inf, repaired), axis=1)
    assert np.all(repaired[rows, label] > runner_up)
    # Fix-up and float32 arithmetic keep the top-1 mass within a few ulps of the larger of
    # the runner-up and the rounded float64 value.
    floor = np.maximum(cast[rows, label], runner_up)
    assert np.all(np.abs(outputs["confidence"] - floor) <= 8 * np.spacing(floor))
    np.testing.assert_array_equal(outputs["confidence"], repaired[rows, label])


def test_float64_graph_needs_no_fix_up(lower_end_rows, cases, run_model):
    """The 1e-12 margin of eq. 23 is far above float64 rounding: the float64 graph's top-1
    mass is cord_ops' to rounding and still strictly on top."""
    vs, fitted_cord, logits = lower_end_rows
    cord = cases.with_eta(fitted_cord, WIDE_REPAIR_BELOW_ETA / 2)
    expected = cases.reference(vs, cord, logits)
    outputs = run_model(export_onnx(vs, cord, 10, dtype="float64"), logits.astype(np.float64))
    cases.assert_parity(outputs, expected, "float64")
