"""``cord_ops.select`` piece by piece, fast (benchmarks/mutation.py's selection for it).

Most tests replace the calibrator factory and CORD with stand-ins (a fixed probability row
per input row, and a repair that keeps the calibrated rows), so every figure of a
candidate -- losses, NLL, its error, ECE, AUC, TPCR, seconds, warnings -- is written out
by hand; a clock that advances one second per reading makes the budget exact. A few
tests run the real families on a few dozen rows. The slower behaviour on realistic data
(which family wins on calibrated and distorted classifiers) is in test_select.py.
"""

from __future__ import annotations

import itertools
import math
import re
import warnings

import numpy as np
import pytest
from corpus import calibrated_logits as calibrated

import cord_ops.select as select
from cord_ops.metrics import PROB_FLOOR
from cord_ops.select import (
    RULES,
    SIMPLICITY,
    Candidate,
    Selection,
    candidate_families,
    choose,
    rank,
    select_calibrator,
)

EPS = 2.0 ** -52  # PROB_FLOOR, float64's machine epsilon

# Four rows, K = 2 (input "probs": the scores are the original probabilities).
ORIGINAL = np.array([[0.875, 0.125], [0.625, 0.375], [0.25, 0.75], [0.125, 0.875]])
LABELS = np.array([0, 1, 0, 1])
# The stand-in calibrator's rows: top-1 changed on row 1 only (TPCR 1/4); row 2 gives its
# label probability 0 (the floor), row 3 gives it exactly 1 (clipped to 1 - eps).
TABLE = np.array([[0.625, 0.375], [0.25, 0.75], [0.0, 1.0], [0.0, 1.0]])
LOSSES = [-float(np.log(q)) for q in (0.625, 0.75, EPS, 1 - EPS)]  # numpy's log, as used
FOLDS = [(np.array([2, 3]), np.array([0, 1])), (np.array([0, 1]), np.array([2, 3]))]


class _Table:
    """A stand-in calibrator: each input row's probabilities are a fixed row of ``table``,
    found by the input row's values (rows of ``scores``); ``fit`` raises ``error`` or
    warns, as a family may."""

    def __init__(self, scores, table, warns=(), error=None):
        self.scores, self.table, self.warns, self.error = scores, table, warns, error

    def fit(self, scores, labels):
        scores, labels = np.asarray(scores, dtype=float), np.asarray(labels)
        if scores.ndim != 2 or labels.shape != (len(scores),):
            raise TypeError("fit: expected rows of scores and one label per row")
        for category, text in self.warns:
            warnings.warn(text, category, stacklevel=2)
        if self.error is not None:
            raise self.error
        return self

    def predict_proba(self, scores):
        scores = np.asarray(scores, dtype=float)
        rows = [int(np.flatnonzero((self.scores == row).all(axis=1))[0]) for row in scores]
        for category, text in self.warns:  # warned again: deduplicated in the record
            warnings.warn(text, category, stacklevel=2)
        return self.table[rows]


class _KeepCalibrated:
    """A stand-in for CORD whose repair leaves the calibrated rows as they are."""

    def fit(self, original, calibrated):
        if np.shape(original) != np.shape(calibrated):
            raise TypeError("fit: original and calibrated differ in shape")
        return self

    def transform(self, original, calibrated):
        if np.shape(original) != np.shape(calibrated):
            raise TypeError("transform: original and calibrated differ in shape")
        return np.array(calibrated, dtype=float)


def _stand_ins(monkeypatch, scores, tables: dict, warns=None, errors=None, clock=True,
               start=0.0):
    """Every family ``name`` -> a _Table of ``tables[name]`` (default: ``tables[None]``);
    CORD -> _KeepCalibrated; the clock -> one second per reading from ``start``."""
    warns, errors = warns or {}, errors or {}

    def factory(name, *, input_kind):
        if input_kind not in ("logits", "probs"):
            raise TypeError(f"input_kind: {input_kind!r}")
        table = tables.get(name, tables.get(None))
        return _Table(scores, table, warns.get(name, ()), errors.get(name))

    monkeypatch.setattr(select, "make_calibrator", factory)
    monkeypatch.setattr(select, "CORD", _KeepCalibrated)
    if clock:
        ticks = itertools.count(start)
        monkeypatch.setattr(select, "_clock", lambda: float(next(ticks)))


