"""The guards every hand move of ``@champion`` applies from a version's registry tags alone:
``promote``, ``rollback``, ``rollout start`` and a rollout's promotion at its end ask the
same questions with the same words, and the command line asks them first, from the
store's cheap reads (:mod:`flows.store.reads`), before MLflow or Prefect is
imported.

A version is refused, in this order, when

1. it is a label-free prior-shift candidate (``cord.label_free=true``) that no labels have
   judged yet (no ``cord.label_free.verdict``), unless the operator says
   ``--allow-label-free``: nothing but an assumption (label shift) says it is better;
2. its registration did not finish (``cord.registration`` is not ``complete``);
3. the gate found it worse than the uncalibrated model (``cord.gate.harms=true``), unless
   the operator says ``--allow-harm``: the house rule that nothing promotes a model worse
   than the classifier itself without an explicit override.

:func:`overrides` names the overrides a move actually used (a flag given for a version that
did not need it is no override), for the champion history.

Pure: a function of tags and flags; no MLflow, Prefect or ONNX (tests/test_layering.py).
"""

from __future__ import annotations

from collections.abc import Mapping

from flows.store.registry import (
    COMPLETE,
    HARMS_TAG,
    LABEL_FREE_SOURCE_TAG,
    LABEL_FREE_TAG,
    LABEL_FREE_VERDICT_TAG,
    REASON_TAG,
    REGISTRATION_TAG,
    UNCALIBRATED_NLL_TAG,
)

ALLOW_HARM = "allow-harm"
ALLOW_LABEL_FREE = "allow-label-free"


def unjudged_label_free(tags: Mapping[str, str]) -> bool:
    """A label-free prior-shift candidate no labels have judged yet."""
    return tags.get(LABEL_FREE_TAG) == "true" and not tags.get(LABEL_FREE_VERDICT_TAG)


def harms(tags: Mapping[str, str]) -> bool:
    """The gate found the version worse than the uncalibrated model."""
    return tags.get(HARMS_TAG) == "true"


def harm_words(version: str, tags: Mapping[str, str]) -> str:
    """Why a harmful version is harmful, in the gate's own numbers when it recorded them."""
    baseline = tags.get(UNCALIBRATED_NLL_TAG)
    reason = tags.get(REASON_TAG) or ""
    said = [part.strip() for part in reason.split(";") if part.strip().startswith("does harm")]
    detail = said[0] if said else (f"the uncalibrated model's NLL is {baseline}"
                                   if baseline not in (None, "", "None") else "")
    return (f"v{version} is worse than the uncalibrated model (the gate's do-no-harm rule"
            + (f": {detail}" if detail else "") + ")")


def refusal(version: str, tags: Mapping[str, str], *, allow_harm: bool = False,
            allow_label_free: bool = False) -> str | None:
    """Why ``version`` (with registry ``tags``) may not take ``@champion``, in one line
    that names the override where there is one; None when these guards pass."""
    if unjudged_label_free(tags) and not allow_label_free:
        return (f"v{version} is a label-free prior-shift candidate of v"
                f"{tags.get(LABEL_FREE_SOURCE_TAG, '?')} that no labels have judged yet "
                "(docs/label-free.md); monitor its batch with labels first, or pass "
                "--allow-label-free to promote it anyway")
    state = tags.get(REGISTRATION_TAG)
    if state != COMPLETE:
        return f"v{version} has not finished registration ({REGISTRATION_TAG}={state})"
    if harms(tags) and not allow_harm:
        return f"{harm_words(version, tags)}; pass --allow-harm to promote it anyway"
    return None


def overrides(tags: Mapping[str, str], *, allow_harm: bool = False,
              allow_label_free: bool = False) -> list[str]:
    """The overrides a move of ``@champion`` to a version with ``tags`` relies on."""
    used = []
    if allow_harm and harms(tags):
        used.append(ALLOW_HARM)
    if allow_label_free and unjudged_label_free(tags):
        used.append(ALLOW_LABEL_FREE)
    return used
