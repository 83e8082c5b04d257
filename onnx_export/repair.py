"""The CORD repair (Section 3, Appendix A) as an ONNX subgraph with eta* baked in.

Per row, with ``a`` the original top-1 (computed by the caller with the smallest-index tie
rule) and ``q`` the calibrated row, the graph computes what ``cord_ops.cord.CORD.transform``
computes, in the same order up to the last step (so float64 agrees to rounding):

- boundary stabilisation S(u) = (1 - delta) u + delta / K (eq. 11) of the rows of ``q``
  and of ``p0`` whose minimum is <= 0, independently; only ``p0_a`` is needed from p0.
  For q it is folded into two per-row coefficients (c1, c0) = (1 - delta, delta / K) on
  boundary rows and (1, 0) elsewhere, so q * c1 + c0 is q bit for bit on interior rows;
- b = q_a, the tail sum over j != a as a sum of the masked row (never 1 - b), and
  rho = max_{j != a} q_j / tail (max commutes with the monotone affine stabilisation);
- the interval I = [rho / (1 + rho) + eps, 1 - eps] (eq. 4);
- the local reference g = b where argmax q == a, else lambda b + (1 - lambda) p0_a
  (eq. 5, lambda = 1/2; eq. 25 otherwise);
- H(g, eta*) by the cancellation-safe closed form (eqs. 19-20). There is no Hypot
  operator, so R = m sqrt((x/m)^2 + (y/m)^2) with m = max(|x|, |y|); eta* is a constant,
  so its branch (eta* = 0, eta* <= 1, eta* > 1) is chosen at export time;
- s = clip(H, I) (eq. 16) and p~ = s e_a + (1 - s) alpha (eq. 2), where rows with s == b
  keep the stabilised q exactly, as ``reconstruct`` does. The tail is divided by the
  tail sum first (alpha, in [0, 1]) and then multiplied by 1 - s: (1 - s) / tail overflows
  when eta* < -1 meets a subnormal tail, and tail / (1 - s) rounds to its grid.

Strict top-1 guarantee (the float32 fix-up). In exact arithmetic s >= rho/(1+rho) + eps
makes p~_a exceed every other entry by at least (1 + rho) eps (eq. 23). In float32 the
1e-12 offset is below the resolution of s, so a row whose s sits at the interval's lower
end can round to p~_a == max_{j != a} p~_j, and the tie rule would then return the smaller
index. The graph therefore computes the runner-up r = max_{j != a} p~_j exactly (the tail
is ((c1 q_j + c0) / T) M with per-row c1, T, M > 0, a monotone map, so its maximum is the map of
max_{j != a} q_j) and replaces s by max(s, r * (1 + 4 u)), u the unit roundoff of the dtype.
The product is at least two ulps above r, so it rounds strictly above r whenever r is a
normal number; when r is subnormal, s >= 1/K already exceeds it. The correction moves
p~_a by at most a few ulps of r and only on rows where rounding tied or inverted the
order; in float64 the 1e-12 margin is far above rounding and the fix-up never fires.
"""

from __future__ import annotations

import numpy as np

from cord_ops.cord_kernels import DELTA_STAB, EPS_NUM
from onnx_export.builder import GraphBuilder


def _stabilise_coefficients(gb: GraphBuilder, edge: str, n_classes: int) -> tuple[str, str]:
    """(c1, c0) per row: (1 - delta, delta / K) where ``edge`` marks a boundary row."""
    c1 = gb.op("Where", edge, gb.const(1.0 - DELTA_STAB), gb.const(1.0), hint="stab_scale")
    c0 = gb.op("Where", edge, gb.const(DELTA_STAB / n_classes), gb.const(0.0),
               hint="stab_shift")
    return c1, c0


#: Below this |eta*|, R = sqrt(x^2 + y^2) needs no scaling: |x| <= |eta*| + 1 and y <= 1, so
#: the squares cannot overflow even in float32, and where they underflow (x or y below
#: 1e-19) the other term or the 2 in H's denominator dominates R. Per row it differs from
#: hypot by at most 4.5 units in the last place (see ``cord_ops.cord_solve._MeanResponse``).
UNSCALED_HYPOT_BELOW_ETA = 1e15