# ---- the orders: simplicity (near ties) and cost (what a budget leaves out) ----

def test_rank_is_the_place_in_the_simplicity_order_and_unlisted_names_come_last():
    assert [rank(name) for name in ("identity", "ts", "dir-odir", "ms")] == [0, 1, 10, 11]
    assert rank("custom") == 12 == len(SIMPLICITY)


def test_cost_rank_puts_unlisted_families_after_every_listed_one():
    assert [select._cost_rank(name) for name in ("identity", "ts", "dir-odir")] == [0, 1, 11]
    assert select._cost_rank("custom") == 12


# ---- candidate families ----

def test_the_full_matrix_families_need_five_rows_per_parameter_in_the_smallest_fold():
    # K = 3: 12 parameters, 60 rows; 75 rows in 5 folds train on 60, 74 rows on 59
    every = ["identity", "ts", "ts-tva", "vs", "svs", "mcct-i", "irm", "irova-ts", "irova",
             "sms", "dir-odir", "ms"]
    assert candidate_families(3, 75) == (every, {})
    assert candidate_families(3, 75, 5) == (every, {})
    why = "12 parameters at K = 3 need 60 rows per training fold, 59 here"
    assert candidate_families(3, 74) == (every[:10], {"dir-odir": why, "ms": why})
    # 2 folds of 119 rows: the smaller training fold has 59 rows; 120 rows: 60
    assert candidate_families(3, 119, 2)[1]["ms"] == why
    assert candidate_families(3, 120, 2) == (every, {})


def test_one_fold_or_none_leaves_no_training_rows():
    why = "6 parameters at K = 2 need 30 rows per training fold, 0 here"
    for n_splits in (1, 0):
        chosen, ruled_out = candidate_families(2, 1000, n_splits)
        assert chosen == ["identity", "ts", "ts-tva", "vs", "svs", "mcct-i", "irm",
                          "irova-ts", "irova", "sms"]
        assert ruled_out == {"dir-odir": why, "ms": why}


# ---- the choice ----

def test_no_family_scored_is_refused():
    with pytest.raises(ValueError, match=r"^choose: no family was scored$"):
        choose({})


def test_the_width_is_met_with_equality_and_the_reason_names_both_figures():
    # identity - ts per row: [0, 1]: gap 0.5, paired SE sqrt(0.5) / sqrt(2) = 0.5 exactly
    losses = {"identity": np.array([1.0, 2.0]), "ts": np.array([1.0, 1.0])}
    assert choose(losses, 1.0) == (
        "identity", "identity's CV NLL 1.5 is within 1 paired standard error (0.5) of ts's "
                    "1; the simpler family is kept")
    assert choose(losses, 0.99) == ("ts", "lowest CV NLL (1)")
    assert choose(losses, 0.99, identity_se=1.0)[0] == "identity"
    assert choose(losses, 1.0, identity_se=0.99)[0] == "ts"
    # a family other than identity takes tie_se
    losses = {"ts": np.array([1.0, 2.0]), "vs": np.array([1.0, 1.0])}
    assert choose(losses, 1.0, identity_se=0.0) == (
        "ts", "ts's CV NLL 1.5 is within 1 paired standard error (0.5) of vs's 1; the "
              "simpler family is kept")
    assert choose(losses, 0.99, identity_se=5.0) == ("vs", "lowest CV NLL (1)")


def test_exact_ties_go_to_the_simpler_family_as_the_lowest():
    same = np.array([0.5, 1.5])
    assert choose({"vs": same, "ts": same.copy()}, 0.0) == ("ts", "lowest CV NLL (1)")
    # names neither order lists: by name
    assert choose({"zeta": same, "custom": same.copy()}, 0.0) == ("custom",
                                                                  "lowest CV NLL (1)")


def test_one_row_has_no_paired_error_and_warns_nothing():
    losses = {"identity": np.array([1.5]), "ts": np.array([1.0])}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert choose(losses, 1.0) == ("ts", "lowest CV NLL (1)")
        assert choose(losses, 100.0) == ("ts", "lowest CV NLL (1)")


