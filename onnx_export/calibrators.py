"""Graph builders for the calibrator families of ``cord_ops.calibrators``.

Each builder reads the fitted attributes of a calibrator (the arrays ``to_dict()`` lists)
and appends the operations of its ``predict_proba`` to a graph, returning the calibrated
probabilities. In a float64 graph the operations are those of the numpy code, in the same
order, so the outputs agree to rounding. ``Family`` also records two facts the export needs:

- ``keeps_top1``: the map provably keeps the original top-1 (argmax q == argmax p0 on every
  row, ties included, in exact arithmetic), so the local reference is g = b everywhere and
  a float32 graph computing q in float32 needs no argmax of q, whose float32 rounding could
  otherwise disagree with the float64 decision (used by TS; IRM runs in float64 anyway);
- ``float64_inside``: a float32 graph still runs this family in float64 and casts q down,
  because float32 rounding would break parity (matrix products accumulate K rounding errors;
  isotonic maps need their 1e-9 * p tie-breaker, which float32 cannot resolve).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from onnx import TensorProto

from onnx_export.builder import GraphBuilder


def model_logits(gb: GraphBuilder, x: str, calibrator) -> str:
    """The calibrator's logits: the scores, or log(max(p, prob_floor)) for probabilities."""
    if calibrator.input_kind == "probs":
        return gb.op("Log", gb.op("Max", x, gb.const(calibrator.prob_floor)), hint="log_p")
    return x


def _tempered(gb: GraphBuilder, x: str, cal, beta: float, out: str | None = None) -> str:
    """softmax(beta * z) of the calibrator's logits z."""
    z = model_logits(gb, x, cal)
    if gb.dtype == np.float32 and cal.input_kind == "logits":
        # Softmax is shift-invariant: subtracting the row max first (exact for entries within
        # a factor 2 of it, Sterbenz) keeps float32 rounding relative to z_j - max z rather
        # than to |z_j|, which matters for logits of magnitude 1e4.
        z = gb.sub(z, gb.row_max(z), hint="z_shifted")
    return gb.softmax(gb.mul(gb.const(beta), z, hint="tempered_logits"), out=out)


def _temperature(gb: GraphBuilder, x: str, cal, out: str | None = None) -> str:
    """``ts``: softmax(beta * z)."""
    return _tempered(gb, x, cal, cal.beta_, out=out)


def _affine_map(gb: GraphBuilder, features: str, cal, out: str | None) -> str:
    """softmax(x * w + b) for a weight vector, softmax(x @ W.T + b) for a matrix."""
    weights = np.asarray(cal.weights_)
    if weights.ndim == 1:
        s = gb.mul(features, gb.const(weights, "weights"))
    else:
        s = gb.op("MatMul", features, gb.const(weights.T, "weights_t"))
    return gb.softmax(gb.add(s, gb.const(cal.bias_, "bias"), hint="affine_logits"), out=out)


def _affine(gb: GraphBuilder, x: str, cal, out: str | None = None) -> str:
    """``vs``: softmax(z * w + b); ``ms``: softmax(z @ W.T + b)."""
    return _affine_map(gb, model_logits(gb, x, cal), cal, out)


def _structured(gb: GraphBuilder, x: str, cal, out: str | None = None) -> str:
    """``svs`` / ``sms``: the affine map on log of the ts-mix
    (1 - eps) softmax(beta z) + eps / K."""
    tempered = _tempered(gb, x, cal, cal.mix_beta_)
    k = int(cal.n_classes_)
    mixed = gb.add(gb.mul(gb.const(1.0 - cal.mix_eps_), tempered),
                   gb.const(cal.mix_eps_ / k), hint="ts_mix")
    return _affine_map(gb, gb.op("Log", mixed, hint="features"), cal, out)


