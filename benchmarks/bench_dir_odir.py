"""Fit time of Dir-ODIR (Kull et al.'s grid, 5-fold CV, path search) per CIFAR-100 net.

Target: one fit on 5,000 x 100 in at most 60 s on the 2-core CI machine.

Protocol: the paper's split (``cord_ops.data.split_indices``, seed 0 unless ``--seeds``),
Dir-ODIR with its defaults on the 5,000 calibration logits; wall and process CPU seconds of
one ``fit`` (``flows.reproduce.timing.once``; fits run on one BLAS thread, so CPU seconds
show the cost without other processes' load), the 1-minute load average before and after
each fit, the number of (lambda, mu) pairs scored and of fold fits, the selected pair, its
CV NLL and the evaluation-half NLL. ``--grid`` also scores every pair of the grid (243 at
K = 100, minutes per net) and prints the grid's optimum and how far the path's selection is
from it in CV NLL.

Usage: python benchmarks/bench_dir_odir.py [--files cifar100_resnet56 ...] [--seeds 1]
       [--grid]
"""

from __future__ import annotations

import argparse
import os
import warnings
from pathlib import Path

import numpy as np

from cord_ops import data
from cord_ops.calibrators import make_calibrator
from cord_ops.metrics import nll
from flows.reproduce.timing import once

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
NETS = ("vgg16_bn", "resnet56", "mobilenetv2_x1_4", "shufflenetv2_x1_0", "repvgg_a1")


def run(path: Path, seed: int, grid: bool) -> dict:
    dataset = data.load_npz(path)
    cal, ev = data.split_indices(dataset.n, seed)
    x, y = dataset.scores[cal], dataset.labels[cal]
    model = make_calibrator("dir-odir", input_kind=dataset.input_kind)
    load_before = os.getloadavg()[0]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit = once(lambda: model.fit(x, y))
    load_after = os.getloadavg()[0]
    cv = model.cv_path_
    chosen = cv[(cv[:, 0] == model.reg_lambda_) & (cv[:, 1] == model.reg_mu_), 2][0]
    row = dict(file=path.stem, seed=seed, wall_s=fit.best, cpu_s=fit.best_cpu,
               load=(load_before, load_after), pairs=len(cv), fold_fits=5 * len(cv) + 1,
               reg_lambda=model.reg_lambda_, reg_mu=model.reg_mu_, cv_nll=float(chosen),
               eval_nll=nll(model.predict_proba(dataset.scores[ev]), dataset.labels[ev]),
               warnings=len(caught))
    print(f"{path.stem:27s} seed {seed}: fit {row['wall_s']:6.1f} s wall, {row['cpu_s']:6.1f} s "
          f"CPU (load {load_before:.1f} -> {load_after:.1f}); {row['pairs']} pairs, "
          f"{row['fold_fits']} fits; lambda {model.reg_lambda_:g} mu {model.reg_mu_:g} "
          f"CV NLL {chosen:.5f}; eval NLL {row['eval_nll']:.5f}; warnings {len(caught)}",
          flush=True)
    if grid:
        full = make_calibrator("dir-odir", input_kind=dataset.input_kind, search="grid")
        timing = once(lambda: full.fit(x, y))
        best = full.cv_path_[np.argmin(full.cv_path_[:, 2])]
        print(f"{'':27s} grid: {len(full.cv_path_)} pairs in {timing.best:.0f} s; optimum "
              f"lambda {best[0]:g} mu {best[1]:g} CV NLL {best[2]:.5f}; path's selection "
              f"{chosen - best[2]:+.2e} nats from it", flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", nargs="+", default=[f"cifar100_{n}" for n in NETS])
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--grid", action="store_true")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs", flush=True)
    rows = [run(DATA / f"{name}.npz", seed, args.grid)
            for seed in range(args.seeds) for name in args.files]
    walls = [r["wall_s"] for r in rows]
    cpus = [r["cpu_s"] for r in rows]
    print(f"Dir-ODIR fit over {len(rows)} fits: wall median {np.median(walls):.1f} s, max "
          f"{max(walls):.1f} s; CPU median {np.median(cpus):.1f} s, max {max(cpus):.1f} s "
          f"(target: at most 60 s per fit)", flush=True)


if __name__ == "__main__":
    main()
