"""The prepared GPU check: every exported graph on the GPU against cord_ops, and the lean
VS + CORD graph's throughput beside the same machine's CPU; figures in one JSON file.

    python benchmarks/gpu_check.py [--out gpu_check.json] [--budget 330] [--quick] [--tiny]
                                   [--runtime auto|onnxruntime-cuda|torch-cuda|cpu]
                                   [--data ../shared/data] [--rows 1000000] [--only vs,ts]

Stages, each with its share of ``--budget`` seconds (default 330, so the whole run with
imports and fits stays under 6 minutes), in this order:

1. ``environment``: Python, onnxruntime and its providers, PyTorch, CuPy, the GPU, and the
   runtime the GPU figures come from: onnxruntime's CUDAExecutionProvider when a session
   starts on it (TF32 off, ``onnx_export.runtime.CUDA_OPTIONS``; every node must run on
   it, ``onnx_export.runtime.placement``), else ``onnx_export.torch_runtime.TorchGraph``
   on PyTorch's CUDA with TF32 switched off here, else none (every GPU check is skipped
   with that reason and the checks run on the CPU runtimes instead, so that the script's
   own paths are exercised: onnxruntime CPU, and TorchGraph on the CPU when PyTorch is
   installed).
2. ``cifar``: each calibrator fitted (capped iterations, ``FIT_OPTIONS``) on the first half
   of a CIFAR-100 logits file of ``--data`` (manifest.json; skipped with the reason when
   absent), its float32 and float64 graphs run on the other half: max abs difference of
   repaired / calibrated / confidence against the numpy pipeline (``predict_proba`` then
   ``CORD.transform`` in float64) and top-1 changes (rows whose label or repaired argmax
   differs from the input's top-1; must be 0).
3. ``synthetic``: the same on ``--rows`` x 1,000 synthetic logits (default 1,000,000),
   generated and compared chunk by chunk (a chunk of 2**16 rows is 256 MiB in float32);
   each graph gets an equal share of the stage's budget and the figures say how many rows
   it covered.
4. ``throughput``: the lean VS + CORD float32 graph at K = 100 and 1,000; on the GPU with
   the input and outputs kept on the device (onnxruntime IO binding / torch tensors), and
   with host arrays in and out, beside onnxruntime CPU on all cores of the same machine;
   microseconds per example, fastest of the repeats.

Exit status 1 when any parity figure fails (a difference above the bound of
docs/contract.md, a top-1 change, a node off the GPU); skipped checks do not fail.
``--tiny`` shrinks everything (K = 10 synthetic rows, a few hundred CIFAR rows) for the
test suite; ``--quick`` halves the budget and keeps VS, TS, irova and dir-odir.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

REPO = Path(__file__).resolve().parents[1]
#: Parity bounds of docs/contract.md per graph dtype.
TOLERANCE = {"float32": 1e-5, "float64": 1e-12}
#: Capped fits (still genuine fitted states) so eleven fits at K = 1,000 fit the budget.
FIT_OPTIONS = {
    "vs": {"max_iter": 60}, "ms": {"max_iter": 20}, "svs": {"max_iter": 60},
    "sms": {"max_iter": 20}, "mcct-i": {"max_iter": 60},
    "dir-odir": {"reg_lambdas": (1e-2,), "reg_mus": (1e-2,), "max_iter": 20},
}
#: The K x K families get a few iterations at K = 1,000.
WIDE_FIT_OPTIONS = {"max_iter": 3}
FULL_MATRIX = ("ms", "sms", "dir-odir")
QUICK_CALIBRATORS = ("vs", "ts", "irova", "dir-odir")
#: Shares of --budget per stage.
SHARES = {"cifar": 0.3, "synthetic": 0.45, "throughput": 0.25}
CHUNK_ROWS = 1 << 16
#: Rows of a graph's first chunk, and of each synthetic block (its own seed), so the
#: synthetic rows are the same whatever the chunks.
FIRST_ROWS = 1 << 12
CIFAR100 = "cifar100_"


class Clock:
    """Seconds left of a stage's budget."""

    def __init__(self, seconds: float):
        self.deadline = time.perf_counter() + seconds

    def left(self) -> float:
        return self.deadline - time.perf_counter()


