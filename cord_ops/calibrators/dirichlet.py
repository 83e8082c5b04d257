"""Dirichlet calibration with ODIR regularisation (Kull et al., NeurIPS 2019), tuned as in
Kull et al.'s deep-network experiments (``dirichletcal/experiments_dnn``, scripts
``tune_cal_odir.py`` and ``calibration/cal_methods.py``; see docs/reproduction.md).

Predict path, with the log-probability features clipped at log(prob_floor):

    x = max(z - logsumexp(z), log(prob_floor))   (input_kind="logits", z the logits)
    x = log(max(p, prob_floor))                  (input_kind="probs")
    q = softmax(x @ weights.T + bias)            weights (K, K), bias (K,)

Both feature forms give the same x up to rounding. The default floor is the project's
``cord_ops.metrics.PROB_FLOOR``, float64 machine epsilon (2.2e-16, log = -36.04), which is
the reference's ``log(clip(p, eps, 1 - eps))``; the upper
clip at 1 - eps changes a log-probability by at most 2.2e-16 and is left out. The floor is
stored in the state and used identically at fit and predict time.

Objective (the reference's Keras model: mean cross-entropy plus *unnormalised* per-entry
L2 penalties on the off-diagonal weights and the bias; the diagonal is free, so the map
shrinks toward a per-class power transform):

    L = mean_i NLL_i + lambda * sum_{i != j} W_ij^2 + mu * sum_j b_j^2

Hyperparameters: Kull et al.'s grid, lambda in {0.25, 0.5, 1} x 10^e and mu in 10^e for
e = e0, ..., 6 with e0 = -5 for K <= 10 and -2 above (the reference uses -5 exactly at
K = 10 and -2 otherwise; smaller K is our extension), each pair scored by the mean over
``n_folds`` = 5 folds of the held-out mean NLL (``StratifiedKFold(shuffle=True,
random_state)``; KFold with the same seed when a class has fewer members than folds).
Explicit ``reg_lambdas`` / ``reg_mus`` replace the grid.

Search (``search="path"``, the default): the reference evaluates all 243 (K = 100) to 432
(K = 10) pairs; we walk the grid by warm-started coordinate descent instead:

1. lambda from the strongest value down, mu = the grid value nearest lambda (log scale),
   until a grid value's CV NLL exceeds the path's best by more than ``STOP_MARGIN``
   (1e-2 nats; ``PATIENCE`` = 1 such value): the over-fitting climb at weak lambda;
2. mu both ways from the best pair's mu, lambda held; then lambda both ways, mu held; each
   walk stops at the first step (``WALK_PATIENCE``) that improves on the walk's best by no
   more than ``TURN_TOL`` (1e-4); rounds repeat while the best CV NLL improves by more than
   TURN_TOL (at most ``MAX_ROUNDS``).

Why step 1 does not stop where the CV loss first turns: on CIFAR-100 the CV curve along
lambda is not unimodal. From the plateau at strong lambda it falls to a local minimum,
rises by a small bump, falls to its global minimum at weaker lambda and then climbs
steeply (over-fitting), so a search that stops at the first turn selects the local
minimum. On some splits the curve has no dip at all and the path selects the per-class
power map, which cold-started fits at weaker lambda do not beat. Warm starts move a CV
value slightly against a cold start: the diagonal is unpenalised, and a class whose
training log-probabilities separate it from the rest has no finite optimum for its
diagonal weight, so converged fits stop at a point that depends on the start.
STOP_MARGIN sits above every bump measured and below the over-fitting climb (the curves,
and the walk against the exhaustive grid: docs/reproduction.md, "Dir-ODIR as Kull et al.
tune it"). Every fold's fit starts from that fold's solution at the neighbouring grid
point (warm start along the regularisation path). The selected pair is the lowest CV NLL
among the visited pairs (ties: stronger lambda, then stronger mu). Deviation: on a CV
surface with a bump higher than STOP_MARGIN, or not unimodal along mu, the walk can miss
the grid's global minimum; ``search="grid"`` evaluates every pair (as the reference) for
comparison (``benchmarks/bench_dir_odir.py --grid``).

Fits: converged, not capped. Identity start (W = I, b = 0) or a warm start, analytic
gradient; dense Newton while K (K + 1) <= 500 (K <= 21), Newton-CG above (``_affine``:
Hessian-vector products in float32, Jacobi-preconditioned CG, gradient and objective in
float64), stopping at a gradient max-abs <= ``gtol`` (1e-5) or a relative decrease <=
``ftol`` (1e-12) in one step. Newton-CG rather than L-BFGS-B above K = 21: on a weakly
regularised fold fit it needs a few Newton steps where L-BFGS-B needs hundreds of
iterations, takes less time, and reaches a lower objective. A class absent from the
calibration labels has no finite optimum (its free diagonal weight drives its logit to
-inf); the ``ftol`` stop ends such fits once the objective no longer moves at that
resolution. ``max_iter`` (default 1000) caps every fit; a capped search fit or refit is
recorded in ``warnings_`` and raises a ConvergenceWarning. The reference trains with Adam
(lr 1e-3, then 1e-4, batch 128, early stopping on the training loss); the objective is
convex, so converged fits reach its optimum where one exists (Adam with early stopping may
stop short).

Refit: the selected pair is refitted on all rows, warm-started from the mean of its fold
solutions. Deviation: the reference keeps the five fold models and averages their
predictions instead of refitting (an average of five softmax outputs is not a Dirichlet
map, so it could not be stored or exported as one weights/bias pair).

Other implementations: probmetrics' ``dircal-cv`` is not this method. It is Dir-L2 (one
L2 strength on every entry of W and b, the diagonal included, shrinking toward zero), with
the strength searched over a per-entry grid; dividing that grid by K (K - 1) and K to
match ODIR's normalisation leaves no candidate strong enough at K = 100
(docs/reproduction.md).
"""

