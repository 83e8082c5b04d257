"""One ONNX graph per fitted pipeline: calibrator + CORD repair with eta* baked in.

Graph contract (docs/contract.md, "The ONNX graph"): input ``scores`` [N, K] (logits or
probabilities, in the export dtype, symbolic N; for K = 2 also [N, 1], one score column);
outputs ``repaired``, ``calibrated``, ``original`` [N, K], ``label`` [N] int64 (original
top-1, smallest index on ties) and ``confidence`` [N] (= repaired[label]);
``outputs="lean"`` keeps only ``repaired``, ``label`` and ``confidence``. Model metadata:
``cord.eta_star`` (repr), ``cord.calibrator``, ``cord.n_classes``, ``cord.version``, plus
``cord.input_kind``, ``cord.dtype``, ``cord.outputs`` (the output names, comma-separated)
and ``cord.input_widths`` ("1,2" for K = 2, else K).

float64 graphs repeat the numpy operations of cord_ops in the same order and agree with it
to rounding (onnxruntime's double Exp differs from numpy's by up to 2 ulps, which isotonic
maps on logits amplify by their slope; everything else stays within a few ulps).

float32 graphs take float32 scores and return float32 outputs. Which arithmetic runs in
float32 is chosen per pipeline so that every output stays within 1e-5 of cord_ops run on the
same inputs upcast to float64:

- TS, VS and SVS run in float32 (TS and the ts-mix of SVS subtract the row max of the
  logits first, so logits of magnitude 1e4 lose nothing);
- MS, SMS, Dir-ODIR and the isotonic maps run in float64 and cast q down (float32 matrix
  products accumulate K roundings; isotonic maps need float64 to resolve their 1e-9 * p
  tie-breaker);
- when eta* <= ``WIDE_REPAIR_BELOW_ETA`` (-1/2) q and the repair run in float64 too. For
  eta* < -1, H(g, eta*) tends to -1/eta* (not to 1) as g -> 1, so rows whose tail mass is
  below float32 resolution (1e-38) reach the output with weight 1 - s = O(1), and only
  float64 resolves that tail as cord_ops does; below -1/2 the margin is kept.

Order guarantees of float32 graphs (docs/contract.md: argmax(repaired) == label ==
argmax(original)):

- ``label`` is the argmax of the float32 input itself, smallest index on ties (ArgMax with
  select_last_index = 0). For probabilities that is exactly cord_ops' label on the same inputs;
  for logits it is argmax softmax(z) in float64 except when the top two logits differ by
  less than about 2**-52 (only possible for |z| < 2e-9).
- float32 softmax can round two distinct logits to the same probability, so ``original``
  has its ``label`` entry raised to just above the runner-up logit's probability on the rows
  where rounding tied them (a few ulps; other rows are the plain softmax). The repair uses
  the plain softmax entry of the label.
- ``repaired`` keeps the label strictly on top by the fix-up in ``onnx_export.repair``.
- whether q keeps the original top-1 (eq. 5) is decided exactly where it matters: not at
  all for TS (it provably does), by float64 argmax where q is computed in float64, and by
  q_a < max_{j != a} q_j for VS/SVS in float32 (``repair.CHANGED_FROM_RUNNER_UP``);
- isotonic maps of probabilities read a knot's value where the input's float32 rounding
  puts an input that lies on the knot (``irova``, ``irm``: knots rounded to float32 as the
  input is; ``irova-ts``: a window of |beta| eps32 around each knot), so exact ties of two
  classes' maps stay exact and are decided as cord_ops decides them
  (``calibrators.for_float32_scores``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import TensorProto, helper

import cord_ops
from cord_ops.atomic import write_bytes_atomic
from onnx_export.builder import IR_VERSION, OPSET, GraphBuilder, tensor_info
from onnx_export.calibrators import FAMILIES, family_of, for_float32_scores
from onnx_export.repair import CHANGED_FROM_RUNNER_UP, build_repair, on_boundary

INPUT = "scores"
OUTPUTS = ("repaired", "calibrated", "original", "label", "confidence")
#: What a server needs: the repaired row, its label and its confidence (``outputs="lean"``).
LEAN_OUTPUTS = ("repaired", "label", "confidence")
#: Metadata key listing the graph's outputs, comma-separated in graph order, so a logger,
#: registry or server can tell a lean model from a full one without opening a session.
OUTPUTS_KEY = "cord.outputs"


def _requested_outputs(outputs) -> tuple[str, ...]:
    """The output names asked for, in graph order: "full" (all of OUTPUTS), "lean"
    (LEAN_OUTPUTS) or a non-empty collection of names from OUTPUTS."""
    if isinstance(outputs, str):
        presets = {"full": OUTPUTS, "lean": LEAN_OUTPUTS}
        if outputs not in presets:
            raise ValueError(
                f"outputs: expected 'full', 'lean' or names from {OUTPUTS}, got {outputs!r}"
            )
        return presets[outputs]
    try:
        names = list(outputs)
    except TypeError:
        raise ValueError(
            f"outputs: expected 'full', 'lean' or names from {OUTPUTS}, got {outputs!r}"
        ) from None
    unknown = [name for name in names if name not in OUTPUTS]
    if unknown or not names or len(set(names)) != len(names):
        raise ValueError(
            f"outputs: expected distinct names from {OUTPUTS}, got {names!r}"
        )
    return tuple(name for name in OUTPUTS if name in names)


def prune_unused(nodes: list, initializers: list, keep: tuple[str, ...]) -> tuple[list, list]:
    """The nodes and initializers that ``keep`` depends on, in their original order (also
    used by :mod:`onnx_export.prior_shift` on a composed graph)."""
    needed, kept = set(keep), []
    for node in reversed(nodes):
        if needed.intersection(node.output):
            kept.append(node)
            needed.update(name for name in node.input if name)
    return kept[::-1], [init for init in initializers if init.name in needed]


def _check_fitted(calibrator, cord, n_classes: int, input_kind: str, dtype: str) -> None:
    if input_kind not in ("logits", "probs"):
        raise ValueError(f"input_kind: expected 'logits' or 'probs', got {input_kind!r}")
    if dtype not in ("float32", "float64"):
        raise ValueError(f"dtype: expected 'float32' or 'float64', got {dtype!r}")
    if not isinstance(n_classes, int | np.integer) or n_classes < 2:
        raise ValueError(f"n_classes: expected an integer >= 2, got {n_classes!r}")
    if not hasattr(calibrator, "n_classes_"):
        raise ValueError("calibrator: not fitted (no n_classes_); fit it before exporting")
    if not hasattr(cord, "eta_"):
        raise ValueError("cord: not fitted (no eta_); fit CORD before exporting")
    if calibrator.n_classes_ != n_classes or cord.n_classes_ != n_classes:
        raise ValueError(
            f"n_classes: expected {n_classes} to match the calibrator "
            f"({calibrator.n_classes_}) and CORD ({cord.n_classes_})"
        )
    if calibrator.input_kind != input_kind:
        raise ValueError(
            f"input_kind: the calibrator was fitted on {calibrator.input_kind!r}, "
            f"not {input_kind!r}"
        )
    if not np.isfinite(cord.eta_):
        raise ValueError(f"cord: eta_ must be finite, got {cord.eta_!r}")


def _label_and_original_float32(gb: GraphBuilder, source: str, input_kind: str,
                                with_original: bool) -> tuple[str, str]:
    """([N, 1] label, [N, 1] original probability of the label) of a float32 graph, and
    the ``original`` output when ``with_original``, with ``label`` strictly on top of it
    (see the module docstring).

    The label is the ArgMax of the input (first maximum: the tie rule). TopK, which also
    yields the runner-up, costs several ArgMaxes at small K in onnxruntime, so the runner-up
    probability is the maximum of the row with the label's entry zeroed, and only where
    ``original`` is built. The probability handed to the repair is the plain softmax entry
    either way, so a lean graph's outputs are the full graph's bit for bit."""
    label = gb.row_argmax(source, hint="label_col")
    if input_kind == "probs":
        # Same array, same tie rule: the input already is the original row.
        if with_original:
            gb.op("Identity", source, out="original")
        return label, gb.take(source, label, hint="p0_a")
    p = gb.softmax(source)
    p0_a = gb.take(p, label, hint="p0_a")
    if with_original:
        # Softmax is monotone, so the largest probability other than the label's is the
        # runner-up logit's; where rounding made it equal to the label's, that is raised.
        runner = gb.row_max(gb.put(p, label, gb.zeros_like(label), hint="p_others"))
        nudge = gb.const(1.0 + 2.0 * np.finfo(np.float32).eps)
        top = gb.op("Max", p0_a, gb.mul(runner, nudge), hint="p0_top")
        gb.put(p, label, top, out="original")
    return label, p0_a


#: At or below this eta*, a float32 graph computes q and the repair in float64 (module
#: docstring).
WIDE_REPAIR_BELOW_ETA = -0.5
#: Metadata key: the score widths the graph's input takes ("1,2" for binary, else K).
INPUT_WIDTHS_KEY = "cord.input_widths"


def input_widths(metadata: dict[str, str]) -> tuple[int, ...]:
    """The score widths a graph takes, from its metadata; graphs exported before
    ``cord.input_widths`` existed take exactly K."""
    text = metadata.get(INPUT_WIDTHS_KEY) or metadata["cord.n_classes"]
    return tuple(int(width) for width in text.split(","))


def _two_columns(gb: GraphBuilder, input_kind: str) -> str:
    """A binary graph's input as its two columns: the input itself when it has two, and
    one score column as ``cord_ops.validation.two_columns`` reads it (p clipped to [0, 1]
    -> [1 - p, p], margin m -> logits [0, m]), chosen by the input's width with Where (no
    branch, exact: either column is copied or computed, never mixed).

    Whether the input is one column is looked up in a table indexed by its width
    ([-, yes, no]), so a width above 2 fails in onnxruntime (index out of bounds) instead
    of being read as two columns."""
    width = gb.op("Gather", gb.op("Shape", INPUT), gb.const(1, "width_axis", dtype=np.int64,
                                                              rank0=True), axis=0)
    one_column = gb.op("Gather", gb.const(np.array([False, True, False]), "is_one_column",
                                          dtype=np.bool_), width, axis=0, hint="one_column")
    slice_axes = gb.const(np.array([1], dtype=np.int64), "slice_axes", dtype=np.int64)
    last = gb.op("Slice", INPUT, gb.const(np.array([-1], dtype=np.int64), "last",
                                          dtype=np.int64),
                 gb.const(np.array([2], dtype=np.int64), "end", dtype=np.int64), slice_axes,
                 hint="positive")
    first = gb.op("Slice", INPUT, gb.const(np.array([0], dtype=np.int64), "start",
                                           dtype=np.int64),
                  gb.const(np.array([1], dtype=np.int64), "stop", dtype=np.int64), slice_axes,
                  hint="first")
    if input_kind == "probs":
        # p within its rounding outside [0, 1] is clipped, as the loaders clip it
        # (cord_ops.validation.one_column_probabilities); Max/Min are exact.
        p = gb.op("Min", gb.op("Max", last, gb.const(0.0)), gb.const(1.0), hint="p_clipped")
        column0 = gb.op("Where", one_column, gb.sub(gb.const(1.0), p, hint="one_minus_p"),
                        first, hint="negative")
        column1 = gb.op("Where", one_column, p, last, hint="positive_column")
        return gb.op("Concat", column0, column1, hint="two_columns", axis=1)
    column0 = gb.op("Where", one_column, gb.sub(last, last, hint="zero_logit"), first,
                    hint="negative")
    return gb.op("Concat", column0, last, hint="two_columns", axis=1)


#: Metadata key: the binary decision threshold the graph's label and repair keep (absent
#: when the graph keeps the argmax).
THRESHOLD_KEY = "cord.decision_threshold"


def graph_threshold(cord) -> float | None:
    """The threshold a graph of ``cord`` is built for: None for the argmax, which a
    threshold of 1/2 is too (``cord_ops.threshold``: W_{1/2} is the identity)."""
    t = getattr(cord, "decision_threshold", None)
    return None if t is None or float(t) == 0.5 else float(t)


def _threshold_pipeline(gb: GraphBuilder, source: str, calibrator, input_kind: str,
                        eta: float, weight: float, t: float, keep: tuple[str, ...]) -> tuple:
    """(label, confidence) of a binary graph that keeps the decision at ``t``
    (``cord_ops.threshold``): everything in float64, as ``CORD.transform`` computes it.

    The rows are reweighted by w = (t, 1 - t) and renormalised (``label_free.reweighted``'s
    operations in its order), the label is their argmax, the repair runs on the reweighted
    rows and its output is reweighted back by (1 - t, t) (proportional to 1 / w). A float32
    graph casts the result down and then checks each row's decision at t (in float64, as
    cord_ops decides it): where the cast moved p1 across t (the repair leaves a margin of
    about 1e-12, far below float32's resolution), p1 and p0 are moved one float32 ulp or two
    apart toward the label's side (x (1 + 2^-23) up, x (1 - 2^-23) down: the exact product
    lies at least one ulp away, so it rounds past x); since the float64 row was on the
    label's side, the nudged entries are at least as far on it as the float64 ones, and the
    decision holds on every row."""
    family = family_of(calibrator)
    wide = gb if gb.dtype == np.float64 else gb.retyped("float64")
    narrow = wide is not gb
    x = wide.cast(source, np.float64) if narrow else source
    original = x if input_kind == "probs" else wide.softmax(x)
    w = wide.const(np.array([[t, 1.0 - t]]), "threshold_weights")
    # (1 - t, t): proportional to (1 / t, 1 / (1 - t)), as cord_ops.threshold.back_weights
    w_back = wide.const(np.array([[1.0 - t, t]]), "threshold_weights_back")

    def reweight(rows: str, by: str, hint: str) -> str:
        moved = wide.mul(rows, by)
        return wide.div(moved, wide.row_sum(moved), hint=hint)

    if "original" in keep:
        if narrow:
            gb.op("Cast", original, out="original", to=TensorProto.FLOAT)
        else:
            wide.op("Identity", original, out="original")
    original_w = reweight(original, w, "original_w")
    label = wide.row_argmax(original_w, hint="label_col")
    stored = for_float32_scores(calibrator) if narrow else calibrator
    q = family.build(wide, x, stored, out=None if narrow else "calibrated")
    if narrow:
        gb.op("Cast", q, out="calibrated", to=TensorProto.FLOAT)
    q_w = reweight(q, w, "calibrated_w")
    changed = wide.op("Not", wide.op("Equal", wide.row_argmax(q_w), label), hint="changed")
    repaired_w, _ = build_repair(wide, wide.take(original_w, label),
                                 on_boundary(wide, original_w), q_w, label, changed, eta,
                                 weight, 2, out=wide.fresh("repaired_w"))
    if not narrow:
        repaired = reweight(repaired_w, w_back, "repaired_back")
        repaired = gb.op("Identity", repaired, out="repaired")
        return label, gb.take(repaired, label, hint="confidence_col")
    cast = gb.cast(reweight(repaired_w, w_back, "repaired_back"), np.float32, hint="cast")
    decided = wide.row_argmax(reweight(wide.cast(cast, np.float64), w, "check_w"))
    wrong = gb.op("Not", gb.op("Equal", decided, label), hint="decision_moved")
    eps = float(np.finfo(np.float32).eps)
    up, down = 1.0 + eps, 1.0 - eps
    positive = gb.op("Equal", label, gb.const(1, "one_label", dtype=np.int64))
    factors = gb.op("Where", positive, gb.const(np.array([[down, up]]), "toward_1"),
                    gb.const(np.array([[up, down]]), "toward_0"), hint="nudge")
    repaired = gb.op("Where", wrong, gb.mul(cast, factors), cast, out="repaired")
    return label, gb.take(repaired, label, hint="confidence_col")


def export_onnx(calibrator, cord, n_classes: int, input_kind: str = "logits",
                dtype: str = "float32", outputs="full") -> onnx.ModelProto:
    """Build the pipeline graph of a fitted calibrator and a fitted ``cord_ops.CORD``.

    Parameters
    ----------
    calibrator : a fitted ``cord_ops.calibrators`` calibrator (any of the eleven families)
    cord : a fitted ``cord_ops.CORD``; its ``eta_`` and ``local_weight`` are baked in
    n_classes : K, checked against both
    input_kind : "logits" or "probs", what ``scores`` holds; must be the calibrator's
    dtype : "float32" or "float64", the dtype of the input, the outputs and the arithmetic
    outputs : "full" (default: all five outputs), "lean" (``repaired``, ``label``,
        ``confidence``: what a server needs) or a collection of names from OUTPUTS. Only
        the operations the chosen outputs depend on stay in the graph; every output kept
        is the same, bit for bit, as in the full graph. The metadata key ``cord.outputs``
        lists them.

    A binary graph (K = 2) takes ``scores`` of width 1 or 2 (``[N, width]``): one score
    column is expanded in the graph as the loaders expand it (``_two_columns``);
    metadata ``cord.input_widths`` says which widths the input takes.

    Returns a model that passes ``onnx.checker.check_model(full_check=True)``.
    """
    _check_fitted(calibrator, cord, n_classes, input_kind, dtype)
    keep = _requested_outputs(outputs)
    family = family_of(calibrator)
    gb = GraphBuilder(dtype)
    gb.fresh(INPUT)
    k = int(n_classes)
    eta, weight = float(cord.eta_), float(cord.local_weight)
    source = _two_columns(gb, input_kind) if k == 2 else INPUT
    threshold = graph_threshold(cord)

    if threshold is not None:
        label, confidence = _threshold_pipeline(gb, source, calibrator, input_kind, eta,
                                                weight, threshold, keep)
    elif dtype == "float64":
        original = (gb.op("Identity", source, out="original") if input_kind == "probs"
                    else gb.softmax(source, out="original"))
        label = gb.row_argmax(original, hint="label_col")
        q = family.build(gb, source, calibrator, out="calibrated")
        changed = gb.op("Not", gb.op("Equal", gb.row_argmax(q), label), hint="changed")
        _, confidence = build_repair(gb, gb.take(original, label), on_boundary(gb, original),
                                     q, label, changed, eta, weight, k)
    else:
        label, p0_a = _label_and_original_float32(gb, source, input_kind, "original" in keep)
        if family.float64_inside or eta <= WIDE_REPAIR_BELOW_ETA:
            wide = gb.retyped("float64")
            q = family.build(wide, wide.cast(source, np.float64),
                             for_float32_scores(calibrator))
            changed = gb.op("Not", gb.op("Equal", gb.row_argmax(q), label), hint="changed")
            gb.op("Cast", q, out="calibrated", to=TensorProto.FLOAT)
            _, confidence = build_repair(wide, wide.cast(p0_a, np.float64), None, q, label,
                                         changed, eta, weight, k, out_dtype=np.float32)
        else:
            q = family.build(gb, source, calibrator, out="calibrated")
            changed = None if family.keeps_top1 else CHANGED_FROM_RUNNER_UP
            _, confidence = build_repair(gb, p0_a, None, q, label, changed, eta, weight, k)

    flat = gb.const(np.array([-1], dtype=np.int64), "flat", dtype=np.int64)
    gb.op("Reshape", label, flat, out="label")
    gb.op("Reshape", confidence, flat, out="confidence")

    elem = gb.onnx_dtype
    info = {"repaired": tensor_info("repaired", elem, ["N", k]),
            "calibrated": tensor_info("calibrated", elem, ["N", k]),
            "original": tensor_info("original", elem, ["N", k]),
            "label": tensor_info("label", TensorProto.INT64, ["N"]),
            "confidence": tensor_info("confidence", elem, ["N"])}
    nodes, initializers = prune_unused(gb.nodes, gb.initializers, keep)
    graph = helper.make_graph(
        nodes,
        f"cord_{calibrator.name}_{dtype}",
        [tensor_info(INPUT, elem, ["N", "width" if k == 2 else k])],
        [info[name] for name in keep],
        initializer=initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="cord-ops", producer_version=cord_ops.__version__,
                              ir_version=IR_VERSION)
    helper.set_model_props(model, {
        "cord.eta_star": repr(float(cord.eta_)),
        "cord.calibrator": calibrator.name,
        "cord.n_classes": str(k),
        "cord.version": cord_ops.__version__,
        "cord.input_kind": input_kind,
        "cord.dtype": dtype,
        OUTPUTS_KEY: ",".join(keep),
        INPUT_WIDTHS_KEY: "1,2" if k == 2 else str(k),
        **({} if getattr(cord, "decision_threshold", None) is None
           else {THRESHOLD_KEY: repr(float(cord.decision_threshold))}),
    })
    onnx.checker.check_model(model, full_check=True)
    return model


def compute_itemsize(metadata: dict[str, str]) -> int | None:
    """Bytes per element of the [N, K] intermediates of an exported graph, from its
    metadata: 8 where it computes in float64 (a float64 graph, a family with
    ``float64_inside``, or eta* <= WIDE_REPAIR_BELOW_ETA), 4 otherwise; None for a model
    without cord metadata."""
    try:
        dtype, name = metadata["cord.dtype"], metadata["cord.calibrator"]
        eta = float(metadata["cord.eta_star"])
        wide = FAMILIES[name].float64_inside
    except (KeyError, ValueError):
        return None
    thresholded = metadata.get(THRESHOLD_KEY) not in (None, "0.5")
    return 8 if dtype == "float64" or wide or thresholded or eta <= WIDE_REPAIR_BELOW_ETA else 4


def save_model(model: onnx.ModelProto, path) -> Path:
    """Write ``model`` to ``path`` atomically (temp file in the same folder, then rename)."""
    return write_bytes_atomic(path, model.SerializeToString())


def load_model(path) -> onnx.ModelProto:
    """Read and check a model file; a missing, corrupt or invalid file raises ValueError."""
    path = Path(path)
    try:
        model = onnx.load_model(str(path))
        onnx.checker.check_model(model, full_check=True)
    except (OSError, ValueError, DecodeError, onnx.checker.ValidationError,
            onnx.shape_inference.InferenceError) as exc:
        raise ValueError(f"{path}: not a valid ONNX model ({exc})") from exc
    return model


def model_metadata(model: onnx.ModelProto) -> dict[str, str]:
    """The model's metadata_props as a dict."""
    return {prop.key: prop.value for prop in model.metadata_props}


def pipeline_input(model: onnx.ModelProto, model_path) -> tuple[int, str]:
    """A pipeline model's (n_classes, input_kind); ValueError naming ``model_path`` when
    its metadata does not say (not a cord-ops pipeline model)."""
    meta = model_metadata(model)
    try:
        return int(meta["cord.n_classes"]), meta["cord.input_kind"]
    except (KeyError, ValueError) as exc:
        raise ValueError(f"{model_path}: not a cord-ops pipeline model (metadata {exc})") from exc
