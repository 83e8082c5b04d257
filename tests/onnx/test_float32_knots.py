"""The knots a float32 graph stores for an isotonic map of probabilities
(``onnx_export.calibrators.for_float32_scores``): an input exactly on a knot in float64
reads that knot's value from its float32 rounding, so two classes on plateaus of the same
value stay tied as in cord_ops; every other family, and maps of logits, keep their knots."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from onnx import TensorProto, helper

from cord_ops import CORD
from cord_ops.calibrators import make_calibrator
from onnx_export import export_onnx, open_session
from onnx_export.builder import IR_VERSION, OPSET, GraphBuilder
from onnx_export.calibrators import for_float32_scores
from onnx_export.interpolate import interpolate, knot_tables, snap_widths
from onnx_export.torch_runtime import OPERATORS


def _votes(k: int = 4, n: int = 400, votes: int = 10, seed: int = 0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, n)
    p = rng.multinomial(votes, np.full(k, 1.0 / k), size=n).astype(np.float64)
    p[np.arange(n), y] += votes // 2
    return p / p.sum(axis=1, keepdims=True), y


def _fit(name: str, kind: str = "probs"):
    x, y = _votes()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scores = x if kind == "probs" else np.log(np.maximum(x, 1e-3))
        return make_calibrator(name, input_kind=kind).fit(scores, y), scores


@pytest.mark.parametrize("name", ["irova", "irm"])
def test_maps_of_the_input_read_a_knot_from_its_float32_rounding(name):
    cal, x = _fit(name)
    stored = for_float32_scores(cal)
    assert stored is not cal and cal.knots_ is not stored.knots_
    for (kx, ky), (sx, sy) in zip(cal.knots_, stored.knots_, strict=True):
        np.testing.assert_array_equal(sx, kx.astype(np.float32))  # the input's rounding
        np.testing.assert_array_equal(sy, ky)
        t = kx.astype(np.float32).astype(np.float64)  # inputs on the knots, as the graph
        np.testing.assert_array_equal(np.interp(t, sx, sy), ky)  # gets them
        knot_tables([(sx, sy)])  # equal knots are accepted
    # the calibrator itself is untouched
    assert all(kx.dtype == np.float64 for kx, _ in cal.knots_)
    assert not np.array_equal(cal.knots_[0][0], cal.knots_[0][0].astype(np.float32))


def _interp_graph(knots: list, k: int, snap: float):
    gb = GraphBuilder("float64")
    gb.fresh("t")
    gb.op("Identity", interpolate(gb, "t", knots, snap=snap), out="r")
    graph = helper.make_graph(
        gb.nodes, "interp", [helper.make_tensor_value_info("t", TensorProto.DOUBLE, ["N", k])],
        [helper.make_tensor_value_info("r", TensorProto.DOUBLE, ["N", k])],
        initializer=gb.initializers)
    return open_session(helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                          ir_version=IR_VERSION), provider="cpu")


def test_irova_ts_reads_a_knot_within_the_input_rounding_of_p_and_np_interp_elsewhere():
    """Each knot reads its own y on a window of half-width about |beta| eps32 x_j (how far
    a probability computed from the float32 input can be from cord_ops' float64 one), at
    most a quarter gap; outside the windows the graph is np.interp bit for bit."""
    cal, x = _fit("irova-ts")
    stored = for_float32_scores(cal)
    assert stored.knots_ is cal.knots_ and not hasattr(cal, "float32_snap")
    eps32 = float(np.finfo(np.float32).eps)
    assert stored.float32_snap == abs(float(cal.beta_)) * eps32 * (1 + 2**-10) + 2**-40
    k = len(cal.knots_)
    moved = abs(float(cal.beta_)) * eps32  # the bound on p's relative move
    rng = np.random.default_rng(0)
    columns = []
    for kx, _ in cal.knots_:
        w = snap_widths(kx, stored.float32_snap)
        assert np.all(w <= stored.float32_snap * kx) and np.all(kx[:-1] + w[:-1] < kx[1:] - w[1:])
        edges = np.concatenate([kx - w, kx + w])
        columns.append(np.concatenate([
            kx, kx * (1.0 - moved), kx * (1.0 + moved),
            edges, np.nextafter(kx - w, -np.inf), np.nextafter(kx + w, np.inf),
            rng.uniform(0.0, 1.0, 200)]))
    n = min(len(c) for c in columns)
    t = np.stack([c[:n] for c in columns], axis=1)
    got = _interp_graph(cal.knots_, k, stored.float32_snap).run(None, {"t": t})[0]
    for col, (kx, ky) in enumerate(cal.knots_):
        w = snap_widths(kx, stored.float32_snap)
        near = ((t[:, col, None] >= (kx - w)[None, :])
                & (t[:, col, None] <= (kx + w)[None, :]))  # the windows as stored
        expected = np.where(near.any(axis=1), ky[np.argmax(near, axis=1)],
                            np.interp(t[:, col], kx, ky))
        np.testing.assert_array_equal(got[:, col], expected)
        assert near.any(axis=1).sum() >= 3 * len(kx) and (~near.any(axis=1)).sum() > 100


@pytest.mark.parametrize("name, kind", [("irova", "logits"), ("irova-ts", "logits"),
                                        ("irm", "logits"), ("ts", "probs")])
def test_other_families_and_maps_of_logits_keep_their_calibrator(name, kind):
    cal, _ = _fit(name, kind)
    assert for_float32_scores(cal) is cal


@pytest.mark.parametrize("name", ["irova", "irova-ts", "irm"])
def test_float32_graphs_use_only_operators_every_runtime_has(name):
    """The snap windows' operators are among those ``onnx_export.torch_runtime`` executes
    (its own tests need PyTorch; this check does not)."""
    cal, x = _fit(name)
    model = export_onnx(cal, CORD().fit(x, cal.predict_proba(x)), x.shape[1],
                        input_kind="probs", dtype="float32")
    assert {node.op_type for node in model.graph.node} <= set(OPERATORS)
