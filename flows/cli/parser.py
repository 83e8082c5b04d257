"""The ``cord-ops`` argument parser: :func:`build_parser` puts together the subparsers the
command modules add (handed in by :mod:`flows.cli.main`, so this module imports no
command), and the option groups several commands share: each group's options
(``add_flow_options``, ...) beside the frozen value a command's validation reads them into
(:class:`FlowOptions`, ...).

Building it imports nothing heavy (no numpy, Prefect or MLflow), so ``--help`` and a usage
error cost well under a second.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from cord_ops.names import CALIBRATOR_CHOICES, INPUT_KINDS
from flows import inputs
from flows.store import tracking

#: flows.store.lock.DEFAULT_TIMEOUT, repeated so building the parser imports no flow module.
DEFAULT_LOCK_TIMEOUT = 600.0
#: flows.promotion.rules.MIN_RARER_CLASS_ROWS, repeated for the same reason.
MIN_RARER_CLASS_ROWS = 20


def build_parser(adders: Sequence[Callable[..., None]],
                 handlers: Mapping[str, Mapping[str, object]]) -> argparse.ArgumentParser:
    """The whole ``cord-ops`` parser. ``adders``: each adds one command's subparser (or a
    few), in the order ``--help`` lists them; ``handlers``: by command name, the defaults
    its parsed arguments carry (``func`` to run, ``validate`` to check the inputs first,
    ``prefect`` when it runs Prefect flows); a name no command has is a KeyError."""
    parser = _Parser(
        prog="cord-ops",
        description="Prediction-preserving recalibration (CORD) with Prefect, MLflow and ONNX.")
    add_common(parser, top=True)
    parser.add_argument("--version", action="version", version=f"%(prog)s {installed_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in adders:
        add(sub)
    for name, defaults in handlers.items():
        sub.choices[name].set_defaults(**defaults)
    for command in sub.choices.values():
        add_common(command, top=False)
    return parser


def installed_version() -> str:
    """The version of the installed ``cord-ops`` distribution (wheel or editable install)."""
    from importlib import metadata

    try:
        return metadata.version("cord-ops")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed; pip install . names it)"


# ---------------------------------------------------------------- shared options
class _Parser(argparse.ArgumentParser):
    """argparse, with its usage errors ending in one ``error:`` line like every other."""

    def error(self, message: str):
        self.print_usage(sys.stderr)
        self.exit(2, f"error: {self.prog}: {message}\n")


def add_common(parser: argparse.ArgumentParser, top: bool) -> None:
    """``--tracking-uri`` and ``--verbose``, accepted before or after the command name
    (after it, the defaults are suppressed so they do not undo a value given before)."""
    default = None if top else argparse.SUPPRESS
    parser.add_argument("--tracking-uri", default=default,
                        help="MLflow store (default: MLFLOW_TRACKING_URI, else "
                             "sqlite:///<working folder>/mlruns/mlflow.db)")
    parser.add_argument("-v", "--verbose", action="store_true",
                        default=False if top else argparse.SUPPRESS,
                        help="show tracebacks of errors")


def add_flow_options(parser: argparse.ArgumentParser, model_name: str = "cord-ops") -> None:
    parser.add_argument("--calibrator", default="auto", choices=CALIBRATOR_CHOICES,
                        help="calibration map fitted before the CORD repair: a family, "
                             "identity (the classifier's own probabilities), or auto (the "
                             "family chosen by 5-fold cross-validation on the calibration "
                             "split, identity included; docs/calibrators.md) (default: auto; "
                             "on Parquet shards name ts or vs)")
    parser.add_argument("--select-budget", type=float, default=None, metavar="SECONDS",
                        help="with --calibrator auto: start no further family (and abandon "
                             "one still fitting) after this many seconds of cross-validation; "
                             "each family left out is named (default: 60)")
    parser.add_argument("--fraction", type=float, default=0.5,
                        help="share of --data used for calibration (default: 0.5)")
    parser.add_argument("--seed", type=int, default=0, help="split seed (default: 0)")
    parser.add_argument("--model-name", default=model_name,
                        help=f"registered model name (default: {model_name})")
    parser.add_argument("--input-kind", default="auto", choices=("auto", *INPUT_KINDS),
                        help="what the data file holds (default: whichever is present)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "float64"),
                        help="float type of the exported ONNX graph (default: float32)")
    parser.add_argument("--lock-timeout", type=float, default=DEFAULT_LOCK_TIMEOUT,
                        metavar="SECONDS",
                        help="wait at most this long for another recalibration of the same "
                             f"model to leave the registry (default: {DEFAULT_LOCK_TIMEOUT:g})")
    parser.add_argument("--store-timeout", type=float,
                        default=tracking.DEFAULT_STORE_TIMEOUT, metavar="SECONDS",
                        help="fail within about this long when the tracking store is down "
                             f"(default: {tracking.DEFAULT_STORE_TIMEOUT:g})")


def add_gate_options(parser: argparse.ArgumentParser) -> None:
    """Overrides of the champion gate's evidence rules (defaults depend on K;
    flows.promotion.rules)."""
    parser.add_argument("--min-calibration", type=int, default=None,
                        help="calibration rows needed to promote (default: max(100, 10 K))")
    parser.add_argument("--min-evaluation", type=int, default=None,
                        help="evaluation rows needed to promote (default: max(100, 10 K))")
    parser.add_argument("--max-class-share", type=float, default=None,
                        help="largest share one class may hold in a split "
                             "(default: min(0.9, max(0.5, 5 / K)); off for K = 2)")
    parser.add_argument("--min-class-rows", type=int, default=None,
                        help="rows each class (for K = 2: the rarer one) must hold in either "
                             f"split (default: {MIN_RARER_CLASS_ROWS} for K = 2, else 0)")
    parser.add_argument("--max-label-shift", type=float, default=None,
                        help="total-variation distance allowed between the evaluation labels "
                             "and the champion's reference split's, beyond sampling noise "
                             "(default: 0.2)")


def add_thresholds(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-ece-increase", type=float, default=0.02,
                        help="recalibrate when ECE rises more than this over the champion's")
    parser.add_argument("--max-nll-increase", type=float, default=0.05,
                        help="recalibrate when NLL rises more than this over the champion's")


# ---------------------------------------------------------------- the groups, read once
@dataclass(frozen=True)
class FlowOptions:
    """The options :func:`add_flow_options` adds, checked (:meth:`read`)."""

    calibrator: str
    select_budget: float | None
    fraction: float
    seed: int
    model_name: str
    input_kind: str
    dtype: str
    lock_timeout: float
    store_timeout: float

    @classmethod
    def read(cls, args: argparse.Namespace) -> FlowOptions:
        """The parsed options, after the checks a flow would make later: the fraction in
        (0, 1), a non-negative seed, a selection budget of seconds > 0."""
        inputs.fraction_in_unit_interval(args.fraction)
        if args.seed < 0:
            raise inputs.InputError(f"--seed: expected a non-negative integer, got {args.seed}")
        budget = args.select_budget
        if budget is not None and not (budget > 0 and math.isfinite(budget)):
            raise inputs.InputError(f"--select-budget: expected seconds > 0, got {budget}")
        return cls(args.calibrator, budget, args.fraction, args.seed, args.model_name,
                   args.input_kind, args.dtype, args.lock_timeout, args.store_timeout)

    def flow_kwargs(self) -> dict:
        """The recalibration flow's keyword arguments for these options (the flow's own
        default selection budget unless one was given)."""
        kwargs = {"calibrator": self.calibrator, "fraction": self.fraction, "seed": self.seed,
                  "model_name": self.model_name, "input_kind": self.input_kind,
                  "dtype": self.dtype, "lock_timeout": self.lock_timeout,
                  "store_timeout": self.store_timeout}
        if self.select_budget is not None:
            kwargs["select_budget"] = self.select_budget
        return kwargs


@dataclass(frozen=True)
class GateOptions:
    """The overrides :func:`add_gate_options` adds (None: the gate's default for K)."""

    min_calibration: int | None
    min_evaluation: int | None
    max_class_share: float | None
    max_label_shift: float | None
    min_class_rows: int | None

    @classmethod
    def read(cls, args: argparse.Namespace) -> GateOptions:
        return cls(args.min_calibration, args.min_evaluation, args.max_class_share,
                   args.max_label_shift, args.min_class_rows)

    def as_dict(self) -> dict:
        """By the flows' parameter names (:class:`flows.promotion.rules.Policy`'s)."""
        return {"min_calibration": self.min_calibration, "min_evaluation": self.min_evaluation,
                "max_class_share": self.max_class_share, "max_label_shift": self.max_label_shift,
                "min_class_rows": self.min_class_rows}


@dataclass(frozen=True)
class DriftThresholds:
    """The thresholds :func:`add_thresholds` adds, checked non-negative."""

    max_ece_increase: float
    max_nll_increase: float

    @classmethod
    def read(cls, args: argparse.Namespace) -> DriftThresholds:
        inputs.non_negative(args.max_ece_increase, "--max-ece-increase")
        inputs.non_negative(args.max_nll_increase, "--max-nll-increase")
        return cls(args.max_ece_increase, args.max_nll_increase)
