"""``onnx_export.repair`` on its own: the repair subgraph built with a bare GraphBuilder and
run by onnxruntime on hand-made rows, without fitting a calibrator (the export
tests reach the repair only through fitted families, seconds a case).

Expected values come from outside the module under test: H(g, eta) from the quadratic of
eq. 13 solved in 50-digit decimal arithmetic, the repaired rows from
``cord_ops.cord_kernels`` (the numpy implementation the graph mirrors), and the float32
fix-up from the module docstring's rule s = max(s, r (1 + 2 eps)).
"""

from __future__ import annotations

from decimal import Decimal, getcontext

import numpy as np
import pytest
from onnx import TensorProto, helper

from cord_ops.cord_kernels import DELTA_STAB, EPS_NUM, reconstruct, repair_terms, response
from onnx_export.builder import IR_VERSION, OPSET, GraphBuilder, tensor_info
from onnx_export.repair import CHANGED_FROM_RUNNER_UP, build_repair, interior_response, on_boundary
from onnx_export.runtime import open_session

ELEM = {"float32": TensorProto.FLOAT, "float64": TensorProto.DOUBLE}


def run(gb: GraphBuilder, inputs: dict[str, tuple[np.ndarray, int]], outputs: dict[str, int]):
    graph = helper.make_graph(
        gb.nodes, "repair_under_test",
        [tensor_info(name, elem, ["N", a.shape[1]]) for name, (a, elem) in inputs.items()],
        [tensor_info(name, elem, None) for name, elem in outputs.items()],
        initializer=gb.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              ir_version=IR_VERSION)
    session = open_session(model, provider="cpu", threads=1)
    values = session.run(list(outputs), {name: a for name, (a, _) in inputs.items()})
    return dict(zip(outputs, values, strict=True))


def exact_response(g: float, eta: float) -> float:
    """The root in (0, 1) of eta s^2 + (1 - eta) s - g = 0, i.e. of (s - g) / (s (1 - s)) =
    eta (eq. 13), in 50-digit arithmetic; the root taken is the one with the + sign, written
    without cancellation for either sign of (eta - 1)."""
    getcontext().prec = 50
    g_, eta_ = Decimal(g), Decimal(eta)
    if eta_ == 0:
        return g
    a = eta_ - 1
    root = (a * a + 4 * eta_ * g_).sqrt()
    s = (a + root) / (2 * eta_) if a > 0 else (2 * g_) / (root - a)
    return float(s)


def response_graph(dtype: str, eta: float, g: np.ndarray) -> np.ndarray:
    gb = GraphBuilder(dtype)
    gb.fresh("g")
    h = interior_response(gb, "g", eta)
    if h == "g":  # eta == 0 returns its input: route it through an Identity output
        h = gb.op("Identity", "g")
    gb.op("Identity", h, out="h")
    return run(gb, {"g": (g.reshape(-1, 1), ELEM[dtype])}, {"h": ELEM[dtype]})["h"].ravel()


G = np.array([1e-12, 1e-8, 1e-4, 0.01, 0.1, 1 / 3, 0.5, 0.9, 0.999, 1 - 1e-9])


@pytest.mark.parametrize("eta", [-1e20, -1e15, -50.0, -1.0, -0.3, 0.0, 0.4, 1.0, 1.5, 2.0,
                                 7.0, 1e15, 1e20])
def test_interior_response_is_the_root_of_eq_13_in_float64(eta):
    h = response_graph("float64", eta, G)
    expected = np.array([exact_response(g, eta) for g in G])
    np.testing.assert_allclose(h, expected, rtol=2e-15, atol=0)


def test_eta_one_gives_the_square_root():
    """eta = 1: s^2 = g, so H(g, 1) = sqrt(g) (eqs. 19 and 20 agree there)."""
    np.testing.assert_allclose(response_graph("float64", 1.0, G), np.sqrt(G), rtol=2e-16,
                               atol=0)


@pytest.mark.parametrize("eta", [-1e20, -1e16, 1e16, 1e20])
def test_huge_eta_does_not_overflow_in_float32(eta):
    """|eta| >= 1e15: x^2 = eta^2 overflows float32, so R must be the scaled hypot."""
    g = G[G > 1e-6].astype(np.float32)
    h = response_graph("float32", eta, g)
    expected = np.array([exact_response(float(x), eta) for x in g])
    assert np.all(np.isfinite(h))
    np.testing.assert_allclose(h, expected, rtol=3e-7, atol=0)


