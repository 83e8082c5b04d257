"""The step logic of a staged rollout (shadow, then canary steps, then promotion), as pure
functions of numbers: no store, no server, no clock of its own.

A rollout moves a candidate version through :attr:`Plan.fractions`, the share of requests
the candidate answers at each step; ``0.0`` is the *shadow* step (the champion answers
everything and the candidate scores a copy off the request's path). After the last step
passes, the candidate is promoted.

Routing (:func:`bucket`, :func:`routes_to_candidate`) is sticky: a request key (a caller's
id) hashes with the rollout's id to a fixed point ``u`` in [0, 1), and the candidate
answers exactly when ``u < fraction``. The hash is SHA-256, not Python's ``hash`` (salted
per process), so every server of the model routes a key the same way; and because the
fractions only grow, a caller on the candidate at 10 % is still on it at 25 %.

A step is judged (:func:`decide`) on the :class:`Figures` gathered at that step:

- **top-1 agreement must be 100 %.** Two versions that repair the same classifier keep its
  top-1 on every row (the prediction-preserving repair, paper Eq. 1-2: the repaired
  argmax is the input's), so one row on which the candidate's decision differs from the
  champion's (or from its own input's top-1) is a defect, not noise;
- **errors**: the share of the candidate's requests that failed (a runtime error, a
  non-finite or non-normalised answer) is at most ``max_error_rate`` (default 0);
- **latency**: the candidate's p99 scoring time is at most ``max_p99_ratio`` times the
  champion's, once both have ``min_latency_samples``;
- **confidence profile**: on rows both versions scored, the mean confidence (the largest
  repaired probability) moves by at most ``max_confidence_shift``. A recalibration is
  meant to move confidence, so this is wide by default (0.1); it is there for a collapse
  (every row at 1/K or at 1), which the offline gate's reference split may never show.

Any breach rolls back at once, whatever the step and however little evidence there is: a
breach is evidence enough. A step advances only without a breach, after at least
``min_requests`` candidate requests compared with the champion and ``min_seconds`` at the
step.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field

#: The registered model's tag that holds its rollout record (JSON), active or ended.
ROLLOUT_TAG = "cord.rollout"
SCHEMA = 1
ACTIVE, PROMOTED, ROLLED_BACK, ABORTED = "active", "promoted", "rolled_back", "aborted"


def record_of(raw: str | None) -> dict | None:
    """The rollout record held in the tag text ``raw``; None for no tag, text that is not
    JSON, or a record of another schema."""
    if not raw:
        return None
    try:
        record = json.loads(raw)
    except json.JSONDecodeError:
        return None
    if not isinstance(record, dict) or record.get("schema") != SCHEMA:
        return None
    return record


def active_refusal(name: str, record: dict | None) -> str | None:
    """Why a rollout of ``name`` cannot start while ``record`` is active; None otherwise.
    The command line's pre-check and the start under the registry lock say the same."""
    if record is None or record.get("state") != ACTIVE:
        return None
    return (f"{name}: rollout {record['id']} of v{record['version']} is active "
            f"(`cord-ops rollout abort --model-name {name}` first)")

#: The canary steps of a plan when none are given (shares of requests).
DEFAULT_CANARY = (0.10, 0.25, 0.50)
DEFAULT_MIN_REQUESTS = 500
DEFAULT_MIN_SECONDS = 300.0
MODES = ("shadow", "canary")
ACTIONS = ("hold", "advance", "promote", "rollback")


# ---------------------------------------------------------------- plan and budget
@dataclass(frozen=True)
class Plan:
    """The steps of a rollout and how much evidence each needs.

    ``fractions``: strictly increasing shares in [0, 1) (``0.0`` only first: the shadow
    step); ``min_requests`` candidate requests compared with the champion and
    ``min_seconds`` at each step before it may advance."""

    fractions: tuple[float, ...]
    min_requests: int = DEFAULT_MIN_REQUESTS
    min_seconds: float = DEFAULT_MIN_SECONDS

    @classmethod
    def build(cls, mode: str, canary: tuple[float, ...] = DEFAULT_CANARY,
              min_requests: int = DEFAULT_MIN_REQUESTS,
              min_seconds: float = DEFAULT_MIN_SECONDS) -> Plan:
        """``mode`` ``shadow``: a shadow step, then ``canary``; ``canary``: the canary
        steps alone."""
        if mode not in MODES:
            raise ValueError(f"--mode: expected one of {MODES}, got {mode!r}")
        fractions = ((0.0,) if mode == "shadow" else ()) + tuple(float(f) for f in canary)
        plan = cls(fractions, int(min_requests), float(min_seconds))
        plan.check()
        return plan

    def check(self) -> None:
        """Raise ValueError naming the first bad field."""
        f = self.fractions
        if not f:
            raise ValueError("--steps: a rollout needs at least one step")
        if not all(isinstance(x, float) and 0.0 <= x < 1.0 for x in f):
            raise ValueError(f"--steps: expected percentages in [0, 100), got "
                             f"{[x * 100 for x in f]}")
        if any(b <= a for a, b in zip(f, f[1:], strict=False)):
            raise ValueError(f"--steps: expected strictly increasing percentages, got "
                             f"{[x * 100 for x in f]}")
        if isinstance(self.min_requests, bool) or self.min_requests < 1:
            raise ValueError(f"--min-requests: expected a positive integer, got "
                             f"{self.min_requests!r}")
        if not (math.isfinite(self.min_seconds) and self.min_seconds >= 0):
            raise ValueError(f"--min-seconds: expected seconds >= 0, got {self.min_seconds!r}")

    @property
    def mode(self) -> str:
        return "shadow" if self.fractions[0] == 0.0 else "canary"

    def describe(self, step: int) -> str:
        """Step ``step`` in words: ``shadow`` or ``canary 25%``."""
        fraction = self.fractions[step]
        return "shadow" if fraction == 0.0 else f"canary {fraction * 100:g}%"