# ---------------------------------------------------------------- environment
def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


def environment(requested: str) -> dict:
    """What the machine has, and the runtime chosen for the GPU figures."""
    torch = _torch()  # imported before onnxruntime: onnxruntime-gpu then finds its CUDA libs
    import onnxruntime as ort

    from onnx_export.runtime import CUDA, CUDA_OPTIONS, cuda_available

    env = {"python": platform.python_version(), "machine": platform.machine(),
           "cpu_count": os.cpu_count(), "onnxruntime": ort.__version__,
           "onnxruntime_providers": ort.get_available_providers(),
           "torch": getattr(torch, "__version__", None), "torch_cuda": None, "gpu": None,
           "cupy": None}
    try:
        import cupy

        env["cupy"] = cupy.__version__
    except ImportError:
        pass
    torch_gpu = torch is not None and torch.cuda.is_available()
    if torch is not None:
        env["torch_cuda"] = torch.version.cuda
        # float32 MatMul on tensor cores keeps 10 mantissa bits: off for every figure.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    env["tf32"] = {"onnxruntime_cuda_options": CUDA_OPTIONS,
                   "torch_matmul": bool(torch and torch.backends.cuda.matmul.allow_tf32),
                   "torch_cudnn": bool(torch and torch.backends.cudnn.allow_tf32)}
    if torch_gpu:
        props = torch.cuda.get_device_properties(0)
        env["gpu"] = {"name": props.name, "memory_gib": round(props.total_memory / 2**30, 1),
                      "count": torch.cuda.device_count()}
    ort_cuda, reason = False, None
    if cuda_available():
        if hasattr(ort, "preload_dlls"):
            ort.preload_dlls()
        ort_cuda, reason = _ort_cuda_starts()
    else:
        reason = f"onnxruntime {ort.__version__} has no {CUDA} (a CPU-only build)"
    env["onnxruntime_cuda"] = {"usable": ort_cuda, "reason": reason}
    choices = {"onnxruntime-cuda": ort_cuda, "torch-cuda": torch_gpu, "cpu": True}
    if requested == "auto":
        runtime = next(name for name, ok in choices.items() if ok)
    elif not choices[requested]:
        raise SystemExit(f"error: --runtime {requested}: not available here "
                         f"({reason if requested == 'onnxruntime-cuda' else 'torch sees no GPU'})")
    else:
        runtime = requested
    env["runtime"] = runtime
    env["runtimes_checked"] = ([runtime] if runtime != "cpu"
                               else ["onnxruntime-cpu"] + (["torch-cpu"] if torch else []))
    return env


def _ort_cuda_starts() -> tuple[bool, str | None]:
    from onnx import TensorProto, helper

    from onnx_export.runtime import CUDA, open_session

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])], "probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)],
                              ir_version=9)
    try:
        session = open_session(model, provider="cuda")
    except RuntimeError as exc:
        return False, str(exc)
    return CUDA in session.get_providers(), None


