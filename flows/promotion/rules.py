"""The champion gate: when a candidate version may take ``@champion``.

A candidate is promoted only when every one of these holds (:func:`decide`):

1. **It preserves decisions.** TPCR 0 on its evaluation split, and ONNX parity verified.
2. **There is enough evidence** (:class:`Policy`, :func:`evidence_problems`):

   - the calibration and evaluation splits hold at least ``min_calibration`` /
     ``min_evaluation`` rows. The default is ``max(100, 10 * K)`` for both: the default
     calibrator (vector scaling) fits 2K parameters, and 10 rows per class under balanced
     labels is 5 rows per parameter, the least at which each class's scale and bias are
     estimated from data rather than from the optimiser's start; below 100 rows the
     evaluation itself is noise (the standard error of a mean NLL is about sd / sqrt(n),
     with sd near 1 nat for a classifier's per-row NLL, i.e. 0.1 nat at n = 100, more than
     the gap between most calibrators). Both are overridable.
   - for K >= 3, no class dominates either split: the largest class's share is at most
     ``max_class_share``, by default ``min(0.9, max(0.5, 5 / K))``: five times its share
     under balanced labels, at least one half (so K >= 10 keeps a majority class out) and at
     most 0.9 (so a 3-class problem may be imbalanced but not single-class). A file whose
     labels are all one class (a broken labelling job, an all-zeros default) is caught
     here whatever its NLL.
   - for K = 2, enough rows of the rarer class instead of balance: each class holds at
     least ``min_class_rows`` rows in either split, by default
     ``MIN_RARER_CLASS_ROWS = 20``, and ``max_class_share`` defaults to 1 (off). Fraud,
     churn and cancellation models are calibrated on a few per cent of positives, and a
     share rule would refuse them all (0.9 refuses every problem under 10 % positives);
     what the guard exists for is a single-class or mislabelled batch, which has no rows
     of one class. 20 is the events-per-variable rule of thumb for logistic models (10
     events of the rarer class per fitted parameter, Peduzzi et al. 1996) applied to the
     two parameters a binary scaling map fits on the margin (Platt's slope and bias; VS's
     four collapse to these two for K = 2): below it the fitted slope is noise. It is
     checked on the evaluation split too, where the rarer class's rows are what the NLL
     and the TPCR of the decisions that matter are measured on. ``--min-class-rows``
     changes it (and sets it for K >= 3, where it is 0 by default: a class may be absent
     from a split of many classes).
   - the evaluation labels are not far from those the champion was evaluated on: the
     total-variation distance between the two label distributions is at most
     ``max_label_shift`` (default 0.2) **plus** the distance two samples of these sizes
     drawn from one distribution show by chance (:func:`sampling_tv`), so small splits
     of many classes are not flagged for noise.

3. **The champion can be scored.** A champion that cannot run on the split (broken
   artifact, foreign model, other K or input kind) is a rejection and a health problem
   (:class:`flows.promotion.champion.ChampionUnhealthyError`), never a free win.
4. **No worse than the uncalibrated model** (do no harm). The candidate's NLL (after
   CORD, the output it would serve) is no worse than the classifier's own uncalibrated NLL
   on the candidate's evaluation split, and on the champion's reference split when that is
   used: ``candidate <= uncalibrated * (1 + tolerance)``, with the tolerance of that split
   (below). This holds for the first version too: without a champion, the uncalibrated
   model is the baseline, so a calibrator that makes its own data worse never takes the
   alias. ``cord-ops promote`` can still move the alias to such a version, with a reason.
5. **Better than the champion, no worse on its reference split.** The candidate's NLL
   must be *strictly* better than the champion's on the candidate's evaluation split,
   beyond the tolerance (``candidate < champion * (1 - nll_tolerance)``): a tie (a refit
   of unchanged data, the same graph) never moves ``@champion``. On the champion's pinned
   reference split (its own evaluation split, logged as an MLflow dataset input), when
   that is available and compatible (same K and input kind), it must be no worse
   (``candidate <= champion * (1 + reference_tolerance)``). The two tolerances:

   - ``nll_tolerance`` (default 1e-6, relative) on the candidate's split, where both
     models see the same rows: float rounding only. Any larger tolerance would make the
     champion depend on the order in which the registry lock lets concurrent
     recalibrations through (a later candidate up to the tolerance worse would replace
     a better one); with rounding only, serial gates always end on the lowest NLL (the
     first of tied candidates keeps the alias).
   - ``reference_tolerance`` (default 0.02, relative) on the champion's reference split,
     which is older data: a candidate fitted to the present distribution may lose a
     little there, and should be allowed to, or drift would freeze the champion. The rule
     is there for disasters (the all-zero-labels batch's candidate is 16 times worse
     there), and 2 % is several standard errors of a mean NLL on a few thousand rows.
6. ``promote`` is not switched off.
7. **It decides as the champion does.** A binary candidate keeping another decision
   threshold than the champion (:func:`decision_change`; none and 1/2 are the argmax)
   changes the decisions the operator takes, which is a policy change for ``cord-ops
   promote``, not a gate's win on NLL.

:func:`decide` is a pure function of numbers, and so is everything here: this module needs
numpy and nothing of MLflow (``tests/test_layering.py`` checks), so the rules can be read,
tested and reused without a registry. Scoring a registered champion and the registry tags
of its health and history are :mod:`flows.promotion.champion`'s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

#: Below these a split is too small to fit and evaluate at all: the recalibration fails
#: before any run exists. 5 calibration rows is what the most demanding calibrator
#: (dir-odir's 5-fold search) needs; one rule for every calibrator keeps it predictable.
MIN_FIT_CALIBRATION = 5
MIN_FIT_EVALUATION = 2

#: The float types a graph may compute in.
DTYPES = ("float32", "float64")
DEFAULT_MAX_LABEL_SHIFT = 0.2
DEFAULT_NLL_TOLERANCE = 1e-6
DEFAULT_REFERENCE_TOLERANCE = 0.02


def default_min_rows(n_classes: int) -> int:
    """``max(100, 10 * K)`` (see the module docstring for why)."""
    return max(100, 10 * int(n_classes))


#: Rows of the rarer class a binary split needs (module docstring: the EPV rule).
MIN_RARER_CLASS_ROWS = 20


def default_max_class_share(n_classes: int) -> float:
    """``min(0.9, max(0.5, 5 / K))`` for K >= 3; 1.0 (off) for K = 2, which the rarer-class
    rule guards instead (see the module docstring for why)."""
    if int(n_classes) == 2:
        return 1.0
    return min(0.9, max(0.5, 5.0 / int(n_classes)))


def default_min_class_rows(n_classes: int) -> int:
    """``MIN_RARER_CLASS_ROWS`` for K = 2, else 0 (see the module docstring for why)."""
    return MIN_RARER_CLASS_ROWS if int(n_classes) == 2 else 0


@dataclass(frozen=True)
class Policy:
    """The gate's thresholds for one K; build with :meth:`for_classes`."""

    min_calibration: int
    min_evaluation: int
    max_class_share: float
    min_class_rows: int = 0
    max_label_shift: float = DEFAULT_MAX_LABEL_SHIFT
    nll_tolerance: float = DEFAULT_NLL_TOLERANCE
    reference_tolerance: float = DEFAULT_REFERENCE_TOLERANCE

    @classmethod
    def for_classes(cls, n_classes: int, **overrides) -> Policy:
        """The defaults for K = ``n_classes``; ``overrides`` set to None keep the default."""
        policy = cls(default_min_rows(n_classes), default_min_rows(n_classes),
                     default_max_class_share(n_classes), default_min_class_rows(n_classes))
        given = {k: v for k, v in overrides.items() if v is not None}
        unknown = set(given) - set(cls.__dataclass_fields__)
        if unknown:
            raise TypeError(f"unknown gate option(s): {sorted(unknown)}")
        policy = replace(policy, **given)
        policy.check()
        return policy

    def check(self) -> None:
        """Reject a threshold no split could meet or one that switches a check off by
        accident (negative sizes, shares outside (0, 1], negative tolerances)."""
        for name in ("min_calibration", "min_evaluation"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
                raise ValueError(f"{name}: expected a positive integer, got {value!r}")
        value = self.min_class_rows
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
            raise ValueError(f"min_class_rows: expected an integer >= 0, got {value!r}")
        if not 0.0 < self.max_class_share <= 1.0:
            raise ValueError(f"max_class_share: expected a share in (0, 1], "
                             f"got {self.max_class_share!r}")
        for name in ("max_label_shift", "nll_tolerance", "reference_tolerance"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise ValueError(f"{name}: expected a finite number >= 0, got {value!r}")

    def allowed_nll(self, baseline_nll: float, on_reference: bool = False) -> float:
        """The largest candidate NLL that is "no worse" than ``baseline_nll`` (the
        uncalibrated model's, or the champion's on its reference split) on the candidate's
        split, or on the champion's reference split."""
        tolerance = self.reference_tolerance if on_reference else self.nll_tolerance
        return baseline_nll + tolerance * abs(baseline_nll)

    def nll_to_beat(self, champion_nll: float) -> float:
        """A candidate replaces the champion only with an NLL strictly below this, on the
        candidate's split: better beyond float rounding, so a tie never moves the alias."""
        return champion_nll - self.nll_tolerance * abs(champion_nll)

    def as_tags(self) -> dict[str, str]:
        return {f"cord.gate.policy.{k}": repr(v) for k, v in self.__dict__.items()}


def check_fit_floor(n_calibration: int, n_evaluation: int, where: str) -> None:
    """Raise one ValueError line when a split is too small to fit or evaluate at all."""
    if n_calibration < MIN_FIT_CALIBRATION or n_evaluation < MIN_FIT_EVALUATION:
        raise ValueError(
            f"{where}: {n_calibration} calibration and {n_evaluation} evaluation rows; "
            f"fitting needs at least {MIN_FIT_CALIBRATION} and {MIN_FIT_EVALUATION} "
            "(and promotion far more: see `cord-ops recalibrate --help`, --min-calibration)")


def label_counts(labels: np.ndarray, n_classes: int) -> tuple[int, ...]:
    return tuple(int(c) for c in np.bincount(np.asarray(labels), minlength=n_classes))


@dataclass(frozen=True)
class Evidence:
    """What the candidate was fitted and evaluated on: label counts per class of the
    calibration and evaluation splits, and of the champion's reference split (None when
    there is no champion or its reference split is unavailable or incompatible)."""

    calibration_counts: tuple[int, ...]
    evaluation_counts: tuple[int, ...]
    reference_counts: tuple[int, ...] | None = None

    @property
    def n_classes(self) -> int:
        return len(self.evaluation_counts)

    @property
    def n_calibration(self) -> int:
        return int(sum(self.calibration_counts))

    @property
    def n_evaluation(self) -> int:
        return int(sum(self.evaluation_counts))


def tv_distance(p_counts, q_counts) -> float:
    """Total-variation distance between two label histograms (0 same, 1 disjoint)."""
    p = np.asarray(p_counts, dtype=np.float64)
    q = np.asarray(q_counts, dtype=np.float64)
    return float(0.5 * np.abs(p / p.sum() - q / q.sum()).sum())


def sampling_tv(p_counts, q_counts) -> float:
    """The total-variation distance expected by chance between two samples of these sizes
    from one distribution (the pooled one): per class E|p1 - p2| with the normal
    approximation sqrt(2 / pi) * sqrt(p (1 - p) (1 / n1 + 1 / n2)), halved and summed."""
    p = np.asarray(p_counts, dtype=np.float64)
    q = np.asarray(q_counts, dtype=np.float64)
    pooled = (p + q) / (p.sum() + q.sum())
    spread = np.sqrt(pooled * (1 - pooled) * (1 / p.sum() + 1 / q.sum()))
    return float(0.5 * math.sqrt(2 / math.pi) * spread.sum())


def evidence_problems(evidence: Evidence, policy: Policy) -> list[str]:
    """Why this evidence cannot support a promotion (empty when it can)."""
    problems = []
    if evidence.n_calibration < policy.min_calibration:
        problems.append(f"calibration split has {evidence.n_calibration} rows "
                        f"(< {policy.min_calibration} needed for K={evidence.n_classes})")
    if evidence.n_evaluation < policy.min_evaluation:
        problems.append(f"evaluation split has {evidence.n_evaluation} rows "
                        f"(< {policy.min_evaluation} needed for K={evidence.n_classes})")
    for split, counts in (("calibration", evidence.calibration_counts),
                          ("evaluation", evidence.evaluation_counts)):
        total = sum(counts)
        if total == 0:
            continue
        top = int(np.argmax(counts))
        share = counts[top] / total
        if share > policy.max_class_share:
            problems.append(f"class {top} holds {share:.1%} of the {split} labels "
                            f"(> {policy.max_class_share:.0%}; --max-class-share)")
        rarest = int(np.argmin(counts))
        if counts[rarest] < policy.min_class_rows:
            problems.append(f"class {rarest} has {counts[rarest]} of the {total} {split} rows "
                            f"(< {policy.min_class_rows} needed of each class; "
                            "--min-class-rows)")
    if evidence.reference_counts is not None and sum(evidence.reference_counts) > 0 \
            and evidence.n_evaluation > 0:
        shift = tv_distance(evidence.evaluation_counts, evidence.reference_counts)
        allowed = policy.max_label_shift + sampling_tv(evidence.evaluation_counts,
                                                       evidence.reference_counts)
        if shift > allowed:
            problems.append(f"evaluation labels are far from the champion's reference split "
                            f"(total variation {shift:.3f} > {allowed:.3f})")
    return problems


def decision_change(candidate: float | None, champion: float | None,
                    champion_version: str) -> str | None:
    """Why a candidate deciding at another threshold than the champion may not take the
    alias by the gate (a change of decision policy is the operator's: ``cord-ops
    promote``), or None when both decide alike (1/2 is the argmax)."""
    def words(t):
        return "the argmax" if t is None or t == 0.5 else f"p1 > {t:g}"

    if words(candidate) == words(champion):
        return None
    return (f"decides at {words(candidate)} but champion v{champion_version} decides at "
            f"{words(champion)} (a change of decision policy is promoted by hand)")


@dataclass(frozen=True)
class ChampionScore:
    """The current champion's version and its NLL on the candidate's evaluation split;
    ``problem`` says why it could not be scored (then ``nll`` is None)."""

    version: str
    nll: float | None
    problem: str | None = None


@dataclass(frozen=True)
class ReferenceScore:
    """Candidate, champion and the uncalibrated classifier on the champion's pinned
    reference split, or why that split was not used (``problem``: unavailable,
    incompatible)."""

    version: str
    candidate_nll: float | None = None
    champion_nll: float | None = None
    problem: str | None = None
    uncalibrated_nll: float | None = None


@dataclass(frozen=True)
class GateDecision:
    """Outcome of the champion gate; ``reason`` says in words why (every failed rule).

    ``champion_problem`` is set when the champion could not be scored: the registry then
    needs an operator (``cord-ops promote`` or ``rollback``).
    """

    promote: bool
    reason: str
    candidate_nll: float
    champion_nll: float | None
    champion_version: str | None
    reference: ReferenceScore | None = None
    champion_problem: str | None = None
    evidence: list[str] = field(default_factory=list)
    uncalibrated_nll: float | None = None
    #: The candidate is worse than the uncalibrated classifier (rule 4) on some split.
    harms: bool = False

    @property
    def label(self) -> str:
        return "promoted" if self.promote else "rejected"


def decide(candidate_nll: float, candidate_tpcr: float, parity_ok: bool,
           champion: ChampionScore | None, *, uncalibrated_nll: float, evidence: Evidence,
           policy: Policy, reference: ReferenceScore | None = None,
           promote: bool = True, decision_change: str | None = None) -> GateDecision:
    """The champion gate as a pure function of the measured numbers (rules in the module
    docstring). ``uncalibrated_nll``: the classifier's own NLL on the candidate's
    evaluation split, the baseline every candidate must not lose to. ``decision_change``:
    why the candidate takes other decisions than the champion (another binary decision
    threshold), a rule of its own. Every failed rule is named in ``reason``."""
    champion_nll = None if champion is None else champion.nll
    champion_version = None if champion is None else champion.version
    failed = []
    if candidate_tpcr != 0.0:
        failed.append(f"repaired output changes top-1 decisions (TPCR {candidate_tpcr!r})")
    if not parity_ok:
        failed.append("ONNX parity check failed")
    if decision_change is not None:
        failed.append(decision_change)
    problems = evidence_problems(evidence, policy)
    if problems:
        failed.append(f"not enough evidence ({'; '.join(problems)})")
    harms = not candidate_nll <= policy.allowed_nll(uncalibrated_nll)
    if harms:
        failed.append(f"does harm: NLL {candidate_nll:.6g} is worse than the uncalibrated "
                      f"model's {uncalibrated_nll:.6g} on this evaluation split")
    champion_problem = None
    if champion is not None and champion.problem is not None:
        champion_problem = champion.problem
        failed.append(f"champion v{champion.version} could not be scored on this evaluation "
                      f"split ({champion.problem})")
    elif champion is not None and not candidate_nll < policy.nll_to_beat(champion.nll):
        verb = "ties" if candidate_nll <= policy.allowed_nll(champion.nll) else "is worse than"
        failed.append(f"NLL {candidate_nll:.6g} {verb} champion v{champion.version}'s "
                      f"{champion.nll:.6g} (the alias moves only on a strict improvement)")
    used_reference = (reference is not None and reference.problem is None
                      and champion_problem is None)
    if used_reference and not reference.candidate_nll <= policy.allowed_nll(
            reference.champion_nll, on_reference=True):
        failed.append(f"NLL {reference.candidate_nll:.6g} on champion v{reference.version}'s "
                      f"reference split is worse than its {reference.champion_nll:.6g}")
    if used_reference and reference.uncalibrated_nll is not None and not (
            reference.candidate_nll <= policy.allowed_nll(reference.uncalibrated_nll,
                                                          on_reference=True)):
        harms = True
        failed.append(f"does harm: NLL {reference.candidate_nll:.6g} on champion "
                      f"v{reference.version}'s reference split is worse than the uncalibrated "
                      f"model's {reference.uncalibrated_nll:.6g} there")
    if not failed and not promote:
        failed.append("gates passed but promotion is switched off (promote=False)")

    baseline = (f"uncalibrated {uncalibrated_nll:.6g}")
    if failed:
        reason = "; ".join(failed)
    elif champion is None:
        reason = (f"no champion yet; NLL {candidate_nll:.6g} no worse than the {baseline}; "
                  "enough evidence, TPCR 0 and parity verified")
    else:
        reason = (f"NLL {candidate_nll:.6g} better than champion v{champion.version}'s "
                  f"{champion.nll:.6g} and no worse than the {baseline}")
        if used_reference:
            reason += (f" (and {reference.candidate_nll:.6g} vs {reference.champion_nll:.6g} "
                       "on its reference split)")
        elif reference is not None and reference.problem:
            reason += f" (reference split not used: {reference.problem})"
        reason += "; TPCR 0 and parity verified"
    return GateDecision(not failed, reason, float(candidate_nll), champion_nll, champion_version,
                        reference, champion_problem, problems, float(uncalibrated_nll), harms)
