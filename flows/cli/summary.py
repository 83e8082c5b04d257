"""What a recalibration prints when it is done (``recalibrate``, ``demo``, and ``monitor``
when drift started one): the summary table, the family chosen, the gate's decision, the
repair's effect, the timings and the commands to run next."""

from __future__ import annotations

import time
from pathlib import Path

from flows import inputs

#: The table's columns: (title, metric key of a report).
SUMMARY_METRICS = (("ECE", "ece"), ("NLL", "nll"), ("Brier", "brier"),
                   ("accuracy", "accuracy"), ("TPCR", "tpcr"))


def summary_table(result) -> str:
    """The closing table: uncal / base / cord by ECE, NLL, Brier, accuracy, TPCR, and eta*."""
    header = f"{'report':<8}" + "".join(f"{title:>11}" for title, _ in SUMMARY_METRICS)
    lines = [header, "-" * len(header)]
    uncal = result.reports["uncal"]["nll"]
    for report in ("uncal", "base", "cord"):
        values = result.reports[report]
        # Worse than the classifier itself beyond rounding (the gate's 1e-6 relative).
        harm = report != "uncal" and values["nll"] > uncal + 1e-6 * abs(uncal)
        lines.append(f"{report:<8}" + "".join(f"{values[key]:>11.5f}"
                                              for _, key in SUMMARY_METRICS)
                     + ("  ! NLL worse than uncal" if harm else ""))
    lines.append(f"eta* = {result.eta_star!r}")
    return "\n".join(lines)


def predict_hint(data) -> str:
    """``--input ... --output ...`` of the suggested ``predict``, of the kind the run read:
    a folder or glob of shards scores into a new folder, a Parquet file into Parquet."""
    if data is not None and inputs.is_batch_input(data):
        return "--input FOLDER --output NEW_FOLDER"
    if data is not None and Path(str(data)).suffix.lower() in (".parquet", ".pq"):
        return "--input FILE.parquet --output OUT.parquet"
    return "--input FILE.npz --output OUT.npz"


def next_steps(result, total_seconds: float, data=None) -> str:
    """Where the run, the model and the timings are, and what to run next (``data``: what
    the run read, so the suggested ``predict`` takes the same kind of input)."""
    decision = result.decision
    alias = (f"-> {result.model_name}@champion" if decision.promote
             else f"(@champion unchanged: {decision.reason})")
    compute = sum(result.timings.values())
    return "\n".join([
        f"gate:     v{result.version} {decision.label} {alias}",
        f"          candidate NLL {decision.candidate_nll:.6g}, champion NLL "
        f"{'-' if decision.champion_nll is None else f'{decision.champion_nll:.6g}'}",
        *_reference_line(decision),
        *_repair_lines(result),
        *_warning_lines(result),
        *[f"{'input:' if i == 0 else '':<10}{note}"
          for i, note in enumerate(getattr(result, "input_notes", None) or [])],
        f"onnx:     max |onnx - cord_ops| = {result.onnx_max_abs_diff:.3g}",
        f"time:     {total_seconds:.1f} s total, {compute:.1f} s in flow tasks, "
        f"{total_seconds - compute:.1f} s start-up and orchestration",
        f"tracking: {result.tracking_uri} (run {result.run_id})",
        "next:     cord-ops ui    # browse runs, metrics, reliability diagrams",
        *_serving_step(result, data),
    ])


def _serving_step(result, data) -> list[str]:
    """The ``predict`` to run next, or, when the model has no champion after this run,
    why not and the ``promote`` that would make this version serve."""
    decision = result.decision
    if decision.promote or decision.champion_version is not None:
        return [f"          cord-ops predict --model models:/{result.model_name}@champion "
                f"{predict_hint(data)}"]
    from flows.store import registry

    tags = {registry.REASON_TAG: decision.reason, registry.DECISION_TAG: decision.label,
            registry.HARMS_TAG: str(bool(decision.harms)).lower()}
    return [f"          no @champion yet: "
            f"{inputs.refusal_and_next_step(result.model_name, str(result.version), tags)}"]


def _reference_line(decision) -> list[str]:
    ref = decision.reference
    if ref is None:
        return []
    if ref.problem:
        return [f"          champion v{ref.version}'s reference split not used: {ref.problem}"]
    return [f"          on champion v{ref.version}'s reference split: candidate NLL "
            f"{ref.candidate_nll:.6g}, champion NLL {ref.champion_nll:.6g}"]


def _repair_lines(result) -> list[str]:
    """What the CORD repair did on the evaluation split: rows moved, pinned onto
    the decision boundary, made one constant, and a binary model's AUC before and after."""
    effect = getattr(result, "repair", None) or {}
    if not effect:
        return []
    t = getattr(result, "decision_threshold", None)
    boundary = "the decision boundary" if t is None else f"the threshold p1 = {t:g}"
    line = (f"repair:   moved {effect['moved_share']:.1%} of the outputs, "
            f"{effect['boundary_share']:.1%} onto {boundary}")
    if effect["flat_share"] > 0:
        line += f", {effect['flat_share']:.1%} to one value {effect['flat_value']!r}"
    lines = [line]
    if t is not None:
        lines.append(f"          decisions kept at p1 >= {t:g} (label, accuracy and TPCR are "
                     "of those decisions)")
    if "auc_uncal" in effect:
        lines.append(f"          AUC {effect['auc_uncal']:.4f} uncalibrated, "
                     f"{effect['auc_base']:.4f} calibrated, {effect['auc_cord']:.4f} "
                     "after CORD")
    return lines


def _warning_lines(result) -> list[str]:
    found = getattr(result, "warnings", None) or []
    return [f"{'warnings:' if i == 0 else '':<10}{text}" for i, text in enumerate(found)]


def selection_lines(result) -> list[str]:
    """The family fitted and how it was chosen; when it was cross-validated, every
    candidate best first, the fitted one marked ``*`` (:mod:`flows.recalibrate.selection`)."""
    choice = getattr(result, "choice", None)
    if choice is None:
        return []
    lines = [f"family:   {choice.family} ({choice.how})"]
    if choice.selection is not None:
        table = choice.selection.table().splitlines()
        # The table marks the cross-validation's choice; after a fall-back, identity's row.
        lines += ["          " + (("*" + line[1:]) if line[2:].split()[:1] == [choice.family]
                                 else (" " + line[1:])) for line in table]
    return lines


def print_result(result, started: float, data=None) -> None:
    """Everything above, after a blank line; ``started``: the command's start
    (``time.perf_counter``), ``data``: what the run read."""
    print()
    if getattr(result, "skipped", None):
        print(f"skipped:  {result.skipped}")
        print(f"tracking: {result.tracking_uri} (run {result.run_id})")
        return
    print(summary_table(result))
    print()
    chosen = selection_lines(result)
    if chosen:
        print("\n".join(chosen))
        print()
    print(next_steps(result, time.perf_counter() - started, data))
