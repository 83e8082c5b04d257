"""Fit time, predict time and evaluation NLL of every calibrator on the shared CIFAR logits.

Protocol (the peers' protocol; their numbers are in tests/data/probmetrics_cifar.json): for seed s,
``perm = np.random.default_rng(s).permutation(10000)``, calibration = perm[:5000],
evaluation = perm[5000:]. Calibrators see p0 = softmax(float64 logits) with
``input_kind="probs"`` (as the peers did; ``--input-kind logits`` feeds the logits instead).
NLL = -mean log q[y] with q[y] clipped below at float64 eps (sklearn ``log_loss``, the
peers' convention). Fit time = ``time.perf_counter`` around ``fit`` on 5,000 rows, after a
discarded warm-up fit on 500 rows; predict time = one ``predict_proba`` on the 5,000
evaluation rows. Fit CPU seconds (``time.process_time``) are printed too: fits run on one
BLAS thread, so on a shared machine they show the cost without other processes' load.
Every time is taken by ``flows.reproduce.timing`` (the protocol of ``cord-ops bench``).
With ``--seeds 5`` the table also shows probmetrics 1.3's five-seed mean NLL from the
anchors and our difference.

Then vector scaling on synthetic 25,000 x 1,000 logits (its scale target: < 60 s).

Usage: python benchmarks/bench_calibrators.py [--seeds 5] [--files cifar10_resnet56 ...]
       [--calibrators ts vs ...] [--input-kind probs|logits] [--no-synthetic]
       python benchmarks/bench_calibrators.py --predict   # predict_proba at K = 10, 100,
       1,000 and the peak extra memory of a VS fit on 25,000 x 1,000 float32 logits
"""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path

import numpy as np

from cord_ops.calibrators import CALIBRATOR_NAMES, make_calibrator
from cord_ops.softmax import softmax
from flows.reproduce.timing import measure, once

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"

# probmetrics 1.3.0 five-seed mean evaluation NLL (eps64 clip) and mean fit seconds
# (CIFAR-10, CIFAR-100) from the anchors' tables; one copy, shared with the tests.
ANCHORS = json.loads((Path(__file__).resolve().parents[1] / "tests" / "data" /
                      "probmetrics_cifar.json").read_text())
PEER_NLL = ANCHORS["five_seed_mean_nll"]
PEER_FIT_S = {name: tuple(seconds) for name, seconds in ANCHORS["mean_fit_seconds"].items()
              if name != "columns"}


def nll(q: np.ndarray, y: np.ndarray) -> float:
    true = q[np.arange(y.shape[0]), y]
    return float(-np.mean(np.log(np.clip(true, np.finfo(np.float64).eps, None))))


