"""Penalised multinomial logistic maps ``q = softmax(x @ W.T + b)`` (full W) or
``q = softmax(x * w + b)`` (diagonal W), the map behind VS, MS, SVS, SMS and Dir-ODIR.

Objective (mean NLL plus ridges that shrink toward the identity map):

    L(W, b) = mean_i NLL_i + diag_penalty * sum_k (W_kk - 1)^2
                           + offdiag_penalty * sum_{k != j} W_kj^2
                           + bias_penalty * sum_k b_k^2

Internally the parameters are one K x m matrix Theta (row k = what class k's logit uses):
full maps ``Theta = [W | b]`` on the features ``xbar_i = [x_i, 1]`` (m = K + 1), diagonal
maps ``Theta[k] = [w_k, b_k]`` on ``xbar_ik = [x_ik, 1]`` (m = 2). With
D = (softmax(s) - onehot) / n the gradient is ``G[k, a] = sum_i D_ik xbar_ika``
(docs/calibrators.md, notation) and the Hessian of the mean NLL is

    H[(k, a), (l, c)] = (1/n) sum_i q_ik (delta_kl - q_il) xbar_ika xbar_ilc,

assembled as a block diagonal minus ``U.T @ U / n`` with ``U[i, (k, a)] = q_ik xbar_ika``.

Solvers (the objective is convex, so all three reach the same optimum):

* ``"newton"``: damped Newton with Armijo backtracking (``solvers.newton``), used by
  ``"auto"`` for at most ``NEWTON_MAX_PARAMS`` parameters (diagonal maps up to K = 250, full
  maps up to K = 21, e.g. every CIFAR-10 map). dirichletcal does the same for K <= 36; it
  needs 3-20 iterations where L-BFGS needs hundreds on unregularised maps. Stops when the
  largest gradient entry is <= ``gtol`` or the objective stops decreasing at float64
  resolution.
* ``"newton-cg"``: the same Newton iteration for diagonal maps above NEWTON_MAX_PARAMS, each
  step solved inexactly by conjugate gradients preconditioned with the exact 2 x 2 per-class
  Hessian blocks, using Hessian-vector products (``auto`` picks it there: VS at K = 1,000
  converges in a few steps where L-BFGS-B needs hundreds of iterations).
  Full maps (chosen by MS up to K = 50 and by Dir-ODIR above K = 21) use Jacobi-
  preconditioned CG with float32 Hessian-vector products (``_cg_newton_step_full``).
* ``"lbfgs"``: scipy L-BFGS-B with the analytic gradient, on preconditioned variables
  ``theta = M phi`` with ``M^T H(theta_0) M ~ I`` (``_preconditioner``: Jacobi for full
  maps, 2 x 2 block Jacobi for diagonal ones), an exact change of variables that cuts the
  iterations of structured matrix scaling severalfold. Stops when the largest entry of
  the gradient w.r.t. phi is <= ``gtol`` or the relative decrease is <= ``ftol``.

Either reports hitting ``max_iter`` instead of converging (a ConvergenceWarning by default).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import minimize

from cord_ops.calibrators._base import Calibrator
from cord_ops.calibrators.solvers import dense_newton_step, newton, warn_not_converged
from cord_ops.softmax import mean_nll_and_grad, softmax

#: Largest parameter count K * m solved by Newton's method (the Hessian is (K m)^2).
NEWTON_MAX_PARAMS = 500


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
    s = x * weights if weights.ndim == 1 else x @ weights.T
    s += bias
    return s


class _Problem:
    """L, its gradient and Hessian in the Theta layout (module docstring)."""

    def __init__(self, x, y, full, penalty):
        self.x, self.y, self.full = x, y, full
        k = x.shape[1]
        self.k, self.m = k, (k + 1 if full else 2)
        weight = np.zeros((k, self.m))
        centre = np.zeros((k, self.m))
        if full:
            weight[:, :k] = penalty.offdiag
        weight[np.arange(k), np.arange(k) if full else 0] = penalty.diag
        centre[np.arange(k), np.arange(k) if full else 0] = 1.0
        weight[:, -1] = penalty.bias
        self.pen_weight, self.pen_centre = weight, centre

    def split(self, theta):
        if self.full:
            return theta[:, :-1], theta[:, -1]
        return theta[:, 0], theta[:, 1]

    def value_grad(self, theta):
        w, b = self.split(theta)
        loss, d = mean_nll_and_grad(affine_logits(self.x, w, b), self.y, overwrite=True)
        grad = np.empty_like(theta)
        if self.full:
            grad[:, :-1] = d.T @ self.x
        else:
            grad[:, 0] = np.einsum("ik,ik->k", d, self.x)
        grad[:, -1] = d.sum(axis=0)
        dev = theta - self.pen_centre
        loss += float(np.sum(self.pen_weight * dev * dev))
        grad += 2.0 * self.pen_weight * dev
        return loss, grad, d

    def probabilities(self, d, overwrite: bool = False):
        """softmax(s) recovered from D = (softmax(s) - onehot) / n (in ``d`` itself with
        ``overwrite``)."""
        n = self.x.shape[0]
        q = np.multiply(d, n, out=d if overwrite else None)
        q[np.arange(n), self.y] += 1.0
        return q

    def hessian_diagonal(self, d):
        """Diagonal of the Hessian: (1/n) sum_i q_ik (1 - q_ik) xbar_ika^2 plus 2 * ridge."""
        n = self.x.shape[0]
        q = self.probabilities(d)
        w = q * (1.0 - q)
        diag = np.empty((self.k, self.m))
        if self.full:
            diag[:, :-1] = w.T @ (self.x * self.x)
        else:
            diag[:, 0] = np.einsum("ik,ik->k", w, self.x * self.x)
        diag[:, -1] = w.sum(axis=0)
        return diag / n + 2.0 * self.pen_weight

    def hessian(self, d):
        n, k, m = self.x.shape[0], self.k, self.m
        q = self.probabilities(d)
        if self.full:
            xbar = np.hstack([self.x, np.ones((n, 1))])
            u = (q[:, :, None] * xbar[:, None, :]).reshape(n, k * m)
            blocks = (u.T @ xbar).reshape(k, m, m)
        else:
            qx = q * self.x
            blocks = np.empty((k, 2, 2))
            blocks[:, 0, 0] = np.einsum("ik,ik->k", qx, self.x)
            blocks[:, 0, 1] = blocks[:, 1, 0] = qx.sum(axis=0)
            blocks[:, 1, 1] = q.sum(axis=0)
            u = np.stack([qx, q], axis=2).reshape(n, k * m)
        h = -(u.T @ u)
        for kk in range(k):
            h[kk * m:(kk + 1) * m, kk * m:(kk + 1) * m] += blocks[kk]
        h /= n
        h[np.diag_indices_from(h)] += 2.0 * self.pen_weight.ravel()
        return h


def _cg_newton_step(problem, grad, d, max_cg=50):
    """Newton step for a diagonal map by preconditioned conjugate gradients on
    ``H p = -grad`` with Hessian-vector products (a few passes over the n x K data, never
    forming H) and the exact 2 x 2 per-class diagonal blocks of H as preconditioner.

    Memory: q is built in ``d`` itself (the caller's D is not needed after the step) and
    every product goes through one n x K scratch array, so the step holds x, q and that
    scratch: three n x K float64 arrays at most (the fit's peak, 25,000 x 1,000: 0.6 GB).
    """
    n, x = problem.x.shape[0], problem.x
    q = problem.probabilities(d, overwrite=True)
    pen = 2.0 * problem.pen_weight
    scratch = np.subtract(1.0, q)
    scratch *= q  # q (1 - q)
    a = np.einsum("ik,ik,ik->k", scratch, x, x) / n + pen[:, 0] + 1e-12
    c = np.einsum("ik,ik->k", scratch, x) / n
    b = scratch.sum(axis=0) / n + pen[:, 1] + 1e-12
    det = a * b - c * c

    def hess_vec(v):
        qt = np.multiply(x, v[:, 0], out=scratch)
        qt += v[:, 1]
        qt *= q  # q (x v_w + v_b)
        r = qt.sum(axis=1)
        out = np.column_stack([np.einsum("ik,ik->k", qt, x) - np.einsum("ik,ik,i->k", q, x, r),
                               qt.sum(axis=0) - q.T @ r]) / n
        return out + pen * v

    def precondition(r):
        inv = np.column_stack([b * r[:, 0] - c * r[:, 1], a * r[:, 1] - c * r[:, 0]])
        return inv / det[:, None]

    step = np.zeros_like(grad)
    resid = -grad
    z = precondition(resid)
    direction = z.copy()
    rz = float(np.sum(resid * z))
    target = min(0.5, np.sqrt(np.linalg.norm(grad))) * np.linalg.norm(grad)
    for _ in range(max_cg):
        hd = hess_vec(direction)
        curvature = float(np.sum(direction * hd))
        if curvature <= 0.0:
            break
        alpha = rz / curvature
        step += alpha * direction
        resid -= alpha * hd
        if np.linalg.norm(resid) <= target:
            break
        z = precondition(resid)
        rz_new = float(np.sum(resid * z))
        direction = z + (rz_new / rz) * direction
        rz = rz_new
    return step if np.any(step) else -precondition(grad)


def _cg_newton_step_full(problem, grad, d, max_cg=100):
    """Newton step for a full map by Jacobi-preconditioned conjugate gradients on
    ``H p = -grad`` with Hessian-vector products: for V in the Theta layout,
    ``H V = (q * (S - sum_k q_k S_k)).T @ xbar / n + 2 ridge * V`` with ``S = xbar @ V.T``
    (two n x (K + 1) x K matrix products per product, never forming the (K (K + 1))^2 H;
    sklearn's multinomial newton-cg uses the same product).

    The products run in float32 (``xbar``, q and V cast once per step or product): CG
    only needs the step to the forcing tolerance ``min(0.5, sqrt|g|) |g|``, far above
    float32's 1e-7 relative rounding, while the gradient, the objective and the stopping
    test stay float64, so the optimum and the convergence test are unchanged while each
    step moves half the bytes."""
    n = problem.x.shape[0]
    xbar = np.empty((n, problem.m), dtype=np.float32)
    xbar[:, :-1] = problem.x
    xbar[:, -1] = 1.0
    q = problem.probabilities(d)
    q32 = q.astype(np.float32)
    pen = 2.0 * problem.pen_weight
    # The 1e-10 relative ridge of the dense step keeps the singular (shift-invariant)
    # direction of an unpenalised map from stalling CG.
    diag = problem.hessian_diagonal(d)
    ridge = 1e-10 * (1.0 + float(np.max(diag)))
    inv_diag = 1.0 / (diag + ridge)

    def hess_vec(v):
        sv = xbar @ v.T.astype(np.float32)
        sv -= np.einsum("ik,ik->i", q32, sv)[:, None]
        sv *= q32
        return (sv.T @ xbar).astype(np.float64) / n + (pen + ridge) * v

    step = np.zeros_like(grad)
    resid = -grad
    z = inv_diag * resid
    direction = z.copy()
    rz = float(np.sum(resid * z))
    norm = np.linalg.norm(grad)
    target = min(0.5, np.sqrt(norm)) * norm
    for _ in range(max_cg):
        hd = hess_vec(direction)
        curvature = float(np.sum(direction * hd))
        if curvature <= 0.0:
            break
        alpha = rz / curvature
        step += alpha * direction
        resid -= alpha * hd
        if np.linalg.norm(resid) <= target:
            break
        z = inv_diag * resid
        rz_new = float(np.sum(resid * z))
        direction = z + (rz_new / rz) * direction
        rz = rz_new
    return step if np.any(step) else -inv_diag * grad


def _lbfgs(problem, theta, max_iter, gtol, ftol):
    to_theta, to_phi, grad_phi = _preconditioner(problem, theta)

    def fun(phi):
        loss, grad, _ = problem.value_grad(to_theta(phi.reshape(theta.shape)))
        return loss, grad_phi(grad).ravel()

    res = minimize(fun, to_phi(theta).ravel(), jac=True, method="L-BFGS-B",
                   options={"maxiter": max_iter, "maxfun": 2 * max_iter + 20,
                            "gtol": gtol, "ftol": ftol})
    return (to_theta(res.x.reshape(theta.shape)), float(res.fun), int(res.nit),
            res.status == 0, str(res.message))


def _preconditioner(problem, theta):
    """A linear change of variables theta = M phi with M^T H(theta_0) M ~ I.

    Full maps: M = diag(H)^(-1/2) (Jacobi). Diagonal maps: per class, the inverse transposed
    Cholesky factor of the exact 2 x 2 Hessian block of (w_k, b_k), which decorrelates each
    weight from its bias (block Jacobi). Returns (phi -> theta, theta -> phi, the gradient
    w.r.t. phi from the gradient w.r.t. theta)."""
    _, _, d = problem.value_grad(theta)
    diag = problem.hessian_diagonal(d) + 1e-12
    if problem.full:
        scale = 1.0 / np.sqrt(diag)
        return (lambda phi: phi * scale), (lambda th: th / scale), (lambda g: g * scale)
    n = problem.x.shape[0]
    q = problem.probabilities(d)
    cross = np.einsum("ik,ik->k", q * (1.0 - q), problem.x) / n
    l11 = np.sqrt(diag[:, 0])
    l21 = cross / l11
    l22 = np.sqrt(np.maximum(diag[:, 1] - l21 * l21, 1e-12))
    m12 = -l21 / (l11 * l22)

    def to_theta(phi):
        return np.column_stack([phi[:, 0] / l11 + m12 * phi[:, 1], phi[:, 1] / l22])

    def to_phi(th):
        return np.column_stack([l11 * th[:, 0] + l21 * th[:, 1], l22 * th[:, 1]])

    def grad_phi(g):
        return np.column_stack([g[:, 0] / l11, m12 * g[:, 0] + g[:, 1] / l22])

    return to_theta, to_phi, grad_phi


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
    solver: str = "auto",
    newton_rtol: float = 1e-15,
) -> AffineFit:
    """Minimise L (module docstring) from ``init`` (identity and zero bias when None).

    ``solver="auto"``: dense Newton for at most NEWTON_MAX_PARAMS parameters, else
    Newton-CG (diagonal maps) or L-BFGS-B (full maps); ``"newton"``, ``"newton-cg"``
    and ``"lbfgs"`` force one (``"newton-cg"`` on a full map uses
    ``_cg_newton_step_full``). ``max_iter`` caps the iterations, and
    stopping there raises a ConvergenceWarning naming ``name`` (unless ``warn`` is False;
    the result still says ``converged=False``). Newton also stops, converged, when one
    step lowers L by at most ``newton_rtol`` relative (default: float64 resolution).
    """
    problem = _Problem(x, y, full, penalty)
    theta = problem.pen_centre.copy()
    if init is not None:
        w0, b0 = init
        if full:
            theta[:, :-1] = w0
        else:
            theta[:, 0] = w0
        theta[:, -1] = b0
    if solver == "auto":
        solver = ("newton" if theta.size <= NEWTON_MAX_PARAMS
                  else "lbfgs" if full else "newton-cg")
    if solver in ("newton", "newton-cg"):
        step = (dense_newton_step if solver == "newton"
                else _cg_newton_step_full if full else _cg_newton_step)
        theta, loss, n_iter, converged, message = newton(problem, theta, max_iter, gtol, step,
                                                          newton_rtol)
    else:
        theta, loss, n_iter, converged, message = _lbfgs(problem, theta, max_iter, gtol, ftol)
    if warn and not converged:
        warn_not_converged(name, f"{message}; {n_iter} iterations, max_iter={max_iter}")
    w, b = problem.split(theta)
    return AffineFit(weights=w.copy(), bias=b.copy(), objective=loss, n_iter=n_iter,
                     converged=converged, message=message)


class UnregularisedAffine(Calibrator):
    """Shared fit/predict of VS and MS: q = softmax(z @ W.T + b) by unregularised NLL.

    Subclasses set ``full`` (a K x K matrix, or a diagonal stored as a vector) and own the
    constructor, whose defaults are each method's.
    """

    full: bool
    _options = ("max_iter", "gtol", "ftol")
    _option_checks = {"max_iter": {"integer": True}, "gtol": {}, "ftol": {"allow_zero": True}}

    def __init__(self, input_kind: str, prob_floor: float, max_iter: int, gtol: float,
                 ftol: float):
        super().__init__(input_kind, prob_floor)
        self.max_iter = max_iter
        self.gtol = gtol
        self.ftol = ftol

    def _solver(self, k: int) -> str:
        """The ``fit_affine`` solver for K classes (subclasses may choose)."""
        return "auto"

    def _fit(self, x, y):
        fit = fit_affine(self._logits(x), y, full=self.full, max_iter=self.max_iter,
                         gtol=self.gtol, ftol=self.ftol, name=self.name, warn=False,
                         solver=self._solver(x.shape[1]))
        self.weights_, self.bias_ = fit.weights, fit.bias
        if not fit.converged:
            self._warn(f"optimiser stopped before convergence ({fit.message}; {fit.n_iter} "
                       f"iterations, max_iter={self.max_iter}); the returned map is the last "
                       "iterate, not an optimum. Raise max_iter to fit further.")

    def _predict(self, x):
        return softmax(affine_logits(self._logits(x), self.weights_, self.bias_),
                       overwrite=True)
