"""The guards every hand move of ``@champion`` applies (flows/promotion/guards.py), as pure
functions of a version's registry tags: which refusal comes first, what each override
lifts, which overrides a move used, and the words a harmful version is refused with."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from flows.promotion import guards
from flows.store import registry

COMPLETE = {registry.REGISTRATION_TAG: registry.COMPLETE}
HARMFUL = {**COMPLETE, registry.HARMS_TAG: "true", registry.UNCALIBRATED_NLL_TAG: "0.128",
           registry.REASON_TAG: "not enough evidence (x); does harm: NLL 1.23 is worse than "
                                "the uncalibrated model's 0.128 on this evaluation split"}
UNJUDGED = {**COMPLETE, registry.LABEL_FREE_TAG: "true", registry.LABEL_FREE_SOURCE_TAG: "4"}


def test_a_complete_version_the_gate_found_harmless_passes():
    assert guards.refusal("3", {**COMPLETE, registry.HARMS_TAG: "false"}) is None
    assert guards.refusal("3", COMPLETE) is None  # registered before the harm tag existed


def test_harm_is_refused_in_the_gates_words_and_lifted_by_allow_harm_only():
    said = guards.refusal("1", HARMFUL)
    assert said == ("v1 is worse than the uncalibrated model (the gate's do-no-harm rule: "
                    "does harm: NLL 1.23 is worse than the uncalibrated model's 0.128 on this "
                    "evaluation split); pass --allow-harm to promote it anyway")
    assert guards.refusal("1", HARMFUL, allow_label_free=True) == said
    assert guards.refusal("1", HARMFUL, allow_harm=True) is None
    # Without the gate's words, its baseline; without either, the rule alone.
    bare = {**COMPLETE, registry.HARMS_TAG: "true", registry.UNCALIBRATED_NLL_TAG: "0.5"}
    assert guards.harm_words("2", bare) == ("v2 is worse than the uncalibrated model (the "
                                            "gate's do-no-harm rule: the uncalibrated model's "
                                            "NLL is 0.5)")
    assert guards.harm_words("2", {registry.HARMS_TAG: "true"}) == (
        "v2 is worse than the uncalibrated model (the gate's do-no-harm rule)")
    for unknown in ("None", ""):
        assert guards.harm_words("2", {registry.UNCALIBRATED_NLL_TAG: unknown}) == (
            "v2 is worse than the uncalibrated model (the gate's do-no-harm rule)")


def test_an_unjudged_label_free_candidate_is_refused_first_and_lifted_by_its_flag():
    both = {**UNJUDGED, registry.HARMS_TAG: "true"}
    said = guards.refusal("5", both, allow_harm=True)
    assert said == ("v5 is a label-free prior-shift candidate of v4 that no labels have "
                    "judged yet (docs/label-free.md); monitor its batch with labels first, or "
                    "pass --allow-label-free to promote it anyway")
    assert guards.refusal("5", both) == said  # the label-free refusal comes first
    assert "--allow-harm" in guards.refusal("5", both, allow_label_free=True)
    assert guards.refusal("5", both, allow_label_free=True, allow_harm=True) is None
    judged = {**UNJUDGED, registry.LABEL_FREE_VERDICT_TAG: "not better: x"}
    assert guards.refusal("5", judged) is None
    assert guards.refusal("5", {**UNJUDGED, registry.LABEL_FREE_VERDICT_TAG: ""}) == \
        guards.refusal("5", UNJUDGED)
    assert guards.refusal("5", {**UNJUDGED, registry.LABEL_FREE_TAG: "false"}) is None
    assert "of v?" in guards.refusal("5", {**COMPLETE, registry.LABEL_FREE_TAG: "true"})


def test_an_unfinished_registration_is_refused_whatever_the_overrides():
    for state in (registry.PENDING, None):
        tags = {} if state is None else {registry.REGISTRATION_TAG: state}
        assert guards.refusal("2", tags, allow_harm=True, allow_label_free=True) == (
            f"v2 has not finished registration ({registry.REGISTRATION_TAG}={state})")
    # After the label-free check, before the harm check.
    pending_harm = {registry.REGISTRATION_TAG: registry.PENDING, registry.HARMS_TAG: "true"}
    assert "registration" in guards.refusal("2", pending_harm)
    assert "label-free" in guards.refusal("2", {**UNJUDGED, **pending_harm})


def test_overrides_name_only_the_flags_a_move_needed():
    assert guards.overrides(HARMFUL, allow_harm=True) == [guards.ALLOW_HARM]
    assert guards.overrides(HARMFUL, allow_label_free=True) == []
    assert guards.overrides(COMPLETE, allow_harm=True, allow_label_free=True) == []
    assert guards.overrides({**UNJUDGED, registry.HARMS_TAG: "true"}, allow_harm=True,
                            allow_label_free=True) == [guards.ALLOW_HARM,
                                                       guards.ALLOW_LABEL_FREE]
    assert guards.overrides(UNJUDGED, allow_label_free=True) == [guards.ALLOW_LABEL_FREE]
    assert guards.overrides(UNJUDGED) == []


TAG_VALUES = st.sampled_from(["true", "false", "", "None", registry.COMPLETE,
                              registry.PENDING, "x"])


@given(st.dictionaries(st.sampled_from([registry.REGISTRATION_TAG, registry.HARMS_TAG,
                                        registry.LABEL_FREE_TAG,
                                        registry.LABEL_FREE_VERDICT_TAG]), TAG_VALUES),
       st.booleans(), st.booleans())
def test_a_move_passes_exactly_when_every_guard_passes_or_is_overridden(tags, harm, free):
    passes = guards.refusal("7", tags, allow_harm=harm, allow_label_free=free) is None
    expected = (tags.get(registry.REGISTRATION_TAG) == registry.COMPLETE
                and (harm or tags.get(registry.HARMS_TAG) != "true")
                and (free or tags.get(registry.LABEL_FREE_TAG) != "true"
                     or bool(tags.get(registry.LABEL_FREE_VERDICT_TAG))))
    assert passes == expected
    # Every override a passing move used was given, and needed.
    used = guards.overrides(tags, allow_harm=harm, allow_label_free=free)
    assert (guards.ALLOW_HARM in used) == (harm and tags.get(registry.HARMS_TAG) == "true")
