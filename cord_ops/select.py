"""Choosing the calibrator family per model (``--calibrator auto``; docs/calibrators.md,
"Choosing the family").

No family wins on every model, and on some every family does harm; so the family is chosen
on the calibration split itself, the identity map (the classifier's own probabilities)
included:

1. **Candidates** (:func:`candidate_families`): identity plus every family, less those
   whose cost or known failure rules them out at this K and split size (:data:`RULES`).
2. **Score**: stratified k-fold cross-validation (``n_splits`` = 5, folds shuffled with
   ``seed``). In each fold the calibrator and CORD are fitted on the other folds, and the
   held-out rows are scored after the repair -- the output that will be served -- with the
   reported NLL and its one log floor (:func:`cord_ops.metrics.nll`). Every held-out row
   is scored exactly once, so a family's CV NLL is the mean of n row losses.
3. **Choice** (:func:`choose`): the lowest mean wins, except that a simpler family
   (:data:`SIMPLICITY`; identity is the simplest) whose mean is within ``tie_se`` paired
   standard errors of the lowest mean takes its place. The standard error is that of the
   mean per-row difference between the two families over the same held-out rows (paired:
   the rows' own difficulty cancels), so it measures whether the two differ on these
   rows, not how noisy the NLL is. ``tie_se=0`` is "lowest mean wins" (an exact tie still
   goes to the simpler family).

Everything is deterministic given ``seed`` (fits run single-threaded BLAS; folds are seeded)
unless a time ``budget`` leaves a family out.
A family that fails to fit in some fold (an error, not a warning) is dropped from the
choice and named in :attr:`Selection.skipped` with the error; so is a family not started
because the time budget was spent.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass, field

import numpy as np
from sklearn.model_selection import KFold, StratifiedKFold

from cord_ops.calibrators import make_calibrator
from cord_ops.cord import CORD
from cord_ops.metrics import PROB_FLOOR, ece, tpcr
from cord_ops.names import CALIBRATOR_NAMES, IDENTITY
from cord_ops.softmax import softmax

#: Folds of the cross-validation.
N_SPLITS = 5
#: Default near-tie widths, in paired standard errors (module docstring, step 3): between
#: families, and between identity and the lowest family. Half an error, by measurement
#: (benchmarks/bench_select.py, docs/calibrators.md section 8): on 104 entries one error
#: cost mean regret (18.1 % against 11.6 %) and "lowest mean wins" (11.2 %) gives up the
#: identity band that keeps an exactly calibrated classifier's own probabilities.
TIE_SE = 0.5
IDENTITY_SE = 0.5

#: From simplest to most flexible, by what the map can change (and how many parameters it
#: fits): the near-tie rule prefers the earlier one. Families not listed rank after these.
SIMPLICITY = (IDENTITY, "ts", "ts-tva", "vs", "svs", "mcct-i", "irm", "irova-ts", "irova",
              "sms", "dir-odir", "ms")

#: The order families are cross-validated in: cheapest first, by one fit's time at K = 100
#: (docs/calibrators.md, "Choosing the family"), so a time budget leaves out the costliest.
#: Families not listed go last.
COST_ORDER = (IDENTITY, "ts", "svs", "vs", "irm", "irova", "irova-ts", "sms", "ts-tva",
              "mcct-i", "ms", "dir-odir")

#: Rows per fitted parameter the full-matrix families (K^2 + K parameters) need in a
#: training fold: below it they overfit (MS on a separable problem, Dir-ODIR and MS at
#: K >= 100 in CalArena, log-loss 26-39) and cost minutes (10,100 parameters at K = 100).
ROWS_PER_MATRIX_PARAMETER = 5
#: Families with a K x K matrix of free parameters.
FULL_MATRIX = ("ms", "dir-odir")
#: The rules of :func:`candidate_families`, as documentation and for the run's record.
RULES = (f"identity and every family of cord_ops.names.CALIBRATOR_NAMES; "
         f"{' and '.join(FULL_MATRIX)} only when a training fold has at least "
         f"{ROWS_PER_MATRIX_PARAMETER} rows per parameter (K^2 + K)")


def _clock() -> float:
    """Seconds (``time.perf_counter``): fit times and the budget's deadline."""
    return time.perf_counter()