def test_the_simplest_family_within_its_width_wins_not_the_first_one_found():
    # identity and ts both within 1 SE of sms; the simpler (identity) is kept; without
    # identity, ts; a family more flexible than the lowest is never considered
    base = np.array([1.0, 1.0, 1.0, 1.0])
    losses = {"sms": base, "ts": base + [0.0, 0.0, 0.0, 0.5],
              "identity": base + [0.0, 0.0, 0.5, 0.0], "ms": base + 1.0}
    assert choose(losses, 1.0)[0] == "identity"
    assert choose({k: v for k, v in losses.items() if k != "identity"}, 1.0)[0] == "ts"
    assert choose(losses, 0.0)[0] == "sms"


# ---- folds ----

def test_folds_are_stratified_when_every_present_class_fills_each_fold():
    labels = np.array([1] * 5 + [2] * 10)  # class 0 absent: only present classes count
    folds = select._folds(labels, 5, 3)
    assert len(folds) == 5
    for train, test in folds:
        assert sorted(labels[test].tolist()) == [1, 2, 2]
        assert sorted([*train, *test]) == list(range(15))
    assert sorted(np.concatenate([test for _, test in folds]).tolist()) == list(range(15))


def test_folds_are_plain_when_a_class_has_fewer_rows_than_folds():
    labels = np.array([0] * 3 + [1] * 12)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # StratifiedKFold would warn about the 3 rows
        folds = select._folds(labels, 5, 0)
    assert [len(test) for _, test in folds] == [3] * 5
    assert sorted(np.concatenate([test for _, test in folds]).tolist()) == list(range(15))


def test_folds_are_shuffled_and_the_seed_decides_them():
    labels = np.array([0, 1] * 20)
    first = [test.tolist() for _, test in select._folds(labels, 5, 11)]
    assert first == [test.tolist() for _, test in select._folds(labels, 5, 11)]
    assert first != [test.tolist() for _, test in select._folds(labels, 5, 12)]
    assert first[0] != list(range(8))  # not contiguous blocks


# ---- one family's figures ----

def _expected_record(name="shift", fit_seconds=2.0, warns=()):
    losses = np.array(LOSSES)
    return {"family": name, "nll": float(np.mean(losses)),
            "nll_se": float(np.std(losses, ddof=1) / 2.0),
            # bins (l, u] of width 1/15: 0.625 alone (gap 0.375), 0.75 alone (0.25), the
            # two rows at 1.0 together (accuracy 1/2, gap 0.5)
            "ece": (0.375 + 0.25 + 2 * 0.5) / 4,
            # positives 0.75 and 1.0 against negatives 0.375 and 1.0: 2.5 of 4 pairs
            "auc": 0.625, "tpcr": 0.25, "fit_seconds": fit_seconds, "warnings": list(warns)}


def test_a_candidate_holds_its_held_out_figures_written_out(monkeypatch):
    warns = [(RuntimeWarning, "slow"), (UserWarning, "odd")]
    _stand_ins(monkeypatch, ORIGINAL, {None: TABLE}, warns={"shift": warns})
    candidate = select._score("shift", FOLDS, ORIGINAL, LABELS, ORIGINAL, "probs", 2, 1)
    # two folds of two clock readings each, one second apart
    assert candidate.record() == _expected_record(
        warns=["RuntimeWarning: slow", "UserWarning: odd"])
    assert candidate.losses.tolist() == LOSSES  # exactly: the floor and 1 - eps
    assert LOSSES[3] > 0 and EPS == PROB_FLOOR


def test_folds_in_parallel_give_the_same_figures(monkeypatch):
    _stand_ins(monkeypatch, ORIGINAL, {"shift": TABLE}, clock=False)
    monkeypatch.setattr(select, "_clock", lambda: 0.0)
    candidate = select._score("shift", FOLDS, ORIGINAL, LABELS, ORIGINAL, "probs", 2, 2,
                              deadline=-1.0)  # threads: the budget is not checked per fold
    assert candidate.record() == _expected_record(fit_seconds=0.0)


def test_n_jobs_folds_are_fitted_at_the_same_time(monkeypatch):
    import threading

    both = threading.Barrier(2, timeout=10)  # each fold's fit waits for the other's

    class _Waits(_Table):
        def fit(self, scores, labels):
            both.wait()
            return super().fit(scores, labels)

    monkeypatch.setattr(select, "make_calibrator",
                        lambda name, *, input_kind: _Waits(ORIGINAL, TABLE))
    monkeypatch.setattr(select, "CORD", _KeepCalibrated)
    candidate = select._score("shift", FOLDS, ORIGINAL, LABELS, ORIGINAL, "probs", 2, 2)
    assert candidate.nll == _expected_record()["nll"]


