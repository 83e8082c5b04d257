"""Penalised multinomial logistic maps ``q = softmax(x @ W.T + b)`` fitted by L-BFGS-B.

One fitter serves vector scaling (diagonal W), matrix scaling and Dirichlet (full W) and the
structured maps (either), because they differ only in structure and ridge strengths:

    L(W, b) = mean_i NLL_i + diag_penalty * sum_k (W_kk - 1)^2
                           + offdiag_penalty * sum_{k != j} W_kj^2
                           + bias_penalty * sum_k b_k^2

The diagonal ridge is centred on 1 (identity), so every penalty shrinks toward the
uncalibrated map. Gradient (CALIBRATORS.md, shared gradient): dL/dW = D.T @ x + ridge terms,
dL/db = sum_i D_i, with D = (softmax(s) - onehot) / n; for a diagonal W only the diagonal of
D.T @ x is needed, i.e. sum_i D_ik x_ik.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import minimize
from threadpoolctl import threadpool_limits

from cord_ops.calibrators._base import mean_nll_and_grad, warn_not_converged


@dataclass(frozen=True)
class Penalty:
    """Ridge strengths (already multiplied out: each applies to a plain sum of squares)."""

    diag: float = 0.0
    offdiag: float = 0.0
    bias: float = 0.0


@dataclass
class AffineFit:
    weights: np.ndarray  # (K,) for a diagonal map, (K, K) for a full one
    bias: np.ndarray
    objective: float
    n_iter: int
    converged: bool
    message: str


def affine_logits(x: np.ndarray, weights: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """``x * w + b`` (diagonal, weights of shape (K,)) or ``x @ W.T + b`` (full)."""
    if weights.ndim == 1:
        return x * weights + bias
    return x @ weights.T + bias


def fit_affine(
    x: np.ndarray,
    y: np.ndarray,
    *,
    full: bool,
    penalty: Penalty = Penalty(),
    init: tuple[np.ndarray, np.ndarray] | None = None,
    max_iter: int,
    gtol: float,
    ftol: float,
    name: str,
    warn: bool = True,
) -> AffineFit:
    """Minimise L above from ``init`` (identity, zero bias when None) with L-BFGS-B.

    Stops when the projected gradient's max-abs entry is <= ``gtol`` or the relative
    decrease of L per iteration is <= ``ftol``; after ``max_iter`` iterations it stops
    early and (when ``warn``) raises a ConvergenceWarning naming ``name``.
    """
    k = x.shape[1]
    if init is None:
        w0 = np.eye(k) if full else np.ones(k)
        b0 = np.zeros(k)
    else:
        w0, b0 = init
    n_w = k * k if full else k
    theta0 = np.concatenate([np.asarray(w0, dtype=np.float64).ravel(), b0])
    offdiag_mask = 1.0 - np.eye(k) if full else None

    def objective(theta):
        w = theta[:n_w].reshape(k, k) if full else theta[:n_w]
        b = theta[n_w:]
        s = affine_logits(x, w, b)
        loss, d = mean_nll_and_grad(s, y)
        grad_b = d.sum(axis=0)
        grad_w = d.T @ x if full else np.einsum("ik,ik->k", d, x)
        if penalty.bias:
            loss += penalty.bias * float(b @ b)
            grad_b += 2.0 * penalty.bias * b
        if penalty.diag:
            dev = (np.diagonal(w) if full else w) - 1.0
            loss += penalty.diag * float(dev @ dev)
            if full:
                grad_w[np.diag_indices(k)] += 2.0 * penalty.diag * dev
            else:
                grad_w += 2.0 * penalty.diag * dev
        if penalty.offdiag and full:
            off = w * offdiag_mask
            loss += penalty.offdiag * float(np.sum(off * off))
            grad_w += 2.0 * penalty.offdiag * off
        return loss, np.concatenate([grad_w.ravel(), grad_b])

    # One BLAS thread: L-BFGS-B's many small BLAS calls on K^2 + K = 10,100 parameters run
    # 10-50x slower with OpenBLAS threads on a busy 2-core machine, and single-threaded
    # products make the fit bit-reproducible whatever the thread count.
    with threadpool_limits(limits=1, user_api="blas"):
        res = minimize(
            objective,
            theta0,
            jac=True,
            method="L-BFGS-B",
            options={"maxiter": max_iter, "maxfun": 2 * max_iter + 20, "gtol": gtol,
                     "ftol": ftol},
        )
    converged = res.status == 0
    if warn and not converged:
        warn_not_converged(name, f"{res.message}; {res.nit} iterations, max_iter={max_iter}")
    w = res.x[:n_w].reshape(k, k) if full else res.x[:n_w].copy()
    return AffineFit(
        weights=w,
        bias=res.x[n_w:].copy(),
        objective=float(res.fun),
        n_iter=int(res.nit),
        converged=converged,
        message=str(res.message),
    )
