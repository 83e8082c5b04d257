"""Reference computations shared by the tests of cord_ops.partition_sums and
cord_ops.reduce, written with plain numpy from the equations."""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from cord_ops.cord_kernels import EPS_NUM, interior_response, sweep
from cord_ops.softmax import softmax

SCALE = 2**1074


def units(x: float, n: int = 1) -> int:
    """n * x as an exact sum (times 2^1074): what a reducer returns for n rows of x."""
    value = Fraction(x) * n * SCALE
    assert value.denominator == 1
    return value.numerator


def fraction_sum(x) -> int:
    return int(sum((Fraction(v) for v in np.ravel(x).tolist()), Fraction(0)) * SCALE)


def logit_rows(seed, n, k):
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, k)) * 3.0
    y = (softmax(0.4 * z + rng.normal(size=k)).cumsum(axis=1) > rng.random((n, 1))).argmax(1)
    return z, y


def part_scalars(seed, n, k, lam=0.5):
    rng = np.random.default_rng(seed)
    p0 = softmax(rng.normal(size=(n, k)) * 2.0)
    q = softmax(rng.normal(size=(n, k)) * 2.0)
    terms = sweep(p0, q, lam)
    return {"b": terms.b, "lower": terms.lower, "g": terms.g}


def response_terms(eta, part):
    return np.clip(interior_response(eta, part["g"]), part["lower"], 1.0 - EPS_NUM)


def vs_reference(z, y, w, b):
    """NLL, gradient (K, 2) and Hessian (2K x 2K, theta rows (w_k, b_k)) of
    softmax(z w + b), written out."""
    n, k = z.shape
    s = z * w + b
    q = softmax(s)
    nll = float(np.sum(np.log(np.sum(np.exp(s - s.max(1, keepdims=True)), 1))
                       + s.max(1) - s[np.arange(n), y]))
    onehot = np.eye(k)[y]
    grad = np.column_stack([np.sum((q - onehot) * z, 0), np.sum(q - onehot, 0)])
    u = np.stack([z, np.ones_like(z)], axis=2)  # (n, k, 2)
    cov = np.einsum("ik,kl->ikl", q, np.eye(k)) - np.einsum("ik,il->ikl", q, q)
    h = np.einsum("ika,ikl,ilc->kalc", u, cov, u).reshape(2 * k, 2 * k)
    return nll, grad, h


def metrics_from(sums):
    from cord_ops.reduce import metrics_from_sums

    return metrics_from_sums([sums])
