"""np.interp as an ONNX subgraph, bit for bit, at a cost that does not grow with the knots.

``interpolate(gb, t, knots)`` appends the graph of np.interp(t[:, k], x_k, y_k) for every
column k, with one knot set shared by all columns (``irm``) or one per column (``irova``,
``irova-ts``). np.interp finds, by binary search, the largest j with x_j <= t and returns
slope_j * (t - x_j) + y_j with slope_j = (y_{j+1} - y_j) / (x_{j+1} - x_j), y_0 left of
x_0 and y_last from x_last on. The graph finds the same j in a fixed number of steps:

1. (only for inputs not known to lie in [lo, hi]) t is clipped to [lo, hi] =
   [min(0, x_0), max(1, x_last)] over all sets; probabilities are never moved;
2. in float32, v = f(t) * scale + shift with f = sqrt (knots >= 0) or the identity, and
   the *cell* c = Cast(v) to int32. Clip, Cast to float32, Sqrt, Mul and Add are
   correctly rounded IEEE operations, so numpy reproduces v exactly, and each is monotone,
   so v is a non-decreasing function of t; the export evaluates v at every knot. Cast to
   int32 may truncate or round (the ONNX specification leaves it open): either way t in
   cell c has c - 1/2 <= v(t) < c + 1, so every knot with v < c - 1/2 is below t and every
   knot with v >= c + 1 is above it, whatever the rounding. ``scale`` is chosen per set so
   that such a window holds a few knots at most (sqrt spreads the knots that isotonic fits
   on probabilities pile up near 0), and ``shift`` gives each set its own range of one flat
   cell table. float32 is enough to pick a window (knots closer than its resolution share
   one) and its Sqrt costs a tenth of float64's;
3. the cell table gives J, the flat index of the last knot below the window (the set's
   left sentinel when there is none), and ``steps`` halving steps j += h * [x_{j+h} <= t]
   (h = 2**(steps-1), ..., 1; float64 comparisons) reach the largest j with x_j <= t, the
   window holding at most 2**steps - 1 knots; x_{j+h} comes from a copy of the knot table
   shifted by h, and +inf padding after each set keeps a step inside its set;
4. x_j, y_j and slope_j are looked up and slope_j * (t - x_j) + y_j is np.interp's own
   formula (separate Mul and Add, as numpy computes it). The left sentinel (t < x_0) and
   the last knot have slope 0 and give y_0 and y_last exactly.

All lookups are GatherElements on [1, M] tables with int32 indices of shape [1, N * K],
and the steps use Cast and Add rather than Where: onnxruntime's CPU kernels for those are
several times cheaper per element than Gather on axis 0 (a memcpy per index) or Where
(docs/performance.md, "ONNX graphs: isotonic families").

Snap windows (``snap`` > 0, float32 graphs of ``irova-ts``): each knot also reads y_j on
[x_j - w_j, x_j + w_j], w_j = snap |x_j| (at most a quarter gap). Steps 1-3 run on the
window starts x_j - w_j instead of the knots, so they find knot j from its window on, and
step 4 zeroes slope_j where t <= x_j + w_j; elsewhere j, and the value, are np.interp's.

Deviation from np.interp: NaN and infinite t are not supported (np.interp returns NaN or
a clipped value; here the cell index is undefined and onnxruntime rejects the lookup, or
the product with a zero slope is NaN). The values reaching this graph are probabilities,
which the serving path validates.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from onnx import TensorProto

from onnx_export.builder import GraphBuilder

#: Upper bound on the cells of all knot sets together (the int32 cell table: 4 bytes each;
#: float32 holds every cell number below 2**24 exactly).
MAX_CELLS = 1 << 21
#: Upper bound on the cells of one knot set.
MAX_SET_CELLS = 1 << 16
#: Two halving steps find j when a cell's window holds at most this many knots; the cells
#: are refined to that where MAX_CELLS and MAX_SET_CELLS allow.
TARGET_PER_CELL = 3
#: The smallest power-of-two cell count per set.
MIN_CELLS = 16

F32 = np.float32


@dataclass(frozen=True)
class KnotTables:
    """Everything ``interpolate`` bakes into the graph (see the module docstring)."""

    sqrt: bool  # f = sqrt, or the identity
    lo: float  # t is clipped to [lo, hi]
    hi: float
    scale: np.ndarray  # float32 [S] per set
    shift: np.ndarray  # float32 [S]
    cell_start: np.ndarray  # int32 [cells]: J per cell
    x: np.ndarray  # [M] flat knots: per set a sentinel, the knots, +inf padding
    y: np.ndarray  # [M] y_0 at the sentinel, the set's last y in the padding
    slope: np.ndarray  # [M] slope_j; 0 at the sentinel, each last knot and the padding
    steps: int  # halving steps: 2**steps - 1 >= the most knots in one cell's window
    # With ``snap``: ``x`` holds the window starts x_j - w_j (searched), ``at`` the knots
    # x_j (the formula's) and ``flat_until`` the window ends x_j + w_j; None without.
    at: np.ndarray | None = None
    flat_until: np.ndarray | None = None

    def shifted_x(self, h: int) -> np.ndarray:
        """x_{i+h} at index i (+inf past the end)."""
        return np.concatenate([self.x[h:], np.full(h, np.inf)])


def cell_value(t: np.ndarray, lo: float, hi: float, scale, shift, sqrt: bool) -> np.ndarray:
    """v of the module docstring (float32), with the graph's operations in its order. The
    float64 clip is the identity on a bounded t (in [0, 1], inside [lo, hi]), so it is
    the same whether the graph has it or not."""
    u = np.clip(np.asarray(t, dtype=np.float64), lo, hi).astype(F32)
    if sqrt:
        u = np.sqrt(u)
    return u * np.asarray(scale, dtype=F32) + np.asarray(shift, dtype=F32)


def _wanted_cells(u: np.ndarray, span: float) -> int:
    """A power-of-two cell count over a span of f at which no window (1.5 cells) should hold
    more than TARGET_PER_CELL knots: three times span / (smallest positive distance between
    knots TARGET_PER_CELL apart; knots closer than float32 resolves share a window anyway),
    the factor leaving room for the half-cell margin and rounding; MIN_CELLS to
    MAX_SET_CELLS."""
    if len(u) <= TARGET_PER_CELL:
        return MIN_CELLS
    gaps = u[TARGET_PER_CELL:].astype(np.float64) - u[:-TARGET_PER_CELL]
    gaps = gaps[gaps > 0]
    if not len(gaps):
        return MIN_CELLS
    want = 3.0 * span / gaps.min()
    if not want < MAX_SET_CELLS:
        return MAX_SET_CELLS
    return max(MIN_CELLS, 1 << int(np.ceil(np.log2(max(want, 1.0)))))


def _layout(kx: np.ndarray, clip: tuple, sqrt: bool, cells: int, offset: int):
    """(scale, shift, v at the knots, first cell, last cell) of one set whose cells start at
    ``offset``: v(lo) lands near offset + 1/2, v(hi) about ``cells`` higher."""
    lo, hi = clip
    ends = np.array([lo, hi])
    u_lo, u_hi = np.array([lo, hi]).astype(F32)
    if sqrt:
        u_lo, u_hi = np.sqrt(u_lo), np.sqrt(u_hi)
    for nudge in range(64):  # float32 rounding may put v(lo) below offset: move up
        scale = F32(cells / (float(u_hi) - float(u_lo)))
        shift = F32(offset + 0.5 + nudge - float(u_lo) * float(scale))
        first, last = cell_value(ends, lo, hi, scale, shift, sqrt).astype(np.float64)
        if np.floor(first) >= offset:
            knots_v = cell_value(kx, lo, hi, scale, shift, sqrt).astype(np.float64)
            return scale, shift, knots_v, int(np.floor(first)), int(np.ceil(last))
    raise ValueError(f"knots: cannot place a knot set at cell {offset}")


def snap_widths(kx: np.ndarray, snap: float) -> np.ndarray:
    """w_j = snap * |x_j|, at most a quarter of the gap to each neighbour, so the windows
    [x_j - w_j, x_j + w_j] of consecutive knots are disjoint and ordered as the knots."""
    w = snap * np.abs(kx)
    gaps = np.diff(kx) / 4.0
    w[:-1] = np.minimum(w[:-1], gaps)
    w[1:] = np.minimum(w[1:], gaps)
    return w


def knot_tables(knots: list, snap: float = 0.0) -> KnotTables:
    """The lookup tables for ``knots``, a list of (x, y) with x non-decreasing.

    Equal knots (float64 knots rounded onto each other, ``onnx_export.calibrators``) are
    read as np.interp reads them: the largest j with x_j <= t is the last of them, so t at
    them gives the last one's y, and the segment to their left ends at the first one's y.
    The zero-width segment between them is never read; its slope is stored as 0.

    ``snap`` > 0 (strictly increasing knots): t in [x_j - w_j, x_j + w_j] (``snap_widths``)
    reads y_j; the search runs on the window starts, so j is knot j's from its window on,
    and elsewhere it is np.interp's j and the formula np.interp's."""
    sets = [(np.asarray(kx, dtype=np.float64), np.asarray(ky, dtype=np.float64))
            for kx, ky in knots]
    knots_at = [kx for kx, _ in sets]
    widths = [snap_widths(kx, snap) if snap else None for kx in knots_at]
    if snap:
        sets = [(kx - w, ky) for (kx, ky), w in zip(sets, widths, strict=True)]
    lo = min(0.0, min(kx[0] for kx, _ in sets))
    hi = max(1.0, max(kx[-1] for kx, _ in sets))
    sqrt = lo >= 0.0

    def f(a):
        u = np.asarray(a, dtype=np.float64).astype(F32)
        return np.sqrt(u) if sqrt else u

    span = float(f(hi)) - float(f(lo))
    cells = [_wanted_cells(f(kx), span) for kx, _ in sets]
    while sum(cells) > MAX_CELLS and max(cells) > MIN_CELLS:
        largest = max(cells)
        cells = [n // 2 if n == largest else n for n in cells]
    layouts, offset = [], 0
    for (kx, _), n_cells in zip(sets, cells, strict=True):
        layouts.append(_layout(kx, (lo, hi), sqrt, n_cells, offset))
        offset = layouts[-1][4] + 1
    if offset >= 1 << 23:
        raise ValueError(f"knots: {offset} cells exceed what float32 numbers exactly")
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
    xs, ys, slopes, ats, flats, base = [], [], [], [], [], 0
    for (kx, ky), (_, _, knots_v, first, last), at, w in zip(sets, layouts, knots_at, widths,
                                                            strict=True):
        # J: the sentinel at ``base``, then one index per knot below the window.
        c = np.arange(first, last + 1)
        cell_start[first:last + 1] = base + np.searchsorted(knots_v, c - 0.5, side="left")
        slope = np.zeros(1 + len(kx) + pad)
        dx = np.diff(at)
        slope[1:len(kx)] = np.divide(np.diff(ky), dx, out=np.zeros_like(dx), where=dx > 0)
        xs.append(np.concatenate([[lo], kx, np.full(pad, np.inf)]))
        ys.append(np.concatenate([ky[:1], ky, np.full(pad, ky[-1])]))
        slopes.append(slope)
        if snap:
            ats.append(np.concatenate([[lo], at, np.full(pad, np.inf)]))
            flats.append(np.concatenate([[lo], at + w, np.full(pad, np.inf)]))
        base += 1 + len(kx) + pad
    if base >= 2**31:
        raise ValueError(f"knots: {base} table entries exceed int32 indices")
    return KnotTables(
        sqrt=sqrt, lo=lo, hi=hi, scale=np.array([layout[0] for layout in layouts], dtype=F32),
        shift=np.array([layout[1] for layout in layouts], dtype=F32),
        cell_start=cell_start.astype(np.int32), x=np.concatenate(xs), y=np.concatenate(ys),
        slope=np.concatenate(slopes), steps=steps,
        at=np.concatenate(ats) if snap else None,
        flat_until=np.concatenate(flats) if snap else None)


def interpolate(gb: GraphBuilder, t: str, knots: list, bounded: bool = False,
                snap: float = 0.0) -> str:
    """np.interp(t[:, k], x_k, y_k) for every column k of the [N, K] float64 tensor t, with
    one knot set shared by all columns or one per column; returns [N, K]. ``bounded``: t
    is known to lie in [0, 1] (a softmax output), so it needs no clipping.

    ``snap`` > 0: y_j wherever |t - x_j| <= w_j (``snap_widths``: snap * |x_j|, at most a
    quarter gap), np.interp bit for bit elsewhere (``knot_tables``); a float32 graph's
    irova-ts reads a knot through the rounding of its input this way
    (``onnx_export.calibrators.for_float32_scores``). Four [1, N K] operations more."""
    if gb.dtype != np.float64:
        raise ValueError("interpolate: np.interp parity needs a float64 graph")
    tables = knot_tables(knots, snap)
    shared = len(knots) == 1
    if not (bounded and tables.lo <= 0.0 and tables.hi >= 1.0):
        t = gb.op("Clip", t, gb.const(tables.lo, rank0=True), gb.const(tables.hi, rank0=True),
                  hint="t_clipped")
    u = gb.cast(t, F32, hint="t_f32")
    if tables.sqrt:
        u = gb.op("Sqrt", u, hint="u_sqrt")

    def per_set(values: np.ndarray, hint: str) -> str:
        return gb.const(values[0] if shared else values, hint, dtype=F32)

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
    x_j = lookup(tables.x if tables.at is None else tables.at, j, "x_j")
    y_j = lookup(tables.y, j, "y_j")
    slope_j = lookup(tables.slope, j, "slope_j")
    if tables.flat_until is not None:
        # t in knot j's window [x_j - w_j, x_j + w_j] (it is at or above x_j - w_j, as j
        # was searched on the window starts): a zero slope gives y_j exactly, with a Mul
        # instead of a Where (several times slower in onnxruntime). Less rather than
        # Greater: an operator every runtime of these graphs has (torch_runtime.OPERATORS)
        beyond = gb.op("Less", lookup(tables.flat_until, j, "flat_until_j"), t_flat,
                       hint="beyond_window")
        slope_j = gb.mul(slope_j, gb.cast(beyond, np.float64, hint="outside_window"),
                         hint="slope_outside_window")
    value = gb.add(gb.mul(slope_j, gb.sub(t_flat, x_j)), y_j, hint="interp_flat")
    return gb.op("Reshape", value, gb.op("Shape", t, hint="t_shape"), hint="interp")
