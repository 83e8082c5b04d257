"""Default batches of ``run_batched``: sized from the model's metadata and the session's
threads so that each thread's share of a [rows, K] intermediate stays near
``BATCH_BYTES`` (float64 where the graph computes in float64), and the batched result is
the one-shot result bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from onnx_export import export_onnx, open_session, run_batched
from onnx_export.builder import IR_VERSION, OPSET
from onnx_export.export import compute_itemsize, model_metadata
from onnx_export.runtime import BATCH_BYTES, session_batch_size


@pytest.mark.parametrize("name, dtype, itemsize", [
    ("vs", "float32", 4), ("vs", "float64", 8), ("irova", "float32", 8), ("ts", "float32", 4),
])
def test_batch_follows_the_compute_dtype(cases, name, dtype, itemsize):
    k = 10
    cal, cord = cases.fitted(name, k, "logits")
    model = export_onnx(cal, cord, k, dtype=dtype, outputs="lean")
    assert compute_itemsize(model_metadata(model)) == itemsize
    session = open_session(model, provider="cpu", threads=1)
    rows = session_batch_size(session, k)
    assert rows == min(16384, BATCH_BYTES // (k * itemsize))
    two = open_session(model, provider="cpu", threads=2)
    assert session_batch_size(two, k) == min(16384, 2 * BATCH_BYTES // (k * itemsize))
    scores = cases.adversarial_scores(k, "logits", seed=5).astype(dtype)
    scores = np.concatenate([scores] * (2 * rows // len(scores) + 2))  # several batches
    batched = run_batched(session, scores)
    whole = dict(zip(["repaired", "label", "confidence"],
                     session.run(["repaired", "label", "confidence"], {"scores": scores}),
                     strict=True))
    for key, value in whole.items():
        np.testing.assert_array_equal(batched[key], value)


def test_a_model_without_cord_metadata_uses_its_input():
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "plain",
                              [helper.make_tensor_value_info("x", TensorProto.DOUBLE, ["N", 50])],
                              [helper.make_tensor_value_info("y", TensorProto.DOUBLE, ["N", 50])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              ir_version=IR_VERSION)
    session = open_session(model, provider="cpu", threads=1)
    assert session_batch_size(session, 50) == BATCH_BYTES // (50 * 8)


def test_sessions_that_do_not_spin_give_the_same_outputs(cases):
    cal, cord = cases.fitted("irova", 10, "logits")
    model = export_onnx(cal, cord, 10, outputs="lean")
    scores = cases.adversarial_scores(10, "logits", seed=6)
    quiet = open_session(model, provider="cpu", threads=2, spin=False)
    assert quiet.get_session_options().get_session_config_entry(
        "session.intra_op.allow_spinning") == "0"
    spinning = open_session(model, provider="cpu", threads=2)
    for got, want in zip(run_batched(quiet, scores).values(),
                         run_batched(spinning, scores).values(), strict=True):
        np.testing.assert_array_equal(got, want)