def _dirichlet(gb: GraphBuilder, x: str, cal, out: str | None = None) -> str:
    """``dir-odir``: softmax(f @ W.T + b) with f the log-probabilities clipped at
    log(prob_floor): max(z - max z - log sum exp(z - max z), log floor) from logits,
    log(max(p, floor)) from probabilities."""
    if cal.input_kind == "probs":
        features = model_logits(gb, x, cal)
    else:
        shifted = gb.sub(x, gb.row_max(x), hint="shifted")
        lse = gb.op("Log", gb.row_sum(gb.op("Exp", shifted)), hint="lse")
        features = gb.op("Max", gb.sub(shifted, lse), gb.const(np.log(cal.prob_floor)),
                         hint="log_probs")
    return _affine_map(gb, features, cal, out)


def _monotone(gb: GraphBuilder, x: str, cal, out: str | None = None) -> str:
    """``mcct-i``: TopK ranks the scores as given (larger first, smaller index first on
    ties, as ``rank_order``; probabilities are ranked before their log, which can tie
    them), s = inv_scales * (ranked logits - row min) + biases is computed by rank and
    scattered back to the class order, then q = softmax(s)."""
    z = model_logits(gb, x, cal)
    k = int(cal.n_classes_)
    ranked, order = gb.op("TopK", x, gb.const(np.array([k], dtype=np.int64), "k_all",
                                              dtype=np.int64),
                          outputs=2, hint="ranked", axis=1, largest=1, sorted=1)
    if cal.input_kind == "probs":
        ranked = gb.op("GatherElements", z, order, hint="ranked_logits", axis=1)
    shifted = gb.sub(ranked, gb.row_min(ranked), hint="ranked_shifted")
    s = gb.add(gb.mul(shifted, gb.const(cal.inv_scales_, "inv_scales")),
               gb.const(cal.biases_, "biases"), hint="ranked_scores")
    # Every column is overwritten (order is a permutation), so ``ranked`` serves as the
    # ScatterElements data of the right shape.
    scores = gb.op("ScatterElements", ranked, order, s, hint="monotone_scores", axis=1)
    return gb.softmax(scores, out=out)


#: Largest cell table (entries over all knot sets) the knot lookup may build.
MAX_GRID_ENTRIES = 1 << 22
#: The cell grid is refined until a lookup window holds at most this many knots.
TARGET_WINDOW = 4


