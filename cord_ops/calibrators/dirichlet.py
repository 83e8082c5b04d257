"""Dirichlet calibration with ODIR regularisation (Kull et al., NeurIPS 2019;
docs/calibrators.md section 3).

Predict path, with the log-probability features clipped at log(prob_floor):

    x = max(z - logsumexp(z), log(prob_floor))   (input_kind="logits", z the logits)
    x = log(max(p, prob_floor))                  (input_kind="probs")
    q = softmax(x @ weights.T + bias)            weights (K, K), bias (K,)

Both feature forms give the same x up to rounding; the floor (default float32 tiny, log =
-87.34) is stored in the state and used identically at fit and predict time.

Objective (the paper's normalised ODIR, dirichletcal ``reg_norm=True`` on the full W):

    L = NLL + lambda / (K (K - 1)) * sum_{i != j} W_ij^2 + mu / K * sum_j b_j^2

The diagonal is unpenalised, so the map shrinks toward a per-class power transform.
(lambda, mu) are chosen by a seeded 5-fold ``StratifiedKFold(shuffle=True,
random_state=0)`` search over ``reg_lambdas`` x ``reg_mus`` (default {1e-1, ..., 1e-5} each,
as probmetrics ``dircal-cv``), scored by the mean over folds of the held-out mean NLL (ties:
first in grid order), then refit on all rows. A class with fewer members than folds makes
stratification impossible; KFold with the same seed is used then.

Optimisation: identity start (W = I, b = 0) and the analytic gradient; Newton up to K = 21
(dirichletcal uses Newton up to K = 36), preconditioned L-BFGS-B above (``_affine``; as
dirichletcal's K > 36 path). Warm starts: within each fold the grid is walked from the
strongest to the weakest penalty (lambda descending, mu in snake order), each fit starting
from the previous solution; the final refit starts from the mean of the selected pair's fold
solutions. Caps: ``max_iter`` (default 300) iterations for the refit and ``cv_max_iter`` per
search fit, by default a work budget of about 5e4 parameter-iterations,
``clip(50_000 // (K (K + 1)), 5, 300)`` (300 at K = 10, where Newton converges in a few
steps; 5 at K = 100), so the 125 search fits take seconds. At K = 100 and lambda <= 0.1 the
problem is nearly unregularised matrix scaling: the search fits reach the cap and one
ConvergenceWarning reports how many did; a capped refit warns on its own.
"""

from __future__ import annotations

import warnings

import numpy as np
from sklearn.model_selection import KFold, StratifiedKFold

from cord_ops.calibrators._affine import Penalty, affine_logits, fit_affine
from cord_ops.calibrators._base import (
    PROB_FLOOR,
    Calibrator,
    ConvergenceWarning,
    mean_nll_and_grad,
    softmax,
)

DEFAULT_GRID = (1e-1, 1e-2, 1e-3, 1e-4, 1e-5)


def odir_penalty(reg_lambda: float, reg_mu: float, k: int) -> Penalty:
    """ODIR strengths per squared entry: lambda / (K (K - 1)) off the diagonal, mu / K on b."""
    return Penalty(diag=0.0, offdiag=reg_lambda / (k * (k - 1)), bias=reg_mu / k)


