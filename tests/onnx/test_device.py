"""IO binding and per-node placement (onnx_export.runtime): on this machine's device.

Where onnxruntime has CUDAExecutionProvider and an NVIDIA GPU is visible, every graph must
run on CUDA, every node of it (a node that fell back to the CPU fails the test; nothing
here skips for want of a GPU); elsewhere the same tests run the IO-binding path and the
placement check on the CPU.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from cord_ops.calibrators import CALIBRATOR_NAMES
from onnx_export import export_onnx, open_session
from onnx_export.runtime import (
    CPU,
    CUDA,
    node_providers,
    placement,
    run_host,
    run_on_device,
    session_device,
    to_device,
)


def _gpu_present() -> bool:
    """CUDAExecutionProvider is installed and the kernel exposes an NVIDIA GPU (decided
    without onnxruntime, so a session that silently lands on the CPU cannot hide it)."""
    return CUDA in ort.get_available_providers() and Path("/dev/nvidiactl").exists()


PROVIDER, EXPECTED = ("cuda", CUDA) if _gpu_present() else ("cpu", CPU)


@pytest.mark.parametrize("name", CALIBRATOR_NAMES)
def test_every_node_runs_on_the_machines_device(name, cases):
    cal, cord = cases.fitted(name, 10, "logits")
    scores = cases.adversarial_scores(10, "logits", seed=3)
    for dtype in ("float32", "float64"):
        model = export_onnx(cal, cord, 10, dtype=dtype)
        ran = placement(model, scores.astype(dtype), PROVIDER)
        # the profile lists the graph's own kernels, not only some of them
        assert {"ArgMax", "ScatterElements", "GatherElements"} <= {op for op, _ in ran.values()}
        assert {node: p for node, (_, p) in ran.items() if p != EXPECTED} == {}


@pytest.mark.parametrize("name", ["irova", "irova-ts", "irm"])
def test_float32_isotonic_graphs_of_probabilities_run_on_the_machines_device(name, cases):
    """Their float32 graphs read knots through the input's rounding
    (``onnx_export.calibrators.for_float32_scores``); irova-ts's snap windows add a float64
    Less, which must not fall back to the CPU either."""
    cal, cord = cases.fitted(name, 10, "probs")
    scores = cases.adversarial_scores(10, "probs", seed=3).astype(np.float32)
    ran = placement(export_onnx(cal, cord, 10, input_kind="probs", dtype="float32"), scores,
                    PROVIDER)
    assert {"GatherElements", "LessOrEqual"} <= {op for op, _ in ran.values()}
    if name == "irova-ts":
        assert "Less" in {op for op, _ in ran.values()}
    assert {node: p for node, (_, p) in ran.items() if p != EXPECTED} == {}


def test_placement_names_the_nodes_that_ran_on_another_provider(cases):
    """The check above can fail: asked about CUDA, a CPU session's nodes are all off it."""
    cal, cord = cases.fitted("vs", 10, "logits")
    model = export_onnx(cal, cord, 10)
    ran = placement(model, cases.adversarial_scores(10, "logits", seed=4), "cpu")
    off = {node for node, (_, p) in ran.items() if p != CUDA}
    assert off == set(ran) and len(off) > 10


def test_node_providers_needs_a_profiled_session(cases):
    cal, cord = cases.fitted("ts", 10, "logits")
    with pytest.raises(ValueError, match="profile_dir"):
        node_providers(open_session(export_onnx(cal, cord, 10), provider="cpu"))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_io_binding_gives_what_session_run_gives(dtype, cases):
    cal, cord = cases.fitted("irova", 10, "logits")
    scores = cases.adversarial_scores(10, "logits", seed=5).astype(dtype)
    session = open_session(export_onnx(cal, cord, 10, dtype=dtype), provider=PROVIDER)
    names = [o.name for o in session.get_outputs()]
    expected = dict(zip(names, session.run(names, {"scores": scores}), strict=True))
    device = session_device(session)
    assert device == PROVIDER
    resident = to_device(scores, device)
    on_device = run_on_device(session, resident)
    assert sorted(on_device) == sorted(names)
    assert {v.device_name().lower() for v in on_device.values()} == {device}
    to_host = run_on_device(session, resident, device="cpu")
    for name in names:
        np.testing.assert_array_equal(to_host[name].numpy(), expected[name])
    # a numpy input is cast to the session's dtype and copied; a subset of outputs
    subset = run_on_device(session, scores.astype(np.float64), ["label"], device="cpu")
    assert list(subset) == ["label"]
    np.testing.assert_array_equal(subset["label"].numpy(), expected["label"])
    for name, value in zip(["repaired", "label"], run_host(session, scores,
                                                           ["repaired", "label"]), strict=True):
        np.testing.assert_array_equal(value, expected[name])


def test_io_binding_refuses_a_device_the_session_is_not_on(cases):
    cal, cord = cases.fitted("ts", 10, "logits")
    session = open_session(export_onnx(cal, cord, 10), provider="cpu")
    scores = cases.adversarial_scores(10, "logits", seed=6)
    with pytest.raises(RuntimeError, match="does not run on CUDAExecutionProvider"):
        run_on_device(session, scores, device="cuda")
    with pytest.raises(ValueError, match="device"):
        run_on_device(session, scores, device="gpu")
    with pytest.raises(ValueError, match="device"):
        to_device(scores, "tpu")
