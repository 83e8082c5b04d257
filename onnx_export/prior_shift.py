"""A registered champion's graph moved to new class priors, decisions kept: the graph of a
label-free prior-shift candidate (:class:`cord_ops.prior_shift.PriorShiftRepair`).

The champion's graph already computes ``original`` (the classifier's probabilities), its
top-1 ``label`` and ``repaired`` (the champion's calibrated, CORD-repaired rows). The
candidate appends, per row,

- q = normalise(w * repaired) with the fitted weights ``w = pi^t / pi^s`` baked in, a row
  the weights send to zero everywhere kept as it was (``cord_ops.label_free.reweighted``);
- a second CORD repair of q against ``original`` (``onnx_export.repair.build_repair``)
  with the second fit's eta* baked in, so every top-1 stays the classifier's.

Outputs keep the champion's names and meaning: ``repaired`` is the candidate's row,
``calibrated`` (where the champion has it) the reweighted q before its repair, as an
exported pipeline's ``calibrated`` is q before the repair; ``original`` and ``label`` are
the champion's; ``confidence`` is ``repaired[label]``.

The appended stage computes in float64 whatever the graph's dtype (a float32 graph casts
the champion's two outputs up and the results down): the weights can be as small as a
prior ratio makes them, and the second eta* can be anywhere, including below
``WIDE_REPAIR_BELOW_ETA``, where only float64 resolves the tail as cord_ops does. It is a
handful of [N, K] passes after the champion's own.
"""

from __future__ import annotations

import hashlib

import numpy as np
import onnx
from onnx import helper

from cord_ops.label_free import check_priors, prior_weights
from onnx_export.builder import GraphBuilder, tensor_info
from onnx_export.export import OUTPUTS_KEY, model_metadata, prune_unused
from onnx_export.repair import build_repair, on_boundary

#: Metadata keys of a candidate graph (besides the champion's, which it keeps).
PRIOR_SHIFT_KEY = "cord.prior_shift"
SOURCE_VERSION_KEY = "cord.prior_shift.source_version"
ETA_KEY = "cord.prior_shift.eta_star"
LOCAL_WEIGHT_KEY = "cord.prior_shift.local_weight"
PRIORS_DIGEST_KEY = "cord.prior_shift.priors_sha256"
#: The value of ``cord.prior_shift``: no label has checked this graph.
LABEL_FREE = "label-free candidate"
#: Where the champion's outputs this graph replaces live on inside it.
CHAMPION_PREFIX = "champion/"
STAGE_PREFIX = "prior_shift/"
REQUIRED = ("repaired", "original", "label")


def priors_digest(source_priors, target_priors) -> str:
    """SHA-256 of the float64 bytes of the source then the target priors."""
    source = np.ascontiguousarray(source_priors, dtype=np.float64)
    target = np.ascontiguousarray(target_priors, dtype=np.float64)
    return hashlib.sha256(source.tobytes() + target.tobytes()).hexdigest()


def _checked(champion: onnx.ModelProto, repair, source_priors) -> tuple[int, np.ndarray]:
    outputs = {o.name: o for o in champion.graph.output}
    missing = [name for name in REQUIRED if name not in outputs]
    if missing:
        raise ValueError(f"champion graph: has no output {', '.join(map(repr, missing))} "
                         f"(outputs {sorted(outputs)}); a prior-shift candidate needs the "
                         "champion's 'repaired', 'original' and 'label'")
    if not hasattr(repair, "cord_"):
        raise ValueError("repair: not fitted (no cord_); fit PriorShiftRepair first")
    dims = outputs["repaired"].type.tensor_type.shape.dim
    k = dims[-1].dim_value if dims and dims[-1].HasField("dim_value") else None
    weights = np.asarray(repair.weights_, dtype=np.float64)
    if k is None or weights.shape != (k,) or repair.cord_.n_classes_ != k:
        raise ValueError(f"repair: fitted for {weights.size} classes, the champion graph's "
                         f"'repaired' has {k}")
    if not np.isfinite(repair.cord_.eta_):
        raise ValueError(f"repair: eta_ must be finite, got {repair.cord_.eta_!r}")
    try:
        source = check_priors(source_priors, k, "source_priors")
    except ValueError as exc:
        raise ValueError(f"{exc} (for a candidate of {k} classes)") from None
    if not np.array_equal(prior_weights(source, repair.priors_), weights):
        raise ValueError("source_priors: do not give the repair's weights with its target "
                         "priors (pi^t / pi^s); pass the priors it was fitted with")
    taken = {name for node in champion.graph.node for name in (*node.input, *node.output)}
    taken |= {init.name for init in champion.graph.initializer}
    clash = sorted(n for n in taken if n.startswith((CHAMPION_PREFIX, STAGE_PREFIX)))
    if clash:
        raise ValueError(f"champion graph: already has tensors named {clash[:3]}; it is "
                         "itself a prior-shift candidate or clashes with one")
    return k, weights


