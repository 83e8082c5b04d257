"""Throughput and memory of exported pipelines under onnxruntime (CPU), against cord_ops.

Prints, for N synthetic rows (default 25,000): microseconds per example of the VS + CORD
graph in float32 at K = 1,000 and K = 100, full (five outputs) and lean
(``outputs="lean"``: repaired, label, confidence; target at K = 1,000: <= 2.5 us/example
on 2 threads), the same graphs in float64, and the isotonic graphs (irova, irova-ts, irm
at K = 10, 100, 1,000, float32 and float64; target: no slower than cord_ops' numpy path),
and the peak memory a session adds to its process. Each line sets the graph, at every
thread count asked for, beside cord_ops' numpy path (``predict_proba`` then
``transform``, single-threaded) on the same rows, and prints the load average when it
was measured.

The memory-bandwidth bound of a lean graph: it must read the N x K input and write the
N x K repaired rows plus a label and a confidence, (8 K + 12) bytes per example in float32,
so no implementation runs faster than that over the machine's copy bandwidth, which is
measured here (one numpy thread copying 256 MiB: read + write bytes over time).

    python benchmarks/bench_onnx.py [--threads 1,2] [--rows 25000] [--only irova,irm]
                                    [--batch-size N] [--repeats 5] [--quick] [--no-memory]
                                    [--no-spin]

Lean graphs are also timed as a server runs them, ``session.run`` batch after batch with
the outputs handed on rather than assembled into N x K arrays (assembling adds a fresh
result array, which the kernel zeroes, to every pass), each thread count in a fresh
process (in the alternating loop, the idle threads of one session and the numpy path
disturb the others: that loop times a lean graph at about twice what a process of its
own does).

Timing: ``flows.reproduce.timing.measure``, the numpy path and every graph x thread count
called alternately (each exposed to the same load), ``--repeats`` full passes over the N
rows each after one warm-up pass; a figure is the fastest pass / N, as wall time and as
process CPU time (summed over threads, steadier on a shared machine). ``numpy/onnx`` is the
wall-time ratio (above 1: the graph is faster). Graphs run in batches of
``onnx_export.runtime.session_batch_size`` rows unless ``--batch-size`` is given. Memory
is measured in a fresh process per configuration (peak RSS while the session runs minus
RSS before it opened). All graphs include the calibrator and the repair.
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
from cord_ops.softmax import softmax  # noqa: E402
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


def load_average() -> str:
    return Path("/proc/loadavg").read_text().split()[0]


def pipeline_call(cal, cord, logits: np.ndarray):
    """cord_ops' numpy path on float64 copies of the logits."""
    x = logits.astype(np.float64)
    return lambda: cord.transform(softmax(x), cal.predict_proba(x))


def onnx_call(model_bytes: bytes, scores: np.ndarray, threads: int, batch_size: int | None,
              spin: bool = True):
    """``run_batched``: every batch through the session, outputs assembled into [N, ...]
    arrays (as the numpy path returns them)."""
    session = open_session(model_bytes, provider="cpu", threads=threads, spin=spin)
    return lambda: run_batched(session, scores, batch_size=batch_size)


def _served(model_path: str, scores_path: str, threads: int, batch_size: int | None,
            spin: bool, repeats: int, queue) -> None:
    scores = np.load(scores_path)
    session = open_session(model_path, provider="cpu", threads=threads, spin=spin)
    rows_per_batch = batch_size or session_batch_size(session, scores.shape[1])

    def run():
        for rows in batches(len(scores), rows_per_batch):
            session.run(None, {"scores": scores[rows]})

    (timing,) = measure(run, repeats=repeats)
    queue.put((timing.best, timing.best_cpu))


def _in_fresh_process(target, model, scores: np.ndarray, *args):
    """``target(model_path, scores_path, *args, queue)`` in a spawned process, on copies of
    ``model`` and ``scores`` written to a temporary folder; returns what it puts on the
    queue. A fresh process: nothing of this one (threads, arenas, peak RSS) disturbs it."""
    with tempfile.TemporaryDirectory() as folder:
        model_path, scores_path = f"{folder}/m.onnx", f"{folder}/x.npy"
        Path(model_path).write_bytes(model.SerializeToString())
        np.save(scores_path, scores)
        ctx = multiprocessing.get_context("spawn")
        queue = ctx.Queue()
        child = ctx.Process(target=target, args=(model_path, scores_path, *args, queue))
        child.start()
        result = queue.get()
        child.join()
    return result


def served_seconds(model, scores: np.ndarray, threads: int, batch_size: int | None,
                   spin: bool, repeats: int) -> tuple[float, float]:
    """(wall, CPU) seconds of the fastest pass of what a server does, each batch through
    ``session.run`` with its outputs handed on (not assembled, so no fresh N x K result
    array is zeroed by the kernel each pass), in a fresh process: the idle threads of the
    other sessions and the numpy path of this one cannot disturb it."""
    return _in_fresh_process(_served, model, scores, threads, batch_size, spin, repeats)


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
    rows_per_batch = batch_size or session_batch_size(session, scores.shape[1])
    for rows in batches(len(scores), rows_per_batch):
        session.run(None, {"scores": scores[rows]})
    queue.put((_status_kib("VmHWM") - before) / 1024)


