"""The parity suite on CUDAExecutionProvider (onnxruntime-gpu, the ``gpu`` extra); skipped
where this onnxruntime has no CUDA provider or no GPU is visible."""

from __future__ import annotations

import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from cord_ops.calibrators import CALIBRATOR_NAMES
from onnx_export import export_onnx, open_session
from onnx_export.runtime import CUDA


def _cuda_runs() -> bool:
    """CUDAExecutionProvider is installed and a session can actually start on it."""
    if CUDA not in ort.get_available_providers():
        return False
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])], "probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)
    try:
        return CUDA in open_session(model, provider="cuda").get_providers()
    except RuntimeError:
        return False


pytestmark = pytest.mark.skipif(not _cuda_runs(), reason="no CUDAExecutionProvider with a GPU")


@pytest.mark.parametrize("input_kind", ["logits", "probs"])
@pytest.mark.parametrize("name", CALIBRATOR_NAMES)
def test_parity_on_cuda(name, input_kind, cases, run_model):
    for k in (2, 10, 1000):
        cal, cord = cases.fitted(name, k, input_kind)
        scores = cases.adversarial_scores(k, input_kind, seed=k + 1)
        expected = cases.reference(cal, cord, scores)
        for dtype in ("float32", "float64"):
            model = export_onnx(cal, cord, k, input_kind=input_kind, dtype=dtype)
            outputs = run_model(model, scores.astype(dtype), provider="cuda")
            cases.assert_parity(outputs, expected, dtype)