def test_one_class_has_no_auc_and_one_row_no_error(monkeypatch):
    _stand_ins(monkeypatch, ORIGINAL, {None: TABLE})
    only_zeros = np.zeros(4, dtype=int)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # scikit-learn's AUC would warn "only one class"
        candidate = select._score("shift", FOLDS, ORIGINAL, only_zeros, ORIGINAL, "probs",
                                  2, 1)
    assert math.isnan(candidate.auc)
    two = [(np.array([], dtype=int), np.array([0, 1]))]
    candidate = select._score("shift", two, ORIGINAL[:2], LABELS[:2], ORIGINAL[:2], "probs",
                              2, 1)
    # losses -ln(5/8) and -ln(3/4): their standard deviation (ddof 1) is |difference| / sqrt 2
    assert candidate.nll_se == pytest.approx(math.log(0.75 / 0.625) / 2, rel=1e-12)
    one = [(np.array([], dtype=int), np.array([0]))]
    candidate = select._score("shift", one, ORIGINAL[:1], LABELS[:1], ORIGINAL[:1], "probs",
                              2, 1)
    assert (candidate.nll, candidate.nll_se) == (-math.log(0.625), 0.0)


def test_more_than_two_classes_have_no_auc(monkeypatch):
    original = np.array([[0.5, 0.25, 0.25], [0.25, 0.5, 0.25], [0.25, 0.25, 0.5]])
    _stand_ins(monkeypatch, original, {None: original})
    folds = [(np.array([1, 2]), np.array([0])), (np.array([0]), np.array([1, 2]))]
    candidate = select._score("shift", folds, original, np.array([0, 1, 2]), original,
                              "probs", 3, 1)
    assert candidate.auc is None
    assert candidate.nll == pytest.approx(math.log(2), abs=0) and candidate.tpcr == 0.0


def test_a_family_is_abandoned_only_after_a_fold_that_ends_past_the_deadline(monkeypatch):
    _stand_ins(monkeypatch, ORIGINAL, {None: TABLE})
    # fold 1 reads the clock at 0 and 1, the deadline check reads 2; fold 2 (the last)
    # reads 3 and 4 and is not followed by a check
    candidate = select._score("shift", FOLDS, ORIGINAL, LABELS, ORIGINAL, "probs", 2, 1,
                              deadline=2.0)
    assert candidate.name == "shift"
    _stand_ins(monkeypatch, ORIGINAL, {None: TABLE})
    with pytest.raises(select._OutOfTime, match=r"^stopped after fold 1 of 2: the budget "
                                                r"ran out$"):
        select._score("shift", FOLDS, ORIGINAL, LABELS, ORIGINAL, "probs", 2, 1,
                      deadline=1.5)


def test_warnings_are_recorded_even_where_the_caller_ignores_them(monkeypatch):
    _stand_ins(monkeypatch, ORIGINAL, {None: TABLE},
               warns={"ts": [(ResourceWarning, "unclosed")]})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        selection = select_calibrator(ORIGINAL, LABELS, "probs", families=["ts"],
                                      n_splits=2)
    assert selection.candidate("ts").warnings == ("ResourceWarning: unclosed",)
    assert selection.candidate("identity").warnings == ()


# ---- the whole selection, with stand-ins ----

def _rows(n, k, seed):
    """n distinct probability rows over k classes and labels with every class present."""
    rng = np.random.default_rng(seed)
    return rng.dirichlet(np.ones(k), n), np.arange(n) % k


def test_the_refusals_name_the_argument_and_the_value():
    p, y = _rows(10, 2, 0)
    for key in ("tie_se", "identity_se"):
        for bad in (-0.5, math.nan, math.inf, "1", None):
            with pytest.raises(ValueError, match=rf"^{key}: expected a finite number >= 0, "
                                                 rf"got {re.escape(repr(bad))}$"):
                select_calibrator(p, y, "probs", **{key: bad})
    for bad in (0, -1.0, "5"):
        with pytest.raises(ValueError, match=rf"^budget: expected seconds > 0 or None, got "
                                             rf"{re.escape(repr(bad))}$"):
            select_calibrator(p, y, "probs", budget=bad)


