"""The isotonic lookup graph equals np.interp bit for bit: linear between knots (not the
nearest knot), y_0 / y_last outside the knot range, exact y at the knots."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from onnx_export import open_session
from onnx_export.builder import IR_VERSION, OPSET, GraphBuilder
from onnx_export.interpolate import cell_value, interpolate, knot_tables


def interp_graph(knots: list, k: int):
    gb = GraphBuilder("float64")
    gb.fresh("t")
    out = interpolate(gb, "t", knots)
    gb.op("Identity", out, out="r")
    graph = helper.make_graph(
        gb.nodes, "interp",
        [helper.make_tensor_value_info("t", TensorProto.DOUBLE, ["N", k])],
        [helper.make_tensor_value_info("r", TensorProto.DOUBLE, ["N", k])],
        initializer=gb.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              ir_version=IR_VERSION)
    return open_session(model, provider="cpu")


def knot_set(draw_sizes, rng):
    x = np.unique(rng.uniform(0.0, 1.0, draw_sizes))
    y = np.sort(rng.uniform(0.0, 1.0, len(x)))
    y[len(y) // 2:] = y[len(y) // 2]  # a flat block, as PAV produces
    return x, y


def queries(knots, k, rng, n=64):
    t = rng.uniform(-0.1, 1.1, (n, k))
    for col in range(k):
        kx = knots[col % len(knots)][0]
        t[: len(kx), col] = kx[: n]  # exactly at the knots
        t[-2:, col] = kx[0] - 1e-3, kx[-1] + 1e-3
    return t


@settings(max_examples=25, deadline=None)
@given(sizes=st.lists(st.integers(1, 40), min_size=1, max_size=5), seed=st.integers(0, 10**6),
       shared=st.booleans())
def test_matches_np_interp(sizes, seed, shared):
    """One knot set shared by all columns (irm) or one per column (irova), of different
    lengths (so the padded tables are exercised)."""
    rng = np.random.default_rng(seed)
    knots = [knot_set(size, rng) for size in (sizes[:1] if shared else sizes)]
    k = len(sizes)
    t = queries(knots, k, rng)
    expected = np.stack([np.interp(t[:, c], *knots[c % len(knots)]) for c in range(k)],
                        axis=1)
    got = interp_graph(knots, k).run(None, {"t": t})[0]
    np.testing.assert_array_equal(got, expected)


def test_is_not_a_nearest_knot_lookup():
    knots = [(np.array([0.0, 1.0]), np.array([0.0, 1.0]))]
    got = interp_graph(knots, 1).run(None, {"t": np.array([[0.3], [0.75]])})[0]
    np.testing.assert_array_equal(got[:, 0], [0.3, 0.75])


@pytest.mark.parametrize("value", [-5.0, 0.0, 2.0, 9.0])
def test_single_knot_map_is_constant(value):
    knots = [(np.array([2.0]), np.array([0.25]))]
    got = interp_graph(knots, 1).run(None, {"t": np.array([[value]])})[0]
    assert got[0, 0] == np.interp(value, [2.0], [0.25]) == 0.25


def _clustered_knots(rng, n):
    """Knots as PAV leaves them on real probabilities: most within 1e-6 of 0 or of 1, some
    1e-12 apart, the rest spread between."""
    x = np.concatenate([rng.uniform(0.0, 1e-6, n // 3), 1.0 - rng.uniform(0.0, 1e-6, n // 3),
                        rng.uniform(0.0, 1.0, n - 2 * (n // 3)),
                        0.5 + np.arange(20) * 1e-12])
    x = np.unique(x)
    return x, np.sort(rng.uniform(0.0, 1.0, len(x)))


def probe_points(tables, index: int, kx: np.ndarray, rng) -> np.ndarray:
    """t at and next to the knots, at and next to every value where the cell value v
    crosses c - 1/2, c or c + 1/2 around a knot's cell, and random t in [-0.1, 1.1]."""
    scale, shift = tables.scale[index].astype(np.float64), tables.shift[index]
    v = cell_value(kx, tables.lo, tables.hi, scale, shift, tables.sqrt).astype(np.float64)
    bounds = (np.floor(v)[:, None] + np.arange(-1.0, 2.0, 0.5)).ravel()
    with np.errstate(divide="ignore", invalid="ignore"):
        u = (bounds - shift) / scale
    edges = u**2 if tables.sqrt else u
    t = np.concatenate([kx, edges[np.isfinite(edges)], rng.uniform(-0.1, 1.1, 200)])
    return np.concatenate([t, np.nextafter(t, -np.inf), np.nextafter(t, np.inf)])