def export_prior_shift(champion: onnx.ModelProto, repair, source_priors,
                       source_version: str) -> onnx.ModelProto:
    """The candidate graph of ``champion`` (version ``source_version``'s graph, as
    registered) moved by the fitted ``repair`` (:class:`cord_ops.prior_shift.PriorShiftRepair`,
    fitted on that graph's ``original`` and ``repaired`` with ``source_priors``).

    Same input, same output names and dtypes; metadata is the champion's plus
    ``cord.prior_shift`` (:data:`LABEL_FREE`), ``cord.prior_shift.source_version``,
    ``cord.prior_shift.eta_star`` (repr), ``cord.prior_shift.local_weight`` and
    ``cord.prior_shift.priors_sha256`` (:func:`priors_digest`). ``cord.eta_star`` stays
    the champion's (its own repair is the graph's first). Raises ValueError when the
    champion lacks ``repaired``/``original``/``label``, K differs, or the priors do not
    give the repair's weights.
    """
    k, weights = _checked(champion, repair, source_priors)
    outputs = {o.name: o for o in champion.graph.output}
    elem = outputs["repaired"].type.tensor_type.elem_type
    out_dtype = np.dtype(helper.tensor_dtype_to_np_dtype(elem))
    wide_out = None if out_dtype == np.float64 else out_dtype

    # The champion's repaired, calibrated and confidence become internal tensors.
    renamed = {name: CHAMPION_PREFIX + name for name in ("repaired", "calibrated", "confidence")}
    nodes = []
    for node in champion.graph.node:
        node = onnx.NodeProto.FromString(node.SerializeToString())
        for seq in (node.input, node.output):
            for i, name in enumerate(seq):
                if name in renamed:
                    seq[i] = renamed[name]
        nodes.append(node)

    gb = GraphBuilder("float64", prefix=STAGE_PREFIX)
    lifted = {}
    for name, tensor in (("repaired", renamed["repaired"]), ("original", "original")):
        lifted[name] = tensor if wide_out is None else gb.cast(tensor, np.float64, hint=name)
    label = gb.op("Reshape", "label", gb.const(np.array([-1, 1], dtype=np.int64), "col",
                                               dtype=np.int64), hint="label_col")
    p0, base = lifted["original"], lifted["repaired"]
    if np.all(weights == weights[0]) and weights[0] > 0:
        # reweighted() returns the rows as they are for equal weights: no renormalisation.
        q = base
    else:
        scaled = gb.mul(base, gb.const(weights.reshape(1, k), "weights"), hint="weighted")
        sums = gb.row_sum(scaled, hint="weighted_sum")
        dead = gb.op("LessOrEqual", sums, gb.const(0.0), hint="dead_row")
        q = gb.div(gb.op("Where", dead, base, scaled, hint="kept_rows"),
                   gb.op("Where", dead, gb.const(1.0), sums, hint="row_norm"), hint="q")
    changed = gb.op("Not", gb.op("Equal", gb.row_argmax(q), label), hint="changed")
    cord = repair.cord_
    _, confidence = build_repair(gb, gb.take(p0, label, hint="p0_a"), on_boundary(gb, p0), q,
                                 label, changed, float(cord.eta_), float(cord.local_weight), k,
                                 out_dtype=wide_out)
    if "calibrated" in outputs:
        if wide_out is None:
            gb.op("Identity", q, out="calibrated")
        else:
            gb.op("Cast", q, out="calibrated", to=elem)
    gb.op("Reshape", confidence, gb.const(np.array([-1], dtype=np.int64), "flat",
                                          dtype=np.int64), out="confidence")

    keep = tuple(o.name for o in champion.graph.output)
    kept, initializers = prune_unused(nodes + gb.nodes,
                                list(champion.graph.initializer) + gb.initializers, keep)
    graph_outputs = []
    for o in champion.graph.output:
        dims = [d.dim_value if d.HasField("dim_value") else d.dim_param
                for d in o.type.tensor_type.shape.dim]
        graph_outputs.append(tensor_info(o.name, o.type.tensor_type.elem_type, dims))
    graph = helper.make_graph(kept, f"{champion.graph.name}_prior_shift",
                              list(champion.graph.input), graph_outputs,
                              initializer=initializers)
    model = helper.make_model(graph, opset_imports=list(champion.opset_import),
                              producer_name=champion.producer_name,
                              producer_version=champion.producer_version,
                              ir_version=champion.ir_version)
    meta = model_metadata(champion)
    meta.update({PRIOR_SHIFT_KEY: LABEL_FREE, SOURCE_VERSION_KEY: str(source_version),
                 ETA_KEY: repr(float(cord.eta_)),
                 LOCAL_WEIGHT_KEY: repr(float(cord.local_weight)),
                 PRIORS_DIGEST_KEY: priors_digest(source_priors, repair.priors_),
                 OUTPUTS_KEY: ",".join(keep)})
    helper.set_model_props(model, meta)
    onnx.checker.check_model(model, full_check=True)
    return model