from __future__ import annotations

import numpy as np
from sklearn.model_selection import KFold, StratifiedKFold

from cord_ops.calibrators._affine import NEWTON_MAX_PARAMS, Penalty, affine_logits, fit_affine
from cord_ops.calibrators._base import PROB_FLOOR, Calibrator
from cord_ops.softmax import mean_nll_and_grad, softmax

#: Largest exponent of both grids (the reference's ``np.arange(start_from, 7)``).
GRID_MAX_EXPONENT = 6
#: The first lambda path stops once PATIENCE consecutive grid values have a CV NLL above
#: the path's best by more than STOP_MARGIN (nats): the over-fitting side of the curve
#: (docs/reproduction.md, "Dir-ODIR as Kull et al. tune it": the bumps before the minimum
#: stay below it, the climb after it passes it within two grid steps; a gentler climb only
#: costs steps).
STOP_MARGIN = 1e-2
#: Consecutive grid values beyond STOP_MARGIN after which the first lambda path stops.
PATIENCE = 1
#: Steps without an improvement after which a walk around the best pair stops.
WALK_PATIENCE = 1
#: An improvement counts (a walk goes on, another round starts) when it exceeds this.
TURN_TOL = 1e-4
#: Rounds of the mu / lambda coordinate walks after the first lambda path.
MAX_ROUNDS = 3
SEARCHES = ("path", "grid")