def session_peak_mib(model, scores: np.ndarray, threads: int, batch_size: int) -> float:
    """Peak RSS added by opening a session and running all rows, in a fresh process."""
    return _in_fresh_process(_session_peak, model, scores, threads, batch_size)


def copy_bandwidth_gb_s(megabytes: int = 256, repeats: int = 5) -> float:
    """Bytes read plus bytes written per second by one numpy copy of ``megabytes``."""
    src = np.ones(megabytes * 2**20 // 8)
    dst = np.empty_like(src)
    # the warm-up copy touches every page first
    (timing,) = measure(lambda: np.copyto(dst, src), repeats=repeats)
    return 2 * src.nbytes / timing.best / 1e9


#: (calibrator, K, [(dtype, outputs), ...]) measured by default; --quick keeps the first.
ISOTONIC = (("float32", "full"), ("float64", "full"))
CONFIGS = (
    ("vs", 1000, (("float32", "lean"), ("float32", "full"), ("float64", "full"))),
    ("vs", 100, (("float32", "lean"), ("float32", "full"), ("float64", "full"))),
    *((name, k, ISOTONIC) for name in ("irova", "irova-ts", "irm") for k in (10, 100, 1000)),
)
#: us/example of the lean VS + CORD float32 graph at K = 1,000 on 2 threads.
LEAN_TARGET_US = 2.5


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=25_000)
    parser.add_argument("--threads", default="1,2",
                        help="comma-separated intra-op thread counts (default 1,2)")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="rows per batch (default: onnx_export.runtime.session_batch_size)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--only", default=None,
                        help="comma-separated calibrator names to measure (default: all)")
    parser.add_argument("--quick", action="store_true", help="VS at K = 1,000 only")
    parser.add_argument("--no-memory", action="store_true",
                        help="skip the per-session peak-memory processes")
    parser.add_argument("--no-spin", action="store_true",
                        help="idle intra-op threads sleep instead of spinning (open_session's "
                             "spin=False; for a machine other processes keep busy)")
    args = parser.parse_args(argv)
    spin = not args.no_spin
    threads = [int(t) for t in args.threads.split(",")]
    configs = CONFIGS[:1] if args.quick else CONFIGS
    if args.only:
        configs = [c for c in configs if c[0] in args.only.split(",")]

    bandwidth = copy_bandwidth_gb_s()
    print(f"onnxruntime CPU{'' if spin else ' (threads do not spin)'}, N = {args.rows}, "
          f"batches of "
          f"{args.batch_size or 'session_batch_size'} rows; us/example = fastest of "
          f"{args.repeats} passes / N, wall (process CPU); {multiprocessing.cpu_count()} "
          f"cores, load average {load_average()} at the start")
    print(f"copy bandwidth (1 numpy thread, read + write): {bandwidth:.1f} GB/s; lean float32 "
          f"bound = (8 K + 12) bytes / bandwidth: {(8 * 1000 + 12) / bandwidth / 1e3:.2f} "
          f"us/example at K = 1,000, {(8 * 100 + 12) / bandwidth / 1e3:.3f} at K = 100; "
          f"lean VS target at K = 1,000 on 2 threads: {LEAN_TARGET_US} us/example")
    columns = "".join(f"{f'onnx {t}t':>17}{'numpy/onnx':>11}" for t in threads)
    header = (f"{'graph':<24}{'K':>6}{'numpy':>17}{columns}{'session MiB':>12}{'load':>6}")
    print(header)
    print("-" * len(header))
    for name, k, variants in configs:
        cal, cord = fit_pipeline(name, k)
        logits, _ = synthetic_logits(args.rows, k, seed=k + 1)
        for dtype, outputs in variants:
            model = export_onnx(cal, cord, k, dtype=dtype, outputs=outputs)
            scores = logits.astype(dtype)
            calls = [pipeline_call(cal, cord, logits)] + [
                onnx_call(model.SerializeToString(), scores, t, args.batch_size, spin)
                for t in threads]
            numpy_time, *onnx_times = measure(*calls, repeats=args.repeats)
            per_row = 1e6 / args.rows
            cells = "".join(
                f"{o.best * per_row:>8.2f} ({o.best_cpu * per_row:>6.2f})"
                f"{numpy_time.best / o.best:>10.2f}x" for o in onnx_times)
            peak = (np.nan if args.no_memory
                    else session_peak_mib(model, scores, threads[-1], args.batch_size))
            label = f"{name} {dtype} {outputs}"
            print(f"{label:<24}{k:>6}{numpy_time.best * per_row:>8.2f} "
                  f"({numpy_time.best_cpu * per_row:>6.2f}){cells}{peak:>12.1f}"
                  f"{load_average():>6}", flush=True)
            if outputs == "lean":
                served = [served_seconds(model, scores, t, args.batch_size, spin,
                                         args.repeats) for t in threads]
                figures = ", ".join(
                    f"{t} threads {wall * per_row:.2f} ({cpu * per_row:.2f})"
                    for t, (wall, cpu) in zip(threads, served, strict=True))
                target = f" (target {LEAN_TARGET_US} on 2 threads)" if k == 1000 else ""
                print(f"  {label} served batch by batch (session.run): {figures} "
                      f"us/example{target}, load {load_average()}", flush=True)


if __name__ == "__main__":
    main()