def interior_response(gb: GraphBuilder, g: str, eta: float) -> str:
    """H(g, eta) of eqs. 19-20 for a constant eta, on [N, 1] tensors."""
    if eta == 0.0:
        return g
    one, two = gb.const(1.0), gb.const(2.0)
    x = gb.add(gb.const(eta), gb.sub(gb.mul(two, g), one), hint="hypot_x")
    y = gb.mul(two, gb.op("Sqrt", gb.mul(g, gb.sub(one, g))), hint="hypot_y")
    if abs(eta) < UNSCALED_HYPOT_BELOW_ETA:
        # Six [N, 1] operations fewer than the scaled form; each costs onnxruntime a few
        # microseconds per batch whatever the number of rows.
        r = gb.op("Sqrt", gb.add(gb.mul(x, x), gb.mul(y, y)), hint="R")
    else:
        # Scaled hypot; the floor only matters when x = y = 0 (g == 1 and eta == -1),
        # where it turns 0/0 into 0 and R = 0 as hypot gives.
        scale = gb.op("Max", gb.op("Abs", x), gb.op("Abs", y),
                      gb.const(np.finfo(gb.dtype).tiny), hint="hypot_scale")
        xs, ys = gb.div(x, scale), gb.div(y, scale)
        r = gb.mul(scale, gb.op("Sqrt", gb.add(gb.mul(xs, xs), gb.mul(ys, ys))), hint="R")
    if eta <= 1.0:
        return gb.div(gb.mul(two, g), gb.add(gb.const(1.0 - eta), r), hint="H")
    return gb.div(gb.add(gb.const(eta - 1.0), r), gb.const(2.0 * eta), hint="H")


#: ``changed`` value asking the repair to derive argmax q != a from q itself (float32 graphs).
CHANGED_FROM_RUNNER_UP = "changed-from-runner-up"


