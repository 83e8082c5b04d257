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

import copy
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from onnx_export.builder import GraphBuilder
from onnx_export.interpolate import interpolate


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


def _identity(gb: GraphBuilder, x: str, cal, out: str | None = None) -> str:
    """``identity``: softmax(z) of logits (the row max subtracted first, as ``_tempered``
    does, in float32), or p / sum p of probabilities (no log, so an exact zero stays 0)."""
    if cal.input_kind == "probs":
        return gb.op("Div", x, gb.row_sum(x, hint="p_sum"), hint="renormalised", out=out)
    if gb.dtype == np.float32:
        x = gb.sub(x, gb.row_max(x), hint="z_shifted")
    return gb.softmax(x, out=out)


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


def _saturation_softmax(gb: GraphBuilder, z: str) -> str:
    """``cord_ops.calibrators.isotonic.saturation_softmax``: e = exp(z - max z) with the
    first maximum's entry set to exactly 1, divided by 1 + (sum of the other entries)."""
    top = gb.row_argmax(z, hint="iso_top")
    e = gb.op("Exp", gb.sub(z, gb.row_max(z)), hint="iso_exp")
    zeros = gb.zeros_like(top)
    rest = gb.row_sum(gb.put(e, top, zeros, hint="iso_others"), hint="iso_rest")
    unit = gb.put(e, top, gb.add(zeros, gb.const(1.0)), hint="iso_unit_top")
    return gb.div(unit, gb.add(gb.const(1.0), rest), hint="iso_p")


def _isotonic(gb: GraphBuilder, x: str, cal, out: str | None = None) -> str:
    """``irova`` / ``irm`` on p, ``irova-ts`` on softmax(beta z) (both softmaxes in the
    saturation-safe form of cord_ops):
    r = g(p) + tie_eps p, q = r / sum r, uniform where the sum is 0.

    r >= 0, so a row summing to 0 is all zeros, and q = (r + e / K) / (sum r + e) with
    e = 1 on those rows and 0 elsewhere is r / sum r bit for bit on the others and 1/K on
    them: one [N, K] Add instead of an [N, K] Where (several times slower in onnxruntime)."""
    if cal.name == "irova-ts":
        p = _saturation_softmax(gb, gb.mul(gb.const(cal.beta_), model_logits(gb, x, cal)))
    else:
        p = x if cal.input_kind == "probs" else _saturation_softmax(gb, x)
    # A softmax output lies in [0, 1] and needs no clipping before the lookup.
    bounded = cal.name == "irova-ts" or cal.input_kind == "logits"
    snap = getattr(cal, "float32_snap", 0.0)  # only on for_float32_scores' copies
    r = gb.add(interpolate(gb, p, cal.knots_, bounded=bounded, snap=snap),
               gb.mul(gb.const(cal.tie_eps), p), hint="r")
    total = gb.row_sum(r, hint="r_sum")
    empty = gb.cast(gb.op("Equal", total, gb.const(0.0), hint="empty_row"), gb.dtype,
                    hint="empty")
    k = int(cal.n_classes_)
    return gb.op("Div", gb.add(r, gb.mul(empty, gb.const(1.0 / k)), hint="r_or_uniform"),
                 gb.add(total, empty, hint="r_sum_or_one"), hint="isotonic_q", out=out)


def for_float32_scores(calibrator):
    """The calibrator a float32 graph stores: ``calibrator`` itself, except for the isotonic
    maps of probabilities, whose copy reads a knot's value wherever the float32 rounding
    of an input that lies exactly on the knot in float64 can land.

    Why: knots are calibration inputs, so on discrete outputs (a random forest's votes,
    k-NN) an input often sits exactly on a knot, and float64 knots put the input's float32
    rounding on either side. One float32 ulp past the end of a plateau moves g by
    slope * ulp (3e-8 at slope 2.5), which outweighs the 1e-9 p tie-breaker between two
    classes whose maps give the same plateau value: the graph took argmax q != a where
    cord_ops did not and repaired the row (0.1 apart). With the knots below, g of an
    input on a knot or a plateau is y exactly, exact ties of g stay exact and the 1e-9 p
    term decides them as in cord_ops (rounding and softmax keep the order of p).

    - ``irova``, ``irm`` read the input itself: every knot x is rounded to float32.
      Rounding is monotone, so p <= x_j implies fl(p) <= fl(x_j) and p >= x_j the reverse;
      an input on a knot lands on it. Knots closer than a float32 ulp become equal, which
      ``interpolate`` reads as np.interp does (the graph cannot tell such inputs apart).
    - ``irova-ts`` reads p = softmax(beta log max(x, floor)) computed in float64 from the
      float32 input, off the float32 grid. Rounding x moves each log by at most u (2^-24,
      relative), so log p by at most 2 |beta| u and p by a relative |beta| eps32 (plus
      float64 roundings). Each knot gets a window [x_j - w_j, x_j + w_j] that reads y_j,
      w_j = (|beta| eps32 (1 + 2^-10) + 2^-40) x_j (``SNAP_MARGIN``), at most a quarter
      of the gap to each neighbour (closer knots are not resolved by a float32 input
      anyway); the copy's ``float32_snap`` holds the relative width, which ``interpolate``
      applies (``snap``): outside the windows the map is np.interp bit for bit, so only
      inputs within w_j of a knot move, by at most slope * w_j. (Not plateaus written
      into the knots: they tilt every segment, 1.7e-5 off on the corpus's
      breast_cancer-mlp probabilities; nor four knots per knot: windows ulps wide grow
      the cell table to its maximum, graphs 40-70x larger.) For normal float32 inputs:
      a probability below 1.2e-38 is rounded by more than u, which matters only with a
      ``prob_floor`` below it (the default is 2.2e-16).

    Elsewhere values move by about slope * ulp, as the input's own rounding moves them
    (``onnx_export.parity`` measures that as ``s_input`` and ``s_store``). Maps of logits
    read a softmax of logits whose rounding error grows with |z|; they keep their knots
    (docs/calibrators.md, section 4)."""
    name = getattr(calibrator, "name", None)
    if (name not in ("irova", "irm", "irova-ts")
            or getattr(calibrator, "input_kind", None) != "probs"):
        return calibrator
    stored = copy.copy(calibrator)
    if name == "irova-ts":
        width = (abs(float(calibrator.beta_)) * float(np.finfo(np.float32).eps)
                 * (1.0 + SNAP_MARGIN) + SNAP_MARGIN * 2.0**-30)
        stored.float32_snap = width
    else:
        stored.knots_ = [(np.asarray(kx, dtype=np.float32).astype(np.float64), ky)
                         for kx, ky in calibrator.knots_]
    return stored


#: Relative margin of an irova-ts snap window over the first-order bound |beta| eps32
#: (which leaves out terms of order (beta eps32)^2), and in units of 2^-30 (relative) the
#: float64 roundings of log, softmax and onnxruntime's Exp (a few ulps each, 2^-52):
#: 2^-40 in all.
SNAP_MARGIN = 2.0**-10


@dataclass(frozen=True)
class Family:
    """How to build one calibrator family's graph (see the module docstring)."""

    #: build(gb, scores, calibrator, out=None) -> name of q (``out`` when given)
    build: Callable[..., str]
    keeps_top1: bool
    float64_inside: bool


FAMILIES: dict[str, Family] = {
    "identity": Family(_identity, keeps_top1=True, float64_inside=False),
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
