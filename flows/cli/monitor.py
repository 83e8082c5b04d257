"""``cord-ops monitor``: score @champion on a batch. A labelled file runs the labelled monitor
(:func:`flows.monitor.labelled.monitor`, recalibrating on drift); a file without labels, a
folder or a glob runs the label-free one (:mod:`flows.cli.label_free`).

:func:`validate` reads the batch once into a :class:`Request`; :func:`run` hands it to the
flow (:func:`flows.files.preloaded`), whose parameters stay the deployments'.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flows import inputs
from flows.cli import label_free as label_free_cli
from flows.cli import summary
from flows.cli.context import Invocation, flow_context
from flows.cli.parser import (
    DriftThresholds,
    FlowOptions,
    GateOptions,
    add_flow_options,
    add_gate_options,
    add_thresholds,
)
from flows.errors import CordOpsError


@dataclass(frozen=True)
class Request:
    """A labelled monitoring run, checked (``batch``: ``--data`` loaded), or, with
    ``label_free``, the label-free one (then the other fields are None)."""

    invocation: Invocation
    data: Path
    store_timeout: float
    label_free: label_free_cli.Request | None = None
    options: FlowOptions | None = None
    gate: GateOptions | None = None
    thresholds: DriftThresholds | None = None
    recalibrate_on_drift: bool = True
    batch: Any = None

    def flow_kwargs(self) -> dict:
        """The labelled monitoring flow's keyword arguments."""
        options = self.options
        return {"data": str(self.data), "model_name": options.model_name,
                "max_ece_increase": self.thresholds.max_ece_increase,
                "max_nll_increase": self.thresholds.max_nll_increase,
                "input_kind": options.input_kind,
                "recalibrate_on_drift": self.recalibrate_on_drift,
                "calibrator": options.calibrator, "fraction": options.fraction,
                "seed": options.seed, "dtype": options.dtype,
                "gate_options": self.gate.as_dict(),
                "tracking_uri": self.invocation.tracking_uri}


def add_parser(sub) -> None:
    """``monitor``: score @champion on a batch, labelled or not."""
    p = sub.add_parser("monitor", help="score @champion on a labelled batch (recalibrate on "
                                       "drift) or on batches without labels (estimate, alert)")
    p.add_argument("--data", required=True, type=Path,
                   help="labelled batch (.npz or .parquet); or a file without labels, a folder "
                        "or a glob: label-free monitoring (exit 3 on an alert)")
    add_thresholds(p)
    label_free_cli.add_options(p)
    label_free_cli.add_labels_option(p)
    p.add_argument("--no-recalibrate", action="store_true",
                   help="only report drift, never start a recalibration")
    add_flow_options(p)
    add_gate_options(p)


def validate(args: argparse.Namespace, invocation: Invocation) -> Request:
    from flows.store.registry import CHAMPION

    uri = invocation.tracking_uri
    if not inputs.is_batch_input(args.data):
        inputs.data_file(args.data, "--data")
    # Either monitor scores @champion: without one, a second's answer, before the batch loads.
    inputs.registered_model(uri, args.model_name, CHAMPION)
    if label_free_cli.is_label_free(args.data, args.labels):
        return Request(invocation, args.data, args.store_timeout,
                       label_free=label_free_cli.validate(args, uri))
    if args.register_candidate:
        raise inputs.InputError(f"--register-candidate: {args.data} holds labels; a "
                                "prior-shift candidate is registered from a batch without "
                                "them (a labelled batch recalibrates through the gate)")
    inputs.data_file(args.data, "--data")
    options = FlowOptions.read(args)
    thresholds = DriftThresholds.read(args)
    gate = GateOptions.read(args)
    batch = inputs.load_data(args.data, args.input_kind)
    inputs.champion_reads(uri, args.model_name, batch)
    inputs.check_recalibration(batch, None, args.calibrator, args.fraction, args.seed,
                               gate.as_dict())
    return Request(invocation, args.data, args.store_timeout, None, options, gate, thresholds,
                   not args.no_recalibrate, batch)


def run(request: Request) -> int:
    with flow_context(request.invocation, request.store_timeout):
        if request.label_free is not None:
            return label_free_cli.run(request.label_free)
        return _run_labelled(request)


def _run_labelled(request: Request) -> int:
    from flows.files import preloaded
    from flows.monitor.labelled import monitor

    with preloaded((request.data, request.options.input_kind, request.batch)):
        result = monitor(**request.flow_kwargs())
    uri, name = request.invocation.tracking_uri, request.options.model_name
    if result is None:  # the champion went away between the check and the run
        raise CordOpsError(f"model '{name}' has no @champion in {uri}")
    print(f"champion v{result.champion_version} on {request.data}:")
    for metric in ("ece", "nll"):
        print(f"  {metric}: {result.metrics[metric]:.5f} (baseline "
              f"{result.baseline[metric]:.5f}, drift {result.drift[metric]:+.5f})")
    print("drift: " + ("; ".join(result.reasons) if result.reasons else "none"))
    for run_id, values in result.settled.items():
        print(f"labels met label-free run {run_id}: realised accuracy "
              f"{values['realised.accuracy']:.4f}, CBPE error {values['error.cbpe']:+.4f}")
        if values.get("verdict"):  # the prior-shift candidate's, as recorded on it
            print(f"  prior-shift candidate: {values['verdict']}")
    if result.recalibration is not None:
        summary.print_result(result.recalibration, request.invocation.started, request.data)
    return 0