def run_file(path: Path, names, seeds: int, input_kind: str) -> list[dict]:
    with np.load(path, allow_pickle=False) as f:
        logits = f["logits"].astype(np.float64)
        labels = f["labels"].astype(np.int64)
    rows = []
    for name in names:
        # Discarded warm-up on 500 rows, so first-call costs (imports, BLAS start-up) do not
        # land in the timed fit; the peers discarded a full warm-up fit.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            warm = softmax(logits[:500]) if input_kind == "probs" else logits[:500]
            make_calibrator(name, input_kind=input_kind).fit(warm, labels[:500]).predict_proba(warm)
        fits, cpus, predicts, nlls, uncals, n_warn = [], [], [], [], [], 0
        for seed in range(seeds):
            perm = np.random.default_rng(seed).permutation(labels.shape[0])
            cal, ev = perm[:5000], perm[5000:]
            scores = softmax(logits) if input_kind == "probs" else logits
            cal_x, ev_x = scores[cal], scores[ev]
            cal_y, ev_y = labels[cal], labels[ev]
            calibrator = make_calibrator(name, input_kind=input_kind)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                fit = once(lambda c=calibrator, x=cal_x, y=cal_y: c.fit(x, y))
            predict = once(lambda c=calibrator, x=ev_x: c.predict_proba(x))
            q = predict.result
            n_warn += len(caught)
            fits.append(fit.best)
            cpus.append(fit.best_cpu)
            predicts.append(predict.best)
            nlls.append(nll(q, ev_y))
            uncals.append(nll(softmax(logits[ev]), ev_y))
        uncal = float(np.mean(uncals))
        rows.append(dict(file=path.stem, calibrator=name, fit_s=float(np.mean(fits)),
                         fit_max_s=float(np.max(fits)), fit_cpu_s=float(np.mean(cpus)),
                         predict_s=float(np.mean(predicts)),
                         nll=float(np.mean(nlls)), uncal_nll=uncal, warnings=n_warn))
        r = rows[-1]
        peer = PEER_NLL.get(path.stem, {}).get(name)
        peer_txt = ""
        if peer is not None and seeds == 5:
            peer_txt = f" | pm {peer:.4f} ({r['nll'] - peer:+.4f})"
        k = logits.shape[1]
        pfit = PEER_FIT_S.get(name)
        pfit_txt = f" | pm fit {pfit[0 if k <= 10 else 1]:.3f}s" if pfit else ""
        print(f"{path.stem:27s} {name:9s} fit {r['fit_s']:7.3f}s (max {r['fit_max_s']:6.3f}, "
              f"cpu {r['fit_cpu_s']:6.3f}) predict {r['predict_s']:.4f}s  "
              f"NLL {r['nll']:.5f} (uncal {uncal:.4f})"
              f"  warnings {n_warn}{peer_txt}{pfit_txt}", flush=True)
    return rows


def run_synthetic(n: int = 25_000, k: int = 1_000) -> None:
    """VS on an ImageNet-sized problem: labels drawn from a true model (one clear favourite
    per row, about 70% top-1), reported logits rescaled and shifted per class."""
    rng = np.random.default_rng(0)
    true = rng.normal(scale=1.5, size=(n, k))
    true[np.arange(n), rng.integers(0, k, n)] += 9.0
    labels = (softmax(true).cumsum(axis=1) > rng.random((n, 1))).argmax(axis=1)
    logits = true * rng.uniform(0.5, 2.0, size=k) + rng.normal(scale=0.5, size=k)
    del true
    calibrator = make_calibrator("vs")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit = once(lambda: calibrator.fit(logits, labels))
    predict = once(lambda: calibrator.predict_proba(logits))
    q = predict.result
    print(f"synthetic {n} x {k}: vs fit {fit.best:.2f}s (cpu {fit.best_cpu:.2f}) predict "
          f"{predict.best:.2f}s, top-1 {np.mean(logits.argmax(axis=1) == labels):.3f}, "
          f"NLL {nll(softmax(logits), labels):.4f} -> {nll(q, labels):.4f} (calibration "
          f"rows), warnings {len(caught)}", flush=True)


def _peer_predictors(name: str, probs: np.ndarray, labels: np.ndarray) -> dict:
    """{peer: predict(probs)} of the peers importable here for family ``name`` (ts, vs,
    irova), each fitted on ``probs`` (the peers take probabilities). probmetrics and netcal
    need torch; install them into a separate environment to time them (they are not
    dependencies of cord-ops)."""
    peers = {}
    try:
        from probmetrics.calibrators import get_calibrator
    except ImportError:
        get_calibrator = None
    try:
        from netcal.scaling import LogisticCalibration, TemperatureScaling
    except ImportError:
        LogisticCalibration = TemperatureScaling = None
    if get_calibrator is not None and name in ("ts", "irova"):
        method = {"ts": "temp-scaling", "irova": "isotonic"}[name]
        peers["probmetrics"] = get_calibrator(method).fit(probs, labels).predict_proba
    if TemperatureScaling is not None and name == "ts":
        peers["netcal"] = TemperatureScaling().fit(probs, labels).transform
    if LogisticCalibration is not None and name == "vs" and probs.shape[1] <= 100:
        peers["netcal"] = LogisticCalibration().fit(probs, labels).transform  # VS (netcal)
    return peers