class DirichletODIR(Calibrator):
    """``dir-odir``: q = softmax(log-prob features @ weights.T + bias), ODIR-penalised.

    Fitted state: ``weights`` (K, K), ``bias`` (K,), ``reg_lambda``, ``reg_mu`` (the selected
    pair) and ``cv_nll`` (len(reg_lambdas) x len(reg_mus) mean held-out NLL; all zeros when
    the grid is a single pair, which is then fitted without a search).
    """

    name = "dir-odir"
    _options = ("reg_lambdas", "reg_mus", "n_folds", "random_state", "max_iter",
                "cv_max_iter", "gtol", "ftol")
    _option_checks = {"n_folds": {"integer": True}, "random_state": {"integer": True,
                                                                      "allow_zero": True},
                      "max_iter": {"integer": True}, "cv_max_iter": {"integer": True},
                      "gtol": {}, "ftol": {"allow_zero": True}}
    _optional = ("cv_max_iter",)
    _param_shapes = {"weights": ("K", "K"), "bias": ("K",), "reg_lambda": (), "reg_mu": (),
                     "cv_nll": ("*", "*")}

    def __init__(self, input_kind: str = "logits", prob_floor: float = PROB_FLOOR,
                 reg_lambdas=DEFAULT_GRID, reg_mus=DEFAULT_GRID, n_folds: int = 5,
                 random_state: int = 0, max_iter: int = 300, cv_max_iter: int | None = None,
                 gtol: float = 1e-5, ftol: float = 1e-12):
        super().__init__(input_kind, prob_floor)
        self.reg_lambdas = reg_lambdas
        self.reg_mus = reg_mus
        self.n_folds = n_folds
        self.random_state = random_state
        self.max_iter = max_iter
        self.cv_max_iter = cv_max_iter
        self.gtol = gtol
        self.ftol = ftol

    def _validate_options(self) -> None:
        super()._validate_options()
        for label in ("reg_lambdas", "reg_mus"):
            grid = getattr(self, label)
            ok = isinstance(grid, tuple | list | np.ndarray) and len(grid) > 0
            ok = ok and all(isinstance(v, int | float | np.number) and not isinstance(v, bool)
                            and np.isfinite(v) and v > 0 for v in grid)
            if not ok:
                raise ValueError(f"{label}: expected a non-empty list of positive numbers, "
                                 f"got {grid!r}")
        if self.n_folds < 2:
            raise ValueError(f"n_folds: expected an integer >= 2, got {self.n_folds!r}")

    def features(self, x: np.ndarray) -> np.ndarray:
        """Clipped log-probabilities of validated scores (module docstring)."""
        log_floor = np.log(self.prob_floor)
        if self.input_kind == "probs":
            return np.log(np.maximum(x, self.prob_floor))
        shifted = x - x.max(axis=1, keepdims=True)
        lse = np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        return np.maximum(shifted - lse, log_floor)

    def _fit(self, x, y):
        f = self.features(x)
        n, k = f.shape
        cv_max_iter = self.cv_max_iter
        if cv_max_iter is None:
            cv_max_iter = int(np.clip(50_000 // (k * (k + 1)), 5, 300))
        grid = [(i, j) for i in range(len(self.reg_lambdas))
                for j in (range(len(self.reg_mus)) if i % 2 == 0
                          else reversed(range(len(self.reg_mus))))]
        self.cv_nll_ = np.zeros((len(self.reg_lambdas), len(self.reg_mus)))
        solutions = {}
        if len(grid) > 1:
            if n < self.n_folds:
                raise ValueError(
                    f"{self.name}: the {self.n_folds}-fold search needs at least "
                    f"{self.n_folds} calibration rows, got {n}"
                )
            counts = np.bincount(y, minlength=k)
            splitter = (StratifiedKFold if counts[counts > 0].min() >= self.n_folds
                        else KFold)(self.n_folds, shuffle=True, random_state=self.random_state)
            capped = 0
            for train, test in splitter.split(f, y):
                init = None
                for i, j in grid:
                    fit = fit_affine(
                        f[train], y[train], full=True, init=init,
                        penalty=odir_penalty(self.reg_lambdas[i], self.reg_mus[j], k),
                        max_iter=cv_max_iter, gtol=self.gtol, ftol=self.ftol,
                        name=self.name, warn=False,
                    )
                    capped += not fit.converged
                    init = (fit.weights, fit.bias)
                    solutions.setdefault((i, j), []).append(init)
                    held_out, _ = mean_nll_and_grad(
                        affine_logits(f[test], fit.weights, fit.bias), y[test])
                    self.cv_nll_[i, j] += held_out / self.n_folds
            if capped:
                warnings.warn(
                    f"{self.name}: {capped} of {len(grid) * self.n_folds} grid-search fits "
                    f"stopped at cv_max_iter={cv_max_iter} before convergence; the "
                    "selection compares those last iterates",
                    ConvergenceWarning,
                    stacklevel=3,
                )
        best = np.unravel_index(np.argmin(self.cv_nll_), self.cv_nll_.shape)
        best = (int(best[0]), int(best[1]))
        if best in solutions:
            init = tuple(np.mean([s[m] for s in solutions[best]], axis=0) for m in (0, 1))
        else:
            init = None
        self.reg_lambda_ = self.reg_lambdas[best[0]]
        self.reg_mu_ = self.reg_mus[best[1]]
        fit = fit_affine(f, y, full=True, init=init,
                         penalty=odir_penalty(self.reg_lambda_, self.reg_mu_, k),
                         max_iter=self.max_iter, gtol=self.gtol, ftol=self.ftol, name=self.name)
        self.weights_, self.bias_ = fit.weights, fit.bias

    def _predict(self, x):
        return softmax(affine_logits(self.features(x), self.weights_, self.bias_))