def _last_at_or_below(kx: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Index of the last knot <= each value (0 when none is)."""
    return np.maximum(np.searchsorted(kx, values, side="right") - 1, 0)


def _cell_bounds(kx: np.ndarray, cells: int) -> tuple[float, np.ndarray, np.ndarray]:
    """(scale, first, last) of one knot set on ``cells`` equal cells spanning [x_0, x_last].

    The graph computes v = (t - x_0) * scale + 1 (rounded, in a folded form) and the table
    entry c = int(min(v, cells + 2)), where int may truncate or round: for t in cell c_t
    (e_{c_t} <= t < e_{c_t + 1}, e_c = x_0 + c / scale) that gives c in [c_t, c_t + 2]. So
    first[c] = last knot <= e_{c-3} and last[c] = last knot <= e_{c+2} bound the knot index
    j(t) = max{j : x_j <= t} for every such c, and for t past x_last (c = cells + 2).
    """
    span = kx[-1] - kx[0]
    if span <= 0.0:  # a single knot
        zeros = np.zeros(cells + 3, dtype=np.int64)
        return 0.0, zeros, zeros
    scale = cells / span
    edges = kx[0] + np.arange(-3, cells + 5) / scale
    at = _last_at_or_below(kx, edges)
    return scale, at[:cells + 3], at[5:]


def _knot_tables(knots: list) -> dict:
    """Flat tables for a knot lookup whose cost does not grow with the number of knots.

    Each set's range [x_0, x_last] is cut into G equal cells (G the same for every set,
    refined until every cell's candidate window spans at most TARGET_WINDOW knots, within
    MAX_GRID_ENTRIES). ``cell_rows`` holds one row per set and cell: the flat index of the
    first candidate knot minus one, then the W candidate knots (W the widest window);
    ``knot_rows`` holds (x_j, y_j, slope_j) per flat knot index. Each set's knots are
    padded with +inf (never <= a finite t, so a window never counts padding) to a common
    stride of longest set + W; y is padded with its last value and the slope with 0.
    slope_j = (y_{j+1} - y_j) / (x_{j+1} - x_j) as np.interp computes it, and 0 at the
    last knot, where np.interp returns y_last.
    """
    longest = max(len(kx) for kx, _ in knots)
    sets = [(np.asarray(kx, dtype=np.float64), np.asarray(ky, dtype=np.float64))
            for kx, ky in knots]
    cells = 1 << max(0, (longest - 1).bit_length())
    best = None
    while True:
        bounds = [_cell_bounds(kx, cells) for kx, _ in sets]
        width = max(int((last - first).max()) + 1 for _, first, last in bounds)
        if best is None or width < best[1]:
            best = (cells, width, bounds)
        if width <= TARGET_WINDOW or len(sets) * (2 * cells + 3) > MAX_GRID_ENTRIES:
            break
        cells *= 2
    cells, width, bounds = best
    window = 1 << (width - 1).bit_length()
    stride = longest + window
    xs = np.full((len(sets), stride), np.inf)
    ys, slopes = np.zeros_like(xs), np.zeros_like(xs)
    for row, (kx, ky) in enumerate(sets):
        xs[row, :len(kx)] = kx
        ys[row, :len(ky)], ys[row, len(ky):] = ky, ky[-1]
        slopes[row, :len(kx) - 1] = np.diff(ky) / np.diff(kx)
    start = np.stack([first + row * stride for row, (_, first, _) in enumerate(bounds)])
    start = start.ravel().astype(np.int64)
    flat_x = xs.ravel()
    # One row per cell: start - 1 (an integer, exact in float64), then the window's knots.
    cell_rows = np.column_stack([start - 1.0] + [flat_x[start + i] for i in range(window)])
    return {"cell_rows": cell_rows, "knot_rows": np.column_stack(
                [flat_x, ys.ravel(), slopes.ravel()]),
            "x0": np.array([kx[0] for kx, _ in sets]),
            "scale": np.array([scale for scale, _, _ in bounds]),
            "cells": cells, "window": window}


def interpolate(gb: GraphBuilder, t: str, knots: list) -> str:
    """np.interp(t[:, k], x_k, y_k) for every column k (one knot set shared by all columns,
    or one per column), clipped to y_0 / y_last outside [x_0, x_last].

    t is first raised to x_0 (so the left clip is an exact y_0). The cell of t on an equal
    grid over the knots (``_knot_tables``: a product, a sum, a Min and a Cast) gives the
    window of candidate knots in one Gather; counting those <= t gives the largest j with
    x_j <= t (the j a binary search over all knots finds, whatever their number), and a
    second Gather fetches x_j, y_j and slope_j. Then slope_j * (t - x_j) + y_j is
    np.interp's own formula on the same interval.
    """
    tables = _knot_tables(knots)
    shared = len(knots) == 1
    per_set = (lambda a: a[0]) if shared else (lambda a: a)
    cells, scale, window = tables["cells"], tables["scale"], tables["window"]
    t = gb.op("Max", t, gb.const(per_set(tables["x0"]), "knots_x0"), hint="t_clipped")
    # Flat table entry of t's cell: (t - x_0) * scale + 1 + set * (cells + 3), folded into
    # one product and one sum; rounding moves it by far less than the one-cell margin
    # ``_cell_bounds`` allows, and Cast may truncate or round.
    base = np.arange(len(knots)) * (cells + 3.0)
    entry = gb.add(gb.mul(t, gb.const(per_set(scale), "scale")),
                   gb.const(per_set(base + 1.0 - tables["x0"] * scale), "cell_shift"),
                   hint="cell")
    entry = gb.op("Cast", gb.op("Min", entry, gb.const(per_set(base + cells + 2.0), "last_cell")),
                  hint="cell_index", to=TensorProto.INT64)
    # Two Gathers in all (each moves a short row per element): the cell's row, then the
    # knot's (x, y, slope). j = start + #{window knots <= t} - 1, since x_start <= t and the
    # window holds j.
    cell_row = gb.op("Gather", gb.const(tables["cell_rows"], "cell_rows"), entry,
                     hint="cell_row")
    before, candidates = gb.op("Split", cell_row,
                               gb.const(np.array([1, window], dtype=np.int64), "split",
                                        dtype=np.int64),
                               axis=2, outputs=2, hint="window")
    t3 = gb.op("Unsqueeze", t, gb.axes(2), hint="t3")
    count = gb.op("ReduceSum", gb.cast(gb.op("LessOrEqual", candidates, t3), gb.dtype),
                  gb.axes(2), keepdims=1, hint="count")
    index = gb.op("Squeeze", gb.op("Cast", gb.add(before, count), to=TensorProto.INT64),
                  gb.axes(2), hint="knot_index")
    knot = gb.op("Gather", gb.const(tables["knot_rows"], "knot_rows"), index, hint="knot")
    x_j, y_j, slope_j = gb.op("Split", knot, axis=2, num_outputs=3, outputs=3, hint="xys")
    interp = gb.add(gb.mul(slope_j, gb.sub(t3, x_j)), y_j, hint="interp3")
    return gb.op("Squeeze", interp, gb.axes(2), hint="interp")


def _isotonic(gb: GraphBuilder, x: str, cal, out: str | None = None) -> str:
    """``irova`` / ``irm`` on p, ``irova-ts`` on softmax(beta z):
    r = g(p) + tie_eps p, q = r / sum r, uniform where the sum is 0."""
    if cal.name == "irova-ts":
        p = gb.softmax(gb.mul(gb.const(cal.beta_), model_logits(gb, x, cal)))
    else:
        p = x if cal.input_kind == "probs" else gb.softmax(x)
    r = gb.add(interpolate(gb, p, cal.knots_), gb.mul(gb.const(cal.tie_eps), p), hint="r")
    total = gb.row_sum(r, hint="r_sum")
    empty = gb.op("Equal", total, gb.const(0.0), hint="empty_row")
    q = gb.div(r, gb.op("Where", empty, gb.const(1.0), total))
    k = int(cal.n_classes_)
    return gb.op("Where", empty, gb.const(1.0 / k), q, hint="isotonic_q", out=out)


@dataclass(frozen=True)
class Family:
    """How to build one calibrator family's graph (see the module docstring)."""

    #: build(gb, scores, calibrator, out=None) -> name of q (``out`` when given)
    build: Callable[..., str]
    keeps_top1: bool
    float64_inside: bool