def test_zero_widths_and_integer_ones_are_taken_and_recorded_as_floats(monkeypatch):
    p, y = _rows(10, 2, 0)
    _stand_ins(monkeypatch, p, {None: p})
    selection = select_calibrator(p, y, "probs", families=["ts"], tie_se=0, identity_se=2,
                                  n_splits=2, seed=3)
    record = selection.record()
    assert (record["tie_se"], record["identity_se"], record["n_splits"], record["seed"]) == (
        0.0, 2.0, 2, 3)
    assert isinstance(record["tie_se"], float) and isinstance(record["identity_se"], float)
    # identity and ts predict the same rows: identity is the lowest by simplicity
    assert selection.chosen == "identity"


def test_a_budget_under_a_second_is_taken_and_the_default_seed_is_0(monkeypatch):
    p, y = _rows(10, 2, 0)
    _stand_ins(monkeypatch, p, {None: p}, start=100.0)
    selection = select_calibrator(p, y, "probs", families=["ts"], n_splits=2, budget=0.5)
    assert selection.skipped == {"ts": "not started: the 0.5 s budget was spent (6.0 s)"}
    assert selection.seed == 0 and selection.record()["seed"] == 0


def test_too_few_rows_keep_identity_without_fitting():
    p, y = _rows(1, 3, 0)
    selection = select_calibrator(p, y, "probs", families=["ts"], seed=4, tie_se=1,
                                  identity_se=0)
    assert selection.record() == {
        "chosen": "identity", "reason": "1 row(s): too few to cross-validate; identity kept",
        "n_splits": 1, "seed": 4, "tie_se": 1.0, "identity_se": 0.0, "rules": RULES,
        "candidates": [], "skipped": {}}


def test_fewer_rows_than_folds_take_one_fold_per_row(monkeypatch):
    p, y = _rows(3, 3, 0)
    _stand_ins(monkeypatch, p, {None: p})
    selection = select_calibrator(p, y, "probs", families=["ts"], n_splits=5)
    assert selection.n_splits == 3
    assert [c.name for c in selection.candidates] == ["identity", "ts"]
    p, y = _rows(2, 2, 0)
    _stand_ins(monkeypatch, p, {None: p})
    two = select_calibrator(p, y, "probs", families=["ts"])
    assert two.n_splits == 2 and [c.name for c in two.candidates] == ["identity", "ts"]


def test_the_default_candidates_follow_k_rows_and_folds(monkeypatch):
    p, y = _rows(74, 3, 0)
    _stand_ins(monkeypatch, p, {None: p})
    selection = select_calibrator(p, y, "probs", n_splits=2)
    # 2 folds of 74 rows train on 37
    why = "12 parameters at K = 3 need 60 rows per training fold, 37 here"
    assert selection.skipped == {"dir-odir": why, "ms": why}
    assert sorted(c.name for c in selection.candidates) == sorted(SIMPLICITY[:10])


def test_identity_is_always_scored_and_each_family_once(monkeypatch):
    p, y = _rows(10, 2, 0)
    _stand_ins(monkeypatch, p, {None: p})
    selection = select_calibrator(p, y, "probs", families=["vs", "ts", "vs"], n_splits=2)
    assert sorted(c.name for c in selection.candidates) == ["identity", "ts", "vs"]


def test_equal_figures_are_listed_simplest_first_and_the_lowest_first(monkeypatch):
    p, y = _rows(10, 2, 0)
    better = np.eye(2)[y] * 0.75 + 0.125  # the label's probability 0.875
    _stand_ins(monkeypatch, p, {None: better, "identity": p})
    selection = select_calibrator(p, y, "probs", families=["svs", "ts-tva"], n_splits=2)
    # svs is cheaper (scored first), ts-tva simpler; identity (the rows themselves) is worse
    assert [c.name for c in selection.candidates] == ["ts-tva", "svs", "identity"]
    assert selection.chosen == "ts-tva"
    assert selection.reason == f"lowest CV NLL ({-math.log(0.875):.6g})"


