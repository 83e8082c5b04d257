"""The step logic of a staged rollout (flows.promotion.rollout_steps): properties of the
decision and of the sticky routing, and the comparison of two versions' answers on binary and
multi-class outputs with exact 0/1 and ties."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flows.promotion.rollout_steps import (
    Budget,
    Figures,
    Plan,
    bucket,
    compare,
    decide,
    routes_to_candidate,
    self_consistent,
)

fractions = st.lists(st.floats(0.01, 0.99), min_size=1, max_size=4, unique=True).map(
    lambda f: tuple(sorted(f)))
plans = st.builds(lambda mode, canary, n, s: Plan.build(mode, canary, n, s),
                  st.sampled_from(["shadow", "canary"]), fractions, st.integers(1, 1000),
                  st.floats(0, 600))
budgets = st.builds(Budget, st.floats(0, 0.2), st.floats(1, 5), st.floats(0, 0.5),
                    st.integers(1, 100))
maybe_p99 = st.none() | st.floats(1e-5, 1.0)


@st.composite
def figures(draw):
    attempts = draw(st.integers(0, 5000))
    champion_p99 = draw(maybe_p99)
    # Often a candidate near the champion's p99 times a ratio: the budget's edge.
    candidate_p99 = draw(maybe_p99 | st.floats(0.5, 6).map(
        lambda r: None if champion_p99 is None else champion_p99 * r))
    # Each budget is often exactly met, so the others' edges are reached too.
    return Figures(requests=draw(st.integers(0, attempts)),
                   errors=draw(st.just(0) | st.integers(0, 50)), attempts=attempts,
                   rows=draw(st.sampled_from([0, 1]) | st.integers(0, 10**6)),
                   disagreements=draw(st.just(0) | st.integers(0, 3)),
                   max_abs_diff=draw(st.floats(0, 1)),
                   confidence_shift=draw(st.just(0.0) | st.floats(-1, 1)),
                   candidate_p99=candidate_p99, champion_p99=champion_p99,
                   candidate_latency_samples=draw(st.integers(0, 500)),
                   champion_latency_samples=draw(st.integers(0, 500)))


@settings(max_examples=400, deadline=None)
@given(plans, st.data(), st.floats(0, 1000), figures(), budgets)
def test_never_advances_or_promotes_when_a_budget_is_breached(plan, data, seconds, f, budget):
    step = data.draw(st.integers(0, len(plan.fractions) - 1))
    decision = decide(plan, step, seconds, f, budget)
    # The budgets, written out here from the rules (not from the module).
    attempts = max(f.attempts, f.requests)
    error_breach = f.errors > 0 and (attempts == 0 or f.errors > budget.max_error_rate * attempts
                                     + 1e-9 * attempts)
    latency_measured = (f.candidate_p99 is not None and f.champion_p99 is not None
                        and min(f.candidate_latency_samples, f.champion_latency_samples)
                        >= budget.min_latency_samples)
    slow = latency_measured and f.candidate_p99 > budget.max_p99_ratio * f.champion_p99
    shifted = f.rows > 0 and abs(f.confidence_shift) > budget.max_confidence_shift
    breached = f.disagreements > 0 or error_breach or slow or shifted
    if breached:
        assert decision.action == "rollback", (decision, f)
    else:
        assert decision.action != "rollback", (decision, f)
    if decision.action in ("advance", "promote"):
        assert f.disagreements == 0 and not breached
        assert f.requests >= plan.min_requests and seconds >= plan.min_seconds
        # Promotion only after the last step; earlier steps only advance.
        assert (decision.action == "promote") == (step == len(plan.fractions) - 1)
    if not breached and f.requests >= plan.min_requests and seconds >= plan.min_seconds:
        assert decision.action in ("advance", "promote")


def test_one_disagreeing_row_rolls_back_with_no_evidence_at_all():
    plan = Plan.build("shadow")
    d = decide(plan, 0, 0.0, Figures(requests=1, attempts=1, rows=100, disagreements=1),
               Budget())
    assert d.action == "rollback" and "1 of 100 rows" in d.reason
    # A wide error budget does not excuse a disagreement.
    d = decide(plan, 3, 1e6, Figures(requests=10**6, attempts=10**6, rows=10**6,
                                     disagreements=1), Budget(max_error_rate=0.5))
    assert d.action == "rollback"


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40), st.text(min_size=1, max_size=16), st.floats(0, 1),
       st.floats(0, 1))
def test_routing_is_sticky_and_monotone_in_the_fraction(key, salt, a, b):
    low, high = sorted((a, b))
    u = bucket(key, salt)
    assert 0.0 <= u < 1.0 and bucket(key, salt) == u
    if routes_to_candidate(key, salt, low):
        assert routes_to_candidate(key, salt, high)  # on the candidate at 10 %: also at 25 %
    assert not routes_to_candidate(key, salt, 0.0)  # shadow: the candidate answers nobody


def test_routing_shares_match_the_fractions_and_depend_on_the_rollout():
    keys = [f"caller-{i}" for i in range(20_000)]
    for fraction in (0.10, 0.25, 0.50):
        share = np.mean([routes_to_candidate(k, "r1", fraction) for k in keys])
        assert abs(share - fraction) < 0.015, (fraction, share)
    # Another rollout draws other callers (the id salts the hash).
    first = {k for k in keys if routes_to_candidate(k, "r1", 0.10)}
    second = {k for k in keys if routes_to_candidate(k, "r2", 0.10)}
    assert len(first & second) < 0.2 * len(first)


def test_a_key_routes_the_same_in_another_process():
    """Two servers must agree: the hash cannot be Python's per-process salted hash()."""
    keys = ["alice", "bob", "caller-17", ""]
    code = ("import sys; from flows.promotion.rollout_steps import bucket; "
            "print(repr([bucket(k, 'abc123') for k in sys.argv[1:]]))")
    other = subprocess.run([sys.executable, "-c", code, *keys], capture_output=True,
                           text=True, check=True, env={"PYTHONHASHSEED": "12345",
                                                       "PATH": "/usr/bin"}).stdout
    assert eval(other) == [bucket(k, "abc123") for k in keys]  # noqa: S307 - our own repr


