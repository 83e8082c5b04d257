"""Cost of keeping a binary decision threshold: the lean VS + CORD graph of a
binary model with ``decision_threshold=0.1`` against the same pipeline keeping the argmax,
in each graph dtype, on the same rows in the same run (one intra-op thread, best of
``--repeats``), and the numpy ``CORD.transform`` alike.

    python benchmarks/bench_threshold.py [--rows 200000] [--repeats 7]

A thresholded graph computes in float64 throughout (the reweighting and the repair) and
a float32 one then checks each row's decision after the cast, so its float32 figure is
expected near the float64 graph's, not the float32 argmax graph's.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cord_ops import CORD  # noqa: E402
from cord_ops.calibrators import ConvergenceWarning, make_calibrator  # noqa: E402
from onnx_export import export_onnx, open_session  # noqa: E402


def _best(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 4000)
    margin = 3.0 * ((2 * labels - 1) * rng.uniform(0.2, 1.5, 4000) + rng.normal(0, 1, 4000))
    p_fit = 1 / (1 + np.exp(-margin))
    fit_rows = np.stack([1 - p_fit, p_fit], axis=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        cal = make_calibrator("vs", input_kind="probs").fit(fit_rows, labels)
    q_fit = cal.predict_proba(fit_rows)
    repairs = {"argmax": CORD().fit(fit_rows, q_fit),
               "t=0.1": CORD(decision_threshold=0.1).fit(fit_rows, q_fit)}
    p = rng.uniform(0, 1, args.rows).astype(np.float32)
    rows = np.stack([1 - p, p], axis=1)
    print(f"rows {args.rows}, load before {os.getloadavg()[0]:.2f}")
    wide = rows.astype(np.float64)
    q = cal.predict_proba(wide)
    numpy = {name: _best(lambda r=r: r.transform(wide, q), args.repeats)
             for name, r in repairs.items()}
    print(f"numpy CORD.transform: argmax {numpy['argmax'] * 1e3:.1f} ms, t=0.1 "
          f"{numpy['t=0.1'] * 1e3:.1f} ms, ratio {numpy['t=0.1'] / numpy['argmax']:.2f}")
    for dtype in ("float32", "float64"):
        x = rows.astype(dtype)
        found = {}
        for name, repair in repairs.items():
            session = open_session(export_onnx(cal, repair, 2, input_kind="probs",
                                               dtype=dtype, outputs="lean"),
                                   provider="cpu", threads=1)
            found[name] = _best(lambda s=session, x=x: s.run(None, {"scores": x}), args.repeats)
        print(f"{dtype} graph: argmax {found['argmax'] * 1e3:.1f} ms, t=0.1 "
              f"{found['t=0.1'] * 1e3:.1f} ms, ratio {found['t=0.1'] / found['argmax']:.2f}")
    print(f"load after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
