"""The ``cord-ops reproduce`` and ``cord-ops bench`` command lines and their handlers.

Building the parser imports only :mod:`flows.reproduce.defaults` (no Prefect, Dask, pandas
or matplotlib), so ``cord-ops --help`` stays fast; each handler imports its flow when it
runs.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from flows.reproduce.defaults import (
    CALIBRATORS,
    DEFAULT_BENCH_OUT,
    DEFAULT_OUT,
    DEFAULT_SEEDS,
    DEFAULT_WORKERS,
    EXPERIMENT,
    QUICK_CALIBRATORS,
    default_data_dir,
)

#: Modules of the ``reproduce`` extra, which the recalibration product does not need.
EXTRA_MODULES = ("prefect_dask",)


def require_extra(command: str) -> None:
    """Fail with one line naming the install command when the ``reproduce`` extra is
    missing, before anything starts."""
    import importlib.util

    missing = [name for name in EXTRA_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        raise RuntimeError(f"cord-ops {command} needs the reproduce extra (missing "
                           f"{', '.join(missing)}): pip install 'cord-ops[reproduce]'")


def run_reproduce(args: argparse.Namespace) -> int:
    """``cord-ops reproduce``: run the sweep, print where the outputs went; exit code 1
    when a task failed (the tables then cover the cells that finished)."""
    require_extra("reproduce")
    from flows.platform.prefect_api import prefect_api
    from flows.reproduce import flow
    from flows.reproduce.plan import plan_sweep, write_digits_data
    from flows.store import tracking

    data_dir = args.data or default_data_dir()
    if data_dir is None and args.quick:
        data_dir = write_digits_data(Path(args.out) / "digits-data")
        print(f"reproduce: ../shared/data not found; --quick runs on the bundled digits "
              f"classifier ({data_dir})")
    if data_dir is None:
        print("cord-ops reproduce: --data is required (../shared/data not found)",
              file=sys.stderr)
        return 2
    plan_sweep(data_dir, seeds=args.seeds, calibrators=args.calibrators, quick=args.quick)
    uri = tracking.store_uri()
    started = time.perf_counter()
    with prefect_api(), flow.quiet_dask_logs():
        flow_fn = flow.reproduce.with_options(
            task_runner=flow.task_runner(args.dask_address, args.workers))
        summary = flow_fn(data_dir=str(data_dir), out_dir=str(args.out), seeds=args.seeds,
                          calibrators=args.calibrators, quick=args.quick,
                          experiment=args.experiment, task_timeout=args.task_timeout,
                          tracking_uri=uri, progress=True)
    total = time.perf_counter() - started
    tracking.client(uri).log_metric(summary["parent_run_id"], "time.end_to_end_seconds", total)
    print(f"reproduce: {summary['cells']} cells, {len(summary['failures'])} failed; "
          f"compute {summary['compute_seconds']:.1f} s, "
          f"end to end {total:.1f} s")
    print(f"reproduce: tables and figures in {args.out}; MLflow parent run "
          f"{summary['parent_run_id']}")
    for failure in summary["failures"]:
        print(f"reproduce: FAILED {failure['file']}/"
              f"{failure['calibrator']}/seed{failure['seed']}: {failure['error']}",
              file=sys.stderr)
    return 1 if summary["failures"] else 0


def run_bench(args: argparse.Namespace) -> int:
    """``cord-ops bench``: the timing table (:mod:`flows.reproduce.bench`)."""
    require_extra("bench")
    from flows.reproduce import bench

    return bench.run_bench(args)


def add_cli(subparsers) -> None:
    """Add ``reproduce`` and ``bench`` to the ``cord-ops`` argparse subparsers.

    Each subcommand sets ``func``: the CLI calls ``args.func(args)`` and exits with the
    integer it returns.
    """
    found = default_data_dir()
    p = subparsers.add_parser(
        "reproduce", help="run the paper's protocol over a folder of .npz logits on Dask",
        description="Evaluate every calibrator, CORD and its ablations over every .npz of a "
                    "folder x seeded 50/50 splits (the paper's protocol) on a Dask cluster; "
                    "write the paper's tables and figures and log them to MLflow.")
    p.add_argument("--data", type=Path, default=found,
                   help=f"folder of .npz files (default: {found or '../shared/data'}; "
                        "--quick without it uses the bundled digits classifier)")
    p.add_argument("--seeds", type=int, default=DEFAULT_SEEDS,
                   help="number of seeded 50/50 splits (seeds 0..N-1; default 5)")
    p.add_argument("--calibrators", nargs="+", choices=CALIBRATORS, default=None,
                   help=f"calibrators to evaluate (default: all {len(CALIBRATORS)}; --quick: "
                        f"{' '.join(QUICK_CALIBRATORS)})")
    p.add_argument("--quick", action="store_true",
                   help="1 seed, 2 files, 3 calibrators (the CI smoke run)")
    p.add_argument("--dask-address", default=None,
                   help="existing Dask scheduler, e.g. tcp://10.0.0.5:8786 (default: local "
                        "cluster)")
    p.add_argument("--workers", type=int, default=DEFAULT_WORKERS,
                   help="worker processes of the local cluster (default 2)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT,
                   help=f"where tables and figures go (default {DEFAULT_OUT})")
    p.add_argument("--experiment", default=EXPERIMENT, help="MLflow experiment name")
    p.add_argument("--task-timeout", type=float, default=None,
                   help="seconds after which one (file, calibrator, seed) task is failed")
    p.set_defaults(func=run_reproduce)

    p = subparsers.add_parser(
        "bench", help="calibrator / CORD / ONNX / flow timings table",
        description="Fit time of each calibrator per dataset, CORD fit/transform next to the "
                    "paper's Table 5, ONNX throughput and end-to-end flow time; one table, "
                    "printed and logged to MLflow.")
    p.add_argument("--data", type=Path, default=found,
                   help=f"folder of .npz files (default: {found or '../shared/data'})")
    p.add_argument("--calibrators", nargs="+", choices=CALIBRATORS, default=list(CALIBRATORS),
                   help=f"calibrators whose fit time is measured (default: all "
                        f"{len(CALIBRATORS)})")
    p.add_argument("--onnx-calibrator", default="vs",
                   help="calibrator of the exported graph and of the flow run (default vs)")
    p.add_argument("--out", type=Path, default=DEFAULT_BENCH_OUT,
                   help=f"where bench.md / bench.csv go (default {DEFAULT_BENCH_OUT})")
    p.set_defaults(func=run_bench)
