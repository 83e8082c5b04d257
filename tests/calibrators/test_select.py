"""Choosing the calibrator family by cross-validation (``cord_ops.select``): the
identity map on an exactly calibrated generator, temperature scaling on a copy distorted by
a temperature, never matrix scaling on a separable 26-class problem, the near-tie rule as
documented, and determinism given the seed."""

from __future__ import annotations

import math

import numpy as np
from corpus import calibrated_logits as calibrated
from hypothesis import given, settings
from hypothesis import strategies as st

from cord_ops.select import SIMPLICITY, candidate_families, choose, select_calibrator
from flows.recalibrate.selection import forced_warning


def test_auto_keeps_identity_on_an_exactly_calibrated_classifier():
    z, y = calibrated(5, 3000, seed=0)
    selection = select_calibrator(z, y, "logits", seed=0)
    assert selection.chosen == "identity"
    # every family was scored, none ruled out at K = 5 on 3,000 rows
    assert {c.name for c in selection.candidates} == set(SIMPLICITY)
    assert selection.skipped == {}


def test_auto_picks_temperature_scaling_on_a_temperature_distorted_copy():
    z, y = calibrated(5, 3000, seed=0, scale=3.0)
    selection = select_calibrator(z, y, "logits", seed=0)
    assert selection.chosen == "ts"
    identity, ts = selection.candidate("identity"), selection.candidate("ts")
    assert ts.nll < identity.nll - 10 * identity.nll_se


def test_auto_never_picks_matrix_scaling_on_a_separable_26_class_problem():
    rng = np.random.default_rng(0)
    n, k = 4400, 26
    y = rng.integers(0, k, n)
    z = rng.normal(0.0, 1.0, (n, k))
    z[np.arange(n), y] += 6.0  # every row's top-1 is its label
    selection = select_calibrator(z, y, "logits", families=["ms", "ts", "vs"], seed=0)
    assert selection.candidate("ms") is not None and selection.chosen != "ms"
    # the default candidates include ms only with 5 rows per parameter in a training fold
    assert "ms" in candidate_families(k, n)[0]
    assert "ms" not in candidate_families(k, 4000)[0]


def test_a_forced_family_that_loses_to_identity_is_warned():
    z, y = calibrated(26, 900, seed=1)  # calibrated: 702 MS parameters can only overfit
    selection = select_calibrator(z, y, "logits", families=["ms"], seed=0)
    ms, identity = selection.candidate("ms"), selection.candidate("identity")
    assert ms.nll > identity.nll
    text = forced_warning(selection, "ms")
    assert text.startswith(f"ForcedFamilyWarning: ms's cross-validated NLL {ms.nll:.6g} is "
                           f"worse than identity's {identity.nll:.6g}")
    z, y = calibrated(5, 900, seed=1, scale=3.0)
    assert forced_warning(select_calibrator(z, y, families=["ts"]), "ts") is None


def test_the_choice_is_deterministic_given_the_seed_and_records_every_figure():
    z, y = calibrated(2, 600, seed=3, scale=2.0)
    first = select_calibrator(z, y, "logits", seed=7)
    again = select_calibrator(z, y, "logits", seed=7)
    assert first.record()["candidates"] == [
        {**c, "fit_seconds": a["fit_seconds"]}
        for c, a in zip(again.record()["candidates"], first.record()["candidates"],
                        strict=True)]
    assert first.chosen == again.chosen
    nlls = [c.nll for c in first.candidates]
    assert nlls == sorted(nlls)  # best first
    assert all(c.auc is not None and 0.5 < c.auc <= 1.0 for c in first.candidates)


def test_probabilities_with_exact_zeros_and_too_few_rows():
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.full(4, 0.3), 400)
    p[p < 0.05] = 0.0
    p /= p.sum(axis=1, keepdims=True)
    y = rng.integers(0, 4, 400)
    selection = select_calibrator(p, y, "probs", seed=0)
    assert all(math.isfinite(c.nll) for c in selection.candidates)
    assert select_calibrator(p[:1], y[:1], "probs").chosen == "identity"


def _paired(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    d = a - b
    return float(d.mean()), float(d.std(ddof=1) / math.sqrt(len(d)))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(SIMPLICITY), min_size=1, max_size=6, unique=True),
       st.integers(0, 2**32 - 1), st.sampled_from([0.0, 0.5, 1.0, 2.0]),
       st.integers(2, 60))