def test_identity_gets_its_own_width_in_the_whole_selection(monkeypatch):
    # identity gives every row 1/2; ts gives rows 0 and 4 (label 0) 3/4, the rest 1/2
    p = np.array([[0.875 - i / 64, 0.125 + i / 64] for i in range(8)])
    y = np.array([0, 1] * 4)
    half = np.full((8, 2), 0.5)
    better = half.copy()
    better[[0, 4]] = [0.75, 0.25]
    _stand_ins(monkeypatch, p, {"identity": half, "ts": better})
    tie = select_calibrator(p, y, "probs", families=["ts"], n_splits=2, tie_se=0.0,
                            identity_se=100.0)
    assert tie.chosen == "identity"
    _stand_ins(monkeypatch, p, {"identity": half, "ts": better})
    lowest = select_calibrator(p, y, "probs", families=["ts"], n_splits=2, tie_se=100.0,
                               identity_se=0.0)
    assert lowest.chosen == "ts"


def test_tie_se_decides_between_two_families_in_the_whole_selection(monkeypatch):
    # vs is better than ts on rows 0 and 4 only; identity is far worse than both
    p = np.array([[0.875 - i / 64, 0.125 + i / 64] for i in range(8)])
    y = np.array([0, 1] * 4)
    ts = np.where(np.eye(2)[y] == 1, 0.75, 0.25)
    vs = ts.copy()
    vs[[0, 4]] = [0.875, 0.125]
    tables = {"identity": np.full((8, 2), 0.5), "ts": ts, "vs": vs}
    for tie_se, chosen in ((100.0, "ts"), (0.0, "vs")):
        _stand_ins(monkeypatch, p, tables)
        selection = select_calibrator(p, y, "probs", families=["ts", "vs"], n_splits=2,
                                      tie_se=tie_se, identity_se=0.0)
        assert selection.chosen == chosen


class _GiveOriginal(_KeepCalibrated):
    """A stand-in for CORD whose repair gives back the original rows."""

    def transform(self, original, calibrated):
        super().transform(original, calibrated)
        return np.array(original, dtype=float)


def test_the_original_is_the_softmax_of_logits_and_the_probabilities_themselves(monkeypatch):
    p = np.array([[0.75, 0.25], [0.25, 0.75], [0.5, 0.5], [0.125, 0.875]])
    y = np.array([0, 1, 1, 0])
    flipped = np.tile([0.25, 0.75], (4, 1))
    for scores, kind in ((np.log(p), "logits"), (p, "probs")):
        _stand_ins(monkeypatch, scores, {None: flipped})
        monkeypatch.setattr(select, "CORD", _GiveOriginal)
        ts = select_calibrator(scores, y, kind, families=["ts"], n_splits=2).candidate("ts")
        # the repaired rows are the original ones: their label's probabilities 3/4, 3/4,
        # 1/2, 1/8; the calibrated rows change top-1 on rows 0 and 2 (a tie reads as 0)
        assert ts.nll == pytest.approx(-(2 * math.log(0.75) + math.log(0.5)
                                         + math.log(0.125)) / 4, rel=1e-12)
        assert ts.tpcr == 0.5


def test_a_family_that_fails_is_named_and_the_others_are_chosen_from(monkeypatch):
    import scipy.linalg

    p, y = _rows(10, 2, 0)
    errors = {"ts": ValueError("no convergence"), "vs": ZeroDivisionError("0 rows"),
              "svs": scipy.linalg.LinAlgError("singular")}
    _stand_ins(monkeypatch, p, {None: p}, errors=errors)
    selection = select_calibrator(p, y, "probs", families=["ts", "vs", "svs", "irm"],
                                  n_splits=2)
    assert selection.skipped == {"ts": "failed: no convergence", "vs": "failed: 0 rows",
                                 "svs": "failed: singular"}
    assert sorted(c.name for c in selection.candidates) == ["identity", "irm"]


