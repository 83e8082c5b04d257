"""A small helper for writing ONNX graphs node by node.

``GraphBuilder`` hands out unique tensor names, stores constants as initializers in the
graph's compute dtype (or any dtype asked for) and returns the output name of every node,
so the family builders read like the numpy code they mirror. Only default-domain operators
are used, at ``OPSET`` (ReduceMax/ReduceMin take their axes as an input from opset 18 on).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

#: Default-domain opset of every exported graph (onnxruntime >= 1.14 runs it on CPU and CUDA).
OPSET = 18
#: IR version written into exported models; 9 is what opset 18 shipped with.
IR_VERSION = 9

DTYPES = {"float32": np.float32, "float64": np.float64}
ONNX_DTYPES = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE}


class GraphBuilder:
    """Accumulates nodes and initializers of one graph computed in ``dtype``."""

    def __init__(self, dtype: str, prefix: str = ""):
        if dtype not in DTYPES:
            raise ValueError(f"dtype: expected one of {tuple(DTYPES)}, got {dtype!r}")
        self.dtype = np.dtype(DTYPES[dtype])
        self.onnx_dtype = ONNX_DTYPES[self.dtype]
        self.prefix = prefix
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._used: set[str] = set()
        self._consts: dict[tuple, str] = {}

    def retyped(self, dtype: str) -> GraphBuilder:
        """A view of the same graph whose constants default to another compute dtype
        (for the parts of a float32 graph that must run in float64)."""
        view = GraphBuilder(dtype, self.prefix)
        view.nodes, view.initializers = self.nodes, self.initializers
        view._used, view._consts = self._used, self._consts
        return view

    def fresh(self, hint: str) -> str:
        """A tensor name not used before in this graph."""
        base = f"{self.prefix}{hint}"
        name, i = base, 1
        while name in self._used:
            name, i = f"{base}_{i}", i + 1
        self._used.add(name)
        return name

    def const(self, value, hint: str = "c", dtype=None, rank0: bool = False) -> str:
        """An initializer holding ``value`` cast to ``dtype`` (the compute dtype by default).

        A scalar is stored with shape [1, 1] (``rank0``: shape [], for inputs that must be
        scalars, such as Clip's bounds): onnxruntime broadcasts an [N, 1] tensor against a
        rank-0 scalar one row at a time, an order of magnitude slower than against [1, 1]
        (docs/performance.md, "ONNX graphs: isotonic families"), and the per-row
        [N, 1] arithmetic of the repair is made of such operations. Scalars are
        deduplicated, so the same constant is stored once.
        """
        arr = np.asarray(value, dtype=self.dtype if dtype is None else dtype)
        if arr.ndim == 0 and not rank0:
            arr = arr.reshape(1, 1)
        key = (arr.dtype.str, arr.shape, arr.tobytes()) if arr.size == 1 else None
        if key is not None and key in self._consts:
            return self._consts[key]
        name = self.fresh(hint)
        self.initializers.append(numpy_helper.from_array(arr, name))
        if key is not None:
            self._consts[key] = name
        return name

    def axes(self, *axes: int) -> str:
        """An int64 axes initializer for Reduce* operators."""
        return self.const(np.array(axes, dtype=np.int64), "axes", dtype=np.int64)

    def op(self, op_type: str, *inputs: str, hint: str | None = None, outputs: int = 1,
           out: str | None = None, **attrs) -> str | list[str]:
        """Append one node; returns its output name (a list when ``outputs`` > 1).

        ``out`` names the (single) output exactly, for tensors that are graph outputs.
        """
        if out is not None:
            self._used.add(out)
            names = [out]
        else:
            names = [self.fresh(hint or op_type.lower()) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), names, **attrs))
        return names[0] if outputs == 1 else names

    # Shorthands for the operators every builder uses.
    def add(self, x: str, y: str, hint: str | None = None) -> str:
        return self.op("Add", x, y, hint=hint)

    def sub(self, x: str, y: str, hint: str | None = None) -> str:
        return self.op("Sub", x, y, hint=hint)

    def mul(self, x: str, y: str, hint: str | None = None) -> str:
        return self.op("Mul", x, y, hint=hint)

    def div(self, x: str, y: str, hint: str | None = None) -> str:
        return self.op("Div", x, y, hint=hint)

    def cast(self, x: str, dtype, hint: str | None = None) -> str:
        return self.op("Cast", x, hint=hint, to=ONNX_DTYPES[np.dtype(dtype)])

    def row_max(self, x: str, hint: str | None = None) -> str:
        """[N, K] -> [N, 1] maximum over classes."""
        return self.op("ReduceMax", x, self.axes(1), hint=hint, keepdims=1)

    def row_min(self, x: str, hint: str | None = None) -> str:
        return self.op("ReduceMin", x, self.axes(1), hint=hint, keepdims=1)

    def row_sum(self, x: str, hint: str | None = None) -> str:
        return self.op("ReduceSum", x, self.axes(1), hint=hint, keepdims=1)

    def row_argmax(self, x: str, hint: str | None = None) -> str:
        """[N, K] -> [N, 1] int64 index of the first maximum (the paper's tie rule)."""
        return self.op("ArgMax", x, hint=hint, axis=1, keepdims=1, select_last_index=0)

    def take(self, x: str, index: str, hint: str | None = None) -> str:
        """x[i, index[i]] as [N, 1]."""
        return self.op("GatherElements", x, index, hint=hint, axis=1)

    def put(self, x: str, index: str, value: str, hint: str | None = None,
            out: str | None = None) -> str:
        """A copy of x with x[i, index[i]] = value[i] ([N, 1] index and value)."""
        return self.op("ScatterElements", x, index, value, hint=hint, out=out, axis=1)

    def zeros_like(self, index: str) -> str:
        """Zeros of the compute dtype shaped like ``index`` (ScatterElements needs updates of
        the indices' shape, so a broadcast scalar will not do)."""
        return self.op("ConstantOfShape", self.op("Shape", index), hint="zeros",
                       value=numpy_helper.from_array(np.zeros(1, dtype=self.dtype)))

    def softmax(self, x: str, out: str | None = None) -> str:
        """Row softmax.

        In float64 it is written out as exp(x - max) / sum, the operations of
        ``cord_ops.softmax.softmax`` (onnxruntime's fused double Softmax is slow
        and rounds differently); in float32 it is the fused Softmax operator, which
        subtracts the row maximum itself.
        """
        if self.dtype == np.float32:
            return self.op("Softmax", x, hint="softmax", out=out, axis=-1)
        shifted = self.sub(x, self.row_max(x), hint="shifted")
        e = self.op("Exp", shifted, hint="exp")
        return self.op("Div", e, self.row_sum(e), hint="softmax", out=out)


def tensor_info(name: str, elem_type: int, shape: list) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem_type, shape)