def build_repair(gb: GraphBuilder, p0_a: str, p0_on_boundary: str | None, calibrated: str,
                 label: str, changed: str | None, eta: float, local_weight: float,
                 n_classes: int, out_dtype=None, out: str = "repaired") -> tuple[str, str]:
    """Append the repair; returns (repaired [N, K] named ``out``, confidence [N, 1]).

    Inputs are in ``gb``'s compute dtype: ``p0_a`` [N, 1] is the original probability of
    ``label`` ([N, 1] int64, the original top-1) and ``p0_on_boundary`` [N, 1] bool marks
    rows of p0 with an entry <= 0. None skips the stabilisation of p0_a, which float32
    graphs may: there (1 - delta) rounds to 1 and delta / K is below half an ulp of any
    p0_a >= 1/K, so S(p0)_a == p0_a exactly.

    ``changed`` is an [N, 1] bool that is true where argmax q != a; None for calibrators
    that provably keep the original top-1 (g = b on every row); or
    ``CHANGED_FROM_RUNNER_UP``, which takes it as q_a < max_{j != a} q_j from the masked row
    the repair builds anyway (one pass fewer than an ArgMax). That rule differs from the
    argmax only on an exact tie between q_a and a runner-up of smaller index, which in a
    float32 q is a rounding artefact that float64 would decide either way.

    With ``out_dtype`` (float32 when computing in float64) the tail, s and the
    runner-up are cast before the strict top-1 fix-up, which then works in the output dtype.
    """
    one = gb.const(1.0)

    if p0_on_boundary is not None:
        # p0_a, stabilised on boundary rows of p0 (eq. 11).
        p_c1, p_c0 = _stabilise_coefficients(gb, p0_on_boundary, n_classes)
        p0_a = gb.add(gb.mul(p_c1, p0_a), p_c0, hint="p0_a_stab")

    # b, tail and rho of the stabilised q; the masked row is q with q_a set to 0.
    c1, c0 = _stabilise_coefficients(gb, on_boundary(gb, calibrated), n_classes)
    # In float32, 1 - delta rounds to 1: c1 is 1 on every row, and its products are
    # skipped (bit for bit the same values, three [N, 1] operations fewer).
    unit_c1 = gb.dtype == np.float32

    def stabilised(t: str) -> str:
        return t if unit_c1 else gb.mul(c1, t)

    q_a = gb.take(calibrated, label, hint="q_a")
    b = gb.add(stabilised(q_a), c0, hint="b")
    rest = gb.put(calibrated, label, gb.zeros_like(label), hint="rest")
    tail_raw, top_raw = gb.row_sum(rest, hint="tail_raw"), gb.row_max(rest, hint="top_raw")
    # Sum of (c1 q_j + c0) over the K - 1 entries j != a.
    tail = gb.add(stabilised(tail_raw), gb.mul(gb.const(n_classes - 1.0), c0), hint="tail")
    rho = gb.div(gb.add(stabilised(top_raw), c0), tail, hint="rho")
    lower = gb.add(gb.div(rho, gb.add(one, rho)), gb.const(EPS_NUM), hint="lower")

    if changed == CHANGED_FROM_RUNNER_UP:
        changed = gb.op("Less", q_a, top_raw, hint="changed")
    if changed is None:
        g = b
    else:
        mixed = gb.add(gb.mul(gb.const(local_weight), b),
                       gb.mul(gb.const(1.0 - local_weight), p0_a), hint="g_mixed")
        g = gb.op("Where", changed, mixed, b, hint="g")

    s = gb.op("Min", gb.op("Max", interior_response(gb, g, eta), lower),
              gb.const(1.0 - EPS_NUM), hint="s")

    # p~_j = ((c1 q_j + c0) / T) * M for j != a, with T = tail and M = 1 - s, i.e. alpha_j
    # first (in [0, 1], so finite for every row) and then (1 - s) alpha_j as eq. 2 writes
    # it; rows with s == b keep the stabilised q (T = M = 1). Multiplying by (1 - s) / tail
    # would overflow for a subnormal tail with eta* < -1, and dividing by tail / (1 - s)
    # rounds that quotient to the subnormal grid (rows 1e-10 off summing to 1 at a tail of
    # 1e-314, 0.4 % at 3e-322), as ``cord_kernels._reconstruct`` explains.
    same = gb.op("Equal", s, b, hint="same")
    tail_or_one = gb.op("Where", same, one, tail, hint="tail_or_one")
    mass = gb.op("Where", same, one, gb.sub(one, s), hint="mass")
    # In float32, 1 - delta rounds to 1: c1 is 1 on every row and its product is skipped.
    # So it is when the result is cast to float32: the factor moves the tail by a relative
    # 1e-10, far below float32's rounding (6e-8), and the [N, K] product costs a pass.
    # The runner-up uses the same formula as the tail, so it stays the tail's maximum.
    dtype = gb.dtype if out_dtype is None else np.dtype(out_dtype)
    if dtype == np.float32:
        stab, top_stab = rest, top_raw
    else:
        stab, top_stab = gb.mul(rest, c1, hint="rest_stab"), gb.mul(top_raw, c1)
    scaled = gb.mul(gb.div(gb.add(stab, c0), tail_or_one), mass, hint="tail_scaled")
    runner_up = gb.mul(gb.div(gb.add(top_stab, c0), tail_or_one), mass, hint="runner_up")

    if dtype != gb.dtype:
        # Casting is monotone, so the cast runner-up is still the maximum of the cast tail.
        scaled, runner_up, s = (gb.cast(t, dtype) for t in (scaled, runner_up, s))
    # Strict top-1 fix-up (module docstring): keep p~_a above the runner-up.
    nudge = gb.const(1.0 + 2.0 * np.finfo(dtype).eps, dtype=dtype)
    s = gb.op("Max", s, gb.mul(runner_up, nudge), hint="s_strict")
    return gb.put(scaled, label, s, out=out), s


def on_boundary(gb: GraphBuilder, rows: str) -> str:
    """[N, 1] bool: the row (in ``gb``'s dtype) has an entry <= 0, i.e. lies outside the
    relative interior of the simplex (``cord_ops.cord_kernels.on_boundary``)."""
    return gb.op("LessOrEqual", gb.row_min(rows), gb.const(0.0), hint="on_boundary")
