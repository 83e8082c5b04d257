"""Throughput and memory of exported pipelines under onnxruntime (CPU), against cord_ops.

Prints, for N = 25,000 synthetic rows: microseconds per example of the VS + CORD graph in
float32 at K = 1,000 and K = 100, full (five outputs) and lean (``outputs="lean"``:
repaired, label, confidence; target at K = 1,000: <= 2.5 us/example on 2 threads), the
same graphs in float64, the isotonic graphs (irova, irova-ts, irm at K = 10, 100, 1,000;
target: no slower than cord_ops' numpy path), and the peak memory a session adds to its
process. Each line sets the graph beside cord_ops' numpy path (``predict_proba`` then
``transform``) on the same rows.

The memory-bandwidth bound of a lean graph: it must read the N x K input and write the
N x K repaired rows plus a label and a confidence, (8 K + 12) bytes per example in float32,
so no implementation runs faster than that over the machine's copy bandwidth, which is
measured here (one numpy thread copying 256 MiB: read + write bytes over time).

    python benchmarks/bench_onnx.py [--threads 2] [--rows 25000] [--batch-size N] [--quick]

Each configuration is timed as the best of ``--repeats`` full passes over the N rows in
batches of ``--batch-size`` (after one warm-up pass), as wall time and as process CPU time
(summed over threads, steadier on a shared machine); the speed-up is the wall-time ratio.
Memory is measured in a fresh process per configuration (peak RSS while the session runs
minus RSS before it opened). All graphs include the calibrator and the repair.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cord_ops import CORD  # noqa: E402
from cord_ops.calibrators import ConvergenceWarning, make_calibrator  # noqa: E402
from cord_ops.calibrators._base import softmax  # noqa: E402
from flows.reproduce.timing import measure  # noqa: E402
from onnx_export import export_onnx, open_session, run_batched  # noqa: E402
from onnx_export.runtime import batches, session_batch_size  # noqa: E402


def synthetic_logits(n: int, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """float32 logits of an overconfident classifier (about 60% top-1) and labels."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, k, n)
    logits = rng.normal(0.0, 2.0, (n, k))
    logits[np.arange(n), labels] += rng.uniform(2.0, 9.0, n)
    return logits.astype(np.float32), labels