def _mapped(cal, logits: np.ndarray) -> np.ndarray:
    """The fitted map's logits: beta z (TS), z w + b (VS), z W^T + b (MS)."""
    if cal.name == "ts":
        return cal.beta_ * logits
    if cal.name == "vs":
        return logits * cal.weights_ + cal.bias_
    return logits @ cal.weights_.T + cal.bias_


def run_predict(rows: int = 5_000, ks=(10, 100, 1000), names=("ts", "vs", "ms")) -> None:
    """predict_proba time at K = 10, 100, 1,000 beside scipy's softmax of the same logits
    and, on probabilities, beside each peer importable here (minimum of 7 calls each)."""
    from scipy.special import softmax as scipy_softmax

    def best(fn, repeats=7):
        return measure(fn, repeats=repeats, warm_up=False)[0].best * 1e3

    for k in ks:
        rng = np.random.default_rng(k)
        labels = rng.integers(0, k, rows)
        logits = rng.normal(0.0, 2.0, (rows, k))
        logits[np.arange(rows), labels] += rng.uniform(2.0, 9.0, rows)
        for name in names:
            if name == "ms" and k > 100:
                continue
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                cal = make_calibrator(name, **({} if name == "ts" else {"max_iter": 20}))
                cal.fit(logits, labels)
            ours = best(lambda c=cal, x=logits: c.predict_proba(x))
            ref = best(lambda c=cal, x=logits: scipy_softmax(_mapped(c, x), axis=1))
            print(f"predict_proba {name:5s} K={k:5d} n={rows}: {ours:8.2f} ms (validation "
                  f"included); scipy softmax of the same map {ref:8.2f} ms -> {ours / ref:.2f}x",
                  flush=True)
        probs = softmax(logits)
        for name in ("ts", "vs", "irova"):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                peers = _peer_predictors(name, probs[:2000], labels[:2000])
                if not peers:
                    continue
                cal = make_calibrator(name, input_kind="probs",
                                      **({"max_iter": 20} if name == "vs" else {}))
                cal.fit(probs[:2000], labels[:2000])
                ours = best(lambda c=cal, x=probs: c.predict_proba(x))
                times = {peer: best(lambda f=fn, x=probs: f(x)) for peer, fn in peers.items()}
            fastest = min(times.values())
            peer_txt = ", ".join(f"{peer} {t:.2f} ms" for peer, t in times.items())
            print(f"predict_proba {name:5s} K={k:5d} on probabilities: cord_ops {ours:.2f} ms; "
                  f"{peer_txt} -> {ours / fastest:.2f}x the fastest peer", flush=True)


def vs_fit_peak(n: int = 25_000, k: int = 1_000) -> None:
    """Peak extra memory (tracemalloc) of one VS fit on n x K float32 logits."""
    import tracemalloc

    rng = np.random.default_rng(0)
    labels = rng.integers(0, k, n)
    logits = rng.normal(0.0, 2.0, (n, k))
    logits[np.arange(n), labels] += rng.uniform(2.0, 9.0, n)
    logits = logits.astype(np.float32)
    tracemalloc.start()
    tracemalloc.reset_peak()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        make_calibrator("vs").fit(logits, labels)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(f"VS fit {n} x {k} float32: peak extra memory {peak / 2**20:.0f} MiB "
          f"(probmetrics' float32 path: 646 MiB)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=DATA)
    parser.add_argument("--files", nargs="*", default=None)
    parser.add_argument("--calibrators", nargs="*", default=list(CALIBRATOR_NAMES))
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--input-kind", choices=("probs", "logits"), default="probs")
    parser.add_argument("--no-synthetic", action="store_true")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    parser.add_argument("--predict", action="store_true",
                        help="only predict_proba at K = 10, 100, 1,000 and VS fit memory")
    args = parser.parse_args()
    if args.predict:
        run_predict()
        vs_fit_peak()
        return
    stems = args.files or sorted(json.loads((args.data_dir / "manifest.json").read_text()))
    rows = []
    for stem in stems:
        rows += run_file(args.data_dir / f"{stem}.npz", args.calibrators, args.seeds,
                         args.input_kind)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    if not args.no_synthetic:
        run_synthetic()


if __name__ == "__main__":
    main()
