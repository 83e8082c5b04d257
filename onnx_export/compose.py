"""Compose a user's classifier graph with an exported pipeline into one end-to-end graph.

The result takes the classifier's own inputs and returns the pipeline's five outputs.
Names are prefixed (``classifier/`` on the classifier's internal tensors, ``cord/`` on the
pipeline's) so the two graphs cannot clash; the classifier's inputs and the pipeline's
outputs keep their names. Both graphs are brought to the same default-domain opset (the
higher of the two, via the ONNX version converter) and IR version before ``onnx.compose``
merges them.
"""

from __future__ import annotations

import onnx
from onnx import compose, version_converter

from onnx_export.export import INPUT, input_widths, model_metadata

CLASSIFIER_PREFIX = "classifier/"
PIPELINE_PREFIX = "cord/"


def _default_opset(model: onnx.ModelProto) -> int:
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return entry.version
    raise ValueError("model imports no default-domain opset")


def _elem_type(value: onnx.ValueInfoProto) -> int:
    return value.type.tensor_type.elem_type


def _last_dim(value: onnx.ValueInfoProto) -> int | None:
    dims = value.type.tensor_type.shape.dim
    return dims[-1].dim_value if dims and dims[-1].HasField("dim_value") else None


def compose_with_classifier(classifier: onnx.ModelProto, pipeline: onnx.ModelProto,
                            logits_output: str | None = None) -> onnx.ModelProto:
    """One graph from the classifier's inputs to ``repaired``, ``calibrated``,
    ``original``, ``label`` and ``confidence``.

    ``logits_output`` names the classifier output that feeds the pipeline's ``scores``
    (logits, or probabilities for a pipeline exported with input_kind="probs"); it may be
    omitted when the classifier has exactly one output. Raises ValueError when that output
    does not exist or its element type or class count differs from the pipeline's input.
    """
    outputs = {o.name: o for o in classifier.graph.output}
    if logits_output is None:
        if len(outputs) != 1:
            raise ValueError(
                f"logits_output: the classifier has outputs {sorted(outputs)}; name the one "
                "holding the logits"
            )
        logits_output = next(iter(outputs))
    if logits_output not in outputs:
        raise ValueError(
            f"logits_output: {logits_output!r} is not a classifier output ({sorted(outputs)})"
        )
    pipe_inputs = {i.name: i for i in pipeline.graph.input}
    if set(pipe_inputs) != {INPUT}:
        raise ValueError(f"pipeline: expected a single input {INPUT!r}, got {sorted(pipe_inputs)}")
    source, target = outputs[logits_output], pipe_inputs[INPUT]
    if _elem_type(source) != _elem_type(target):
        raise ValueError(
            f"logits_output: {logits_output!r} has element type "
            f"{onnx.helper.tensor_dtype_to_np_dtype(_elem_type(source))}, the pipeline expects "
            f"{onnx.helper.tensor_dtype_to_np_dtype(_elem_type(target))}; export the pipeline "
            "in the classifier's dtype"
        )
    width = _last_dim(source)
    widths = input_widths(model_metadata(pipeline)) if pipeline.metadata_props else (
        (_last_dim(target),) if _last_dim(target) is not None else None)
    if width is not None and widths is not None and width not in widths:
        raise ValueError(f"logits_output: {logits_output!r} has {width} classes, the "
                         f"pipeline takes {' or '.join(map(str, widths))}")

    opset = max(_default_opset(classifier), _default_opset(pipeline))
    if _default_opset(classifier) != opset:
        classifier = version_converter.convert_version(classifier, opset)
    if _default_opset(pipeline) != opset:
        pipeline = version_converter.convert_version(pipeline, opset)
    ir_version = max(classifier.ir_version, pipeline.ir_version)

    first = compose.add_prefix(classifier, CLASSIFIER_PREFIX, rename_inputs=False)
    second = compose.add_prefix(pipeline, PIPELINE_PREFIX, rename_outputs=False)
    first.ir_version = second.ir_version = ir_version
    merged = compose.merge_models(
        first, second,
        io_map=[(CLASSIFIER_PREFIX + logits_output, PIPELINE_PREFIX + INPUT)],
        outputs=[output.name for output in pipeline.graph.output],
        producer_name=pipeline.producer_name,
        producer_version=pipeline.producer_version,
    )
    del merged.metadata_props[:]
    merged.metadata_props.extend(pipeline.metadata_props)
    onnx.checker.check_model(merged, full_check=True)
    return merged
