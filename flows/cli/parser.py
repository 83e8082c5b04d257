"""The ``cord-ops`` argument parser: one function per command adds its subparser and options
(``add_recalibrate(sub)``, ...); :func:`build_parser` puts them together with the
commands other modules add (reproduce / bench, status / promote / rollback, rollout) and
attaches what each command runs, handed in by :mod:`flows.cli.main`.

Building it imports nothing heavy (no numpy, Prefect or MLflow), so ``--help`` and a usage
error cost well under a second.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path

from cord_ops.names import CALIBRATOR_CHOICES, INPUT_KINDS
from flows import inputs
from flows.cli import label_free as label_free_cli
from flows.cli import operator as operator_cli
from flows.cli import rollout as rollout_cli
from flows.reproduce import cli as reproduce_cli
from flows.store import tracking

DEMO_MODEL = "cord-ops-demo"
UI_PORT = 5000
#: flows.store.lock.DEFAULT_TIMEOUT, repeated so building the parser imports no flow module.
DEFAULT_LOCK_TIMEOUT = 600.0
#: flows.promotion.rules.MIN_RARER_CLASS_ROWS, repeated for the same reason.
MIN_RARER_CLASS_ROWS = 20


def build_parser(handlers: Mapping[str, Mapping[str, object]]) -> argparse.ArgumentParser:
    """The whole ``cord-ops`` parser. ``handlers``: by command name, the defaults its parsed
    arguments carry (``func`` to run, ``validate`` to check the inputs first, ``prefect``
    when it runs Prefect flows); a name no command has is a KeyError."""
    parser = _Parser(
        prog="cord-ops",
        description="Prediction-preserving recalibration (CORD) with Prefect, MLflow and ONNX.")
    add_common(parser, top=True)
    parser.add_argument("--version", action="version", version=f"%(prog)s {installed_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (add_recalibrate, add_monitor, add_schedule, add_predict, add_demo, add_ui,
                add_server, add_serve):
        add(sub)
    reproduce_cli.add_cli(sub)
    operator_cli.add_cli(sub)
    rollout_cli.add_cli(sub)
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


def add_recalibrate(sub) -> None:
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


def add_monitor(sub) -> None:
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


def add_schedule(sub) -> None:
    """``schedule``: cron deployments of recalibrate and monitor."""
    p = sub.add_parser(
        "schedule", help="serve cron deployments of recalibrate and monitor",
        description="Register cron deployments of the recalibration and monitoring flows and "
                    "serve them from this process. Without PREFECT_API_URL they run on the "
                    "local Prefect server cord-ops manages (started here if needed; see "
                    "`cord-ops server`), whose scheduler creates the runs.")
    p.add_argument("--cron", required=True, help='recalibration schedule, e.g. "0 3 * * *"')
    p.add_argument("--monitor-cron",
                   help=f"monitoring schedule (default: --cron {inputs.MONITOR_OFFSET_MINUTES} "
                        f"minutes later within the hour, else {inputs.MONITOR_OFFSET_SECONDS} s "
                        "later)")
    p.add_argument("--data", required=True, type=Path, help=".npz/.parquet re-read on every run")
    p.add_argument("--eval-data", type=Path, help="separate evaluation .npz")
    p.add_argument("--monitor-data", type=Path, help="labelled batch to monitor (default: --data)")
    p.add_argument("--work-pool", help="register with this work pool instead of serving here")
    label_free_cli.add_schedule_options(p)
    add_thresholds(p)
    add_flow_options(p)


def add_predict(sub) -> None:
    """``predict``: run an exported graph on a file or a folder of Parquet files."""
    p = sub.add_parser("predict", help="run an exported graph on a file, or on a folder of "
                                       "Parquet files with Dask")
    p.add_argument("--model", required=True, help="PATH.onnx or models:/NAME@ALIAS")
    p.add_argument("--input", required=True, type=Path,
                   help=".npz or .parquet with logits or probs; a folder or glob of .parquet "
                        "files scores them on Dask")
    p.add_argument("--output", required=True, type=Path,
                   help="output .npz or .parquet (written atomically); for a folder or glob "
                        "input, a new folder mirroring the input's layout")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing --output file (refused without it; a batch "
                        "output folder is always new)")
    p.add_argument("--dask-address", help="scheduler of an existing Dask cluster "
                                          "(default: start a local one)")
    p.add_argument("--dask-workers", type=int,
                   help="worker processes of the local cluster (default: 2)")
    p.add_argument("--batch-size", type=int, default=None,
                   help="rows per batch (default: about 2^20 scores, 256..4096 rows)")
    p.add_argument("--provider", default="auto", choices=("auto", "cpu", "cuda"),
                   help="onnxruntime execution provider (default: cuda when available)")


def add_demo(sub) -> None:
    """``demo``: the no-argument demo."""
    p = sub.add_parser("demo", help="no-argument demo: digits classifier -> full flow")
    p.add_argument("--data", type=Path, help="use this .npz instead of the digits classifier")
    add_flow_options(p, model_name=DEMO_MODEL)


def add_ui(sub) -> None:
    """``ui``: the MLflow UI."""
    p = sub.add_parser("ui", help="MLflow UI on 127.0.0.1 over the tracking store")
    p.add_argument("--port", type=int, default=UI_PORT, help=f"port (default: {UI_PORT})")


def add_server(sub) -> None:
    """``server``: the managed Prefect server."""
    p = sub.add_parser(
        "server", help="the local Prefect server cord-ops manages (start | stop | status)",
        description="A Prefect server on 127.0.0.1 with its scheduler, state kept next to the "
                    "MLflow store (<store folder>/prefect). While it runs, every cord-ops "
                    "command uses it instead of starting a temporary one.")
    p.add_argument("action", choices=("start", "stop", "status"))


def add_serve(sub) -> None:
    """``serve``: HTTP scoring that follows an alias."""
    p = sub.add_parser("serve", help="HTTP scoring of NAME@ALIAS that follows the alias")
    p.add_argument("--model-name", required=True, help="registered model name")
    p.add_argument("--alias", default="champion", help="alias to follow (default: champion)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=5005, help="port (default: 5005)")
    p.add_argument("--poll-interval", type=float, default=10.0,
                   help="seconds between alias polls (default: 10)")
    p.add_argument("--batch-window-ms", type=float, default=2.0,
                   help="longest wait for concurrent requests to batch (default: 2)")
    p.add_argument("--batch-max-rows", type=int, default=4096,
                   help="most rows per onnxruntime run (default: 4096)")
    p.add_argument("--provider", default="auto", choices=("auto", "cpu", "cuda"),
                   help="onnxruntime execution provider (default: cuda when available)")
    p.add_argument("--monitor-window", type=int, default=label_free_cli.DEFAULT_MONITOR_WINDOW,
                   metavar="ROWS",
                   help="answered rows kept for label-free monitoring (/monitor, gauges in "
                        "/metrics; 0: off; default: %(default)s)")
    p.add_argument("--shadow-queue", type=int, default=1024,
                   help="request copies waiting for the other version during a rollout; "
                        "more are dropped and counted (0: do not follow rollouts; "
                        "default: 1024)")
    p.add_argument("--token-file", metavar="PATH",
                   help="file (mode 600) holding the token POST /monitor/flush needs (default: "
                        "CORD_OPS_SERVE_TOKEN, else a new one written to the store's state "
                        "folder as serve-PORT.token)")
    p.add_argument("--require-token", action="store_true",
                   help="/invocations needs the token too (default: scoring is open)")
    p.add_argument("--max-inflight", type=int, default=128,
                   help="scoring requests admitted at once; more are refused at once with "
                        "503 and Retry-After (default: 128)")
    p.add_argument("--max-body-bytes", type=int, default=64 * 2**20,
                   help="largest request body; bigger: 413 before it is read whole "
                        "(default: 64 MiB)")
    p.add_argument("--max-rows", type=int, default=65536,
                   help="most rows in one request; more: 413 before any row is converted "
                        "(default: 65536)")
    p.add_argument("--workers", type=int, default=1,
                   help="worker processes on the one port, each following the alias "
                        "(default: 1)")
    p.add_argument("--allowed-hosts", nargs="+", default=[], metavar="HOST",
                   help="Host header names answered besides localhost, 127.0.0.1, ::1 and "
                        "the bound address (*: any)")


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

