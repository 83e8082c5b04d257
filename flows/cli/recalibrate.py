"""``cord-ops recalibrate``: fit a calibrator and CORD on a file (or Parquet shards on Dask),
export ONNX, register and gate.

:func:`validate` reads and checks everything once into a :class:`Request` (the loaded
``Dataset`` among it); :func:`run` hands that dataset to the flow
(:func:`flows.files.preloaded`), so the file is read once per command. The
flow keeps its parameters (the deployments' contract): :meth:`Request.flow_kwargs` builds
them.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flows import inputs
from flows.cli import summary
from flows.cli.context import Invocation, flow_context
from flows.cli.parser import FlowOptions, GateOptions, add_flow_options, add_gate_options


@dataclass(frozen=True)
class Shards:
    """``--data`` names Parquet shards (or a Dask scheduler is given): the Dask options,
    the scheduler's address checked."""

    dask_address: str | None
    dask_workers: int
    eval_sample: int


@dataclass(frozen=True)
class Request:
    """A recalibration, checked. ``dataset`` / ``evaluation``: ``--data`` / ``--eval-data``
    loaded and checked (on shards: the shard set, footers only, and no evaluation file)."""

    invocation: Invocation
    data: Path
    eval_data: Path | None
    options: FlowOptions
    gate: GateOptions
    promote: bool
    decision_threshold: float | None
    dataset: Any
    evaluation: Any
    shards: Shards | None

    def flow_kwargs(self, lock: str) -> dict:
        """The recalibration flow's keyword arguments; ``lock``: the registry lock's kind."""
        shards = ({"dask_address": self.shards.dask_address,
                   "dask_workers": self.shards.dask_workers,
                   "eval_sample": self.shards.eval_sample} if self.shards is not None else {})
        return {"data": str(self.data),
                "eval_data": None if self.eval_data is None else str(self.eval_data),
                "promote": self.promote, "tracking_uri": self.invocation.tracking_uri,
                "lock": lock, "decision_threshold": self.decision_threshold,
                **self.options.flow_kwargs(), **self.gate.as_dict(), **shards}


def add_parser(sub) -> None:
    """``recalibrate``: fit, export, register and gate (a file, or shards on Dask)."""
    p = sub.add_parser("recalibrate", help="fit calibrator + CORD, export ONNX, register, gate")
    p.add_argument("--data", required=True, type=Path,
                   help=".npz or .parquet with logits|probs and labels, or a folder or glob "
                        "of Parquet shards (fitted on Dask, docs/scale.md)")
    p.add_argument("--eval-data", type=Path,
                   help="separate evaluation .npz/.parquet (then all of --data calibrates)")
    p.add_argument("--dask-address", help="shards: scheduler of an existing Dask cluster "
                                          "(default: a local cluster)")
    p.add_argument("--dask-workers", type=int, default=2,
                   help="shards: processes of the local cluster (default: 2)")
    p.add_argument("--eval-sample", type=int, default=inputs.DEFAULT_EVAL_SAMPLE,
                   help="shards: evaluation rows gathered for ONNX parity, the reference "
                        "split and the gate (default: %(default)s)")
    add_flow_options(p)
    add_gate_options(p)
    p.add_argument("--no-promote", action="store_true",
                   help="record the gate decision but never move @champion")
    p.add_argument("--decision-threshold", type=float, default=None, metavar="T",
                   help="binary models: keep the decision p1 >= T the operator takes "
                        "instead of the argmax (0.5); baked into the graph and its label "
                        "(default: the argmax)")


def validate(args: argparse.Namespace, invocation: Invocation) -> Request:
    """Files, arrays and options of a recalibration, each read and checked once."""
    if args.dask_address is not None or inputs.is_batch_input(args.data):
        return _validate_shards(args, invocation)
    inputs.data_file(args.data, "--data")
    inputs.data_file(args.eval_data, "--eval-data")
    options = FlowOptions.read(args)
    gate = GateOptions.read(args)
    dataset, evaluation = load_and_check(invocation.tracking_uri, args.data, args.eval_data,
                                         options, gate, args.decision_threshold)
    return Request(invocation, args.data, args.eval_data, options, gate, not args.no_promote,
                   args.decision_threshold, dataset, evaluation, None)


def load_and_check(tracking_uri: str, data: Path, eval_data: Path | None,
                   options: FlowOptions, gate: GateOptions | None = None,
                   decision_threshold: float | None = None):
    """``data`` and ``eval_data`` (files that passed :func:`flows.inputs.data_file`) loaded,
    checked against the options a recalibration of them would refuse
    (:func:`flows.inputs.check_recalibration`) and against the champion's classes and
    input kind; returns (dataset, evaluation or None)."""
    dataset = inputs.load_data(data, options.input_kind)
    evaluation = None if eval_data is None else inputs.load_data(eval_data, dataset.input_kind)
    inputs.check_recalibration(dataset, evaluation, options.calibrator, options.fraction,
                               options.seed, None if gate is None else gate.as_dict(),
                               decision_threshold)
    inputs.champion_reads(tracking_uri, options.model_name, dataset)
    return dataset, evaluation


def _validate_shards(args: argparse.Namespace, invocation: Invocation) -> Request:
    """Shards (footers only), options, the scheduler's address."""
    options = FlowOptions.read(args)
    if args.decision_threshold is not None:
        raise inputs.InputError("--decision-threshold: not available on shards (the repair "
                                "in the threshold's space is fitted on one process's rows)")
    if args.dask_workers < 1:
        raise inputs.InputError(f"--dask-workers: expected a positive integer, got "
                                f"{args.dask_workers}")
    inputs.shard_options(args.calibrator, args.eval_sample)
    address = inputs.dask_scheduler(args.dask_address)
    from flows.shards.plan import plan_shards

    try:
        plan = plan_shards(args.data, args.eval_data, args.input_kind, args.seed,
                           args.fraction)
    except (ValueError, TypeError, OSError) as exc:
        raise inputs.InputError(str(exc)) from exc
    gate = GateOptions.read(args)
    inputs.check_shard_recalibration(plan, args.calibrator, args.eval_sample, gate.as_dict())
    inputs.champion_reads(invocation.tracking_uri, args.model_name, plan.data)
    return Request(invocation, args.data, args.eval_data, options, gate, not args.no_promote,
                   None, plan.data, None, Shards(address, args.dask_workers, args.eval_sample))


def run(request: Request) -> int:
    from flows.files import preloaded
    from flows.recalibrate.flow import recalibrate

    loaded = [] if request.shards is not None else [
        (request.data, request.options.input_kind, request.dataset),
        *([] if request.evaluation is None else
          [(request.eval_data, request.dataset.input_kind, request.evaluation)])]
    with (flow_context(request.invocation, request.options.store_timeout) as flows,
          preloaded(*loaded)):
        result = recalibrate(**request.flow_kwargs(flows.lock))
        summary.print_result(result, request.invocation.started, request.data)
    return 0