def _outputs(repaired, label=None):
    repaired = np.asarray(repaired, dtype=np.float64)
    label = np.argmax(repaired, axis=1) if label is None else np.asarray(label)
    return {"repaired": repaired, "label": label, "confidence": repaired.max(axis=1)}


def test_compare_binary_outputs_with_exact_zeros_ones_and_ties():
    champion = _outputs([[1.0, 0.0], [0.5, 0.5], [0.2, 0.8], [0.0, 1.0]])
    same = _outputs([[1.0, 0.0], [0.5, 0.5], [0.3, 0.7], [0.0, 1.0]])
    c = compare(champion, same)
    assert c.rows == 4 and c.disagreeing == ()
    assert c.max_abs_diff == pytest.approx(0.1)
    assert c.confidence_diff_sum == pytest.approx(-0.1)
    # The tie broken the other way on row 1, and a flipped decision on row 3.
    other = _outputs([[1.0, 0.0], [0.49, 0.51], [0.2, 0.8], [1.0, 0.0]], label=[0, 0, 1, 1])
    assert compare(champion, other).disagreeing == (1, 3)
    broken = _outputs([[1.0, 0.0], [np.nan, 0.5], [0.2, 0.8], [0.0, 1.0]], label=[0, 0, 1, 1])
    assert compare(champion, broken).disagreeing == (1,)


def test_self_consistent_rows_keep_the_input_top1_and_sum_to_one():
    # A binary model's two columns (what one score column becomes), float32 inputs.
    scores = np.array([[0.0, 1.0], [0.5, 0.5], [0.9, 0.1], [0.3, 0.7]], dtype=np.float32)
    answer = _outputs([[0.0, 1.0], [0.5, 0.5], [0.8, 0.2], [0.4, 0.6]])
    assert self_consistent(answer, scores, 1e-5).tolist() == [True, True, True, True]
    bad = _outputs([[0.0, 1.0], [0.5, 0.5], [0.4, 0.6], [0.4, 0.7]], label=[1, 0, 1, 1])
    # row 2 changes the input's top-1; row 3 sums to 1.1
    assert self_consistent(bad, scores, 1e-5).tolist() == [True, True, False, False]
    k = 100
    logits = np.random.default_rng(0).normal(size=(5, k))
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    assert self_consistent(_outputs(probs), logits, 1e-5).all()


