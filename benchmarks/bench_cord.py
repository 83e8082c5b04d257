"""CORD fit/transform time and memory against the whole-array numpy listing, float64.

Run: python benchmarks/bench_cord.py [--sizes 5000x10 5000x100 25000x1000] [--repeats 7]

The reference is ``tests/core/cord_listing.py``: the paper's CORD written as a whole-array
numpy listing (its Appendix C listing is omitted from our copy of the paper, so it is
transcribed from the equations), the one numpy transcription the test suite also checks
cord_ops against. Both run in this process on the same synthetic (p0, q) pairs, with
cord_ops validating its inputs and the listing not. Calls alternate (ours, listing, ours,
...) and each time is the minimum over ``--repeats``: on a shared machine the minimum is
the run least disturbed by other processes, and alternating exposes both to the same load
(``flows.reproduce.timing.measure``, the protocol ``cord-ops bench`` uses too).
Prints each ratio next to its target: fit and transform <= 0.8x the listing at
n = 5,000 (K = 10, 100); fit <= 0.8x and transform <= 0.4x at n = 25,000, K = 1,000.
Peak extra memory of one call (tracemalloc) is in units of one n x K float64 array.
"""

from __future__ import annotations

import argparse
import sys
import tracemalloc
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "core"))

import cord_listing as listing  # noqa: E402

from cord_ops import CORD  # noqa: E402
from flows.reproduce.timing import measure  # noqa: E402

#: (fit, transform) target ratios against the listing, by (n, K).
TARGETS = {(5000, 10): (0.8, 0.8), (5000, 100): (0.8, 0.8), (25000, 1000): (0.8, 0.4)}


def make_pair(n, k, seed=0):
    """p0 = softmax(3 z) and a vector-scaling-like q that flips some top-1 decisions."""
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, k)) * 3
    p0 = np.exp(z - z.max(axis=1, keepdims=True))
    p0 /= p0.sum(axis=1, keepdims=True)
    zq = z * rng.uniform(0.3, 1.5, size=k) + rng.normal(size=(n, k))
    q = np.exp(zq - zq.max(axis=1, keepdims=True))
    q /= q.sum(axis=1, keepdims=True)
    return p0, q


def alternating_minima(first, second, repeats):
    """Minimum wall time of each of two callables, called alternately ``repeats`` times
    (the calls above are their warm-up)."""
    return [t.best for t in measure(first, second, repeats=repeats, warm_up=False)]


def peak_extra(fn):
    tracemalloc.start()
    tracemalloc.reset_peak()
    fn()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak


def run(n, k, repeats):
    p0, q = make_pair(n, k)
    model = CORD().fit(p0, q)
    eta, _ = listing.fit(p0, q)
    out, out_ref = model.transform(p0, q), listing.transform(eta, p0, q)
    fit_ours, fit_ref = alternating_minima(lambda: CORD().fit(p0, q),
                                           lambda: listing.fit(p0, q), repeats)
    tr_ours, tr_ref = alternating_minima(lambda: model.transform(p0, q),
                                         lambda: listing.transform(eta, p0, q), repeats)
    nk = p0.nbytes
    mem = (peak_extra(lambda: CORD().fit(p0, q)) / nk,
           peak_extra(lambda: listing.fit(p0, q)) / nk,
           peak_extra(lambda: model.transform(p0, q)) / nk,
           peak_extra(lambda: listing.transform(eta, p0, q)) / nk)
    target_fit, target_tr = TARGETS.get((n, k), (None, None))

    def verdict(ratio, target):
        if target is None:
            return ""
        return f"<= {target:.1f}x  {'ok' if ratio <= target else 'MISSED'}"

    print(f"\nn = {n:,}, K = {k:,}: eta* cord_ops {model.eta_!r}, listing {eta!r}; "
          f"max |repaired diff| {np.abs(out - out_ref).max():.1e}")
    print(f"{'':<12}{'cord_ops ms':>12}{'listing ms':>12}{'ratio':>8}  target")
    print(f"{'fit':<12}{fit_ours * 1e3:>12.2f}{fit_ref * 1e3:>12.2f}{fit_ours / fit_ref:>7.2f}x"
          f"  {verdict(fit_ours / fit_ref, target_fit)}")
    print(f"{'transform':<12}{tr_ours * 1e3:>12.2f}{tr_ref * 1e3:>12.2f}{tr_ours / tr_ref:>7.2f}x"
          f"  {verdict(tr_ours / tr_ref, target_tr)}")
    print(f"peak extra memory (n x K float64 arrays): fit {mem[0]:.2f} vs {mem[1]:.2f}, "
          f"transform {mem[2]:.2f} vs {mem[3]:.2f}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["5000x10", "5000x100", "25000x1000"],
                        help="n x K pairs, e.g. 5000x100")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    load = Path("/proc/loadavg").read_text().split()[0]
    print(f"CORD vs the numpy listing (tests/core/cord_listing.py), float64, minimum of "
          f"{args.repeats} alternating calls; load average {load}")
    for size in args.sizes:
        n, k = (int(part) for part in size.lower().split("x"))
        run(n, k, args.repeats)


if __name__ == "__main__":
    main()
