"""``export_onnx(..., outputs=...)``: a lean serving graph returns the same repaired rows,
labels and confidences as the full graph bit for bit, carries only the operations they
need, and says which outputs it has in its metadata."""

from __future__ import annotations

import numpy as np
import pytest

from onnx_export import export_onnx, model_metadata, predict_file, save_model
from onnx_export.export import LEAN_OUTPUTS, OUTPUTS, OUTPUTS_KEY

CASES = [
    ("vs", 10, "logits", "float32"),
    ("vs", 100, "logits", "float64"),
    ("ts", 10, "probs", "float32"),
    ("irova", 10, "logits", "float32"),
    ("ms", 10, "logits", "float32"),
    ("irm", 100, "probs", "float32"),
    ("vs", 1000, "logits", "float32"),
]


@pytest.mark.parametrize("name, k, input_kind, dtype", CASES)
def test_lean_outputs_equal_the_full_graphs(cases, run_model, name, k, input_kind, dtype):
    cal, cord = cases.fitted(name, k, input_kind)
    scores = cases.adversarial_scores(k, input_kind, seed=3).astype(dtype)
    full = export_onnx(cal, cord, k, input_kind=input_kind, dtype=dtype)
    lean = export_onnx(cal, cord, k, input_kind=input_kind, dtype=dtype, outputs="lean")
    assert [o.name for o in lean.graph.output] == list(LEAN_OUTPUTS)
    assert model_metadata(lean)[OUTPUTS_KEY] == ",".join(LEAN_OUTPUTS)
    assert model_metadata(full)[OUTPUTS_KEY] == ",".join(OUTPUTS)
    # Dropping two n x K outputs drops the operations only they needed (a float64 graph
    # needs original and calibrated for the label and the repair anyway).
    if dtype == "float32":
        assert len(lean.graph.node) < len(full.graph.node)
    got, want = run_model(lean, scores), run_model(full, scores)
    for key in LEAN_OUTPUTS:
        np.testing.assert_array_equal(got[key], want[key])
    np.testing.assert_array_equal(np.argmax(got["repaired"], axis=1), got["label"])


def test_any_subset_in_graph_order(cases, run_model):
    cal, cord = cases.fitted("vs", 10, "logits")
    model = export_onnx(cal, cord, 10, outputs=["confidence", "original"])
    assert [o.name for o in model.graph.output] == ["original", "confidence"]
    scores = cases.adversarial_scores(10, "logits", seed=4).astype(np.float32)
    full = run_model(export_onnx(cal, cord, 10), scores)
    got = run_model(model, scores)
    np.testing.assert_array_equal(got["original"], full["original"])
    np.testing.assert_array_equal(got["confidence"], full["confidence"])


@pytest.mark.parametrize("outputs, message", [
    ("slim", "outputs: expected 'full', 'lean'"),
    ([], "outputs: expected distinct names"),
    (["repaired", "repaired"], "outputs: expected distinct names"),
    (["repaired", "logits"], "outputs: expected distinct names"),
    (3, "outputs: expected 'full', 'lean'"),
])
def test_bad_outputs_are_rejected(cases, outputs, message):
    cal, cord = cases.fitted("vs", 10, "logits")
    with pytest.raises(ValueError, match=message):
        export_onnx(cal, cord, 10, outputs=outputs)


def test_predict_file_writes_what_a_lean_model_has(cases, tmp_path):
    cal, cord = cases.fitted("vs", 10, "logits")
    path = save_model(export_onnx(cal, cord, 10, outputs="lean"), tmp_path / "lean.onnx")
    scores = cases.adversarial_scores(10, "logits", seed=5).astype(np.float32)
    np.savez(tmp_path / "in.npz", scores=scores)
    predict_file(path, tmp_path / "in.npz", tmp_path / "out.npz", progress=False)
    with np.load(tmp_path / "out.npz") as written:
        assert sorted(written.files) == ["confidence", "label", "repaired"]
