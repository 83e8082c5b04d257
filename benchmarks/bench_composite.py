"""Overhead of ``CORDCalibratedClassifier`` over calling the classifier, the calibrator and
CORD by hand (target: under 5% for predict_proba), at K = 100.

    python benchmarks/bench_composite.py [--rows 20000] [--classes 100] [--repeats 7]

The classifier is a LogisticRegression on 256 synthetic features (fitted once, frozen);
both paths compute decision_function, VS's predict_proba and CORD's transform on the same
rows and are checked to return identical arrays. Each is timed as the best of
``--repeats`` calls, alternating the two so that load on a shared machine hits both alike,
as wall time and as process CPU time (the steadier figure on a busy machine; run with
OPENBLAS_NUM_THREADS=1 so CPU time is not inflated by idle-spinning BLAS threads).
Also prints the fit overhead (the composite additionally checks, on the calibration rows,
that the classifier predicts the argmax of its scores).
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sklearn.frozen import FrozenEstimator  # noqa: E402
from sklearn.linear_model import LogisticRegression  # noqa: E402

from cord_ops import CORD, CORDCalibratedClassifier  # noqa: E402
from cord_ops.calibrators import ConvergenceWarning, make_calibrator  # noqa: E402
from cord_ops.softmax import softmax  # noqa: E402


def problem(n: int, k: int, d: int = 256, seed: int = 0):
    rng = np.random.default_rng(seed)
    centres = rng.normal(0.0, 1.0, (k, d))
    y = rng.integers(0, k, n)
    x = centres[y] + rng.normal(0.0, 3.0, (n, d))
    return x, y


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    k = args.classes
    x, y = problem(3 * args.rows, k)
    train, cal, test = (slice(0, args.rows), slice(args.rows, 2 * args.rows),
                        slice(2 * args.rows, 3 * args.rows))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        warnings.simplefilter("ignore", UserWarning)
        clf = LogisticRegression(max_iter=30).fit(x[train], y[train])

        def by_hand_fit():
            scores = clf.decision_function(x[cal])
            calibrator = make_calibrator("vs", max_iter=50).fit(scores, y[cal])
            cord = CORD().fit(softmax(scores), calibrator.predict_proba(scores))
            return calibrator, cord

        def composite_fit():
            return CORDCalibratedClassifier(
                FrozenEstimator(clf), make_calibrator("vs", max_iter=50)).fit(x[cal], y[cal])

        fit_hand = fit_comp = np.inf
        for _ in range(2):
            t0 = time.perf_counter()
            calibrator, cord = by_hand_fit()
            fit_hand = min(fit_hand, time.perf_counter() - t0)
            t0 = time.perf_counter()
            model = composite_fit()
            fit_comp = min(fit_comp, time.perf_counter() - t0)

    def by_hand():
        scores = clf.decision_function(x[test])
        return cord.transform(softmax(scores), calibrator.predict_proba(scores))

    def composite():
        return model.predict_proba(x[test])

    assert np.array_equal(by_hand(), composite()), "the two paths disagree"
    wall = {"hand": np.inf, "comp": np.inf}
    cpu = dict(wall)
    for _ in range(args.repeats):
        for name, run in (("hand", by_hand), ("comp", composite)):
            w0, c0 = time.perf_counter(), time.process_time()
            run()
            wall[name] = min(wall[name], time.perf_counter() - w0)
            cpu[name] = min(cpu[name], time.process_time() - c0)
    print(f"CORDCalibratedClassifier overhead, K = {k}, {args.rows:,} rows, 256 features, "
          "LogisticRegression + VS + CORD (best of each)")
    print(f"{'':<22}{'by hand':>12}{'composite':>12}{'overhead':>10}")
    for label, table in (("predict_proba wall", wall), ("predict_proba CPU", cpu)):
        print(f"{label:<22}{table['hand'] * 1e3:>10.1f}ms{table['comp'] * 1e3:>10.1f}ms"
              f"{100 * (table['comp'] / table['hand'] - 1):>9.1f}%")
    print(f"{'fit wall':<22}{fit_hand * 1e3:>10.1f}ms{fit_comp * 1e3:>10.1f}ms"
          f"{100 * (fit_comp / fit_hand - 1):>9.1f}%")

if __name__ == "__main__":
    main()