# ---------------------------------------------------------------- runners
class Runner:
    """Runs one exported graph on one runtime: ``__call__(scores) -> {output: ndarray}``.
    ``placement`` lists the nodes that ran elsewhere than the runtime's device."""

    def __init__(self, model, runtime: str):
        self.runtime, self.off_device = runtime, []
        if runtime.startswith("torch"):
            from onnx_export.torch_runtime import TorchGraph

            self.graph = TorchGraph(model, "cuda" if runtime == "torch-cuda" else "cpu")
            self.session = None
        else:
            from onnx_export.runtime import open_session

            provider = "cuda" if runtime == "onnxruntime-cuda" else "cpu"
            self.session = open_session(model, provider=provider)
            self.model = model

    def check_placement(self, scores: np.ndarray) -> list[str]:
        """Nodes not on the runtime's provider in one profiled run (onnxruntime), or for
        TorchGraph the outputs that did not come out on its device."""
        if self.session is None:
            outputs = self.graph.run({"scores": scores})
            self.off_device = sorted(f"output {name} on {value.device}"
                                     for name, value in outputs.items()
                                     if value.device.type != self.graph.device.type)
            return self.off_device
        from onnx_export.runtime import CPU, CUDA, placement

        want = CUDA if self.runtime == "onnxruntime-cuda" else CPU
        ran = placement(self.model, scores, "cuda" if want == CUDA else "cpu")
        self.off_device = sorted(f"{node} ({op}) on {provider}"
                                 for node, (op, provider) in ran.items() if provider != want)
        return self.off_device

    def __call__(self, scores: np.ndarray) -> dict[str, np.ndarray]:
        if self.session is None:
            return self.graph.run_numpy({"scores": scores})
        from onnx_export.runtime import run_on_device

        return {name: value.numpy()
                for name, value in run_on_device(self.session, scores, device="cpu").items()}