@dataclass(frozen=True)
class Budget:
    """What the candidate may cost at a step (the module docstring says why each)."""

    max_error_rate: float = 0.0
    max_p99_ratio: float = 2.0
    max_confidence_shift: float = 0.1
    min_latency_samples: int = 50

    def check(self) -> None:
        for name in ("max_error_rate", "max_confidence_shift"):
            value = getattr(self, name)
            if not (math.isfinite(value) and 0.0 <= value <= 1.0):
                raise ValueError(f"--{name.replace('_', '-')}: expected 0..1, got {value!r}")
        if not (math.isfinite(self.max_p99_ratio) and self.max_p99_ratio >= 1.0):
            raise ValueError(f"--max-p99-ratio: expected a ratio >= 1, got "
                             f"{self.max_p99_ratio!r}")
        if isinstance(self.min_latency_samples, bool) or self.min_latency_samples < 1:
            raise ValueError(f"--min-latency-samples: expected a positive integer, got "
                             f"{self.min_latency_samples!r}")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, value: dict) -> Budget:
        budget = cls(**{k: value[k] for k in cls.__dataclass_fields__ if k in value})
        budget.check()
        return budget


# ---------------------------------------------------------------- routing
def bucket(key: str, salt: str) -> float:
    """The fixed point in [0, 1) of request key ``key`` in the rollout ``salt``: the first
    8 bytes of SHA-256(salt NUL key) over 2^64."""
    digest = hashlib.sha256(f"{salt}\x00{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def routes_to_candidate(key: str, salt: str, fraction: float) -> bool:
    """Whether the candidate answers request key ``key`` at share ``fraction``."""
    return fraction > 0.0 and bucket(key, salt) < fraction


# ---------------------------------------------------------------- comparing answers
@dataclass(frozen=True)
class Comparison:
    """Candidate against champion on the same rows (from :func:`compare`)."""

    rows: int
    disagreeing: tuple[int, ...]
    max_abs_diff: float
    confidence_diff_sum: float


def decisions(repaired, threshold: float | None = None, input_kind: str = "probs"):
    """Top-1 of each repaired row, ties to the lowest index (as ``label``); for a binary
    version keeping a decision ``threshold``, the decision at it of the rows'
    probabilities (softmax of ``input_kind`` "logits" rows first)."""
    import numpy as np  # here, not at the top: `cord-ops --help` builds on this module

    if threshold is None:
        return np.argmax(np.asarray(repaired), axis=1)
    from cord_ops import threshold as at
    from cord_ops.softmax import softmax

    rows = np.asarray(repaired, dtype=np.float64)
    return at.decisions(softmax(rows) if input_kind == "logits" else rows, threshold)


def compare(champion: dict, candidate: dict, thresholds: tuple = (None, None)) -> Comparison:
    """Compare two versions' outputs (``repaired`` [n, K], ``label`` [n], ``confidence``
    [n]) on the same rows. A row disagrees when the labels differ or the repaired top-1s
    differ (the decisions at each version's binary threshold, ``thresholds`` (champion,
    candidate), where it keeps one); a non-finite candidate row counts as disagreeing too."""
    import numpy as np

    a = np.asarray(champion["repaired"], dtype=np.float64)
    b = np.asarray(candidate["repaired"], dtype=np.float64)
    if a.shape != b.shape:
        return Comparison(int(a.shape[0]), tuple(range(int(a.shape[0]))), math.inf, 0.0)
    finite = np.isfinite(b).all(axis=1)
    differ = ((np.asarray(champion["label"]) != np.asarray(candidate["label"]))
              | (decisions(a, thresholds[0]) != decisions(b, thresholds[1])) | ~finite)
    diff = float(np.max(np.abs(a - b))) if finite.all() and a.size else (
        math.inf if a.size else 0.0)
    shift = float(np.sum(np.asarray(candidate["confidence"], dtype=np.float64)
                         - np.asarray(champion["confidence"], dtype=np.float64)))
    return Comparison(int(a.shape[0]), tuple(int(i) for i in np.flatnonzero(differ)), diff,
                      shift if math.isfinite(shift) else math.inf)


def self_consistent(outputs: dict, scores, sum_tolerance: float,
                    threshold: float | None = None, input_kind: str = "probs"):
    """Rows of one version's answer that keep the invariants: finite ``repaired`` summing
    to 1 within ``sum_tolerance``, whose top-1 is ``label`` and the input's top-1 (for a
    version keeping a binary decision ``threshold``, the decisions at it; ``input_kind``
    says what ``scores`` hold). The check a canary answer passes before it is sent."""
    import numpy as np

    repaired = np.asarray(outputs["repaired"], dtype=np.float64)
    if repaired.shape != scores.shape:
        return np.zeros(scores.shape[0], dtype=bool)
    with np.errstate(invalid="ignore"):
        finite = np.isfinite(repaired).all(axis=1)
        sums = np.abs(repaired.sum(axis=1) - 1.0) <= sum_tolerance
    label = np.asarray(outputs["label"])
    return finite & sums & (decisions(repaired, threshold) == label) & (
        label == decisions(scores, threshold, input_kind))


# ---------------------------------------------------------------- figures and decision
@dataclass(frozen=True)
class Figures:
    """What one server saw of the candidate (and the champion) at the current step."""

    requests: int = 0           # candidate requests compared with the champion
    errors: int = 0             # candidate requests that failed or broke an invariant
    attempts: int = 0           # candidate requests scored (compared or not)
    rows: int = 0               # rows compared
    disagreements: int = 0      # rows on which the decisions differ
    max_abs_diff: float = 0.0
    confidence_shift: float = 0.0  # mean candidate - champion confidence on rows compared
    candidate_p99: float | None = None
    champion_p99: float | None = None
    candidate_latency_samples: int = 0
    champion_latency_samples: int = 0
    dropped: int = 0            # shadow copies dropped (queue full): not evidence

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Decision:
    action: str
    reason: str
    breaches: list[str] = field(default_factory=list)


def breaches(figures: Figures, budget: Budget) -> list[str]:
    """Every budget the candidate broke at this step (empty when none)."""
    out = []
    if figures.disagreements > 0:
        out.append(f"top-1 disagrees with the champion on {figures.disagreements} of "
                   f"{figures.rows} rows (must be 100 % agreement)")
    attempts = max(figures.attempts, figures.requests)
    if figures.errors > 0 and (attempts == 0
                               or figures.errors / attempts > budget.max_error_rate):
        out.append(f"{figures.errors} of {attempts} candidate requests failed "
                   f"(error rate allowed {budget.max_error_rate:g})")
    if (figures.candidate_p99 is not None and figures.champion_p99 is not None
            and figures.candidate_latency_samples >= budget.min_latency_samples
            and figures.champion_latency_samples >= budget.min_latency_samples
            and not figures.candidate_p99 <= budget.max_p99_ratio * figures.champion_p99):
        out.append(f"p99 scoring time {figures.candidate_p99 * 1e3:.3g} ms is more than "
                   f"{budget.max_p99_ratio:g}x the champion's "
                   f"{figures.champion_p99 * 1e3:.3g} ms")
    if figures.rows > 0 and not abs(figures.confidence_shift) <= budget.max_confidence_shift:
        out.append(f"mean confidence moved by {figures.confidence_shift:+.3g} on "
                   f"{figures.rows} rows (allowed {budget.max_confidence_shift:g})")
    return out


def decide(plan: Plan, step: int, seconds_at_step: float, figures: Figures,
           budget: Budget) -> Decision:
    """The next move at step ``step`` (index into ``plan.fractions``): ``rollback`` on any
    breach, ``advance`` (``promote`` after the last step) once the step has its minimum
    evidence, else ``hold``."""
    if not 0 <= step < len(plan.fractions):
        raise ValueError(f"step {step}: the plan has {len(plan.fractions)} steps")
    broken = breaches(figures, budget)
    where = plan.describe(step)
    if broken:
        return Decision("rollback", f"{where}: " + "; ".join(broken), broken)
    missing = []
    if figures.requests < plan.min_requests:
        missing.append(f"{figures.requests}/{plan.min_requests} requests compared")
    if seconds_at_step < plan.min_seconds:
        missing.append(f"{seconds_at_step:.0f}/{plan.min_seconds:g} s")
    if missing:
        return Decision("hold", f"{where}: within budget, waiting for " + ", ".join(missing))
    last = step == len(plan.fractions) - 1
    evidence = (f"{where} passed: {figures.requests} requests ({figures.rows} rows) agree, "
                f"{figures.errors} errors, confidence shift {figures.confidence_shift:+.3g}")
    if figures.candidate_p99 is not None and figures.champion_p99 is not None:
        evidence += (f", p99 {figures.candidate_p99 * 1e3:.3g} vs "
                     f"{figures.champion_p99 * 1e3:.3g} ms")
    return Decision("promote" if last else "advance", evidence)
