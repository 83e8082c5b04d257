"""The model registry side of a recalibration: register a version last, gate it against the
current ``@champion``, and clean up after crashes.

Life of a version
-----------------
1. :func:`register_version` creates it with the tag ``cord.registration=pending``, in the
   same call that creates it, after every artifact of its run is logged and ONNX parity is
   verified. A retried call finds the version of its own run instead of adding a second.
2. :func:`flows.gate.score_champion` runs the champion on the same evaluation split and
   :func:`flows.gate.decide` compares the two (the gate's rules live in :mod:`flows.gate`).
3. :func:`apply_decision` records the decision and both NLLs as version tags, moves the
   ``champion`` alias only for a winner, and finally marks the version ``complete``.

A process killed between 1 and 3 leaves a pending version that holds no alias. The next
registration of the same model deletes such versions from other runs
(:func:`discard_orphans`) and marks their runs FAILED, so a rerun leaves nothing orphaned.
A flow that fails after step 1 calls :func:`withdraw_version`, which puts the alias back
and deletes the version.
"""

from __future__ import annotations

import numpy as np

CHAMPION = "champion"
REGISTRATION_TAG = "cord.registration"
PENDING = "pending"
COMPLETE = "complete"
DECISION_TAG = "cord.gate.decision"
REASON_TAG = "cord.gate.reason"
CANDIDATE_NLL_TAG = "cord.gate.candidate_nll"
CHAMPION_NLL_TAG = "cord.gate.champion_nll"
CHAMPION_VERSION_TAG = "cord.gate.champion_version"
#: Version tag saying what the graph's ``scores`` input holds ("logits" or "probs").
INPUT_KIND_TAG = "cord.input_kind"
#: Version tag with the number of classes K the graph reads.
N_CLASSES_TAG = "cord.n_classes"


def ensure_registered_model(client, name: str) -> None:
    """Create registered model ``name`` unless it exists (safe under a concurrent create)."""
    from mlflow.exceptions import MlflowException

    try:
        client.get_registered_model(name)
    except MlflowException:
        try:
            client.create_registered_model(name)
        except MlflowException:
            client.get_registered_model(name)


def champion_version(client, name: str):
    """The ModelVersion behind ``name@champion``, or None when the alias is unset.

    Stores differ in whether ``ModelVersion.version`` is an int or a str, so callers
    compare ``str(mv.version)``.
    """
    from mlflow.exceptions import MlflowException

    try:
        return client.get_model_version_by_alias(name, CHAMPION)
    except MlflowException:
        return None


def _versions(client, name: str):
    return client.search_model_versions(f"name = '{name}'")


def discard_orphans(client, name: str, current_run_id: str) -> list[str]:
    """Delete pending, alias-free versions of ``name`` left by other (crashed) runs.

    Their runs, still RUNNING after a kill, are marked FAILED. Returns the deleted versions.
    This assumes one recalibration of a model at a time (the served deployments run with
    a concurrency limit of 1): a concurrent run inside its register-to-gate window would
    look orphaned.
    """
    deleted = []
    for mv in _versions(client, name):
        if mv.tags.get(REGISTRATION_TAG) != PENDING or mv.run_id == current_run_id:
            continue
        if client.get_model_version(name, mv.version).aliases:
            continue
        client.delete_model_version(name, mv.version)
        deleted.append(str(mv.version))
        if mv.run_id and client.get_run(mv.run_id).info.status == "RUNNING":
            client.set_terminated(mv.run_id, "FAILED")
    return deleted


def register_version(client, name: str, run_id: str, model_uri: str, model_id: str | None,
                     tags: dict[str, str]):
    """Create the version of ``run_id``'s model, pending until :func:`apply_decision`.

    Idempotent per run: when a version of this run already exists (a retried call whose
    first attempt reached the store), that version is returned.
    """
    ensure_registered_model(client, name)
    discard_orphans(client, name, run_id)
    for mv in _versions(client, name):
        if mv.run_id == run_id:
            return mv
    return client.create_model_version(
        name, source=model_uri, run_id=run_id, model_id=model_id,
        tags={**tags, REGISTRATION_TAG: PENDING},
    )


def run_registered_model(model_uri: str, scores: np.ndarray) -> dict[str, np.ndarray]:
    """Load a registered graph with ``mlflow.pyfunc.load_model`` (the path a serving system
    takes) and run it on ``scores``, fed in the dtype its signature declares."""
    import mlflow.pyfunc

    model = mlflow.pyfunc.load_model(model_uri)
    spec = model.metadata.get_input_schema().inputs[0]
    outputs = model.predict({spec.name: np.asarray(scores, dtype=spec.type)})
    return {name: np.asarray(value) for name, value in outputs.items()}


def apply_decision(client, name: str, version: str, decision) -> None:
    """Record ``decision`` (a :class:`flows.gate.GateDecision`) on ``version``; move
    ``@champion`` there only if it was promoted.

    The alias moves before the version is marked complete, so a crash in between leaves
    a champion that :func:`discard_orphans` will not touch (it holds an alias).
    """
    client.set_model_version_tag(name, version, DECISION_TAG, decision.label)
    client.set_model_version_tag(name, version, REASON_TAG, decision.reason)
    client.set_model_version_tag(name, version, CANDIDATE_NLL_TAG, repr(decision.candidate_nll))
    client.set_model_version_tag(name, version, CHAMPION_NLL_TAG, repr(decision.champion_nll))
    client.set_model_version_tag(name, version, CHAMPION_VERSION_TAG,
                                 str(decision.champion_version))
    if decision.promote:
        client.set_registered_model_alias(name, CHAMPION, version)
    client.set_model_version_tag(name, version, REGISTRATION_TAG, COMPLETE)


def withdraw_version(client, name: str, version: str, previous_champion: str | None) -> None:
    """Undo a registration whose flow failed: restore the alias, delete the version."""
    from mlflow.exceptions import MlflowException

    try:
        holder = str(client.get_model_version_by_alias(name, CHAMPION).version)
    except MlflowException:
        holder = None
    if holder == str(version):
        if previous_champion is None:
            client.delete_registered_model_alias(name, CHAMPION)
        else:
            client.set_registered_model_alias(name, CHAMPION, previous_champion)
    client.delete_model_version(name, version)
