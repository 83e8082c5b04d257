"""Run an exported pipeline graph with PyTorch, on a CUDA GPU or the CPU.

For a GPU whose machine has PyTorch but no onnxruntime build with CUDAExecutionProvider
(docs/gpu.md: the onnxruntime-gpu wheel is too large to carry to such a machine),
:class:`TorchGraph` executes the ONNX graph itself, node by node, each operator mapped to
the torch operation with ONNX's semantics. It is an interpreter of exactly the operators
the exporters write (``OPERATORS``); a graph holding any other is refused when it is
opened, never run in part. PyTorch is optional: it is imported when a graph is opened, so
``onnx_export`` imports without it.

Semantics that torch does not give by default and are enforced here:

- TopK orders ties by lower index first (ONNX); ``torch.topk`` does not promise an order
  for ties on CUDA, so it is a stable descending sort cut to k.
- GatherElements/ScatterElements indices may be int32 (the isotonic tables) and negative
  (counted from the end); torch wants non-negative int64.
- ArgMax with ``select_last_index=0`` is ``torch.argmax``, documented to return the first
  maximal index.
- float32 MatMul must not run in TF32 (10-bit mantissa on tensor cores): :class:`TorchGraph`
  refuses to open on CUDA while ``torch.backends.cuda.matmul.allow_tf32`` or
  ``torch.backends.cudnn.allow_tf32`` is set, so a caller switches them off itself
  (they are process-wide settings; this module does not change them).

Intermediates are freed after their last use, so a batch needs memory for the tensors
alive at one time, not for every node's output.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

#: The operators of the exported graphs (onnx_export builders), each run as torch does it.
OPERATORS = (
    "Abs", "Add", "ArgMax", "Cast", "Clip", "ConstantOfShape", "Div", "Equal", "Exp",
    "GatherElements", "Identity", "Less", "LessOrEqual", "Log", "MatMul", "Max", "Min",
    "Mul", "Not", "ReduceMax", "ReduceMin", "ReduceSum", "Reshape", "ScatterElements",
    "Shape", "Softmax", "Sqrt", "Sub", "TopK", "Where",
)


def _torch():
    import torch

    return torch


@functools.cache
def _dtypes() -> dict[int, object]:
    torch = _torch()
    return {TensorProto.FLOAT: torch.float32, TensorProto.DOUBLE: torch.float64,
            TensorProto.INT32: torch.int32, TensorProto.INT64: torch.int64,
            TensorProto.BOOL: torch.bool}


def _index(torch, index, size: int):
    """ONNX element indices (int32 or int64, negative from the end) as torch's int64."""
    index = index.long()
    return torch.where(index < 0, index + size, index)


def _reduce(torch, name: str, x, axes, keepdims: int):
    dims = tuple(int(a) for a in axes.tolist()) if axes is not None else tuple(range(x.ndim))
    fn = {"ReduceMax": torch.amax, "ReduceMin": torch.amin, "ReduceSum": torch.sum}[name]
    return fn(x, dim=dims, keepdim=bool(keepdims))


def _reshape(x, shape, allowzero: int):
    dims = [int(d) for d in shape.tolist()]
    if not allowzero:
        dims = [x.shape[i] if d == 0 else d for i, d in enumerate(dims)]
    return x.reshape(dims)


def _topk(torch, x, k, axis: int, largest: int, sorted_: int):
    # A stable sort keeps equal values in index order, the order ONNX prescribes.
    values, order = torch.sort(x, dim=axis, descending=bool(largest), stable=True)
    n = int(k.reshape(-1)[0])
    return values.narrow(axis, 0, n), order.narrow(axis, 0, n)


def _run_node(torch, op: str, inputs: list, attrs: dict, device):
    """The outputs (a list) of one node."""
    if op == "Div" and not inputs[0].is_floating_point():
        # ONNX integer division truncates; torch.div would return floats
        return [torch.div(inputs[0], inputs[1], rounding_mode="trunc")]
    if op in ("Add", "Sub", "Mul", "Div"):
        fn = {"Add": torch.add, "Sub": torch.sub, "Mul": torch.mul, "Div": torch.div}[op]
        return [fn(inputs[0], inputs[1])]
    if op in ("Max", "Min"):
        fn = torch.maximum if op == "Max" else torch.minimum
        return [functools.reduce(fn, inputs)]
    if op in ("Abs", "Exp", "Log", "Sqrt", "Not", "Identity"):
        fn = {"Abs": torch.abs, "Exp": torch.exp, "Log": torch.log, "Sqrt": torch.sqrt,
              "Not": torch.logical_not, "Identity": lambda t: t}[op]
        return [fn(inputs[0])]
    if op in ("Equal", "Less", "LessOrEqual"):
        fn = {"Equal": torch.eq, "Less": torch.lt, "LessOrEqual": torch.le}[op]
        return [fn(inputs[0], inputs[1])]
    if op == "Where":
        return [torch.where(*inputs)]
    if op == "Cast":
        return [inputs[0].to(_dtypes()[attrs["to"]])]
    if op == "Clip":
        x, low, high = (inputs + [None, None])[:3]
        return [torch.clamp(x, min=low, max=high)]
    if op == "MatMul":
        return [torch.matmul(inputs[0], inputs[1])]
    if op == "Softmax":
        return [torch.softmax(inputs[0], dim=attrs.get("axis", -1))]
    if op in ("ReduceMax", "ReduceMin", "ReduceSum"):
        axes = inputs[1] if len(inputs) > 1 else None
        return [_reduce(torch, op, inputs[0], axes, attrs.get("keepdims", 1))]
    if op == "ArgMax":
        if attrs.get("select_last_index", 0):
            raise ValueError("ArgMax with select_last_index=1 is not supported")
        return [torch.argmax(inputs[0], dim=attrs.get("axis", 0),
                             keepdim=bool(attrs.get("keepdims", 1)))]
    if op == "GatherElements":
        axis = attrs.get("axis", 0)
        x = inputs[0]
        return [torch.gather(x, axis, _index(torch, inputs[1], x.shape[axis]))]
    if op == "ScatterElements":
        if attrs.get("reduction", "none") != "none":
            raise ValueError("ScatterElements with a reduction is not supported")
        axis = attrs.get("axis", 0)
        x = inputs[0]
        return [x.scatter(axis, _index(torch, inputs[1], x.shape[axis]), inputs[2])]
    if op == "Shape":
        return [torch.tensor(list(inputs[0].shape), dtype=torch.int64, device=device)]
    if op == "ConstantOfShape":
        value = attrs.get("value")
        array = (numpy_helper.to_array(value) if value is not None
                 else np.zeros(1, np.float32))
        shape = [int(d) for d in inputs[0].tolist()]
        return [torch.full(shape, array.reshape(-1)[0].item(),
                           dtype=_dtypes()[helper.np_dtype_to_tensor_dtype(array.dtype)],
                           device=device)]
    if op == "Reshape":
        return [_reshape(inputs[0], inputs[1], attrs.get("allowzero", 0))]
    if op == "TopK":
        return list(_topk(torch, inputs[0], inputs[1], attrs.get("axis", -1),
                          attrs.get("largest", 1), attrs.get("sorted", 1)))
    raise ValueError(f"operator {op} is not supported")