def rank(name: str) -> int:
    """A family's place in :data:`SIMPLICITY` (unlisted names after every listed one)."""
    return SIMPLICITY.index(name) if name in SIMPLICITY else len(SIMPLICITY)


def _cost_rank(name: str) -> int:
    return COST_ORDER.index(name) if name in COST_ORDER else len(COST_ORDER)


def candidate_families(n_classes: int, n_rows: int,
                       n_splits: int = N_SPLITS) -> tuple[list[str], dict[str, str]]:
    """(the families to cross-validate, simplest first; {family ruled out: why})."""
    train_rows = n_rows - -(-n_rows // max(n_splits, 1))  # the smallest training fold
    parameters = n_classes * n_classes + n_classes
    chosen, ruled_out = [IDENTITY], {}
    for name in sorted(CALIBRATOR_NAMES, key=rank):
        if name in FULL_MATRIX and train_rows < ROWS_PER_MATRIX_PARAMETER * parameters:
            ruled_out[name] = (f"{parameters} parameters at K = {n_classes} need "
                               f"{ROWS_PER_MATRIX_PARAMETER * parameters} rows per training "
                               f"fold, {train_rows} here")
        else:
            chosen.append(name)
    return chosen, ruled_out


@dataclass(frozen=True)
class Candidate:
    """One family's cross-validated figures (held-out rows, after CORD's repair)."""

    name: str
    #: mean NLL over every held-out row, and its standard error (row losses, ddof 1)
    nll: float
    nll_se: float
    ece: float
    #: ROC AUC of the repaired positive-class probability (K = 2 only, else None)
    auc: float | None
    #: share of held-out rows whose top-1 the calibrator changed before the repair
    tpcr: float
    #: seconds spent fitting and scoring over all folds
    fit_seconds: float
    #: warnings the fits raised (deduplicated)
    warnings: tuple[str, ...] = ()
    #: per-row held-out losses (for the paired near-tie rule; not part of the record)
    losses: np.ndarray = field(default=None, repr=False, compare=False)

    def record(self) -> dict:
        """The JSON-safe row of the selection table."""
        return {"family": self.name, "nll": self.nll, "nll_se": self.nll_se,
                "ece": self.ece, "auc": self.auc, "tpcr": self.tpcr,
                "fit_seconds": self.fit_seconds, "warnings": list(self.warnings)}


@dataclass(frozen=True)
class Selection:
    """What :func:`select_calibrator` decided, and every figure it decided on."""

    chosen: str
    #: one sentence: why this family (lowest mean, or a near-tie given to a simpler one)
    reason: str
    #: every scored family, best (lowest CV NLL) first
    candidates: tuple[Candidate, ...]
    #: families not scored: {name: why} (ruled out, failed, or out of time)
    skipped: dict[str, str]
    n_splits: int
    seed: int
    tie_se: float
    identity_se: float

    def candidate(self, name: str) -> Candidate | None:
        return next((c for c in self.candidates if c.name == name), None)

    def record(self) -> dict:
        """JSON-safe: the table, the choice and the rule (the run's artifact)."""
        return {"chosen": self.chosen, "reason": self.reason, "n_splits": self.n_splits,
                "seed": self.seed, "tie_se": self.tie_se, "identity_se": self.identity_se,
                "rules": RULES,
                "candidates": [c.record() for c in self.candidates],
                "skipped": dict(self.skipped)}

    def table(self) -> str:
        """The candidates best first, the choice marked with ``*``; skipped ones after."""
        auc = any(c.auc is not None for c in self.candidates)
        header = (f"  {'family':<10}{'CV NLL':>11}{'+-SE':>10}{'ECE':>9}"
                  + (f"{'AUC':>9}" if auc else "") + f"{'TPCR':>8}{'fit s':>8}")
        lines = [header]
        for c in self.candidates:
            mark = "*" if c.name == self.chosen else " "
            lines.append(f"{mark} {c.name:<10}{c.nll:>11.5f}{c.nll_se:>10.5f}{c.ece:>9.5f}"
                         + ("" if not auc else f"{'-':>9}" if c.auc is None
                            else f"{c.auc:>9.5f}")
                         + f"{c.tpcr:>8.4f}{c.fit_seconds:>8.2f}")
        lines += [f"  {name:<10}skipped: {why}" for name, why in self.skipped.items()]
        return "\n".join(lines)


def choose(losses: dict[str, np.ndarray], tie_se: float = TIE_SE,
           identity_se: float | None = None) -> tuple[str, str]:
    """(chosen family, why) from each family's per-row held-out losses (same rows, same
    order): the lowest mean; identity instead when its mean is within ``identity_se``
    paired standard errors of the lowest (default ``tie_se``); else the simplest family
    within ``tie_se`` paired standard errors of the lowest (module docstring, step 3)."""
    if not losses:
        raise ValueError("choose: no family was scored")
    means = {name: float(np.mean(rows)) for name, rows in losses.items()}
    best = min(means, key=lambda name: (means[name], rank(name), name))
    widths = {name: tie_se for name in means}
    if IDENTITY in widths:
        widths[IDENTITY] = tie_se if identity_se is None else identity_se
    for name in sorted(means, key=lambda name: (rank(name), name)):
        if name == best or (rank(name), name) > (rank(best), best):
            break
        difference = losses[name] - losses[best]
        gap = float(np.mean(difference))
        se = (float(np.std(difference, ddof=1)) / math.sqrt(len(difference))
              if len(difference) > 1 else 0.0)
        if gap <= widths[name] * se:
            return name, (f"{name}'s CV NLL {means[name]:.6g} is within {widths[name]:g} "
                          f"paired standard error ({se:.3g}) of {best}'s {means[best]:.6g}; "
                          f"the simpler family is kept")
    return best, f"lowest CV NLL ({means[best]:.6g})"


def _folds(labels: np.ndarray, n_splits: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Stratified shuffled folds; plain shuffled folds when some class has fewer rows than
    folds (stratification cannot place it in each)."""
    counts = np.bincount(labels)
    counts = counts[counts > 0]
    splitter = (StratifiedKFold if counts.min() >= n_splits else KFold)(
        n_splits=n_splits, shuffle=True, random_state=seed)
    return list(splitter.split(np.zeros(len(labels)), labels))


def _one_fold(name: str, scores: np.ndarray, labels: np.ndarray, original: np.ndarray,
              input_kind: str, train: np.ndarray, test: np.ndarray):
    """(repaired held-out rows, calibrated held-out rows, seconds, warnings) of one fold."""
    start = _clock()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        calibrator = make_calibrator(name, input_kind=input_kind)
        calibrator.fit(scores[train], labels[train])
        repair = CORD().fit(original[train], calibrator.predict_proba(scores[train]))
        calibrated = calibrator.predict_proba(scores[test])
        repaired = repair.transform(original[test], calibrated)
    seen = tuple(dict.fromkeys(f"{w.category.__name__}: {w.message}" for w in caught))
    return repaired, calibrated, _clock() - start, seen


class _OutOfTime(Exception):
    """A family's folds ran past the selection's deadline."""


def _score(name: str, folds, scores, labels, original, input_kind, n_classes, n_jobs,
           deadline: float | None = None):
    """A family's :class:`Candidate` over every fold (folds in parallel when n_jobs > 1).
    One fold at a time, the family is abandoned (:class:`_OutOfTime`) when a fold ends
    past ``deadline`` (a ``_clock()`` value) with folds still to fit."""
    if n_jobs == 1:
        results = []
        for i, (train, test) in enumerate(folds):
            results.append(_one_fold(name, scores, labels, original, input_kind, train, test))
            if deadline is not None and i + 1 < len(folds) and _clock() > deadline:
                raise _OutOfTime(f"stopped after fold {i + 1} of {len(folds)}: the budget "
                                 "ran out")
    else:
        from joblib import Parallel, delayed

        results = Parallel(n_jobs=n_jobs, prefer="threads")(
            delayed(_one_fold)(name, scores, labels, original, input_kind, train, test)
            for train, test in folds)
    n = len(labels)
    repaired = np.empty((n, n_classes))
    calibrated = np.empty((n, n_classes))
    for (_, test), (rep, cal, _, _) in zip(folds, results, strict=True):
        repaired[test], calibrated[test] = rep, cal
    true_mass = np.clip(repaired[np.arange(n), labels], PROB_FLOOR, 1 - PROB_FLOOR)
    losses = -np.log(true_mass)
    auc = None
    if n_classes == 2:
        from sklearn.metrics import roc_auc_score

        auc = (float(roc_auc_score(labels, repaired[:, 1]))
               if len(np.unique(labels)) == 2 else float("nan"))
    return Candidate(
        name=name, nll=float(np.mean(losses)),
        nll_se=float(np.std(losses, ddof=1) / math.sqrt(n)) if n > 1 else 0.0,
        ece=ece(repaired, labels), auc=auc, tpcr=tpcr(original, calibrated),
        fit_seconds=float(sum(r[2] for r in results)),
        warnings=tuple(dict.fromkeys(w for r in results for w in r[3])), losses=losses)


def select_calibrator(scores, labels, input_kind: str = "logits", *,
                      families: list[str] | None = None, n_splits: int = N_SPLITS,
                      seed: int = 0, tie_se: float = TIE_SE,
                      identity_se: float = IDENTITY_SE, budget: float | None = None,
                      n_jobs: int = 1) -> Selection:
    """Cross-validate the candidate families on (``scores``, integer ``labels`` in [0, K))
    and choose one (module docstring). ``scores`` are validated n x K logits or
    probabilities (``input_kind``). ``families``: the candidates (default
    :func:`candidate_families`; identity is always added). ``budget``: seconds after
    which no further family is started, and a family still fitting its folds one at a
    time is abandoned after the fold that ends past it (families go cheapest first,
    :data:`COST_ORDER`, so the costly ones are left out, each named in ``skipped``); the
    choice is then
    deterministic only as long as nothing is left out for time. ``n_jobs``: folds fitted
    in parallel (joblib threads; the budget is then checked between families only).
    """
    scores = np.asarray(scores, dtype=np.float64)
    labels = np.asarray(labels)
    n, k = scores.shape
    for key, width in (("tie_se", tie_se), ("identity_se", identity_se)):
        if not (isinstance(width, int | float) and math.isfinite(width) and width >= 0):
            raise ValueError(f"{key}: expected a finite number >= 0, got {width!r}")
    if budget is not None and not (isinstance(budget, int | float) and budget > 0):
        raise ValueError(f"budget: expected seconds > 0 or None, got {budget!r}")
    if families is None:
        names, skipped = candidate_families(k, n, n_splits)
    else:
        names, skipped = list(dict.fromkeys([IDENTITY, *families])), {}
    splits = min(n_splits, n)
    if splits < 2:
        return Selection(IDENTITY, f"{n} row(s): too few to cross-validate; identity kept",
                         (), skipped, splits, seed, float(tie_se), float(identity_se))
    folds = _folds(labels, splits, seed)
    original = softmax(scores) if input_kind == "logits" else scores
    start = _clock()
    scored = []
    deadline = None if budget is None else start + budget
    for name in sorted(names, key=_cost_rank):
        spent = _clock() - start
        if budget is not None and spent > budget and name != IDENTITY:
            skipped[name] = f"not started: the {budget:g} s budget was spent ({spent:.1f} s)"
            continue
        try:
            scored.append(_score(name, folds, scores, labels, original, input_kind, k,
                                 n_jobs, None if name == IDENTITY else deadline))
        except _OutOfTime as exc:
            skipped[name] = f"{exc} ({budget:g} s)"
        except (ValueError, ArithmeticError, np.linalg.LinAlgError) as exc:
            skipped[name] = f"failed: {exc}"
    chosen, reason = choose({c.name: c.losses for c in scored}, tie_se, identity_se)
    ordered = tuple(sorted(scored, key=lambda c: (c.nll, rank(c.name))))
    return Selection(chosen, reason, ordered, skipped, splits, seed, float(tie_se),
                     float(identity_se))