FAMILIES: dict[str, Family] = {
    "ts": Family(_temperature, keeps_top1=True, float64_inside=False),
    "vs": Family(_affine, keeps_top1=False, float64_inside=False),
    "ms": Family(_affine, keeps_top1=False, float64_inside=True),
    "svs": Family(_structured, keeps_top1=False, float64_inside=False),
    "sms": Family(_structured, keeps_top1=False, float64_inside=True),
    "dir-odir": Family(_dirichlet, keeps_top1=False, float64_inside=True),
    "irova": Family(_isotonic, keeps_top1=False, float64_inside=True),
    "irova-ts": Family(_isotonic, keeps_top1=False, float64_inside=True),
    "irm": Family(_isotonic, keeps_top1=True, float64_inside=True),
    "ts-tva": Family(_temperature, keeps_top1=True, float64_inside=False),
    # Runs in float64 so that the rank order and the subtraction of the row minimum are
    # those of cord_ops (float32 rounding can tie entries that float64 keeps apart).
    "mcct-i": Family(_monotone, keeps_top1=True, float64_inside=True),
}


def family_of(calibrator) -> Family:
    name = getattr(calibrator, "name", None)
    if name not in FAMILIES:
        raise ValueError(
            f"calibrator: no ONNX builder for {name!r}; expected one of {sorted(FAMILIES)}"
        )
    return FAMILIES[name]
