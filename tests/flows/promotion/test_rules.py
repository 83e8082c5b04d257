"""The champion gate's rules as a pure function (flows.promotion.rules.decide): properties over any
NLLs, the evidence thresholds and their K-dependent defaults, and the label-shift noise
allowance measured against real sampling."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flows.promotion import rules

nll = st.floats(min_value=0.0, max_value=10.0, allow_nan=False)
K = st.integers(min_value=2, max_value=120)


def balanced(n: int, k: int) -> tuple[int, ...]:
    counts = np.full(k, n // k)
    counts[: n % k] += 1
    return tuple(int(c) for c in counts)


def plenty(k: int) -> rules.Evidence:
    n = rules.default_min_rows(k)
    return rules.Evidence(balanced(n, k), balanced(n, k), balanced(n, k))


#: The default tolerances, written out: the oracle below must not borrow the gate's own
#: arithmetic (Policy.allowed_nll / nll_to_beat), or a mutant of it would pass.
RTOL = 1e-6
REFERENCE_RTOL = 0.02


@given(candidate=nll, champion=st.one_of(st.none(), nll), uncal=nll, k=K,
       tpcr=st.sampled_from([0.0, 0.001, 0.5]), parity=st.booleans(), promote=st.booleans())
def test_with_enough_evidence_the_gate_promotes_exactly_when_every_condition_holds(
        candidate, champion, uncal, k, tpcr, parity, promote):
    policy = rules.Policy.for_classes(k)
    score = None if champion is None else rules.ChampionScore("3", champion)
    decision = rules.decide(candidate, tpcr, parity, score, uncalibrated_nll=uncal,
                           evidence=plenty(k), policy=policy, promote=promote)
    no_harm = candidate <= uncal * (1 + RTOL)
    wins = tpcr == 0.0 and parity and no_harm and (champion is None
                                                   or candidate < champion * (1 - RTOL))
    assert decision.promote == (wins and promote)
    assert decision.harms == (not no_harm)
    assert decision.candidate_nll == candidate and decision.champion_nll == champion
    assert decision.uncalibrated_nll == uncal
    assert decision.label == ("promoted" if decision.promote else "rejected")


@settings(max_examples=200)
@given(champion=st.floats(min_value=1e-3, max_value=10.0), k=K)
def test_a_tie_never_moves_the_champion(champion, k):
    """A refit of unchanged data is the same graph, with the same NLL: rejected, so a
    schedule on unchanged data never moves @champion."""
    decision = rules.decide(champion, 0.0, True, rules.ChampionScore("4", champion),
                           uncalibrated_nll=10.0, evidence=plenty(k),
                           policy=rules.Policy.for_classes(k))
    assert not decision.promote
    assert "ties champion v4's" in decision.reason and "strict improvement" in decision.reason


def _decide(candidate, *, champion=None, uncal=1.0, reference=None):
    score = None if champion is None else rules.ChampionScore("7", champion)
    return rules.decide(candidate, 0.0, True, score, uncalibrated_nll=uncal,
                       evidence=plenty(10), policy=rules.Policy.for_classes(10),
                       reference=reference)


# Boundaries of both default tolerances, as literal numbers, just inside and just outside.
@pytest.mark.parametrize("candidate, champion, promoted", [
    (0.49999949, 0.5, True),     # beats 0.5 by more than 1e-6 relative (5e-7)
    (0.49999951, 0.5, False),    # better, but by less than float rounding: a tie
    (0.4999995, 0.5, False),     # exactly 0.5 * (1 - 1e-6): not strictly below it
    (0.5, 0.5, False),           # exact tie
    (0.50000049, 0.5, False),    # within the tolerance above: still a tie, not a win
    (2.999996, 3.0, True),       # relative: 3e-6 at 3.0
    (2.999998, 3.0, False),
])
def test_champion_boundary_is_a_strict_improvement_beyond_1e_6(candidate, champion, promoted):
    assert _decide(candidate, champion=champion, uncal=10.0).promote is promoted


@pytest.mark.parametrize("candidate, uncal, promoted", [
    (0.50000049, 0.5, True),     # no worse than uncalibrated within 1e-6 relative
    (0.5000005, 0.5, True),      # exactly 0.5 * (1 + 1e-6): still no worse
    (0.5, 0.5, True),            # a tie with the classifier does no harm
    (0.50000051, 0.5, False),    # worse beyond rounding: harm
    (1.236, 0.19, False),        # the 26-class `ms` (CORD output 0.397 also > 0.19)
    (0.397, 0.19, False),
])
def test_uncalibrated_boundary_applies_to_the_first_version(candidate, uncal, promoted):
    decision = _decide(candidate, uncal=uncal)
    assert decision.promote is promoted and decision.harms is not promoted
    harm = (f"does harm: NLL {candidate:.6g} is worse than the uncalibrated model's "
            f"{uncal:.6g} on this evaluation split")
    assert decision.reason.startswith(harm) is not promoted
    assert decision.reason.startswith("no champion yet; ") is promoted


@pytest.mark.parametrize("ref_candidate, ref_champion, ref_uncal, promoted, words", [
    (0.2549, 0.25, 9.0, True, "(and 0.2549 vs 0.25 on its reference split)"),  # within 2 %
    (0.255, 0.25, 9.0, True, "(and 0.255 vs 0.25 on its reference split)"),  # 0.25 * 1.02
    (0.2551, 0.25, 9.0, False, "reference split is worse than its 0.25"),
    (0.2549, 9.0, 0.25, True, "(and 0.2549 vs 9 on its reference split)"),  # vs uncalibrated
    (0.255, 9.0, 0.25, True, "(and 0.255 vs 9 on its reference split)"),
    (0.2551, 9.0, 0.25, False, "worse than the uncalibrated model's 0.25 there"),
])
def test_reference_split_boundaries_are_2_percent(ref_candidate, ref_champion, ref_uncal,
                                                 promoted, words):
    decision = _decide(0.1, champion=0.2, uncal=1.0, reference=rules.ReferenceScore(
        "7", ref_candidate, ref_champion, uncalibrated_nll=ref_uncal))
    assert decision.promote is promoted
    assert words in decision.reason


@st.composite
def short_evidence(draw):
    """Evidence that misses at least one minimum (rows of either split), with any labels."""
    k = draw(K)
    policy = rules.Policy.for_classes(
        k, min_calibration=draw(st.one_of(st.none(), st.integers(1, 5000))),
        min_evaluation=draw(st.one_of(st.none(), st.integers(1, 5000))))
    short_cal = draw(st.booleans())
    short_eval = draw(st.booleans()) or not short_cal

    def counts(minimum: int, short: bool) -> tuple[int, ...]:
        n = draw(st.integers(0, minimum - 1) if short else st.integers(minimum, minimum + 500))
        cuts = sorted(draw(st.lists(st.integers(0, n), min_size=k - 1, max_size=k - 1)))
        return tuple(int(c) for c in np.diff([0, *cuts, n]))

    return k, policy, rules.Evidence(counts(policy.min_calibration, short_cal),
                                    counts(policy.min_evaluation, short_eval))


@settings(max_examples=300)
@given(case=short_evidence(), candidate=nll, champion=st.one_of(st.none(), nll),
       ref=st.one_of(st.none(), st.tuples(nll, nll)))
def test_never_promotes_when_a_minimum_is_not_met_whatever_the_nlls(case, candidate,
                                                                   champion, ref):
    k, policy, evidence = case
    score = None if champion is None else rules.ChampionScore("1", champion)
    reference = None if ref is None or champion is None else rules.ReferenceScore("1", *ref)
    decision = rules.decide(candidate, 0.0, True, score, uncalibrated_nll=10.0,
                           evidence=evidence, policy=policy, reference=reference)
    assert not decision.promote
    assert "not enough evidence" in decision.reason and "rows (<" in decision.reason


@pytest.mark.parametrize("k, rows, share", [(2, 100, 1.0), (5, 100, 0.9), (10, 100, 0.5),
                                            (100, 1000, 0.5), (1000, 10000, 0.5)])
def test_defaults_depend_on_k(k, rows, share):
    policy = rules.Policy.for_classes(k)
    assert (policy.min_calibration, policy.min_evaluation) == (rows, rows)
    assert policy.max_class_share == pytest.approx(share)
    assert rules.Policy.for_classes(k, min_calibration=7).min_calibration == 7


@pytest.mark.parametrize("bad", [{"min_calibration": 0}, {"min_evaluation": -3},
                                 {"max_class_share": 0.0}, {"max_class_share": 1.5},
                                 {"max_label_shift": -0.1}, {"nll_tolerance": float("nan")}])
def test_out_of_range_thresholds_are_refused(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        rules.Policy.for_classes(10, **bad)


def test_single_class_and_shifted_labels_are_not_promotable_however_good_the_nll():
    policy = rules.Policy.for_classes(10)
    one_class = (500,) + (0,) * 9
    decision = rules.decide(0.001, 0.0, True, rules.ChampionScore("1", 5.0), policy=policy,
                           uncalibrated_nll=9.0,
                           evidence=rules.Evidence(one_class, one_class))
    assert not decision.promote and "class 0 holds 100.0% of the evaluation labels" in (
        decision.reason)
    # Balanced labels, but none of classes 5-9 against a champion evaluated on all ten.
    half = (100,) * 5 + (0,) * 5
    shifted = rules.decide(0.001, 0.0, True, rules.ChampionScore("1", 5.0), policy=policy,
                          uncalibrated_nll=9.0,
                          evidence=rules.Evidence(half, half, balanced(1000, 10)))
    assert not shifted.promote and "far from the champion's reference split" in shifted.reason


def test_reference_split_must_be_no_worse_too():
    policy = rules.Policy.for_classes(10)
    champ = rules.ChampionScore("4", 0.30)
    worse_there = rules.decide(0.20, 0.0, True, champ, evidence=plenty(10), policy=policy,
                              uncalibrated_nll=9.0,
                              reference=rules.ReferenceScore("4", 0.90, 0.25))
    assert not worse_there.promote and "on champion v4's reference split" in worse_there.reason
    within = rules.decide(0.20, 0.0, True, champ, evidence=plenty(10), policy=policy,
                         uncalibrated_nll=9.0,
                         reference=rules.ReferenceScore("4", 0.2520, 0.25))  # < 2 % worse
    assert within.promote and "reference split" in within.reason
    unavailable = rules.decide(0.20, 0.0, True, champ, evidence=plenty(10), policy=policy,
                              uncalibrated_nll=9.0,
                              reference=rules.ReferenceScore("4", problem="unavailable: gone"))
    assert unavailable.promote and "not used: unavailable" in unavailable.reason
    broken = rules.decide(0.1, 0.0, True, rules.ChampionScore("2", None, "K mismatch"),
                         uncalibrated_nll=9.0, evidence=plenty(10), policy=policy)
    assert not broken.promote and broken.champion_problem == "K mismatch"
    assert "TPCR" in rules.decide(0.1, 0.01, True, champ, evidence=plenty(10),
                                 uncalibrated_nll=9.0, policy=policy).reason


@pytest.mark.parametrize("k, n", [(10, 100), (100, 1000), (100, 5000)])
def test_label_shift_allowance_covers_sampling_noise_of_one_distribution(k, n):
    """Two honest samples of one label distribution pass the label-shift rule (99 % of 200
    draws), while a real shift (60 % of the mass moved to one class) is caught every time:
    the noise allowance grows with K and shrinks with n as sampling noise does."""
    rng = np.random.default_rng(k * n)
    policy = rules.Policy.for_classes(k, min_calibration=1, min_evaluation=1)
    weights = rng.dirichlet(np.full(k, 20.0))
    moved = 0.4 * weights + 0.6 * np.eye(k)[0]

    def flagged(a, b) -> bool:
        return any("far from" in p for p in rules.evidence_problems(rules.Evidence(a, a, b),
                                                                   policy))

    same = shifted = 0
    for _ in range(200):
        a = rules.label_counts(rng.choice(k, size=n, p=weights), k)
        same += flagged(a, rules.label_counts(rng.choice(k, size=n, p=weights), k))
        shifted += flagged(a, rules.label_counts(rng.choice(k, size=n, p=moved), k))
    assert same <= 2 and shifted == 200
