"""Wall time and peak worker memory of recalibration over Parquet shards on Dask
(``flows.shards.fit.fit_shards``): TS + CORD and VS + CORD, against reading the shards once.

    python benchmarks/bench_scale.py [--rows 1000000] [--classes 100] [--shards 20]
                                     [--workers 2] [--memory-limit 2GB] [--gather]
                                     [--data FOLDER [--keep]]

Shards hold float32 logits (list column) and labels, written by this script into a
temporary folder (removed at the end), or into ``--data`` (kept with ``--keep``, and
reused when it already holds shards: generate 10 million rows once). Each configuration
starts a fresh local cluster of ``--workers`` single-threaded worker processes
(``--memory-limit`` each), so the peak RSS read from each worker afterwards
(``getrusage`` ru_maxrss) is that configuration's. The
"read once" line is the same cluster loading and validating every shard and nothing else.
Cluster start-up is not included in the times.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cord_ops import data  # noqa: E402
from cord_ops.calibrators import ConvergenceWarning  # noqa: E402
from flows.shards.fit import fit_shards  # noqa: E402
from flows.shards.session import local_cluster  # noqa: E402


def write_shards(folder: Path, rows: int, k: int, shards: int, seed: int = 0) -> float:
    """Synthetic miscalibrated logits with labels drawn from a shifted softmax; returns the
    size of the shards in MB."""
    rng = np.random.default_rng(seed)
    shift = rng.normal(size=k).astype(np.float32)
    for i, count in enumerate(np.diff(np.linspace(0, rows, shards + 1).astype(int))):
        z = (rng.standard_normal((count, k), dtype=np.float32) * 3.0)
        t = 0.45 * z + shift
        t -= t.max(axis=1, keepdims=True)
        p = np.exp(t)
        p /= p.sum(axis=1, keepdims=True)
        y = (p.cumsum(axis=1) > rng.random((count, 1), dtype=np.float32)).argmax(axis=1)
        data.save_parquet(folder / f"part-{i:03d}.parquet", z, y, "logits")
    return sum(f.stat().st_size for f in folder.glob("*.parquet")) / 2**20


def read_shard(path: str) -> int:
    """Read and validate one shard as every fit's first pass does; returns its rows."""
    return data.load_parquet(path, input_kind="logits").n


def peak_rss_mb(client) -> list[float]:
    def peak():
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0

    return sorted(client.run(peak).values())


def run(folder: Path, what: str, args, read: float | None = None) -> float:
    from distributed import Client

    with local_cluster(args.workers, args.memory_limit) as cluster, Client(cluster) as client:
        start = time.perf_counter()
        if what == "read":
            files = sorted(str(f) for f in folder.glob("*.parquet"))
            rows = sum(client.gather([client.submit(read_shard, f, pure=False)
                                      for f in files]))
            detail = f"rows={rows}"
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ConvergenceWarning)
                fit = fit_shards(str(folder), what, client=client, gather=args.gather)
            detail = (" ".join(f"{k}={v:.1f}s" for k, v in fit.seconds.items())
                      + f" eta*={fit.cord.eta_!r} NLL {fit.metrics['original']['nll']:.4f}"
                      f" -> {fit.metrics['repaired']['nll']:.4f}"
                      f" ECE {fit.metrics['original']['ece']:.4f}"
                      f" -> {fit.metrics['repaired']['ece']:.4f}")
        seconds = time.perf_counter() - start
        peaks = peak_rss_mb(client)
    label = "read once" if what == "read" else f"{what.upper()} + CORD"
    load = os.getloadavg()[0]
    ratio = "" if read is None or what == "read" else f" = {seconds / read:.2f}x read"
    print(f"{label:10s} wall {seconds:7.1f} s{ratio}  (load {load:.2f})  peak worker RSS "
          f"{', '.join(f'{p:.0f}' for p in peaks)} MB  {detail}", flush=True)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--shards", type=int, default=20)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--memory-limit", default="2GB")
    parser.add_argument("--gather", action="store_true",
                        help="gather CORD's per-row scalars (eta* bit-identical to CORD.fit)")
    parser.add_argument("--only", choices=["read", "ts", "vs"], nargs="*",
                        default=["read", "ts", "vs"])
    parser.add_argument("--data", type=Path, help="shard folder to write or reuse")
    parser.add_argument("--keep", action="store_true", help="keep --data afterwards")
    args = parser.parse_args()
    folder = args.data or Path(tempfile.mkdtemp(prefix="bench-scale-"))
    try:
        start = time.perf_counter()
        if not list(folder.glob("*.parquet")):
            folder.mkdir(parents=True, exist_ok=True)
            write_shards(folder, args.rows, args.classes, args.shards)
            how = f"written in {time.perf_counter() - start:.1f} s"
        else:
            how = "reused"
        size = sum(f.stat().st_size for f in folder.glob("*.parquet")) / 2**20
        shards = len(list(folder.glob("*.parquet")))
        load = os.getloadavg()
        print(f"{args.rows} rows, K = {args.classes}, {shards} shards, {size:.0f} MB "
              f"Parquet ({how}); {args.workers} workers, memory limit {args.memory_limit} "
              f"each; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}", flush=True)
        read = None
        for what in args.only:
            seconds = run(folder, what, args, read)
            read = seconds if what == "read" else read
    finally:
        if not (args.data and args.keep):
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