def test_a_thresholded_versions_answers_are_judged_at_its_threshold():
    # p1 0.3 and 0.05 at t = 0.1: decisions 1 and 0, where the argmax says 0 and 0
    scores = np.array([[0.7, 0.3], [0.95, 0.05]])
    answer = _outputs([[0.6, 0.4], [0.9, 0.1 - 1e-9]], label=[1, 0])
    assert self_consistent(answer, scores, 1e-5, 0.1).tolist() == [True, True]
    assert self_consistent(answer, scores, 1e-5).tolist() == [False, True]
    # logits rows: softmax([0, m]) has p1 = sigmoid(m); m = -1 gives p1 0.27 > 0.1
    margins = np.array([[0.0, -1.0], [0.0, -3.0]])
    assert self_consistent(answer, margins, 1e-5, 0.1, "logits").tolist() == [True, True]
    moved = _outputs([[0.6, 0.4], [0.85, 0.15]], label=[1, 0])  # row 1 crossed 0.1
    assert compare(answer, moved, (0.1, 0.1)).disagreeing == (1,)
    assert compare(answer, moved).disagreeing == ()


@pytest.mark.parametrize(("mode", "steps", "message"), [
    ("blue", (0.1,), "--mode"),
    ("canary", (), "at least one step"),
    ("canary", (0.5, 0.25), "increasing"),
    ("shadow", (0.0, 0.5), "increasing"),
    ("canary", (0.1, 1.0), "[0, 100)"),
])
def test_a_bad_plan_is_refused_naming_the_option(mode, steps, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(")
                       .replace(")", r"\)")):
        Plan.build(mode, steps)


def test_plan_steps_in_words():
    plan = Plan.build("shadow", (0.1, 0.25))
    assert plan.fractions == (0.0, 0.1, 0.25) and plan.mode == "shadow"
    assert [plan.describe(i) for i in range(3)] == ["shadow", "canary 10%", "canary 25%"]
    assert Plan.build("canary", (0.1,)).mode == "canary"


@pytest.mark.parametrize(("candidate_ms", "action"), [(19.0, "advance"), (21.0, "rollback")])
def test_the_p99_budget_at_its_edge(candidate_ms, action):
    plan = Plan.build("canary", (0.1, 0.5), min_requests=100, min_seconds=0)
    figures = Figures(requests=100, attempts=100, rows=100, candidate_p99=candidate_ms / 1e3,
                      champion_p99=0.010, candidate_latency_samples=100,
                      champion_latency_samples=100)
    assert decide(plan, 0, 1.0, figures, Budget(max_p99_ratio=2.0)).action == action
    # Too few samples to judge latency: the p99 does not count yet.
    few = Figures(**{**figures.to_dict(), "candidate_latency_samples": 10})
    assert decide(plan, 0, 1.0, few, Budget(max_p99_ratio=2.0)).action == "advance"


def test_the_rollout_record_is_read_from_its_tag_and_an_active_one_refuses_a_second():
    from flows.promotion.rollout_steps import active_refusal, record_of

    active = '{"schema": 1, "state": "active", "id": "r1", "version": "3"}'
    assert record_of(active) == {"schema": 1, "state": "active", "id": "r1", "version": "3"}
    for unreadable in (None, "", "{not json", "[1, 2]", '{"schema": 2, "state": "active"}'):
        assert record_of(unreadable) is None
    assert active_refusal("m", record_of(active)) == (
        "m: rollout r1 of v3 is active (`cord-ops rollout abort --model-name m` first)")
    assert active_refusal("m", None) is None
    assert active_refusal("m", {"schema": 1, "state": "promoted", "id": "r1",
                                "version": "3"}) is None