@pytest.mark.parametrize("shared", [True, False])
def test_clustered_knots_and_queries_at_knots_and_cell_edges(shared):
    rng = np.random.default_rng(1 if shared else 2)
    knots = [_clustered_knots(rng, 3000)] if shared else [_clustered_knots(rng, m)
                                                         for m in (5, 400, 3000)]
    tables = knot_tables(knots)
    k = 3
    columns = [probe_points(tables, 0 if shared else col, knots[0 if shared else col][0], rng)
               for col in range(k)]
    n = min(len(c) for c in columns)
    t = np.stack([c[:n] for c in columns], axis=1)
    expected = np.stack([np.interp(t[:, c], *knots[0 if shared else c]) for c in range(k)],
                        axis=1)
    got = interp_graph(knots, k).run(None, {"t": t})[0]
    np.testing.assert_array_equal(got, expected)


def test_lookup_steps_do_not_grow_with_the_knot_count():
    """Knots as PAV leaves them (block ends in close pairs, blocks spread out, piling up
    near 0): 100 or 10,000 of them take the same operations, two halving steps."""
    rng = np.random.default_rng(3)

    def operations(n_blocks):
        starts = ((np.arange(n_blocks) + rng.uniform(0.0, 0.5, n_blocks)) / n_blocks) ** 2
        x = np.unique(np.concatenate([starts, starts + 1e-12]))
        gb = GraphBuilder("float64")
        gb.fresh("t")
        interpolate(gb, "t", [(x, np.sort(rng.uniform(0.0, 1.0, len(x))))])
        return [node.op_type for node in gb.nodes]

    assert operations(5_000) == operations(50)
    # one cell lookup, one per halving step, then x_j, y_j and slope_j
    assert operations(50).count("GatherElements") == 1 + 2 + 3
    assert "Gather" not in operations(50)


def lookup_in_numpy(tables, t: np.ndarray, column_set: np.ndarray, cast) -> np.ndarray:
    """The graph's lookup replayed in numpy with ``cast`` turning v into the cell index."""
    v = cell_value(t, tables.lo, tables.hi, tables.scale[column_set], tables.shift[column_set],
                   tables.sqrt)
    u = np.clip(t, tables.lo, tables.hi)
    j = tables.cell_start[cast(v).astype(np.int64)].astype(np.int64)
    for step in reversed(range(tables.steps)):
        h = 1 << step
        j = j + h * (tables.shifted_x(h)[j] <= u)
    return tables.slope[j] * (u - tables.x[j]) + tables.y[j]


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(1, 300), min_size=1, max_size=4), seed=st.integers(0, 10**6),
       clustered=st.booleans())
def test_cells_hold_whether_cast_truncates_or_rounds(sizes, seed, clustered):
    """ONNX leaves open whether Cast truncates or rounds; the tables give np.interp's j
    either way, at the knots, next to them and at every cell boundary."""
    rng = np.random.default_rng(seed)
    knots = [(_clustered_knots(rng, size) if clustered else knot_set(size, rng))
             for size in sizes]
    tables = knot_tables(knots)
    for index, (kx, ky) in enumerate(knots):
        t = probe_points(tables, index, kx, rng)
        expected = np.interp(t, kx, ky)
        column_set = np.full(len(t), index)
        for cast in (np.trunc, np.rint, np.floor):
            np.testing.assert_array_equal(lookup_in_numpy(tables, t, column_set, cast),
                                          expected)


def test_equal_knots_are_read_as_np_interp_reads_them():
    """Knots rounded onto each other (a float32 graph's irova knots): at them the last
    one's y, left of them the segment to the first one's y, right of them the segment from
    the last one's; the zero-width segment between them is never read."""
    knots = [(np.array([0.0, 0.25, 0.5, 0.5, 0.5, 1.0]),
              np.array([0.0, 0.1, 0.2, 0.6, 0.7, 0.9]))]
    tables = knot_tables(knots)
    assert np.all(np.isfinite(tables.slope))
    t = np.array([0.25, 0.4, np.nextafter(0.5, 0.0), 0.5, np.nextafter(0.5, 1.0), 0.75, 1.0])
    got = interp_graph(knots, 1).run(None, {"t": t[:, None]})[0][:, 0]
    np.testing.assert_array_equal(got, np.interp(t, *knots[0]))
    assert got[3] == 0.7 and got[1] == np.interp(0.4, [0.25, 0.5], [0.1, 0.2])
