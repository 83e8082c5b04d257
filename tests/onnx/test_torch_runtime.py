"""TorchGraph (onnx_export.torch_runtime), the GPU runtime for machines whose onnxruntime
has no CUDA provider: every family's graph against cord_ops, and the operators whose ONNX
semantics torch does not give by default, against onnxruntime. Runs on the CPU here, on
CUDA where torch sees a GPU; skipped without PyTorch (an optional dependency)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from cord_ops.calibrators import CALIBRATOR_NAMES
from onnx_export import export_onnx, open_session

torch = pytest.importorskip("torch")
from onnx_export.torch_runtime import OPERATORS, TorchGraph  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True)
def _no_tf32():
    """TorchGraph refuses CUDA with TF32 allowed; the tests switch it off as callers must."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@pytest.mark.parametrize("input_kind", ["logits", "probs"])
@pytest.mark.parametrize("name", CALIBRATOR_NAMES)
def test_parity_with_cord_ops(name, input_kind, cases):
    for k in (2, 10):
        cal, cord = cases.fitted(name, k, input_kind)
        scores = cases.adversarial_scores(k, input_kind, seed=k + 7)
        expected = cases.reference(cal, cord, scores)
        for dtype in ("float32", "float64"):
            graph = TorchGraph(export_onnx(cal, cord, k, input_kind=input_kind, dtype=dtype),
                               DEVICE)
            assert set(graph.operators) <= set(OPERATORS)
            outputs = graph.run_numpy({"scores": scores.astype(dtype)})
            cases.assert_parity(outputs, expected, dtype)


def _single(op: str, inputs, outputs, initializers=(), **attrs):
    graph = helper.make_graph([helper.make_node(op, [i[0] for i in inputs] +
                                                [t.name for t in initializers],
                                                [o[0] for o in outputs], **attrs)],
                              op, [helper.make_tensor_value_info(*i) for i in inputs],
                              [helper.make_tensor_value_info(*o) for o in outputs],
                              list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)


def _both(model, feeds):
    session = open_session(model, provider="cpu")
    names = [o.name for o in session.get_outputs()]
    want = dict(zip(names, session.run(names, feeds), strict=True))
    got = TorchGraph(model, DEVICE).run_numpy(feeds)
    return got, want


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.integers(-2, 2), min_size=6, max_size=6), min_size=1, max_size=5))
def test_topk_orders_ties_by_index_as_onnx(rows):
    """Small integers: most rows have ties, whose order ONNX fixes (lower index first)."""
    x = np.array(rows, dtype=np.float32)
    model = _single("TopK", [("x", TensorProto.FLOAT, [None, 6])],
                    [("v", TensorProto.FLOAT, [None, 6]), ("i", TensorProto.INT64, [None, 6])],
                    [numpy_helper.from_array(np.array([6], np.int64), "k")], axis=1)
    got, want = _both(model, {"x": x})
    np.testing.assert_array_equal(got["i"], want["i"])
    np.testing.assert_array_equal(got["v"], want["v"])


def test_gather_elements_takes_int32_and_negative_indices():
    x = np.arange(12, dtype=np.float64).reshape(3, 4)
    index = np.array([[0, -1], [3, -4], [-2, 1]], dtype=np.int32)
    model = _single("GatherElements", [("x", TensorProto.DOUBLE, [3, 4]),
                                       ("j", TensorProto.INT32, [3, 2])],
                    [("y", TensorProto.DOUBLE, [3, 2])], axis=1)
    got, want = _both(model, {"x": x, "j": index})
    np.testing.assert_array_equal(got["y"], want["y"])


def test_argmax_takes_the_first_of_tied_maxima():
    x = np.array([[1, 3, 3, 0], [2, 2, 2, 2], [0, 0, 5, 5]], dtype=np.float32)
    model = _single("ArgMax", [("x", TensorProto.FLOAT, [3, 4])],
                    [("y", TensorProto.INT64, [3, 1])], axis=1, keepdims=1)
    got, want = _both(model, {"x": x})
    np.testing.assert_array_equal(got["y"], want["y"])
    np.testing.assert_array_equal(got["y"].ravel(), [1, 0, 2])


def test_an_operator_it_does_not_know_is_refused_before_anything_runs():
    model = _single("Sin", [("x", TensorProto.FLOAT, [1])], [("y", TensorProto.FLOAT, [1])])
    with pytest.raises(ValueError, match="not supported by TorchGraph: Sin"):
        TorchGraph(model, DEVICE)


def test_integer_division_truncates_as_onnx():
    a = np.array([7, -7, 9, -1], dtype=np.int64)
    b = np.array([2, 2, -4, 3], dtype=np.int64)
    model = _single("Div", [("a", TensorProto.INT64, [4]), ("b", TensorProto.INT64, [4])],
                    [("y", TensorProto.INT64, [4])])
    got, want = _both(model, {"a": a, "b": b})
    np.testing.assert_array_equal(got["y"], want["y"])
    assert got["y"].dtype == np.int64