def fit_pipeline(name: str, k: int, n_fit: int = 3000):
    logits, labels = synthetic_logits(n_fit, k, seed=k)
    x = logits.astype(np.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        cal = make_calibrator(name, **({"max_iter": 100} if name == "vs" else {}))
        cal.fit(x, labels)
    return cal, CORD().fit(softmax(x), cal.predict_proba(x))


def best_of(run, repeats: int, rows: int, warm_up: bool = False) -> tuple[float, float]:
    """(wall, CPU) microseconds per row of the fastest of ``repeats`` calls
    (``flows.reproduce.timing``). CPU time sums all threads of the process; on a busy
    machine it is the steadier of the two."""
    (timing,) = measure(run, repeats=repeats, warm_up=warm_up)
    return timing.best / rows * 1e6, timing.best_cpu / rows * 1e6


def time_numpy(cal, cord, logits: np.ndarray, repeats: int) -> tuple[float, float]:
    x = logits.astype(np.float64)
    return best_of(lambda: cord.transform(softmax(x), cal.predict_proba(x)), repeats, len(x))


def time_onnx(model_bytes: bytes, scores: np.ndarray, threads: int, batch_size: int,
              repeats: int) -> tuple[float, float]:
    session = open_session(model_bytes, provider="cpu", threads=threads)
    return best_of(lambda: run_batched(session, scores, batch_size=batch_size), repeats,
                   len(scores), warm_up=True)


def _status_kib(field: str) -> int:
    """A memory field of /proc/self/status (VmRSS, VmHWM) in KiB. VmHWM is the peak RSS of
    this address space; ru_maxrss is not used because Linux carries it over from the parent
    across fork + exec."""
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _session_peak(model_path: str, scores_path: str, threads: int, batch_size: int, queue):
    scores = np.load(scores_path)
    before = _status_kib("VmRSS")
    session = open_session(model_path, provider="cpu", threads=threads)
    # Outputs of each batch are dropped: what is measured is the session (model, arena,
    # one batch of intermediates and outputs), not the caller's result arrays.
    for rows in batches(len(scores), batch_size or session_batch_size(session, scores.shape[1])):
        session.run(None, {"scores": scores[rows]})
    queue.put((_status_kib("VmHWM") - before) / 1024)


def session_peak_mib(model, scores: np.ndarray, threads: int, batch_size: int) -> float:
    """Peak RSS added by opening a session and running all rows, in a fresh process."""
    with tempfile.TemporaryDirectory() as folder:
        model_path, scores_path = f"{folder}/m.onnx", f"{folder}/x.npy"
        Path(model_path).write_bytes(model.SerializeToString())
        np.save(scores_path, scores)
        ctx = multiprocessing.get_context("spawn")
        queue = ctx.Queue()
        child = ctx.Process(target=_session_peak,
                            args=(model_path, scores_path, threads, batch_size, queue))
        child.start()
        peak = queue.get()
        child.join()
    return peak


def copy_bandwidth_gb_s(megabytes: int = 256, repeats: int = 5) -> float:
    """Bytes read plus bytes written per second by one numpy copy of ``megabytes``."""
    src = np.ones(megabytes * 2**20 // 8)
    dst = np.empty_like(src)
    # the warm-up copy touches every page first
    (timing,) = measure(lambda: np.copyto(dst, src), repeats=repeats)
    return 2 * src.nbytes / timing.best / 1e9


#: (calibrator, K, [(dtype, outputs), ...]) measured by default; --quick keeps the first.
CONFIGS = (
    ("vs", 1000, (("float32", "lean"), ("float32", "full"), ("float64", "full"))),
    ("vs", 100, (("float32", "lean"), ("float32", "full"), ("float64", "full"))),
    ("irova", 10, (("float32", "full"),)),
    ("irova", 100, (("float32", "full"),)),
    ("irova", 1000, (("float32", "full"),)),
    ("irova-ts", 10, (("float32", "full"),)),
    ("irova-ts", 100, (("float32", "full"),)),
    ("irova-ts", 1000, (("float32", "full"),)),
    ("irm", 10, (("float32", "full"),)),
    ("irm", 100, (("float32", "full"),)),
    ("irm", 1000, (("float32", "full"),)),
)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=25_000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=None,
                        help="rows per batch (default: onnx_export.runtime.default_batch_size)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="VS at K = 1,000 only")
    parser.add_argument("--no-memory", action="store_true",
                        help="skip the per-session peak-memory processes")
    args = parser.parse_args(argv)

    load = Path("/proc/loadavg").read_text().split()[0]
    rows_per_batch = args.batch_size or "2^20 / K (256..4096)"
    bandwidth = copy_bandwidth_gb_s()
    print(f"onnxruntime CPU, {args.threads} threads, N = {args.rows}, batches of "
          f"{rows_per_batch} rows; us/example = best of {args.repeats} passes / N; wall and "
          f"process CPU time; load average {load} on {multiprocessing.cpu_count()} cores")
    print(f"copy bandwidth (1 numpy thread, read + write): {bandwidth:.1f} GB/s; lean float32 "
          f"bound = (8 K + 12) bytes / bandwidth: {(8 * 1000 + 12) / bandwidth / 1e3:.2f} "
          f"us/example at K = 1,000, {(8 * 100 + 12) / bandwidth / 1e3:.3f} at K = 100")
    header = (f"{'graph':<30}{'K':>6}{'onnx wall':>11}{'onnx cpu':>10}{'numpy wall':>12}"
              f"{'numpy cpu':>11}{'speed-up':>10}{'session MiB':>13}")
    print(header)
    print("-" * len(header))
    for name, k, variants in CONFIGS[:1] if args.quick else CONFIGS:
        cal, cord = fit_pipeline(name, k)
        logits, _ = synthetic_logits(args.rows, k, seed=k + 1)
        numpy_wall, numpy_cpu = time_numpy(cal, cord, logits, args.repeats)
        for dtype, outputs in variants:
            model = export_onnx(cal, cord, k, dtype=dtype, outputs=outputs)
            scores = logits.astype(dtype)
            onnx_wall, onnx_cpu = time_onnx(model.SerializeToString(), scores, args.threads,
                                            args.batch_size, args.repeats)
            peak = (np.nan if args.no_memory
                    else session_peak_mib(model, scores, args.threads, args.batch_size))
            label = f"{name} {dtype} {outputs}"
            print(f"{label:<30}{k:>6}{onnx_wall:>11.2f}{onnx_cpu:>10.2f}"
                  f"{numpy_wall:>12.2f}{numpy_cpu:>11.2f}{numpy_wall / onnx_wall:>9.2f}x"
                  f"{peak:>13.1f}")


if __name__ == "__main__":
    main()
