"""The ``cord-ops`` command line: recalibrate, monitor, schedule, predict, demo, ui (and
reproduce / bench from :mod:`flows.reproduce.cli`).

Every command exits 0 on success and non-zero on failure with a one-line ``error:`` on
stderr that names the cause. Prefect, MLflow and onnxruntime are imported inside the
command that needs them, not when the parser is built.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from cord_ops.names import CALIBRATOR_NAMES, INPUT_KINDS
from flows import tracking
from flows.reproduce import cli as reproduce_cli

SUMMARY_METRICS = (("ECE", "ece"), ("NLL", "nll"), ("Brier", "brier"),
                   ("accuracy", "accuracy"), ("TPCR", "tpcr"))
DEMO_MODEL = "cord-ops-demo"
UI_PORT = 5000


def _error(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 1


# ---------------------------------------------------------------- output
def summary_table(result) -> str:
    """The closing table: uncal / base / cord by ECE, NLL, Brier, accuracy, TPCR, and eta*."""
    header = f"{'report':<8}" + "".join(f"{title:>11}" for title, _ in SUMMARY_METRICS)
    lines = [header, "-" * len(header)]
    for report in ("uncal", "base", "cord"):
        values = result.reports[report]
        lines.append(f"{report:<8}" + "".join(f"{values[key]:>11.5f}"
                                              for _, key in SUMMARY_METRICS))
    lines.append(f"eta* = {result.eta_star!r}")
    return "\n".join(lines)


def next_steps(result, total_seconds: float) -> str:
    """Where the run, the model and the timings are, and what to run next."""
    decision = result.decision
    alias = (f"-> {result.model_name}@champion" if decision.promote
             else f"(@champion unchanged: {decision.reason})")
    compute = sum(result.timings.values())
    return "\n".join([
        f"gate:     v{result.version} {decision.label} {alias}",
        f"          candidate NLL {decision.candidate_nll:.6g}, champion NLL "
        f"{'-' if decision.champion_nll is None else f'{decision.champion_nll:.6g}'}",
        f"onnx:     max |onnx - cord_ops| = {result.onnx_max_abs_diff:.3g}",
        f"time:     {total_seconds:.1f} s total, {compute:.1f} s in flow tasks, "
        f"{total_seconds - compute:.1f} s start-up and orchestration",
        f"tracking: {result.tracking_uri} (run {result.run_id})",
        "next:     cord-ops ui    # browse runs, metrics, reliability diagrams",
        f"          cord-ops predict --model models:/{result.model_name}@champion "
        "--input FILE.npz --output OUT.npz",
    ])


def _print_result(result, started: float) -> None:
    print()
    print(summary_table(result))
    print()
    print(next_steps(result, time.perf_counter() - started))


# ---------------------------------------------------------------- commands
def _flow_options(args) -> dict:
    return {"calibrator": args.calibrator, "fraction": args.fraction, "seed": args.seed,
            "model_name": args.model_name, "input_kind": args.input_kind, "dtype": args.dtype}


def cmd_recalibrate(args) -> int:
    from flows.recalibrate import recalibrate

    result = recalibrate(data=str(args.data),
                         eval_data=None if args.eval_data is None else str(args.eval_data),
                         promote=not args.no_promote, **_flow_options(args))
    _print_result(result, args.started)
    return 0


def cmd_demo(args) -> int:
    """Digits classifier (or ``--data``) -> full flow -> ``cord-ops-demo`` -> table."""
    from cord_ops import data
    from flows.recalibrate import recalibrate

    if args.data is None:
        folder = Path.cwd() / tracking.STORE_DIR / "demo"
        folder.mkdir(parents=True, exist_ok=True)
        digits = data.digits_dataset(args.seed)
        path = data.save_npz(folder / f"digits_seed{args.seed}.npz", digits.scores,
                             digits.labels, digits.input_kind)
        print(f"demo data: held-out logits of a logistic regression on sklearn digits "
              f"({digits.n} x {digits.n_classes}) -> {path}")
    else:
        path = args.data
    result = recalibrate(data=str(path), promote=True, **_flow_options(args))
    _print_result(result, args.started)
    return 0


def cmd_monitor(args) -> int:
    from flows.monitor import monitor

    result = monitor(data=str(args.data), model_name=args.model_name,
                     max_ece_increase=args.max_ece_increase,
                     max_nll_increase=args.max_nll_increase, input_kind=args.input_kind,
                     recalibrate_on_drift=not args.no_recalibrate, calibrator=args.calibrator,
                     fraction=args.fraction, seed=args.seed, dtype=args.dtype)
    print(f"champion v{result.champion_version} on {args.data}:")
    for name in ("ece", "nll"):
        print(f"  {name}: {result.metrics[name]:.5f} (baseline {result.baseline[name]:.5f}, "
              f"drift {result.drift[name]:+.5f})")
    print("drift: " + ("; ".join(result.reasons) if result.reasons else "none"))
    if result.recalibration is not None:
        _print_result(result.recalibration, args.started)
    return 0


def cmd_schedule(args) -> int:
    from flows import schedule

    # Absolute paths: runs start later, from the runner's or the worker's directory.
    recal = {"data": str(args.data.resolve()),
             "eval_data": args.eval_data and str(args.eval_data.resolve()),
             **_flow_options(args)}
    mon = {"data": str((args.monitor_data or args.data).resolve()), "model_name": args.model_name,
           "max_ece_increase": args.max_ece_increase, "max_nll_increase": args.max_nll_increase,
           "calibrator": args.calibrator, "fraction": args.fraction, "seed": args.seed,
           "dtype": args.dtype}
    if args.work_pool:
        ids = schedule.deploy_to_work_pool(args.work_pool, args.cron, recal, mon,
                                           args.monitor_cron)
        print(f"deployed to work pool '{args.work_pool}': {', '.join(ids)}")
        print(f"next: prefect worker start --pool {args.work_pool}")
        return 0
    deployments = schedule.build_deployments(args.cron, recal, mon, args.monitor_cron)
    schedule.serve_deployments(deployments)
    return 0


def local_model_path(model: str, folder: Path) -> Path:
    """``model`` as a local .onnx file: a path as given, or a registry URI
    (``models:/NAME@ALIAS``, ``models:/NAME/VERSION``, ``runs:/...``) downloaded to ``folder``.
    """
    if ":/" not in model:
        return Path(model)
    local = tracking.download(tracking.store_uri(), model, folder)
    found = [local] if local.is_file() else sorted(local.rglob("*.onnx"))
    if len(found) != 1:
        raise ValueError(f"{model}: expected one .onnx file in the model, found {len(found)}")
    return found[0]


def cmd_predict(args) -> int:
    import tempfile

    from onnx_export.predict import predict_file

    with tempfile.TemporaryDirectory(prefix="cord-ops-model-") as folder:
        path = local_model_path(args.model, Path(folder))
        summary = predict_file(path, args.input, args.output, batch_size=args.batch_size,
                               provider=args.provider, progress=True)
    print(f"wrote {summary['rows']} rows x {summary['n_classes']} classes to "
          f"{summary['output']} (providers: {', '.join(summary['providers'])})")
    return 0


def cmd_ui(args) -> int:
    uri = tracking.store_uri()
    command = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri,
               "--host", "127.0.0.1", "--port", str(args.port)]
    if tracking.is_embedded(uri):
        command += ["--default-artifact-root", str(Path.cwd() / tracking.STORE_DIR)]
    print(f"MLflow UI on http://127.0.0.1:{args.port} ({uri}); Ctrl-C stops it", flush=True)
    # Become the server (no parent left behind), so a signal to this PID stops the UI.
    os.execv(sys.executable, command)


# ---------------------------------------------------------------- parser
def _add_flow_options(parser: argparse.ArgumentParser, model_name: str = "cord-ops") -> None:
    parser.add_argument("--calibrator", default="vs", choices=CALIBRATOR_NAMES,
                        help="calibration map fitted before the CORD repair (default: vs)")
    parser.add_argument("--fraction", type=float, default=0.5,
                        help="share of --data used for calibration (default: 0.5)")
    parser.add_argument("--seed", type=int, default=0, help="split seed (default: 0)")
    parser.add_argument("--model-name", default=model_name,
                        help=f"registered model name (default: {model_name})")
    parser.add_argument("--input-kind", default="auto", choices=("auto", *INPUT_KINDS),
                        help="what the .npz holds (default: whichever array is present)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "float64"),
                        help="float type of the exported ONNX graph (default: float32)")


def _add_thresholds(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-ece-increase", type=float, default=0.02,
                        help="recalibrate when ECE rises more than this over the champion's")
    parser.add_argument("--max-nll-increase", type=float, default=0.05,
                        help="recalibrate when NLL rises more than this over the champion's")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cord-ops",
        description="Prediction-preserving recalibration (CORD) with Prefect, MLflow and ONNX.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("recalibrate", help="fit calibrator + CORD, export ONNX, register, gate")
    p.add_argument("--data", required=True, type=Path, help=".npz with logits|probs and labels")
    p.add_argument("--eval-data", type=Path,
                   help="separate evaluation .npz (then all of --data calibrates)")
    _add_flow_options(p)
    p.add_argument("--no-promote", action="store_true",
                   help="record the gate decision but never move @champion")
    p.set_defaults(func=cmd_recalibrate)

    p = sub.add_parser("monitor", help="score @champion on a labelled batch; recalibrate on drift")
    p.add_argument("--data", required=True, type=Path, help="labelled batch (.npz)")
    _add_thresholds(p)
    p.add_argument("--no-recalibrate", action="store_true",
                   help="only report drift, never start a recalibration")
    _add_flow_options(p)
    p.set_defaults(func=cmd_monitor)

    p = sub.add_parser("schedule", help="serve cron deployments of recalibrate and monitor")
    p.add_argument("--cron", required=True, help='recalibration schedule, e.g. "0 3 * * *"')
    p.add_argument("--monitor-cron", help="monitoring schedule (default: --cron)")
    p.add_argument("--data", required=True, type=Path, help=".npz re-read on every run")
    p.add_argument("--eval-data", type=Path, help="separate evaluation .npz")
    p.add_argument("--monitor-data", type=Path, help="labelled batch to monitor (default: --data)")
    p.add_argument("--work-pool", help="register with this work pool of the server "
                                       "PREFECT_API_URL names instead of serving here")
    _add_thresholds(p)
    _add_flow_options(p)
    p.set_defaults(func=cmd_schedule)

    p = sub.add_parser("predict", help="run an exported graph on an .npz file, in batches")
    p.add_argument("--model", required=True, help="PATH.onnx or models:/NAME@ALIAS")
    p.add_argument("--input", required=True, type=Path, help=".npz with logits or probs")
    p.add_argument("--output", required=True, type=Path, help="output .npz (written atomically)")
    p.add_argument("--batch-size", type=int, default=None,
                   help="rows per batch (default: about 2^20 scores, 256..4096 rows)")
    p.add_argument("--provider", default="auto", choices=("auto", "cpu", "cuda"),
                   help="onnxruntime execution provider (default: cuda when available)")
    p.set_defaults(func=cmd_predict)

    p = sub.add_parser("demo", help="no-argument demo: digits classifier -> full flow")
    p.add_argument("--data", type=Path, help="use this .npz instead of the digits classifier")
    _add_flow_options(p, model_name=DEMO_MODEL)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("ui", help="MLflow UI on 127.0.0.1 over the tracking store")
    p.add_argument("--port", type=int, default=UI_PORT, help=f"port (default: {UI_PORT})")
    p.set_defaults(func=cmd_ui)

    reproduce_cli.add_cli(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``cord-ops`` console script; returns the exit status.

    The program, unlike the library, owns its process: it switches MLflow and Prefect
    telemetry off here, for itself and the processes it starts, unless the user's
    environment already says otherwise.
    """
    started = time.perf_counter()
    for key, value in tracking.QUIET_ENVIRONMENT.items():
        os.environ.setdefault(key, value)
    args = build_parser().parse_args(argv)
    args.started = started
    try:
        return args.func(args) or 0
    except KeyboardInterrupt:
        return _error("interrupted")
    except Exception as exc:  # the CLI's contract: one line naming the cause, exit 1
        from flows.recalibrate import RecalibrationError

        # A RecalibrationError already names the step and the underlying error type.
        named = isinstance(exc, RecalibrationError)
        return _error(str(exc) if named else f"{type(exc).__name__}: {exc}")


if __name__ == "__main__":
    sys.exit(main())