def kull_grid(k: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Kull et al.'s (lambdas, mus) for K classes, each in ascending order."""
    first = -5 if k <= 10 else -2
    decades = [10.0 ** e for e in range(first, GRID_MAX_EXPONENT + 1)]
    lambdas = sorted({f * d for d in decades for f in (0.25, 0.5, 1.0)})
    return tuple(lambdas), tuple(decades)


def odir_solver(k: int) -> str:
    """Dense Newton while the K (K + 1) Hessian is small, Newton-CG above (module docstring)."""
    return "newton" if k * (k + 1) <= NEWTON_MAX_PARAMS else "newton-cg"


def odir_penalty(reg_lambda: float, reg_mu: float) -> Penalty:
    """The unnormalised ODIR strengths: lambda per squared off-diagonal weight, mu per
    squared bias entry, none on the diagonal."""
    return Penalty(diag=0.0, offdiag=reg_lambda, bias=reg_mu)


def _grid_option(label: str, grid):
    """A grid option as a sorted tuple of distinct floats (None stays None); raises
    ValueError naming the option when it is not a non-empty list of positive numbers."""
    if grid is None:
        return None
    try:
        if isinstance(grid, str) or any(isinstance(v, bool) for v in grid):
            raise TypeError
        values = tuple(float(v) for v in grid)
    except (TypeError, ValueError):
        raise ValueError(f"{label}: expected a non-empty list of positive numbers or None, "
                         f"got {grid!r}") from None
    if not values or any(not (v > 0 and np.isfinite(v)) for v in values):
        raise ValueError(f"{label}: expected a non-empty list of positive numbers or None, "
                         f"got {grid!r}")
    return tuple(sorted(set(values)))


class _Search:
    """Cross-validated NLL of grid pairs, with one warm-start solution per fold and pair."""

    def __init__(self, cal, f, y, folds, lambdas, mus):
        self.cal, self.f, self.y, self.folds = cal, f, y, folds
        self.lambdas, self.mus = lambdas, mus
        self.cv: dict[tuple[int, int], float] = {}
        self.solutions: dict[tuple[int, int], list] = {}
        self.capped = 0
        self.fits = 0

    def score(self, pair, start=None) -> float:
        """CV NLL of ``pair`` = (lambda index, mu index), fitting each fold from the
        solution at ``start`` (a visited pair) or the identity."""
        if pair in self.cv:
            return self.cv[pair]
        penalty = odir_penalty(self.lambdas[pair[0]], self.mus[pair[1]])
        total, sols = 0.0, []
        for fold, (train, test) in enumerate(self.folds):
            init = self.solutions[start][fold] if start in self.solutions else None
            fit = fit_affine(self.f[train], self.y[train], full=True, init=init,
                             penalty=penalty, max_iter=self.cal.max_iter,
                             gtol=self.cal.gtol, ftol=self.cal.ftol, name=self.cal.name,
                             warn=False, newton_rtol=self.cal.ftol,
                             solver=odir_solver(self.f.shape[1]))
            self.fits += 1
            self.capped += not fit.converged
            sols.append((fit.weights, fit.bias))
            held_out, _ = mean_nll_and_grad(
                affine_logits(self.f[test], fit.weights, fit.bias), self.y[test])
            total += held_out
        self.solutions[pair] = sols
        self.cv[pair] = total / len(self.folds)
        return self.cv[pair]

    def best(self):
        # Lowest CV NLL; ties go to the stronger lambda, then the stronger mu.
        return min(self.cv, key=lambda p: (self.cv[p], -p[0], -p[1]))

    def walk(self, fixed, axis, start_index, steps):
        """Score pairs along one axis (0: lambda, 1: mu) from ``start_index`` in the order
        ``steps``, each fold warm-started from the previous pair; stop at the turn."""
        best_value, worse, previous = np.inf, 0, None
        for index in steps:
            pair = (index, fixed) if axis == 0 else (fixed, index)
            value = self.score(pair, start=previous)
            previous = pair
            # Around the best pair a plateau is a stop too: a step counts unless it
            # improves on the walk's best by more than TURN_TOL.
            if value < best_value - TURN_TOL:
                worse = 0
            else:
                worse += 1
                if worse >= WALK_PATIENCE:
                    return
            best_value = min(best_value, value)

    def both_ways(self, best, axis):
        size = len(self.lambdas) if axis == 0 else len(self.mus)
        centre, fixed = best[axis], best[1 - axis]
        for steps in (range(centre, -1, -1), range(centre, size)):
            self.walk(fixed, axis, centre, steps)


class DirichletODIR(Calibrator):
    """``dir-odir``: q = softmax(clipped log-probabilities @ weights.T + bias), ODIR-
    penalised, (lambda, mu) chosen by 5-fold CV as Kull et al. (module docstring).

    Fitted state: ``weights`` (K, K), ``bias`` (K,), ``reg_lambda``, ``reg_mu`` (the selected
    pair) and ``cv_path`` (one row ``[lambda, mu, CV NLL]`` per scored pair, in visiting
    order; a single given pair is fitted without a search and recorded with CV NLL 0).
    ``warnings_`` (fit-time only, not stored) lists capped fits; ``converged_`` is True when
    it is empty.
    """

    name = "dir-odir"
    _options = ("reg_lambdas", "reg_mus", "n_folds", "random_state", "search", "max_iter",
                "gtol", "ftol")
    _option_checks = {"n_folds": {"integer": True},
                      "random_state": {"integer": True, "allow_zero": True},
                      "max_iter": {"integer": True}, "gtol": {}, "ftol": {"allow_zero": True}}
    param_shapes = {"weights": ("K", "K"), "bias": ("K",), "reg_lambda": (), "reg_mu": (),
                     "cv_path": ("*", 3)}

    def __init__(self, input_kind: str = "logits", prob_floor: float = PROB_FLOOR,
                 reg_lambdas=None, reg_mus=None, n_folds: int = 5, random_state: int = 0,
                 search: str = "path", max_iter: int = 1000, gtol: float = 1e-5,
                 ftol: float = 1e-12):
        super().__init__(input_kind, prob_floor)
        self.reg_lambdas = reg_lambdas
        self.reg_mus = reg_mus
        self.n_folds = n_folds
        self.random_state = random_state
        self.search = search
        self.max_iter = max_iter
        self.gtol = gtol
        self.ftol = ftol

    def validate_options(self) -> None:
        super().validate_options()
        _grid_option("reg_lambdas", self.reg_lambdas)
        _grid_option("reg_mus", self.reg_mus)
        if self.n_folds < 2:
            raise ValueError(f"n_folds: expected an integer >= 2, got {self.n_folds!r}")
        if self.search not in SEARCHES:
            raise ValueError(f"search: expected one of {SEARCHES}, got {self.search!r}")

    def features(self, x: np.ndarray) -> np.ndarray:
        """Clipped log-probabilities of validated scores (module docstring)."""
        log_floor = np.log(self.prob_floor)
        if self.input_kind == "probs":
            return np.log(np.maximum(x, self.prob_floor))
        shifted = x - x.max(axis=1, keepdims=True)
        lse = np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        return np.maximum(shifted - lse, log_floor)

    def _folds(self, f, y, k):
        n = f.shape[0]
        if n < self.n_folds:
            raise ValueError(f"{self.name}: the {self.n_folds}-fold search needs at least "
                             f"{self.n_folds} calibration rows, got {n}")
        counts = np.bincount(y, minlength=k)
        splitter = (StratifiedKFold if counts[counts > 0].min() >= self.n_folds
                    else KFold)(self.n_folds, shuffle=True, random_state=self.random_state)
        return list(splitter.split(f, y))

    def _fit(self, x, y):
        f = self.features(x)
        k = f.shape[1]
        default_l, default_m = kull_grid(k)
        lambdas = _grid_option("reg_lambdas", self.reg_lambdas) or default_l
        mus = _grid_option("reg_mus", self.reg_mus) or default_m
        search = None
        if len(lambdas) * len(mus) > 1:
            search = _Search(self, f, y, self._folds(f, y, k), lambdas, mus)
            if self.search == "grid":
                previous = None
                for i in reversed(range(len(lambdas))):
                    for j in reversed(range(len(mus))):
                        search.score((i, j), start=previous)
                        previous = (i, j)
            else:
                self._walk(search)
            best = search.best()
            path = [[lambdas[i], mus[j], v] for (i, j), v in search.cv.items()]
            sols = search.solutions[best]
            init = (np.mean([s[0] for s in sols], axis=0), np.mean([s[1] for s in sols], axis=0))
        else:
            best, init = (0, 0), None
            path = [[lambdas[0], mus[0], 0.0]]
        self.reg_lambda_, self.reg_mu_ = lambdas[best[0]], mus[best[1]]
        self.cv_path_ = np.asarray(path, dtype=np.float64)
        fit = fit_affine(f, y, full=True, init=init,
                         penalty=odir_penalty(self.reg_lambda_, self.reg_mu_),
                         max_iter=self.max_iter, gtol=self.gtol, ftol=self.ftol,
                         name=self.name, warn=False, newton_rtol=self.ftol,
                         solver=odir_solver(k))
        self.weights_, self.bias_ = fit.weights, fit.bias
        if search is not None and search.capped:
            self._warn(f"{search.capped} of {search.fits} cross-validation fits stopped at "
                       f"max_iter={self.max_iter} before convergence; the selection compares "
                       "those last iterates")
        if not fit.converged:
            self._warn(f"the refit stopped before convergence ({fit.message}; {fit.n_iter} "
                       f"iterations, max_iter={self.max_iter}); the returned map is the last "
                       "iterate")

    @staticmethod
    def _walk(search: _Search) -> None:
        lambdas, mus = search.lambdas, search.mus
        strongest = len(lambdas) - 1

        def nearest_mu(i):
            return int(np.argmin(np.abs(np.log(mus) - np.log(lambdas[i]))))

        # 1. The lambda path from the strongest penalty down, mu tied to lambda's decade.
        # The CV curve along lambda is not unimodal (module docstring), so the path stops
        # only on the over-fitting climb (STOP_MARGIN), never at the first turn.
        previous, best_value, worse = None, np.inf, 0
        for i in range(strongest, -1, -1):
            pair = (i, nearest_mu(i))
            value = search.score(pair, start=previous)
            previous = pair
            best_value = min(best_value, value)
            worse = worse + 1 if value > best_value + STOP_MARGIN else 0
            if worse >= PATIENCE:
                break
        # 2. Coordinate walks around the best pair until it improves by no more than
        # TURN_TOL (a flat stretch of mu is not crept along at 1e-6 steps).
        for _ in range(MAX_ROUNDS):
            before = search.cv[search.best()]
            search.both_ways(search.best(), axis=1)
            search.both_ways(search.best(), axis=0)
            if search.cv[search.best()] >= before - TURN_TOL:
                break

    def _predict(self, x):
        return softmax(affine_logits(self.features(x), self.weights_, self.bias_))