def test_near_ties_go_to_the_simplest_family_within_tie_se_paired_errors(names, seed,
                                                                         tie_se, n):
    rng = np.random.default_rng(seed)
    base = rng.exponential(1.0, n)
    # some families share rows' losses exactly (ties), others differ by small shifts
    losses = {name: base + (0.0 if rng.uniform() < 0.3 else rng.normal(0.0, 0.05, n))
              for name in names}
    chosen, _ = choose(losses, tie_se)
    means = {name: float(np.mean(v)) for name, v in losses.items()}
    lowest = min(means.values())
    best = min((name for name in names if means[name] == lowest), key=SIMPLICITY.index)
    assert SIMPLICITY.index(chosen) <= SIMPLICITY.index(best)
    if chosen != best:
        gap, se = _paired(losses[chosen], losses[best])
        assert gap <= tie_se * se
    for name in names:  # no simpler family than the chosen one is within the width
        if SIMPLICITY.index(name) < SIMPLICITY.index(chosen):
            gap, se = _paired(losses[name], losses[best])
            assert gap > tie_se * se


def test_a_family_past_the_budget_is_named_and_left_out(monkeypatch):
    import itertools

    import cord_ops.select as select

    z, y = calibrated(5, 600, seed=2, scale=2.0)
    # A clock that advances one second per reading: start 0; identity's check 1 and its
    # five folds 2-11; ts's check 12, its first fold 13-14 and the deadline check 15 > 14.
    clock = itertools.count(0.0)
    monkeypatch.setattr(select, "_clock", lambda: float(next(clock)))
    selection = select_calibrator(z, y, "logits", families=["ts", "vs"], budget=14.0)
    assert [c.name for c in selection.candidates] == ["identity"]  # always scored
    assert selection.skipped == {
        "ts": "stopped after fold 1 of 5: the budget ran out (14 s)",
        "vs": "not started: the 14 s budget was spent (16.0 s)"}
    assert selection.chosen == "identity"


def test_identity_may_have_its_own_near_tie_width():
    rng = np.random.default_rng(4)
    base = rng.exponential(1.0, 400)
    noise = rng.normal(0.0, 0.05, 400)
    noise -= noise.mean()  # gaps of exactly 0.001 to sms, paired SEs 0.0025 and 0.00125
    losses = {"identity": base + 0.001 + noise, "ts": base + 0.001 + noise / 2, "sms": base}
    gap = float(np.mean(losses["identity"] - losses["sms"]))
    se = float(np.std(losses["identity"] - losses["sms"], ddof=1) / math.sqrt(400))
    assert 0 < gap < se  # identity is within one paired SE of the lowest (sms)
    assert choose(losses, 0.0, identity_se=1.0)[0] == "identity"
    assert choose(losses, 0.0, identity_se=0.0)[0] == "sms"
    ts_gap = float(np.mean(losses["ts"] - losses["sms"]))
    ts_se = float(np.std(losses["ts"] - losses["sms"], ddof=1) / math.sqrt(400))
    assert ts_gap < ts_se
    assert choose(losses, 1.0, identity_se=0.0)[0] == "ts"


def test_the_record_and_the_table_hold_every_figure_as_given():
    """The run's artifact and the summary's table, written out by hand (literal values)."""
    from cord_ops.select import RULES, Candidate, Selection

    ts = Candidate("ts", 0.25, 0.0125, 0.03125, 0.875, 0.0, 1.5, ("w1",))
    identity = Candidate("identity", 0.5, 0.025, 0.0625, None, 0.125, 0.25)
    picked = Selection("ts", "lowest mean", (ts, identity), {"ms": "too few rows"}, 5, 7,
                       0.5, 0.25)
    assert ts.record() == {"family": "ts", "nll": 0.25, "nll_se": 0.0125, "ece": 0.03125,
                           "auc": 0.875, "tpcr": 0.0, "fit_seconds": 1.5, "warnings": ["w1"]}
    assert picked.record() == {
        "chosen": "ts", "reason": "lowest mean", "n_splits": 5, "seed": 7, "tie_se": 0.5,
        "identity_se": 0.25, "rules": RULES,
        "candidates": [ts.record(), identity.record()], "skipped": {"ms": "too few rows"}}
    assert identity.record()["auc"] is None and identity.record()["warnings"] == []
    assert picked.candidate("identity") is identity and picked.candidate("vs") is None
    assert picked.table().splitlines() == [
        "  family         CV NLL      +-SE      ECE      AUC    TPCR   fit s",
        "* ts            0.25000   0.01250  0.03125  0.87500  0.0000    1.50",
        "  identity      0.50000   0.02500  0.06250        -  0.1250    0.25",
        "  ms        skipped: too few rows"]
    no_auc = Selection("identity", "r", (identity,), {}, 5, 0, 0.5, 0.5)
    assert no_auc.table().splitlines() == [
        "  family         CV NLL      +-SE      ECE    TPCR   fit s",
        "* identity      0.50000   0.02500  0.06250  0.1250    0.25"]
