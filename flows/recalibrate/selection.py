"""The calibrator family of a recalibration: chosen by cross-validation (``--calibrator
auto``, :mod:`cord_ops.select`), or forced by name and checked against the identity map.

What a run records of it (docs/contract.md): metrics ``select.<family>.nll``, ``.nll_se``,
``.ece`` (``.auc`` for K = 2), ``.tpcr`` and ``.fit_seconds`` for every scored family; the
artifact ``select/selection.json`` (the table, the choice, the rule); run tags
``cord.select.family`` (what was fitted), ``cord.select.how`` (one line: why) and
``cord.select.warning`` (a forced family that loses to identity in cross-validation, or
"none"). The registered version carries ``cord.calibrator`` = the family and
``cord.select.how``, which ``status`` shows for the champion.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prefect import get_run_logger

from cord_ops import data
from cord_ops.names import AUTO, IDENTITY
from flows.platform.task_presets import compute_task

#: Run and version tags (module docstring).
FAMILY_TAG = "cord.select.family"
HOW_TAG = "cord.select.how"
WARNING_TAG = "cord.select.warning"
#: Artifact path of the selection table.
ARTIFACT = "select/selection.json"
#: Seconds of cross-validation after which ``auto`` starts no further family and abandons
#: one still fitting (``cord_ops.select.select_calibrator(budget=...)``): well above what
#: CIFAR-100's whole selection takes, below what Dir-ODIR alone can take on a small
#: probability file (docs/calibrators.md, section 8).
DEFAULT_BUDGET = 60.0
#: Folds fitted at once in a recalibration. One: on a machine whose cores other processes
#: share, threads and loky processes made the selection slower, not faster
#: (docs/calibrators.md, "Choosing the family").
N_JOBS = 1


@dataclass
class Choice:
    """The family to fit, how it was chosen, and the cross-validation behind it (None when
    identity was forced: nothing to compare)."""

    family: str
    how: str
    selection: object | None = None
    warnings: list[str] = field(default_factory=list)

    def metrics(self) -> dict[str, float]:
        """``select.<family>.<figure>`` for every scored family."""
        out = {}
        for c in () if self.selection is None else self.selection.candidates:
            figures = {"nll": c.nll, "nll_se": c.nll_se, "ece": c.ece, "tpcr": c.tpcr,
                       "fit_seconds": c.fit_seconds}
            if c.auc is not None:
                figures["auc"] = c.auc
            out.update({f"select.{c.name}.{key}": value for key, value in figures.items()})
        return out

    def tags(self) -> dict[str, str]:
        return {FAMILY_TAG: self.family, HOW_TAG: self.how[:5000],
                WARNING_TAG: "; ".join(self.warnings)[:5000] or "none"}

    def record(self) -> dict | None:
        """The artifact's content, or None when nothing was cross-validated."""
        if self.selection is None:
            return None
        return {**self.selection.record(), "family": self.family, "how": self.how}

    def fall_back(self, reason: str) -> None:
        """Identity replaces the chosen family (refused for harm on the evaluation split)."""
        self.how = (f"auto: chose {self.family}, which does harm on the evaluation split "
                    f"({reason}); fell back to identity, the classifier's own probabilities")
        self.family = IDENTITY


@compute_task
def choose_family(calibration: data.Dataset, calibrator: str, seed: int,
                  budget: float | None = None) -> Choice:
    """``auto``: cross-validate the candidates on the calibration split and choose; a
    forced family is cross-validated against identity only, and a loss is a warning (the
    run goes on with the family asked for)."""
    from cord_ops.select import select_calibrator

    if calibrator == IDENTITY:
        return Choice(IDENTITY, "forced: --calibrator identity")
    families = None if calibrator == AUTO else [calibrator]
    selection = select_calibrator(calibration.scores, calibration.labels,
                                  calibration.input_kind, families=families, seed=seed,
                                  budget=budget, n_jobs=N_JOBS)
    if calibrator == AUTO:
        how = (f"auto: {selection.reason} among {len(selection.candidates)} families "
               f"({selection.n_splits}-fold CV on the calibration split, seed {seed})")
        if selection.chosen == IDENTITY:
            how += "; no calibrator improved this model: its own probabilities are served"
        choice = Choice(selection.chosen, how, selection)
    else:
        choice = Choice(calibrator, "forced: --calibrator " + calibrator, selection)
        text = forced_warning(selection, calibrator)
        if text is not None:
            choice.warnings.append(text)
    for text in choice.warnings:
        get_run_logger().warning("select: %s", text)
    return choice


def forced_warning(selection, name: str) -> str | None:
    """The warning for a forced family that cross-validates worse than identity (or could
    not be cross-validated at all), else None."""
    own, base = selection.candidate(name), selection.candidate(IDENTITY)
    if own is None:
        return (f"ForcedFamilyWarning: {name} could not be cross-validated "
                f"({selection.skipped.get(name)})")
    if own.nll > base.nll:
        return (f"ForcedFamilyWarning: {name}'s cross-validated NLL {own.nll:.6g} is worse "
                f"than identity's {base.nll:.6g} (the classifier's own probabilities) on the "
                "calibration split; --calibrator auto would not choose it")
    return None


def harm_reason(report, policy) -> str | None:
    """Why the gate would refuse this evaluation for harm (its rule 4 on the evaluation
    split), or None."""
    cord, uncal = report.reports["cord"]["nll"], report.reports["uncal"]["nll"]
    if cord <= policy.allowed_nll(uncal):
        return None
    return f"NLL {cord:.6g} against the uncalibrated model's {uncal:.6g}"
