"""CORD fit/transform speed and memory against a direct numpy transcription of Appendix A.

Run: python benchmarks/bench_cord.py [--n 25000] [--k 1000] [--repeats 5]

Prints microseconds per example (median of repeats) and the peak extra memory of one
call, in units of one n x K float64 array, for cord_ops.CORD and for the transcription
below, which is kept here only as the baseline.
"""

from __future__ import annotations

import argparse
import time
import tracemalloc

import numpy as np

from cord_ops import CORD

EPS, DELTA = 1e-12, 1e-10


# --- baseline: Appendix A written down line by line -------------------------------------

def transcription_terms(p0, q):
    n, k = p0.shape
    rows = np.arange(n)
    p0s = np.where((p0 <= 0).any(axis=1)[:, None], (1 - DELTA) * p0 + DELTA / k, p0)
    qs = np.where((q <= 0).any(axis=1)[:, None], (1 - DELTA) * q + DELTA / k, q)
    a = np.argmax(p0s, axis=1)
    is_a = np.zeros((n, k), dtype=bool)
    is_a[rows, a] = True
    b = qs[rows, a]
    others = np.where(is_a, 0.0, qs)
    tail = others.sum(axis=1)
    alpha = others / tail[:, None]
    rho = alpha.max(axis=1)
    lower = rho / (1 + rho) + EPS
    upper = np.full(n, 1 - EPS)
    g = np.where(np.argmax(qs, axis=1) == a, b, (b + p0s[rows, a]) / 2)
    return a, b, alpha, lower, upper, g


def transcription_psi(eta, g, lower, upper):
    if eta == 0:
        return np.clip(g, lower, upper)
    r = np.sqrt((eta + 2 * g - 1) ** 2 + 4 * g * (1 - g))
    h = 2 * g / (1 - eta + r) if eta <= 1 else (eta - 1 + r) / (2 * eta)
    return np.clip(h, lower, upper)


def transcription_fit(p0, q):
    _, b, _, lower, upper, g = transcription_terms(p0, q)
    mu = np.clip(b.mean(), lower.mean(), upper.mean())

    def f(eta):
        return transcription_psi(eta, g, lower, upper).mean()

    f0 = f(0.0)
    if f0 == mu:
        return 0.0
    if f0 < mu:
        lo, hi = 0.0, max(0.0, ((upper - g) / (upper * (1 - upper))).max())
        while lo < (lo + hi) / 2 < hi:
            mid = (lo + hi) / 2
            hi, lo = (mid, lo) if f(mid) >= mu else (hi, mid)
        return hi
    lo, hi = min(0.0, ((lower - g) / (lower * (1 - lower))).min()), 0.0
    while lo < (lo + hi) / 2 < hi:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) <= mu else (lo, mid)
    return lo


def transcription_transform(eta, p0, q):
    a, _, alpha, lower, upper, g = transcription_terms(p0, q)
    s = transcription_psi(eta, g, lower, upper)
    out = (1 - s)[:, None] * alpha
    out[np.arange(len(a)), a] = s
    return out


# --- measurement --------------------------------------------------------------------------

def timed(fn, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times)), result


def peak_extra(fn):
    tracemalloc.start()
    tracemalloc.reset_peak()
    fn()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak


def make_pair(n, k, seed=0):
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, k)) * 3
    p0 = np.exp(z - z.max(axis=1, keepdims=True))
    p0 /= p0.sum(axis=1, keepdims=True)
    zq = z * rng.uniform(0.3, 1.5, size=k) + rng.normal(size=(n, k))
    q = np.exp(zq - zq.max(axis=1, keepdims=True))
    q /= q.sum(axis=1, keepdims=True)
    return p0, q


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=25_000)
    parser.add_argument("--k", type=int, default=1_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    p0, q = make_pair(args.n, args.k)
    nk_bytes = p0.nbytes

    fit_ours, model = timed(lambda: CORD().fit(p0, q), args.repeats)
    fit_base, eta_base = timed(lambda: transcription_fit(p0, q), args.repeats)
    tr_ours, out = timed(lambda: model.transform(p0, q), args.repeats)
    tr_base, out_base = timed(lambda: transcription_transform(eta_base, p0, q), args.repeats)
    mem_ours = peak_extra(lambda: model.transform(p0, q))
    mem_base = peak_extra(lambda: transcription_transform(eta_base, p0, q))
    mem_fit = peak_extra(lambda: CORD().fit(p0, q))

    per = 1e6 / args.n
    print(f"CORD benchmark: n={args.n}, K={args.k}, float64, median of {args.repeats}")
    print(f"eta*: cord_ops {model.eta_!r}  transcription {eta_base!r}  "
          f"|diff| {abs(model.eta_ - eta_base):.2e}")
    print(f"repaired max |diff| vs transcription: {np.abs(out - out_base).max():.2e}")
    print(f"{'':<22}{'cord_ops':>14}{'transcription':>16}{'speed-up':>10}")
    print(f"{'fit (s)':<22}{fit_ours:>14.4f}{fit_base:>16.4f}{fit_base / fit_ours:>9.2f}x")
    print(f"{'transform (us/ex)':<22}{tr_ours * per:>14.3f}{tr_base * per:>16.3f}"
          f"{tr_base / tr_ours:>9.2f}x")
    print(f"{'transform peak (n*K)':<22}{mem_ours / nk_bytes:>14.2f}{mem_base / nk_bytes:>16.2f}")
    print(f"{'fit peak (n*K)':<22}{mem_fit / nk_bytes:>14.2f}")


if __name__ == "__main__":
    main()
