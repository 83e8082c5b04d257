"""The ``cord-ops reproduce`` and ``cord-ops bench`` command lines and the sweep's defaults.

Kept free of Prefect, Dask, pandas and matplotlib so that building the ``cord-ops`` parser
(and ``cord-ops --help``) stays fast: each handler imports its flow module when it runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from flows.reproduce_paper import FIT_TIME_BASELINES, NON_PRESERVING

CALIBRATORS = NON_PRESERVING + FIT_TIME_BASELINES
DEFAULT_SEEDS = 5
DEFAULT_WORKERS = 2
DEFAULT_OUT = Path("out") / "reproduce"
EXPERIMENT = "cord-ops-reproduce"


def default_data_dir() -> Path | None:
    """../shared/data beside the working directory or beside the repository, if present."""
    candidates = (Path.cwd().parent / "shared" / "data",
                  Path(__file__).resolve().parents[2] / "shared" / "data")
    for candidate in candidates:
        if candidate.is_dir():
            return candidate
    return None


def run_reproduce(args: argparse.Namespace) -> int:
    from flows import reproduce

    return reproduce.run_reproduce(args)


def run_bench(args: argparse.Namespace) -> int:
    from flows import reproduce_bench

    return reproduce_bench.run_bench(args)


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
                   help="calibrators to evaluate (default: all nine; --quick: vs svs irova)")
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
                   help="calibrators whose fit time is measured (default: all nine)")
    p.add_argument("--onnx-calibrator", default="vs",
                   help="calibrator of the exported graph and of the flow run (default vs)")
    p.add_argument("--out", type=Path, default=Path("out") / "bench",
                   help="where bench.md / bench.csv go (default out/bench)")
    p.set_defaults(func=run_bench)