# ---------------------------------------------------------------- parity
def fit(name: str, scores: np.ndarray, labels: np.ndarray):
    from cord_ops import CORD
    from cord_ops.calibrators import ConvergenceWarning, make_calibrator
    from cord_ops.softmax import softmax

    options = dict(FIT_OPTIONS.get(name, {}))
    if name in FULL_MATRIX and scores.shape[1] > 100:
        options.update(WIDE_FIT_OPTIONS)
    x = scores.astype(np.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        cal = make_calibrator(name, **options).fit(x, labels)
    return cal, CORD().fit(softmax(x), cal.predict_proba(x))


def reference(cal, cord, logits: np.ndarray) -> dict[str, np.ndarray]:
    """The numpy pipeline in float64."""
    from cord_ops.softmax import softmax

    x = logits.astype(np.float64)
    original = softmax(x)
    calibrated = cal.predict_proba(x)
    repaired = cord.transform(original, calibrated)
    label = np.argmax(original, axis=1)
    return {"calibrated": calibrated, "repaired": repaired, "label": label,
            "confidence": repaired[np.arange(len(label)), label]}


class Parity:
    """Running max abs differences and top-1 changes over chunks of one graph."""

    def __init__(self, dtype: str):
        self.dtype, self.rows, self.top1_changes = dtype, 0, 0
        self.max_abs = {"repaired": 0.0, "calibrated": 0.0, "confidence": 0.0}

    def add(self, got: dict, want: dict) -> None:
        for key in self.max_abs:
            diff = np.abs(got[key].astype(np.float64) - want[key])
            self.max_abs[key] = max(self.max_abs[key], float(np.max(diff, initial=0.0)))
        label = got["label"].reshape(-1)
        self.top1_changes += int(np.count_nonzero(
            (label != want["label"]) | (np.argmax(got["repaired"], axis=1) != want["label"])))
        self.rows += len(label)

    @property
    def ok(self) -> bool:
        return self.top1_changes == 0 and all(
            d <= TOLERANCE[self.dtype] for d in self.max_abs.values())

    def figures(self) -> dict:
        return {"rows": self.rows, "max_abs": self.max_abs, "top1_changes": self.top1_changes,
                "tolerance": TOLERANCE[self.dtype], "ok": self.ok}


def check_graph(name: str, cal, cord, k: int, dtype: str, runtime: str, rows_of,
                total: int, seconds: float) -> dict:
    """Export, then check rows ``rows_of(start, n)`` chunk after chunk until ``total`` rows
    are covered or ``seconds`` pass. The first chunk is small (FIRST_ROWS); each next one
    is sized from the seconds per row measured so far to fit what is left (at most
    CHUNK_ROWS), so a slow machine checks fewer rows instead of overrunning its share."""
    from onnx_export import export_onnx

    clock = Clock(seconds)
    model = export_onnx(cal, cord, k, dtype=dtype)
    runner = Runner(model, runtime)
    parity = Parity(dtype)
    start, n, spent = 0, min(FIRST_ROWS, total), 0.0
    off = None
    while start < total and n > 0:
        began = time.perf_counter()
        logits = rows_of(start, n)
        scores = logits.astype(dtype)
        if off is None:
            off = runner.check_placement(scores[:256])
        parity.add(runner(scores), reference(cal, cord, logits))
        spent += time.perf_counter() - began
        start += n
        per_row = max(spent / start, 1e-9)
        n = int(min(CHUNK_ROWS, total - start, max(clock.left(), 0.0) / per_row))
        n -= n % FIRST_ROWS if n > FIRST_ROWS else 0
    figures = {"calibrator": name, "dtype": dtype, "runtime": runtime, **parity.figures(),
               "nodes_off_device": off}
    figures["ok"] = figures["ok"] and not off
    return figures


def report_line(r: dict) -> str:
    worst = max(r["max_abs"].values())
    return (f"{'ok  ' if r['ok'] else 'FAIL'} {r['data']:<28} {r['calibrator']:<9} "
            f"{r['dtype']} {r['runtime']:<16} rows {r['rows']:>8} max|diff| {worst:.2e} "
            f"top-1 changes {r['top1_changes']}"
            + (f" off device: {r['nodes_off_device']}" if r["nodes_off_device"] else ""))


def cifar_stage(args, calibrators, runtimes, seconds: float) -> tuple[list, list]:
    """Every CIFAR-100 file of the manifest while the stage's budget lasts (a fit and a
    graph that are not started for want of time are listed as skipped)."""
    data = Path(args.data)
    manifest = data / "manifest.json"
    if not manifest.is_file():
        return [], [{"check": "cifar", "reason": f"no {manifest} (the shared CIFAR logits "
                                                 f"are not on this machine)"}]
    names = sorted(n for n in json.loads(manifest.read_text()) if n.startswith(CIFAR100))
    if not names:
        return [], [{"check": "cifar", "reason": f"{manifest} lists no CIFAR-100 file"}]
    clock = Clock(seconds)
    results, skipped = [], []
    for name in names[:1] if args.tiny else names:
        archive = np.load(data / f"{name}.npz")
        logits, labels = archive["logits"], archive["labels"]
        if args.tiny:
            logits, labels = logits[:600], labels[:600]
        half = len(labels) // 2
        for cal_name in calibrators:
            if clock.left() <= 0:
                skipped.append({"check": f"cifar {name} {cal_name}",
                                "reason": "stage budget spent"})
                continue
            cal, cord = fit(cal_name, logits[:half], labels[:half])
            for runtime in runtimes:
                for dtype in ("float32", "float64"):
                    # every held-out row, whatever the clock says: it gates the fits
                    figures = check_graph(
                        cal_name, cal, cord, logits.shape[1], dtype, runtime,
                        lambda start, n, held=logits[half:]: held[start:start + n],
                        len(labels) - half, float("inf"))
                    results.append({"data": name, **figures})
                    print(report_line(results[-1]), flush=True)
    return results, skipped


def synthetic_logits(n: int, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """float32 logits of an overconfident classifier with exact top-two ties in 1% of rows,
    and labels."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, k, n)
    logits = rng.normal(0.0, 2.0, (n, k))
    logits[np.arange(n), labels] += rng.uniform(0.0, 9.0, n)
    logits = logits.astype(np.float32)
    tied = rng.random(n) < 0.01
    top = logits.argmax(axis=1)
    other = (top + 1 + rng.integers(0, k - 1, n)) % k
    logits[tied, other[tied]] = logits[tied, top[tied]]
    return logits, labels


def synthetic_stage(args, calibrators, runtimes, seconds: float) -> tuple[list, list]:
    k = 10 if args.tiny else 1000
    rows = min(args.rows, 2000) if args.tiny else args.rows
    fit_logits, fit_labels = synthetic_logits(300 if k > 100 else 1200, k, seed=k)

    def rows_of(start: int, n: int) -> np.ndarray:
        """Rows [start, start + n) of the batch, built block by block (FIRST_ROWS rows,
        seeded by the block's index)."""
        first, last = start // FIRST_ROWS, (start + n - 1) // FIRST_ROWS
        blocks = [synthetic_logits(FIRST_ROWS, k, seed=1000 + b)[0]
                  for b in range(first, last + 1)]
        offset = start - first * FIRST_ROWS
        return np.concatenate(blocks)[offset:offset + n]

    clock = Clock(seconds)
    results, skipped = [], []
    remaining = len(calibrators) * 2 * len(runtimes)
    for cal_name in calibrators:
        if clock.left() <= 0:
            skipped.append({"check": f"synthetic {cal_name}", "reason": "stage budget spent"})
            continue
        cal, cord = fit(cal_name, fit_logits, fit_labels)
        for runtime in runtimes:
            for dtype in ("float32", "float64"):
                # what is left of the stage, shared by the graphs still to check (the
                # fits are paid from it too)
                share, remaining = max(clock.left(), 0.0) / remaining, remaining - 1
                figures = check_graph(cal_name, cal, cord, k, dtype, runtime, rows_of, rows,
                                      share)
                results.append({"data": f"synthetic {rows} x {k}", "rows_asked": rows,
                                **figures})
                print(report_line(results[-1]), flush=True)
    return results, skipped


# ---------------------------------------------------------------- throughput
def _best(call, repeats: int, sync=lambda: None) -> float:
    call()
    sync()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        sync()
        best = min(best, time.perf_counter() - start)
    return best


def throughput_stage(args, runtime: str, seconds: float) -> tuple[list, list]:
    clock = Clock(seconds)
    rows = 2000 if args.tiny else 1 << 18
    repeats = 2 if args.tiny else 5
    results, skipped = [], []
    for k in ((10,) if args.tiny else (1000, 100)):  # the headline K first
        if clock.left() <= 0:
            skipped.append({"check": f"throughput K={k}", "reason": "stage budget spent"})
            continue
        entry = _throughput(k, rows, repeats, runtime)
        if "gpu_runtime" not in entry:
            skipped.append({"check": f"throughput K={k} on the GPU",
                            "reason": "no GPU runtime (see environment)"})
        results.append(entry)
    return results, skipped


def _throughput(k: int, rows: int, repeats: int, runtime: str) -> dict:
    """us/example of the lean VS float32 graph at K on onnxruntime CPU and on ``runtime``."""
    from onnx_export import export_onnx
    from onnx_export.runtime import open_session, run_host, run_on_device, to_device

    logits, labels = synthetic_logits(rows, k, seed=k + 1)
    cal, cord = fit("vs", logits[:3000].astype(np.float64), labels[:3000])
    model = export_onnx(cal, cord, k, dtype="float32", outputs="lean")
    cpu = open_session(model, provider="cpu")
    names = [o.name for o in cpu.get_outputs()]
    cpu_s = _best(lambda: run_host(cpu, logits, names), repeats)
    entry = {"graph": "vs float32 lean", "K": k, "rows": rows,
             "cpu_onnxruntime_us": cpu_s / rows * 1e6, "cpu_threads": os.cpu_count()}
    if runtime == "onnxruntime-cuda":
        gpu = open_session(model, provider="cuda")
        on_device = to_device(logits, "cuda")
        device_s = _best(lambda: run_on_device(gpu, on_device, device="cuda"), repeats)
        host_s = _best(lambda: run_host(gpu, logits, names), repeats)
    elif runtime == "torch-cuda":
        import torch

        from onnx_export.torch_runtime import TorchGraph

        graph = TorchGraph(model, "cuda")
        on_device = torch.from_numpy(logits).cuda()
        sync = torch.cuda.synchronize
        device_s = _best(lambda: graph.run({"scores": on_device}), repeats, sync)
        host_s = _best(lambda: graph.run_numpy({"scores": logits}), repeats, sync)
    else:
        return entry
    entry.update(gpu_runtime=runtime, gpu_device_resident_us=device_s / rows * 1e6,
                 gpu_host_in_out_us=host_s / rows * 1e6, cpu_over_gpu=cpu_s / device_s)
    return entry


# ---------------------------------------------------------------- main
def main(argv=None) -> int:
    from cord_ops.calibrators import CALIBRATOR_NAMES

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="gpu_check.json")
    parser.add_argument("--budget", type=float, default=330.0,
                        help="seconds for the cifar, synthetic and throughput stages together")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--tiny", action="store_true", help="tiny sizes, for the test suite")
    parser.add_argument("--runtime", default="auto",
                        choices=("auto", "onnxruntime-cuda", "torch-cuda", "cpu"))
    parser.add_argument("--data", default=str(REPO.parent / "shared" / "data"))
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--only", default=None, help="comma-separated calibrator names")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    calibrators = list(QUICK_CALIBRATORS if args.quick else CALIBRATOR_NAMES)
    if args.only:
        unknown = set(args.only.split(",")) - set(CALIBRATOR_NAMES)
        if unknown:
            raise SystemExit(f"error: --only: unknown calibrators {sorted(unknown)}")
        calibrators = args.only.split(",")
    budget = args.budget / 2 if args.quick else args.budget

    env = environment(args.runtime)
    runtimes = env["runtimes_checked"]
    skipped = []
    if env["runtime"] == "cpu":
        skipped.append({"check": "every GPU figure (parity and throughput)",
                        "reason": "no GPU runtime: " + (env["onnxruntime_cuda"]["reason"] or "")
                        + ("; torch sees no CUDA GPU" if env["torch"] else
                           "; PyTorch is not installed")
                        + ". Parity ran on the CPU runtimes instead."})
    print(f"runtime for the GPU figures: {env['runtime']} (checked: {', '.join(runtimes)}); "
          f"GPU: {env['gpu']}; onnxruntime {env['onnxruntime']} providers "
          f"{env['onnxruntime_providers']}; torch {env['torch']} (CUDA {env['torch_cuda']})",
          flush=True)
    cifar, cifar_skipped = cifar_stage(args, calibrators, runtimes,
                                       budget * SHARES["cifar"])
    skipped += cifar_skipped
    synthetic, synthetic_skipped = synthetic_stage(args, calibrators, runtimes,
                                                   budget * SHARES["synthetic"])
    skipped += synthetic_skipped
    throughput, tp_skipped = throughput_stage(args, env["runtime"],
                                              budget * SHARES["throughput"])
    skipped += tp_skipped
    failures = [r for r in cifar + synthetic if not r["ok"]]
    report = {"environment": env, "skipped": skipped, "cifar": cifar, "synthetic": synthetic,
              "throughput": throughput, "failures": len(failures),
              "seconds": round(time.perf_counter() - started, 1)}
    Path(args.out).write_text(json.dumps(report, indent=1))

    for r in failures:
        print(report_line(r))
    for t in throughput:
        gpu = (f"; GPU ({t['gpu_runtime']}) {t['gpu_device_resident_us']:.4f} us/example on "
               f"device, {t['gpu_host_in_out_us']:.4f} host in/out"
               if "gpu_runtime" in t else "")
        print(f"throughput {t['graph']} K={t['K']}: CPU onnxruntime "
              f"{t['cpu_onnxruntime_us']:.3f} us/example ({t['cpu_threads']} threads){gpu}")
    for s in skipped:
        print(f"skipped: {s['check']}: {s['reason']}")
    print(f"{len(failures)} parity failures; {report['seconds']} s; figures in {args.out}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