def rows(k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """p0 and q: interior rows, rows with exact zeros (boundary, stabilised), rows whose
    calibrated top-1 differs from the original, and rows where q keeps p0."""
    rng = np.random.default_rng(seed)
    n = 60
    p0 = rng.dirichlet(np.full(k, 0.7), n)
    q = rng.dirichlet(np.full(k, 0.7), n)
    q[:10] = p0[:10]
    p0[10:20, -1] = 0.0
    p0[10:20] /= p0[10:20].sum(axis=1, keepdims=True)
    q[15:30, 0] = 0.0
    q[15:30] /= q[15:30].sum(axis=1, keepdims=True)
    return p0, q


def repair_graph(dtype: str, p0: np.ndarray, q: np.ndarray, eta: float, weight: float,
                 changed_mode: str = "argmax", out_dtype=None):
    """The float64 wiring of ``export_onnx`` (label, p0_a, its boundary flag, changed from
    the two argmaxes) around ``build_repair``; float32 without the p0 flag, as export
    builds it."""
    gb = GraphBuilder(dtype)
    gb.fresh("p0")
    gb.fresh("q")
    label = gb.row_argmax("p0")
    p0_edge = on_boundary(gb, "p0") if dtype == "float64" else None
    if changed_mode == "argmax":
        changed = gb.op("Not", gb.op("Equal", gb.row_argmax("q"), label))
    else:
        changed = CHANGED_FROM_RUNNER_UP if changed_mode == "runner-up" else None
    repaired, s = build_repair(gb, gb.take("p0", label), p0_edge, "q", label, changed, eta,
                               weight, p0.shape[1], out_dtype=out_dtype)
    out_elem = ELEM["float32" if out_dtype is not None else dtype]
    gb.op("Identity", s, out="confidence")
    elem = ELEM[dtype]
    np_dtype = np.float32 if dtype == "float32" else np.float64
    return run(gb, {"p0": (p0.astype(np_dtype), elem), "q": (q.astype(np_dtype), elem)},
               {repaired: out_elem, "confidence": out_elem})


def numpy_repair(p0, q, eta, weight):
    terms = repair_terms(p0, q, weight)
    return reconstruct(terms, response(eta, terms))


@pytest.mark.parametrize("eta", [-3.0, -0.4, 0.0, 0.6, 1.0, 2.5, 1e16])
@pytest.mark.parametrize("weight", [0.5, 0.8])
def test_float64_repair_is_cord_ops_transform(eta, weight):
    p0, q = rows(5, 1)
    out = repair_graph("float64", p0, q, eta, weight)
    expected = numpy_repair(p0, q, eta, weight)
    # Relative on every entry, zeros of q included: those carry delta / K after the
    # stabilisation, so a wrong delta or K shows up there first.
    np.testing.assert_allclose(out["repaired"], expected, rtol=1e-12, atol=0)
    label = np.argmax(p0, axis=1)
    np.testing.assert_array_equal(out["confidence"].ravel(), out["repaired"][np.arange(60), label])


def test_stabilised_entries_carry_delta_over_k():
    """A boundary row of q keeps its zero entries at (delta / K) scaled by the same factor
    as the rest of the tail (eq. 11): at eta = 0 on a row whose top-1 q keeps, the repair is
    S(q) itself."""
    k = 4
    q = np.array([[0.7, 0.3, 0.0, 0.0]])
    p0 = np.array([[0.6, 0.2, 0.1, 0.1]])
    out = repair_graph("float64", p0, q, 0.0, 0.5)["repaired"]
    stabilised = (1 - DELTA_STAB) * q + DELTA_STAB / k
    np.testing.assert_allclose(out, stabilised, rtol=1e-15, atol=0)


def test_lower_end_of_the_interval():
    """A row whose response lies below rho / (1 + rho) is lifted to that end plus eps
    (eqs. 4 and 16): q_a = 0.2 and a runner-up of 0.5 with tail 0.8 give rho = 0.625 and
    s = 0.625 / 1.625 + 1e-12."""
    q = np.array([[0.2, 0.5, 0.3]])
    p0 = np.array([[0.7, 0.1, 0.2]])  # original top-1: class 0; q moves it to class 1
    out = repair_graph("float64", p0, q, -5.0, 0.5)
    assert out["confidence"].item() == pytest.approx(0.625 / 1.625 + EPS_NUM, rel=1e-15, abs=0)
    tail = out["repaired"][0, 1:]
    np.testing.assert_allclose(tail / tail.sum(), [0.625, 0.375], rtol=1e-14)


def test_changed_rows_use_the_mixed_reference():
    """Where q moves the top-1, g = lambda b + (1 - lambda) p0_a (eq. 25): with eta = 0 the
    response is g itself when g is inside I."""
    p0 = np.array([[0.6, 0.3, 0.1]])
    q = np.array([[0.4, 0.5, 0.1]])
    for weight in (0.5, 0.3):
        g = weight * 0.4 + (1 - weight) * 0.6
        out = repair_graph("float64", p0, q, 0.0, weight)
        assert out["confidence"].item() == pytest.approx(g, rel=1e-15, abs=0)
    # The same row with the graph told nothing changed keeps b = 0.4 as the reference.
    lower = (0.5 / 0.6) / (1 + 0.5 / 0.6) + EPS_NUM
    kept = repair_graph("float64", p0, q, 0.0, 0.5, changed_mode="none")
    assert kept["confidence"].item() == pytest.approx(lower, rel=1e-15, abs=0)


def test_runner_up_rule_marks_the_changed_rows():
    """``CHANGED_FROM_RUNNER_UP`` takes changed = q_a < max_{j != a} q_j."""
    p0 = np.array([[0.6, 0.3, 0.1], [0.6, 0.3, 0.1]])
    q = np.array([[0.4, 0.5, 0.1], [0.45, 0.4, 0.15]])
    # Row 0 changed: g = (0.4 + 0.6) / 2; row 1 kept: g = b = 0.45 (both inside I).
    out = repair_graph("float32", p0, q, 0.0, 0.5, changed_mode="runner-up")
    np.testing.assert_allclose(out["confidence"].ravel(), [0.5, 0.45], rtol=1e-6)


def test_unchanged_interior_row_at_eta_zero_is_q():
    p0, q = rows(5, 2)
    out = repair_graph("float64", p0[:10], q[:10], 0.0, 0.5)
    np.testing.assert_array_equal(out["repaired"], q[:10])


def test_float32_fix_up_puts_the_top_one_two_eps_above_the_runner_up():
    """Rows at the lower end of I in float32: s rounds onto the runner-up r, and the fix-up
    replaces it by r (1 + 2 eps) (module docstring), which is above r."""
    k = 3
    p0 = np.tile(np.array([0.7, 0.2, 0.1]), (4, 1))
    q = np.array([[0.30, 0.45, 0.25], [0.2, 0.6, 0.2], [0.1, 0.85, 0.05],
                  [0.25, 0.5, 0.25]])
    out = repair_graph("float32", p0, q, -50.0, 0.5, changed_mode="runner-up")
    repaired, s = out["repaired"], out["confidence"].ravel()
    runner_up = repaired[:, 1:].max(axis=1)
    eps = np.finfo(np.float32).eps
    expected = np.maximum(s, runner_up * np.float32(1 + 2 * eps))
    np.testing.assert_array_equal(s, expected)
    assert np.all(repaired[:, 0] > runner_up)
    assert np.any(s == runner_up * np.float32(1 + 2 * eps))
    assert repaired.shape == (4, k)


def test_wide_repair_cast_to_float32_matches_float64():
    """float64 compute with a float32 result (``out_dtype``), as export builds it for
    eta* <= WIDE_REPAIR_BELOW_ETA: the float64 repair rounded to float32, to a few ulps."""
    p0, q = rows(6, 3)
    out = repair_graph("float64", p0, q, -2.0, 0.5, out_dtype=np.float32)
    assert out["repaired"].dtype == np.float32
    expected = numpy_repair(p0, q, -2.0, 0.5)
    np.testing.assert_allclose(out["repaired"], expected, rtol=4 * np.finfo(np.float32).eps,
                               atol=0)
