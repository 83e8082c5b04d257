"""``flows.gate``'s small pieces with literal expected values: the K-dependent
defaults at their corners, each tolerance on its own (the own split's 1e-6 and the
reference split's 2 %, neither standing in for the other), the policy's refusals, the
evidence rules' messages and the label-shift arithmetic worked by hand, the champion
error and health texts, and the message words of every gate outcome."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from flows.promotion import champion, rules


@pytest.mark.parametrize("k, rows, share", [
    (2, 100, 1.0), (3, 100, 0.9), (5, 100, 0.9), (6, 100, 5 / 6), (10, 100, 0.5), (11, 110, 0.5),
    (100, 1000, 0.5)])
def test_defaults_at_their_corners(k, rows, share):
    """max(100, 10 K) rows; share min(0.9, max(0.5, 5 / K)), off for K = 2, which needs
    20 rows of its rarer class instead (0 for K >= 3)."""
    assert rules.default_min_rows(k) == rows
    assert rules.default_max_class_share(k) == share
    policy = rules.Policy.for_classes(k)
    assert (policy.min_calibration, policy.min_evaluation, policy.max_class_share) == (
        rows, rows, share)
    assert policy.min_class_rows == (20 if k == 2 else 0)
    assert (policy.max_label_shift, policy.nll_tolerance, policy.reference_tolerance) == (
        0.2, 1e-6, 0.02)


def test_each_tolerance_on_its_own():
    policy = rules.Policy.for_classes(10)
    assert policy.allowed_nll(2.0) == 2.0 + 2e-6
    assert policy.allowed_nll(2.0, on_reference=True) == 2.0 + 0.04
    assert policy.allowed_nll(-2.0) == -2.0 + 2e-6  # relative to |baseline|
    assert policy.allowed_nll(-2.0, on_reference=True) == -2.0 + 0.04
    assert policy.nll_to_beat(2.0) == 2.0 - 2e-6
    assert policy.nll_to_beat(-2.0) == -2.0 - 2e-6
    wide = rules.Policy.for_classes(10, nll_tolerance=0.1, reference_tolerance=0.3)
    assert wide.allowed_nll(1.0) == 1.1 and wide.allowed_nll(1.0, on_reference=True) == 1.3
    assert wide.nll_to_beat(1.0) == 0.9


def test_overrides_none_keeps_the_default_and_unknown_ones_are_refused():
    policy = rules.Policy.for_classes(10, min_calibration=7, min_evaluation=None)
    assert (policy.min_calibration, policy.min_evaluation) == (7, 100)
    with pytest.raises(TypeError, match=r"^unknown gate option\(s\): \['colour', 'size'\]$"):
        rules.Policy.for_classes(10, size=1, colour="red")


@pytest.mark.parametrize("option, value, message", [
    ("min_calibration", 0, "min_calibration: expected a positive integer, got 0"),
    ("min_evaluation", True, "min_evaluation: expected a positive integer, got True"),
    ("min_evaluation", 2.0, "min_evaluation: expected a positive integer, got 2.0"),
    ("max_class_share", 0.0, "max_class_share: expected a share in (0, 1], got 0.0"),
    ("max_class_share", 1.5, "max_class_share: expected a share in (0, 1], got 1.5"),
    ("min_class_rows", -1, "min_class_rows: expected an integer >= 0, got -1"),
    ("min_class_rows", 2.5, "min_class_rows: expected an integer >= 0, got 2.5"),
    ("max_label_shift", -0.1, "max_label_shift: expected a finite number >= 0, got -0.1"),
    ("nll_tolerance", math.inf, "nll_tolerance: expected a finite number >= 0, got inf"),
    ("reference_tolerance", "2%",
     "reference_tolerance: expected a finite number >= 0, got '2%'"),
])
def test_bad_thresholds_are_refused_with_their_name(option, value, message):
    with pytest.raises(ValueError) as raised:
        rules.Policy.for_classes(10, **{option: value})
    assert str(raised.value) == message


def test_edge_thresholds_are_accepted():
    policy = rules.Policy.for_classes(3, min_calibration=1, max_class_share=1.0,
                                     max_label_shift=0, nll_tolerance=0.0,
                                     min_evaluation=np.int64(4))
    assert policy.min_calibration == 1 and policy.max_class_share == 1.0
    assert policy.as_tags() == {
        "cord.gate.policy.min_calibration": "1",
        "cord.gate.policy.min_evaluation": repr(np.int64(4)),
        "cord.gate.policy.max_class_share": "1.0",
        "cord.gate.policy.min_class_rows": "0",
        "cord.gate.policy.max_label_shift": "0",
        "cord.gate.policy.nll_tolerance": "0.0",
        "cord.gate.policy.reference_tolerance": "0.02",
    }


def test_fit_floor_is_five_and_two_rows():
    rules.check_fit_floor(5, 2, "x.npz")
    for cal, ev in ((4, 2), (5, 1)):
        with pytest.raises(ValueError) as raised:
            rules.check_fit_floor(cal, ev, "x.npz")
        assert str(raised.value) == (
            f"x.npz: {cal} calibration and {ev} evaluation rows; fitting needs at least 5 "
            "and 2 (and promotion far more: see `cord-ops recalibrate --help`, "
            "--min-calibration)")


def test_label_counts_and_evidence_sizes():
    assert rules.label_counts(np.array([2, 0, 2]), 4) == (1, 0, 2, 0)
    evidence = rules.Evidence((3, 4), (1, 2, 3))
    assert (evidence.n_classes, evidence.n_calibration, evidence.n_evaluation) == (3, 7, 6)


def test_label_shift_arithmetic_by_hand():
    assert rules.tv_distance([1, 1], [1, 0]) == 0.5
    assert rules.tv_distance([2, 6], [1, 3]) == 0.0
    assert rules.tv_distance([0, 5], [5, 0]) == 1.0
    # pooled (0.5, 0.5); per class sqrt(0.25 * (1/50 + 1/50)) = 0.1; halved sum 0.1.
    assert rules.sampling_tv([25, 25], [25, 25]) == pytest.approx(
        0.1 * math.sqrt(2 / math.pi), rel=1e-15)
    # pooled (0.25, 0.75) from 100 + 300 rows: sqrt(0.1875 * (1/100 + 1/300)) per class.
    assert rules.sampling_tv([50, 50], [50, 250]) == pytest.approx(
        math.sqrt(2 / math.pi) * math.sqrt(0.1875 * (0.01 + 1 / 300)), rel=1e-15)


def test_evidence_problems_name_each_rule():
    policy = rules.Policy.for_classes(2, min_calibration=10, min_evaluation=10,
                                     max_class_share=0.6, min_class_rows=0)
    assert rules.evidence_problems(rules.Evidence((5, 5), (5, 5)), policy) == []
    assert rules.evidence_problems(rules.Evidence((5, 4), (3, 3)), policy) == [
        "calibration split has 9 rows (< 10 needed for K=2)",
        "evaluation split has 6 rows (< 10 needed for K=2)"]
    assert rules.evidence_problems(rules.Evidence((3, 7), (6, 4)), policy) == [
        "class 1 holds 70.0% of the calibration labels (> 60%; --max-class-share)"]
    # A share exactly at the limit passes; ties name the first class.
    assert rules.evidence_problems(rules.Evidence((6, 4), (4, 6)), policy) == []
    assert rules.evidence_problems(rules.Evidence((0, 0), (10, 0)), rules.Policy.for_classes(
        2, min_calibration=1, min_evaluation=1)) == [
        "calibration split has 0 rows (< 1 needed for K=2)",
        "class 1 has 0 of the 10 evaluation rows (< 20 needed of each class; "
        "--min-class-rows)"]


@pytest.mark.parametrize("calibration, evaluation, problems", [
    # a cancellation model's 2.8 % positives, and fraud-like 1 % with 20 positives: pass
    ((1944, 56), (1940, 60), []),
    ((1980, 20), (1980, 20), []),
    ((1981, 19), (1980, 20), ["class 1 has 19 of the 2000 calibration rows (< 20 needed of "
                              "each class; --min-class-rows)"]),
    # a single-class batch (an all-zeros default) is refused in either split
    ((2000, 0), (0, 500), ["class 1 has 0 of the 2000 calibration rows (< 20 needed of "
                           "each class; --min-class-rows)",
                           "class 0 has 0 of the 500 evaluation rows (< 20 needed of each "
                           "class; --min-class-rows)"]),
])
def test_binary_evidence_asks_for_rows_of_the_rarer_class_not_balance(calibration, evaluation,
                                                                      problems):
    policy = rules.Policy.for_classes(2)
    assert rules.evidence_problems(rules.Evidence(calibration, evaluation), policy) == problems


def test_the_rarer_class_rule_is_the_operators_to_change_and_off_for_many_classes():
    few = rules.Evidence((1990, 10), (1990, 10))
    assert rules.evidence_problems(few, rules.Policy.for_classes(2, min_class_rows=10)) == []
    # K = 3 keeps its share rule and no row count: an absent class is allowed
    assert rules.evidence_problems(rules.Evidence((60, 40, 0), (50, 50, 0)),
                                   rules.Policy.for_classes(3)) == []
    assert rules.evidence_problems(rules.Evidence((60, 40, 0), (50, 50, 0)),
                                   rules.Policy.for_classes(3, min_class_rows=1)) == [
        "class 2 has 0 of the 100 calibration rows (< 1 needed of each class; "
        "--min-class-rows)",
        "class 2 has 0 of the 100 evaluation rows (< 1 needed of each class; "
        "--min-class-rows)"]
    # an explicit share limit still applies to K = 2 and names its option
    assert rules.evidence_problems(few, rules.Policy.for_classes(2, max_class_share=0.9)) == [
        "class 0 holds 99.5% of the calibration labels (> 90%; --max-class-share)",
        "class 1 has 10 of the 2000 calibration rows (< 20 needed of each class; "
        "--min-class-rows)",
        "class 0 holds 99.5% of the evaluation labels (> 90%; --max-class-share)",
        "class 1 has 10 of the 2000 evaluation rows (< 20 needed of each class; "
        "--min-class-rows)"]


def test_label_shift_rule_adds_the_sampling_allowance():
    policy = rules.Policy.for_classes(2, min_calibration=1, min_evaluation=1,
                                     max_class_share=1.0, max_label_shift=0.1,
                                     min_class_rows=0)
    evaluation, reference = (5000, 5000), (4000, 6000)  # TV 0.1, sampling ~0.0056
    allowed = 0.1 + rules.sampling_tv(evaluation, reference)
    assert 0.1 < allowed < 0.11
    assert rules.evidence_problems(rules.Evidence((1, 1), evaluation, reference), policy) == []
    far = (3000, 7000)  # TV 0.2
    assert rules.evidence_problems(rules.Evidence((1, 1), evaluation, far), policy) == [
        f"evaluation labels are far from the champion's reference split (total variation "
        f"0.200 > {0.1 + rules.sampling_tv(evaluation, far):.3f})"]
    # An empty reference split or evaluation split skips the rule.
    assert rules.evidence_problems(rules.Evidence((1, 1), evaluation, (0, 0)), policy) == []


def test_health_and_champion_error_texts():
    assert champion.health_message("3", None) == "ok"
    assert champion.health_message("3", "graph missing") == "v3 cannot be scored: graph missing"
    assert len(champion.health_message("3", "x" * 6000)) == 5000
    error = champion.ChampionUnhealthyError("digits", "3", "graph missing", candidate="4")
    assert (error.model_name, error.version, error.problem) == ("digits", "3", "graph missing")
    assert str(error) == (
        "champion v3 of 'digits' cannot be scored (graph missing); candidate v4 registered "
        "as rejected; fix with `cord-ops promote --model-name digits --version N --reason "
        "TEXT` or `cord-ops rollback --model-name digits`")
    assert "registered as rejected" not in str(champion.ChampionUnhealthyError("m", "1", "p"))


def _evidence(k=10):
    n = rules.default_min_rows(k)
    counts = tuple([n // k] * k)
    return rules.Evidence(counts, counts, counts)


def _decide(candidate=0.5, **kw):
    args = {"candidate_tpcr": 0.0, "parity_ok": True, "champion": None,
            "uncalibrated_nll": 1.0, "evidence": _evidence(), "reference": None,
            "promote": True}
    args.update(kw)
    return rules.decide(candidate, args.pop("candidate_tpcr"), args.pop("parity_ok"),
                       args.pop("champion"), policy=rules.Policy.for_classes(10), **args)


def test_reasons_of_each_outcome():
    first = _decide()
    assert first.promote and first.label == "promoted" and not first.harms
    assert first.reason == ("no champion yet; NLL 0.5 no worse than the uncalibrated 1; "
                            "enough evidence, TPCR 0 and parity verified")
    win = _decide(champion=rules.ChampionScore("2", 0.6))
    assert win.reason == ("NLL 0.5 better than champion v2's 0.6 and no worse than the "
                          "uncalibrated 1; TPCR 0 and parity verified")
    assert (win.champion_nll, win.champion_version) == (0.6, "2")
    ref = rules.ReferenceScore("2", 0.3, 0.31, uncalibrated_nll=0.4)
    assert _decide(champion=rules.ChampionScore("2", 0.6), reference=ref).reason == (
        "NLL 0.5 better than champion v2's 0.6 and no worse than the uncalibrated 1 (and "
        "0.3 vs 0.31 on its reference split); TPCR 0 and parity verified")
    unused = rules.ReferenceScore("2", problem="split unavailable")
    assert _decide(champion=rules.ChampionScore("2", 0.6), reference=unused).reason == (
        "NLL 0.5 better than champion v2's 0.6 and no worse than the uncalibrated 1 "
        "(reference split not used: split unavailable); TPCR 0 and parity verified")
    off = _decide(promote=False)
    assert not off.promote and off.label == "rejected"
    assert off.reason == "gates passed but promotion is switched off (promote=False)"


def test_every_failed_rule_is_named():
    sick = _decide(0.7, candidate_tpcr=0.25, parity_ok=False,
                   champion=rules.ChampionScore("2", None, problem="graph missing"),
                   uncalibrated_nll=0.6,
                   evidence=rules.Evidence((1,) * 10, (1,) * 10))
    assert not sick.promote and sick.harms and sick.champion_problem == "graph missing"
    assert sick.reason == (
        "repaired output changes top-1 decisions (TPCR 0.25); ONNX parity check failed; "
        "not enough evidence (calibration split has 10 rows (< 100 needed for K=10); "
        "evaluation split has 10 rows (< 100 needed for K=10)); does harm: NLL 0.7 is worse "
        "than the uncalibrated model's 0.6 on this evaluation split; champion v2 could not be "
        "scored on this evaluation split (graph missing)")
    assert sick.evidence == ["calibration split has 10 rows (< 100 needed for K=10)",
                             "evaluation split has 10 rows (< 100 needed for K=10)"]
    worse = _decide(0.5, champion=rules.ChampionScore("2", 0.4))
    assert worse.reason == ("NLL 0.5 is worse than champion v2's 0.4 (the alias moves only on "
                            "a strict improvement)")
    ref = rules.ReferenceScore("2", 0.5, 0.4, uncalibrated_nll=0.45)
    both = _decide(0.3, champion=rules.ChampionScore("2", 0.4), reference=ref)
    assert both.harms and both.reason == (
        "NLL 0.5 on champion v2's reference split is worse than its 0.4; does harm: NLL 0.5 "
        "on champion v2's reference split is worse than the uncalibrated model's 0.45 there")
    # An unhealthy champion means the reference split is not used either.
    sick_ref = _decide(0.3, champion=rules.ChampionScore("2", None, problem="p"), reference=ref)
    assert not sick_ref.harms
    assert sick_ref.reason == ("champion v2 could not be scored on this evaluation split (p)")


def test_reference_rules_on_each_tolerance_just_inside_and_outside():
    """2 % on the champion's reference split (not the own split's 1e-6), both baselines."""
    champ = rules.ChampionScore("2", 0.4)
    for candidate, promoted in ((0.2039, True), (0.204, True), (0.2041, False)):
        ref = rules.ReferenceScore("2", candidate, 0.2, uncalibrated_nll=None)
        assert _decide(0.3, champion=champ, reference=ref).promote is promoted
        ref = rules.ReferenceScore("2", candidate, 9.0, uncalibrated_nll=0.2)
        decision = _decide(0.3, champion=champ, reference=ref)
        assert decision.promote is promoted and decision.harms is not promoted
    # On the own split the same 2 % would be harm: 1e-6 there.
    assert _decide(0.51, uncalibrated_nll=0.5).harms
    assert not _decide(0.5000004, uncalibrated_nll=0.5).harms


def test_the_tie_word_covers_the_tolerance_boundary_itself():
    # allowed_nll(1.0) = 1.0 + 1e-6 * 1.0 = 1.000001 exactly in float64: still a tie
    champ = rules.ChampionScore("2", 1.0)
    assert "ties champion v2's" in _decide(1.000001, champion=champ, uncalibrated_nll=2.0).reason
    assert "is worse than champion v2's" in _decide(1.0000011, champion=champ,
                                                    uncalibrated_nll=2.0).reason


def test_the_decision_carries_the_reference_it_was_given():
    ref = rules.ReferenceScore("2", 0.3, 0.31, uncalibrated_nll=0.4)
    assert _decide(champion=rules.ChampionScore("2", 0.6), reference=ref).reference is ref
    assert _decide().reference is None


def test_champion_error_without_a_candidate_ends_at_the_fix():
    assert str(champion.ChampionUnhealthyError("m", "1", "p")) == (
        "champion v1 of 'm' cannot be scored (p); fix with `cord-ops promote --model-name m "
        "--version N --reason TEXT` or `cord-ops rollback --model-name m`")


def test_label_shift_rule_at_its_edges():
    policy = rules.Policy.for_classes(2)
    # One reference row, or one evaluation row, is a split: TV 1 against the other side
    # (100, 0) / (0, 1): pooled (100/101, 1/101), spread sqrt(100/101^2 * 1.01) = 0.0995
    # per class, allowance 0.2 + 0.5 * sqrt(2 / pi) * 0.199 = 0.279
    one_ref = rules.evidence_problems(rules.Evidence((50, 50), (100, 0), (0, 1)), policy)
    assert "evaluation labels are far from the champion's reference split (total " \
        "variation 1.000 > 0.279)" in one_ref
    one_eval = rules.evidence_problems(rules.Evidence((50, 50), (1, 0), (0, 100)), policy)
    assert "evaluation labels are far from the champion's reference split (total " \
        "variation 1.000 > 0.279)" in one_eval
    # A shift exactly at the allowance passes: identical one-class splits have TV 0 and
    # no sampling allowance, so with max_label_shift 0 the shift equals what is allowed.
    exact = rules.Policy.for_classes(2, max_label_shift=0.0, max_class_share=1.0,
                                    min_class_rows=0)
    assert rules.evidence_problems(rules.Evidence((100, 0), (100, 0), (100, 0)), exact) == []


def test_an_empty_split_skips_the_label_shift_rule_without_dividing_by_zero():
    policy = rules.Policy.for_classes(2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # 0 / 0 in the TV arithmetic would warn
        assert rules.evidence_problems(rules.Evidence((50, 50), (50, 50), (0, 0)), policy) == []
        assert rules.evidence_problems(rules.Evidence((50, 50), (0, 0), (50, 50)),
                                      policy) == ["evaluation split has 0 rows "
                                                  "(< 100 needed for K=2)"]


# ---------------------------------------------------------------- registry side, stubbed
# The MLflow client and the model runner are collaborators: a stand-in client answers the
# two reads score_champion / champion_reference make, and the runner is replaced, so these
# tests pin what the gate does with the answers (the real store is tests/flows/
# test_gate_store.py).
class _Version:
    def __init__(self, tags: dict, run_id: str = "run-7"):
        self.tags, self.run_id = tags, run_id


class _Client:
    def __init__(self, version_tags: dict | None = None, model_tags: dict | None = None):
        self.version_tags = version_tags or {}
        self.model_tags = dict(model_tags or {})
        self.writes: list[tuple] = []
        self.asked: list[tuple] = []

    def get_model_version(self, name, version):
        self.asked.append((name, version))
        return _Version(self.version_tags)

    def get_registered_model(self, name):
        return _Version(self.model_tags)

    def set_registered_model_tag(self, name, key, value):
        self.writes.append((name, key, value))
        self.model_tags[key] = value


SCORES = np.full((4, 3), 1 / 3)
LABELS = np.array([0, 1, 2, 0])
# rows that give label 0 one half and labels 1, 2 one quarter: NLL (ln 2 + 2 ln 4 + ln 2)/4
HALF_QUARTER = np.array([[0.5, 0.25, 0.25]] * 4, dtype=np.float32)
HALF_QUARTER_NLL = 1.0397207708399179  # 1.5 ln 2


@pytest.fixture
def runner(monkeypatch):
    """Replace the model runner: returns what ``runner.outputs`` holds (or raises
    ``runner.error``) and records the arguments it was called with."""
    class Runner:
        outputs: dict = {"repaired": HALF_QUARTER}
        error: Exception | None = None
        calls: list = []

        def __call__(self, client, uri, scores):
            self.calls.append((client, uri, scores))
            if self.error is not None:
                raise self.error
            return self.outputs

    fake = Runner()
    fake.calls = []
    monkeypatch.setattr(champion.registry, "run_registered_model", fake)
    return fake


# registered with the input-kind tag of this split, or without one (then it is tried)
@pytest.mark.parametrize("tags", [{champion.registry.INPUT_KIND_TAG: "probs"}, {}])
def test_a_champion_that_runs_is_scored_by_its_nll_on_the_split(runner, tags):
    client = _Client(tags)
    score = champion.score_champion(client, "m", "3", SCORES, LABELS, "probs")
    assert score == rules.ChampionScore("3", pytest.approx(HALF_QUARTER_NLL, rel=1e-12), None)
    assert score.version == "3" and score.problem is None
    ((used_client, uri, scores),) = runner.calls
    assert used_client is client and uri == "models:/m/3" and scores is SCORES
    assert client.asked == [("m", "3")]


def test_a_champion_output_of_the_wrong_shape_is_a_problem(runner):
    client = _Client()
    runner.outputs = {"repaired": HALF_QUARTER[:2]}
    assert champion.score_champion(client, "m", "3", SCORES, LABELS, "probs") == \
        rules.ChampionScore("3", None, "'repaired' has shape (2, 3), expected (4, 3)")
    runner.outputs = {"repaired": np.full((4, 2), 0.5)}
    assert champion.score_champion(client, "m", "3", SCORES, LABELS, "probs") == \
        rules.ChampionScore("3", None, "'repaired' has shape (4, 2), expected (4, 3)")
    runner.outputs = {"calibrated": HALF_QUARTER}
    assert champion.score_champion(client, "m", "3", SCORES, LABELS, "probs") == \
        rules.ChampionScore("3", None, "missing key 'repaired'")


def test_a_champion_that_fails_to_run_is_a_problem_cut_to_1000_characters(runner):
    runner.error = RuntimeError("x" * 2000)
    score = champion.score_champion(_Client(), "m", "3", SCORES, LABELS, "probs")
    assert score.version == "3" and score.nll is None
    assert score.problem == "x" * 1000  # in words: no class name


@pytest.mark.parametrize("value", [math.inf, math.nan])
def test_a_champion_nll_that_is_not_finite_is_a_problem(runner, monkeypatch, value):
    # metrics.nll floors the true-class probability, so this guard is reached only if
    # that ever changes; pinned here with nll itself replaced
    monkeypatch.setattr(champion.metrics, "nll", lambda probs, labels: value)
    assert champion.score_champion(_Client(), "m", "3", SCORES, LABELS, "probs") == \
        rules.ChampionScore("3", None, f"its NLL on this split is {value!r}")


class _Split:
    def __init__(self, n_classes, input_kind):
        self.n_classes, self.input_kind = n_classes, input_kind


@pytest.mark.parametrize("k, kind, why", [
    (3, "probs", None),
    (4, "probs", "incompatible: it holds 3 classes of probs, the candidate reads 4 of probs"),
    (3, "logits", "incompatible: it holds 3 classes of probs, the candidate reads 3 of "
                  "logits"),
    (4, "logits", "incompatible: it holds 3 classes of probs, the candidate reads 4 of "
                  "logits")])
def test_the_champion_reference_split_is_used_only_when_compatible(monkeypatch, k, kind, why):
    split = _Split(3, "probs")
    asked = []
    monkeypatch.setattr(champion.reference, "load_reference_split",
                        lambda client, run_id: asked.append((client, run_id)) or split)
    client = _Client()
    found, problem = champion.champion_reference(client, "m", "3", k, kind)
    assert (found, problem) == ((split, None) if why is None else (None, why))
    assert asked == [(client, "run-7")] and client.asked == [("m", "3")]


def test_the_health_tag_is_written_only_when_it_changes():
    client = _Client(model_tags={champion.HEALTH_TAG: "ok"})
    champion.record_health(client, "m", "3", None)
    assert client.writes == []
    champion.record_health(client, "m", "3", "graph missing")
    assert client.writes == [("m", champion.HEALTH_TAG, "v3 cannot be scored: graph missing")]
    champion.record_health(client, "m", "3", "graph missing")
    assert len(client.writes) == 1


class _RacingClient(_Client):
    """A store whose first tag write loses the insert race to another process that wrote
    ``winner`` at that moment (MLflow's sqlite store then raises the unique-key error)."""

    def __init__(self, winner: str, error: Exception):
        super().__init__()
        self.winner, self.error = winner, error

    def set_registered_model_tag(self, name, key, value):
        if self.error is not None:
            error, self.error = self.error, None
            self.model_tags[key] = self.winner
            raise error
        super().set_registered_model_tag(name, key, value)


RACE = "UNIQUE constraint failed: registered_model_tags.key, registered_model_tags.name"


@pytest.mark.parametrize("winner, writes", [
    ("ok", [("m", champion.HEALTH_TAG, "v3 cannot be scored: graph missing")]),
    ("v3 cannot be scored: graph missing", [])])
def test_a_lost_race_on_the_first_health_tag_rereads_and_writes_only_a_differing_value(
        winner, writes):
    from mlflow.exceptions import MlflowException

    client = _RacingClient(winner, MlflowException(RACE))
    champion.record_health(client, "m", "3", "graph missing")
    assert client.model_tags == {champion.HEALTH_TAG: "v3 cannot be scored: graph missing"}
    assert client.writes == writes


@pytest.mark.parametrize("error", [
    "attempt to write a readonly database", "RESOURCE_DOES_NOT_EXIST: no model 'm'"])
def test_a_health_tag_write_failing_otherwise_is_not_retried(error):
    from mlflow.exceptions import MlflowException

    client = _RacingClient("ok", MlflowException(error))
    with pytest.raises(MlflowException, match=error.split(":")[0]):
        champion.record_health(client, "m", "3", "graph missing")
    assert client.writes == []


def test_a_change_of_decision_threshold_is_a_rule_of_its_own():
    decision_change = rules.decision_change
    assert decision_change(None, None, "3") is None
    assert decision_change(0.5, None, "3") is None  # 1/2 is the argmax
    assert decision_change(0.1, 0.1, "3") is None
    assert decision_change(None, 0.1, "3") == (
        "decides at the argmax but champion v3 decides at p1 > 0.1 (a change of decision "
        "policy is promoted by hand)")
    assert decision_change(0.2, 0.1, "3") == (
        "decides at p1 > 0.2 but champion v3 decides at p1 > 0.1 (a change of decision "
        "policy is promoted by hand)")
    changed = _decide(decision_change="decides at p1 > 0.2 but champion v3 decides at the "
                                      "argmax (a change of decision policy is promoted by hand)")
    assert not changed.promote and changed.reason == (
        "decides at p1 > 0.2 but champion v3 decides at the argmax (a change of decision "
        "policy is promoted by hand)")
    assert _decide().promote
