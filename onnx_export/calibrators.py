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
    """``mcct-i``: TopK ranks the logits (larger first, smaller index first on ties, as
    ``rank_order``), s = inv_scales * (ranked - row min) + biases is computed by rank and
    scattered back to the class order, then q = softmax(s)."""
    z = model_logits(gb, x, cal)
    k = int(cal.n_classes_)
    ranked, order = gb.op("TopK", z, gb.const(np.array([k], dtype=np.int64), "k_all",
                                              dtype=np.int64),
                          outputs=2, hint="ranked", axis=1, largest=1, sorted=1)
    shifted = gb.sub(ranked, gb.row_min(ranked), hint="ranked_shifted")
    s = gb.add(gb.mul(shifted, gb.const(cal.inv_scales_, "inv_scales")),
               gb.const(cal.biases_, "biases"), hint="ranked_scores")
    # Every column is overwritten (order is a permutation), so ``ranked`` serves as the
    # ScatterElements data of the right shape.
    scores = gb.op("ScatterElements", ranked, order, s, hint="monotone_scores", axis=1)
    return gb.softmax(scores, out=out)


def _knot_tables(knots: list) -> tuple[np.ndarray, ...]:
    """Flat, padded knot tables for a branch-free search over one or K knot sets.

    Each set is padded to P = the next power of two >= the longest set: x with +inf (never
    <= a finite input, so the search cannot step into padding), y with its last value and
    the slope with 0. slope_j = (y_{j+1} - y_j) / (x_{j+1} - x_j) as np.interp computes it,
    and 0 at the last knot, where np.interp returns y_last.
    """
    size = 1 << max(len(kx) - 1 for kx, _ in knots).bit_length()
    xs = np.full((len(knots), size), np.inf)
    ys, slopes = np.zeros_like(xs), np.zeros_like(xs)
    for row, (kx, ky) in enumerate(knots):
        kx, ky = np.asarray(kx, dtype=np.float64), np.asarray(ky, dtype=np.float64)
        xs[row, :len(kx)] = kx
        ys[row, :len(ky)], ys[row, len(ky):] = ky, ky[-1]
        slopes[row, :len(kx) - 1] = np.diff(ky) / np.diff(kx)
    offsets = np.arange(len(knots), dtype=np.int64) * size
    return xs.ravel(), ys.ravel(), slopes.ravel(), offsets, size


def interpolate(gb: GraphBuilder, t: str, knots: list) -> str:
    """np.interp(t[:, k], x_k, y_k) for every column k (one knot set shared by all columns,
    or one per column), clipped to y_0 / y_last outside [x_0, x_last].

    t is first raised to x_0 (so the left clip is an exact y_0). A binary search, one
    Gather and one Where per halving of P, finds the largest j with x_j <= t; then
    slope_j * (t - x_j) + y_j is np.interp's own formula on the same interval.
    """
    xs, ys, slopes, offsets, size = _knot_tables(knots)
    table_x = gb.const(xs, "knots_x")
    first = gb.const(xs[offsets] if len(knots) > 1 else xs[0], "knots_x0")
    t = gb.op("Max", t, first, hint="t_clipped")
    index = gb.const(offsets if len(knots) > 1 else offsets[0], "knot_offsets",
                     dtype=np.int64)
    step = size // 2
    while step:
        candidate = gb.add(index, gb.const(step, "step", dtype=np.int64), hint="candidate")
        ok = gb.op("LessOrEqual", gb.op("Gather", table_x, candidate), t, hint="step_ok")
        index = gb.op("Where", ok, candidate, index, hint="knot_index")
        step //= 2
    x_j = gb.op("Gather", table_x, index, hint="x_j")
    y_j = gb.op("Gather", gb.const(ys, "knots_y"), index, hint="y_j")
    slope_j = gb.op("Gather", gb.const(slopes, "knots_slope"), index, hint="slope_j")
    return gb.add(gb.mul(slope_j, gb.sub(t, x_j)), y_j, hint="interp")


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