def test_the_budget_cuts_the_costliest_families_and_names_them(monkeypatch):
    p, y = _rows(10, 2, 0)
    # readings: start 0; identity: check 1, two folds 2-5; ts: check 6, fold 1 7-8, the
    # deadline check 9, fold 2 10-11; svs: check 12, ...
    families = ["custom", "dir-odir", "svs", "ts"]  # cheapest last: scored cheapest first
    _stand_ins(monkeypatch, p, {None: p}, start=100.0)  # the budget counts from the start
    cut = select_calibrator(p, y, "probs", families=families, n_splits=2, budget=6)
    assert [c.name for c in cut.candidates] == ["identity"]
    assert cut.skipped == {
        "ts": "stopped after fold 1 of 2: the budget ran out (6 s)",
        "svs": "not started: the 6 s budget was spent (10.0 s)",
        "dir-odir": "not started: the 6 s budget was spent (11.0 s)",
        "custom": "not started: the 6 s budget was spent (12.0 s)"}
    _stand_ins(monkeypatch, p, {None: p}, start=100.0)
    cut = select_calibrator(p, y, "probs", families=families, n_splits=2, budget=12.5)
    # ts ends at 11 (its check at 9 is before 12.5); svs starts at 12, stops after fold 1
    assert sorted(c.name for c in cut.candidates) == ["identity", "ts"]
    assert cut.skipped == {
        "svs": "stopped after fold 1 of 2: the budget ran out (12.5 s)",
        "dir-odir": "not started: the 12.5 s budget was spent (16.0 s)",
        "custom": "not started: the 12.5 s budget was spent (17.0 s)"}
    _stand_ins(monkeypatch, p, {None: p}, start=100.0)
    whole = select_calibrator(p, y, "probs", families=families, n_splits=2, budget=100)
    assert whole.skipped == {} and len(whole.candidates) == 5


# ---- the real families on a few dozen rows ----

def test_real_families_fit_on_logits_and_on_probabilities():
    z, y = calibrated(3, 60, seed=5, scale=3.0)
    on_logits = select_calibrator(z, y, families=["ts"], n_splits=3, seed=1)  # logits
    assert on_logits.skipped == {}
    assert on_logits.chosen == "ts"  # a temperature of 3 is far outside any near tie
    e = np.exp(z - z.max(axis=1, keepdims=True))
    on_probs = select_calibrator(e / e.sum(axis=1, keepdims=True), y, "probs",
                                 families=["ts"], n_splits=3, seed=1)
    assert on_probs.skipped == {} and on_probs.chosen == "ts"


def test_the_seed_decides_the_folds_and_float32_scores_are_read_as_float64():
    z, y = calibrated(3, 60, seed=5, scale=3.0)
    z = z.astype(np.float32)

    def losses(scores, seed):
        selection = select_calibrator(scores, y, families=["ts"], n_splits=3, seed=seed)
        return selection.candidate("ts").losses.tolist()

    first = losses(z, 1)
    assert first == losses(z, 1)
    assert first != losses(z, 2)
    assert first == losses(z.astype(np.float64), 1)


def test_float32_logits_one_step_apart_keep_their_top_1():
    # the runner-up one float32 step below the maximum, in the column before it: a float32
    # softmax rounds some such pairs to equal probabilities, whose argmax is the runner-up
    rng = np.random.default_rng(0)
    z = rng.normal(0.0, 1.0, (30, 3)).astype(np.float32)
    top = z.argmax(axis=1)
    rows = np.arange(30)
    z[rows, (top + 2) % 3] = np.nextafter(z[rows, top], np.float32(-np.inf))
    assert (z.argmax(axis=1) == top).all()
    selection = select_calibrator(z, rows % 3, families=[], n_splits=3)
    assert selection.candidate("identity").tpcr == 0.0  # identity changes no top-1


# ---- the record and the table ----

def test_the_table_marks_only_the_choice_and_lists_skipped_families_last():
    a = Candidate("vs", 0.125, 0.5, 0.25, None, 1.0, 10.0)
    b = Candidate("ts", 0.25, 0.0, 0.0, None, 0.0, 0.0)
    picked = Selection("ts", "r", (a, b), {"ms": "x", "irm": "failed: y"}, 2, 0, 0.0, 0.0)
    assert picked.table().splitlines() == [
        "  family         CV NLL      +-SE      ECE    TPCR   fit s",
        "  vs            0.12500   0.50000  0.25000  1.0000   10.00",
        "* ts            0.25000   0.00000  0.00000  0.0000    0.00",
        "  ms        skipped: x",
        "  irm       skipped: failed: y"]
    assert picked.candidate("vs") is a and picked.candidate("ts") is b