class TorchGraph:
    """An exported graph ready to run on ``device`` ("cuda", "cuda:1", "cpu").

    ``model`` is a path, serialized bytes or a ModelProto. Raises ValueError naming the
    operators outside ``OPERATORS`` (nothing is run), and RuntimeError when ``device`` is
    CUDA and TF32 is allowed (see the module docstring) or no GPU is visible.
    """

    def __init__(self, model, device: str = "cuda"):
        torch = _torch()
        if isinstance(model, bytes):
            model = onnx.load_from_string(model)
        elif isinstance(model, str | Path):
            model = onnx.load(str(model))
        self.device = torch.device(device)
        if self.device.type == "cuda":
            if not torch.cuda.is_available():
                raise RuntimeError(f"device {device!r}: torch sees no CUDA GPU")
            if torch.backends.cuda.matmul.allow_tf32 or torch.backends.cudnn.allow_tf32:
                raise RuntimeError(
                    "TF32 is allowed (torch.backends.cuda.matmul.allow_tf32 or "
                    "torch.backends.cudnn.allow_tf32): float32 MatMul would lose 13 mantissa "
                    "bits; set both to False before opening the graph")
        graph = model.graph
        unsupported = sorted({n.op_type for n in graph.node if n.domain not in ("", "ai.onnx")}
                             | {n.op_type for n in graph.node} - set(OPERATORS))
        if unsupported:
            raise ValueError(f"graph {graph.name!r}: operators not supported by TorchGraph: "
                             f"{', '.join(unsupported)}")
        self.input_names = [i.name for i in graph.input]
        self.output_names = [o.name for o in graph.output]
        self._constants = {
            t.name: torch.from_numpy(numpy_helper.to_array(t).copy()).to(self.device)
            for t in graph.initializer}
        self._nodes = [(n.op_type, list(n.input), list(n.output),
                        {a.name: helper.get_attribute_value(a) for a in n.attribute})
                       for n in graph.node]
        # The index of the last node reading each tensor, so it can be freed after it.
        last = {}
        for i, (_, inputs, _, _) in enumerate(self._nodes):
            for name in inputs:
                last[name] = i
        self._last_use = last

    @property
    def operators(self) -> list[str]:
        """The distinct operators of the graph, sorted."""
        return sorted({op for op, *_ in self._nodes})

    def run(self, feeds: dict, outputs: list[str] | None = None) -> dict:
        """{output name: torch tensor on the graph's device} for ``feeds`` ({input name:
        torch tensor or numpy array}); arrays are copied to the device, tensors already
        there are used in place. ``outputs`` picks a subset (default all)."""
        torch = _torch()
        wanted = list(outputs or self.output_names)
        missing = set(self.input_names) - set(feeds)
        if missing:
            raise ValueError(f"missing inputs: {sorted(missing)}")
        values = dict(self._constants)
        for name, value in feeds.items():
            values[name] = (value.to(self.device) if isinstance(value, torch.Tensor)
                            else torch.from_numpy(np.ascontiguousarray(value)).to(self.device))
        keep = set(wanted)
        with torch.inference_mode():
            for i, (op, inputs, outs, attrs) in enumerate(self._nodes):
                args = [values[name] if name else None for name in inputs]
                for name, value in zip(outs, _run_node(torch, op, args, attrs, self.device),
                                       strict=True):
                    values[name] = value
                for name in inputs:
                    if self._last_use.get(name) == i and name not in keep \
                            and name not in self._constants:
                        values.pop(name, None)
        return {name: values[name] for name in wanted}

    def run_numpy(self, feeds: dict, outputs: list[str] | None = None) -> dict:
        """:meth:`run` with its outputs copied back into numpy arrays."""
        return {name: value.cpu().numpy() for name, value in self.run(feeds, outputs).items()}
