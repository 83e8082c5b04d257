"""np.interp as an ONNX subgraph, bit for bit, at a cost that does not grow with the knots.

``interpolate(gb, t, knots)`` appends the graph of np.interp(t[:, k], x_k, y_k) for every
column k, with one knot set shared by all columns (``irm``) or one per column (``irova``,
``irova-ts``). np.interp finds, by binary search, the largest j with x_j <= t and returns
slope_j * (t - x_j) + y_j with slope_j = (y_{j+1} - y_j) / (x_{j+1} - x_j), y_0 left of
x_0 and y_last from x_last on. The graph finds the same j in a fixed number of steps:

1. t is clipped to [lo, hi] = [min(0, x_0), max(1, x_last)] over all sets (probabilities
   are never moved);
2. v = f(t) * scale + shift, with f = sqrt (knots >= 0) or the identity, and the *cell*
   c = Cast(v) to int32. Clip, Sqrt, Mul and Add are correctly rounded IEEE operations, so
   numpy reproduces v exactly, and each is monotone, so v is a non-decreasing function of
   t; the export evaluates v at every knot. Cast may truncate or round (the ONNX
   specification leaves it open): either way t in cell c has c - 1/2 <= v(t) < c + 1, so
   every knot with v < c - 1/2 is below t and every knot with v >= c + 1 is above it,
   whatever the rounding. ``scale`` is chosen per set so that such a window holds a few
   knots at most (sqrt spreads the knots that isotonic fits on probabilities pile up near
   0), and ``shift`` gives each set its own range of one flat cell table;
3. the cell table gives J, the flat index of the last knot below the window (the set's
   left sentinel when there is none), and ``steps`` halving steps j += h * [x_{j+h} <= t]
   (h = 2**(steps-1), ..., 1) reach the largest j with x_j <= t, the window holding at
   most 2**steps - 1 knots; x_{j+h} comes from a copy of the knot table shifted by h, and
   +inf padding after each set keeps a step inside its set;
4. x_j, y_j and slope_j are looked up and slope_j * (t - x_j) + y_j is np.interp's own
   formula (separate Mul and Add, as numpy computes it). The left sentinel (t < x_0) and
   the last knot have slope 0 and give y_0 and y_last exactly.

All lookups are GatherElements on [1, M] tables with int32 indices of shape [1, N * K],
and the steps use Cast and Add rather than Where: onnxruntime's CPU kernels take about
1 ns per element for those, against 10-40 ns for Gather on axis 0 (a memcpy per index)
and about 5 ns for Where on int32.

Deviation from np.interp: NaN t is not supported (np.interp returns NaN; here the cell
index is undefined and onnxruntime rejects the lookup). The values reaching this graph
are probabilities, which the serving path validates.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from onnx import TensorProto

from onnx_export.builder import GraphBuilder

#: Upper bound on the cells of all knot sets together (the int32 cell table: 4 bytes each).
MAX_CELLS = 1 << 21
#: Upper bound on the cells of one knot set.
MAX_SET_CELLS = 1 << 16
#: Two halving steps find j when a cell's window holds at most this many knots; the cells
#: are refined to that where MAX_CELLS and MAX_SET_CELLS allow.
TARGET_PER_CELL = 3
#: The smallest power-of-two cell count per set.
MIN_CELLS = 16
#: f = identity (no Sqrt in the graph) when the identity needs at most this many cells in
#: all; knots piled up near 0 need far more, and sqrt then spreads them.
IDENTITY_CELLS = 1 << 16


@dataclass(frozen=True)
class KnotTables:
    """Everything ``interpolate`` bakes into the graph (see the module docstring)."""

    sqrt: bool  # f = sqrt, or the identity
    lo: float  # t is clipped to [lo, hi]
    hi: float
    scale: np.ndarray  # [S] per set
    shift: np.ndarray  # [S]
    cell_start: np.ndarray  # int32 [cells]: J per cell
    x: np.ndarray  # [M] flat knots: per set a sentinel, the knots, +inf padding
    y: np.ndarray  # [M] y_0 at the sentinel, the set's last y in the padding
    slope: np.ndarray  # [M] slope_j; 0 at the sentinel, each last knot and the padding
    steps: int  # halving steps: 2**steps - 1 >= the most knots in one cell's window

    def shifted_x(self, h: int) -> np.ndarray:
        """x_{i+h} at index i (+inf past the end)."""
        return np.concatenate([self.x[h:], np.full(h, np.inf)])


def cell_value(t: np.ndarray, lo: float, hi: float, scale, shift, sqrt: bool) -> np.ndarray:
    """v of the module docstring, with the graph's operations in the graph's order."""
    u = np.clip(t, lo, hi)
    if sqrt:
        u = np.sqrt(u)
    return u * scale + shift


def _wanted_cells(u: np.ndarray, span: float) -> float:
    """A power-of-two cell count over a span of f at which no window (1.5 cells) should hold
    more than TARGET_PER_CELL knots: three times span / (smallest distance between knots
    TARGET_PER_CELL apart), the factor leaving room for the half-cell margin and rounding;
    at least MIN_CELLS, possibly inf."""
    if len(u) <= TARGET_PER_CELL:
        return MIN_CELLS
    gap = (u[TARGET_PER_CELL:] - u[:-TARGET_PER_CELL]).min()
    want = 3.0 * span / gap if gap > 0 else np.inf
    if not want < 2.0**60:
        return np.inf
    return max(MIN_CELLS, 2 ** int(np.ceil(np.log2(max(want, 1.0)))))


def _cell_counts(sets: list, transform, span: float) -> tuple[list[int], bool]:
    """(cells per set within MAX_SET_CELLS and MAX_CELLS, whether every set got what it
    wanted)."""
    wanted = [_wanted_cells(transform(kx), span) for kx, _ in sets]
    cells = [int(min(n, MAX_SET_CELLS)) for n in wanted]
    while sum(cells) > MAX_CELLS and max(cells) > MIN_CELLS:
        largest = max(cells)
        cells = [n // 2 if n == largest else n for n in cells]
    return cells, cells == wanted


def _layout(kx: np.ndarray, clip: tuple, sqrt: bool, cells: int, offset: int):
    """(scale, shift, v at the knots, first cell, last cell) of one set whose cells start at
    ``offset``: v(lo) lands at offset + 1/2, v(hi) about ``cells`` higher. A scale that
    overflows falls back to one cell for the set."""
    lo, hi = clip
    u_lo, u_hi = (np.sqrt([lo, hi]) if sqrt else np.array([lo, hi]))
    for n_cells in (cells, 0):
        with np.errstate(over="ignore", invalid="ignore"):
            scale = n_cells / (u_hi - u_lo) if u_hi > u_lo else 0.0
            shift = offset + 0.5 - u_lo * scale
            ends = cell_value(np.array([lo, hi]), lo, hi, scale, shift, sqrt)
            knots_v = cell_value(kx, lo, hi, scale, shift, sqrt)
        first, last = np.floor(ends[0]), np.ceil(ends[1])
        if np.isfinite([scale, shift, first, last]).all() and first >= offset:
            return scale, shift, knots_v, int(first), int(last)
    raise ValueError(f"knots: cannot place a knot set at cell {offset}")


def knot_tables(knots: list) -> KnotTables:
    """The lookup tables for ``knots``, a list of (x, y) with x strictly increasing."""
    sets = [(np.asarray(kx, dtype=np.float64), np.asarray(ky, dtype=np.float64))
            for kx, ky in knots]
    lo = min(0.0, min(kx[0] for kx, _ in sets))
    hi = max(1.0, max(kx[-1] for kx, _ in sets))
    cells, enough = _cell_counts(sets, lambda a: a, hi - lo)
    sqrt = lo >= 0.0 and not (enough and sum(cells) <= IDENTITY_CELLS)
    if sqrt:
        cells, _ = _cell_counts(sets, np.sqrt, np.sqrt(hi) - np.sqrt(lo))
    layouts, offset = [], 0
    for (kx, _), n_cells in zip(sets, cells, strict=True):
        layouts.append(_layout(kx, (lo, hi), sqrt, n_cells, offset))
        offset = layouts[-1][4] + 1
    # Window of cell c: knots with c - 1/2 <= v < c + 1.
    per_cell = 1
    for _, _, knots_v, first, last in layouts:
        c = np.arange(first, last + 1)
        inside = (np.searchsorted(knots_v, c + 1.0, side="left")
                  - np.searchsorted(knots_v, c - 0.5, side="left"))
        per_cell = max(per_cell, int(inside.max()))
    steps = max(1, per_cell.bit_length())  # 2**steps - 1 >= per_cell
    pad = (1 << steps) - 1
    cell_start = np.zeros(offset, dtype=np.int64)  # cells between sets are never read
    xs, ys, slopes, base = [], [], [], 0
    for (kx, ky), (_, _, knots_v, first, last) in zip(sets, layouts, strict=True):
        # J: the sentinel at ``base``, then one index per knot below the window.
        c = np.arange(first, last + 1)
        cell_start[first:last + 1] = base + np.searchsorted(knots_v, c - 0.5, side="left")
        slope = np.zeros(1 + len(kx) + pad)
        slope[1:len(kx)] = np.diff(ky) / np.diff(kx)
        xs.append(np.concatenate([[lo], kx, np.full(pad, np.inf)]))
        ys.append(np.concatenate([ky[:1], ky, np.full(pad, ky[-1])]))
        slopes.append(slope)
        base += 1 + len(kx) + pad
    if max(base, offset) >= 2**31:
        raise ValueError(f"knots: {base} table entries exceed int32 indices")
    return KnotTables(
        sqrt=sqrt, lo=lo, hi=hi, scale=np.array([layout[0] for layout in layouts]),
        shift=np.array([layout[1] for layout in layouts]),
        cell_start=cell_start.astype(np.int32), x=np.concatenate(xs), y=np.concatenate(ys),
        slope=np.concatenate(slopes), steps=steps)


def interpolate(gb: GraphBuilder, t: str, knots: list) -> str:
    """np.interp(t[:, k], x_k, y_k) for every column k of the [N, K] float64 tensor t, with
    one knot set shared by all columns or one per column; returns [N, K]."""
    if gb.dtype != np.float64:
        raise ValueError("interpolate: np.interp parity needs a float64 graph")
    tables = knot_tables(knots)
    shared = len(knots) == 1
    per_set = (lambda a, hint: gb.const(a[0], hint)) if shared else gb.const
    t = gb.op("Clip", t, gb.const(tables.lo), gb.const(tables.hi), hint="t_clipped")
    u = gb.op("Sqrt", t, hint="t_sqrt") if tables.sqrt else t
    v = gb.add(gb.mul(u, per_set(tables.scale, "cell_scale")),
               per_set(tables.shift, "cell_shift"), hint="cell_value")
    flat_shape = gb.const(np.array([1, -1], dtype=np.int64), "flat_shape", dtype=np.int64)
    cell = gb.op("Reshape", gb.op("Cast", v, hint="cell", to=TensorProto.INT32), flat_shape,
                 hint="cell_flat")
    t_flat = gb.op("Reshape", t, flat_shape, hint="t_flat")

    def lookup(values: np.ndarray, index: str, hint: str, dtype=None) -> str:
        table = gb.const(values[None, :], f"{hint}_table", dtype=dtype)
        return gb.op("GatherElements", table, index, hint=hint, axis=1)

    j = lookup(tables.cell_start, cell, "cell_start", dtype=np.int32)
    for step in reversed(range(tables.steps)):
        h = 1 << step
        ahead = gb.op("LessOrEqual", lookup(tables.shifted_x(h), j, f"x_ahead_{h}"), t_flat,
                      hint="ahead")
        move = gb.op("Cast", ahead, hint="move", to=TensorProto.INT32)
        if h > 1:
            move = gb.mul(move, gb.const(h, "step", dtype=np.int32), hint="move")
        j = gb.add(j, move, hint="knot_index")
    x_j = lookup(tables.x, j, "x_j")
    y_j = lookup(tables.y, j, "y_j")
    slope_j = lookup(tables.slope, j, "slope_j")
    value = gb.add(gb.mul(slope_j, gb.sub(t_flat, x_j)), y_j, hint="interp_flat")
    return gb.op("Reshape", value, gb.op("Shape", t, hint="t_shape"), hint="interp")
