"""The model registry side of a recalibration: register a version last, gate it against the
current ``@champion``, and clean up after crashes.

Life of a version (all of it under the model's registry lock, :mod:`flows.store.lock`)
---------------------------------------------------------------------------------
0. :func:`clean_up` undoes what dead owners left (pending versions, an alias held by one,
   RUNNING runs, PENDING logged models), judged by liveness, never by appearance.
1. :func:`register_version` creates it with the tag ``cord.registration=pending`` and the
   champion of that moment, in the same call that creates it, after every artifact of its
   run is logged and verified. A retried call finds the version of its own run.
2. :func:`flows.promotion.champion.score_champion` runs the champion on the same evaluation
   split (and on its pinned reference split) and :func:`flows.promotion.rules.decide` weighs
   the evidence.
3. :func:`record_decision` writes the decision and both NLLs as version tags,
   :func:`move_alias` moves ``@champion`` for a winner, the run is marked FINISHED and
   :func:`complete_version` marks the version ``complete``, the last write.

A process killed anywhere from 1 to 3 leaves a pending version (perhaps holding the
alias) whose owner is dead: the next registration of the model undoes it in step 0. A
flow that fails after step 1 calls :func:`withdraw_version` itself, which puts the alias
back and deletes the version; :func:`record_failure` is the same record written later,
from the local journal, when the store was down at the time.
"""

from __future__ import annotations

import numpy as np

from flows.redact import redact
from flows.store import owner

CHAMPION = "champion"
REGISTRATION_TAG = "cord.registration"
PENDING = "pending"
COMPLETE = "complete"
DECISION_TAG = "cord.gate.decision"
REASON_TAG = "cord.gate.reason"
CANDIDATE_NLL_TAG = "cord.gate.candidate_nll"
CHAMPION_NLL_TAG = "cord.gate.champion_nll"
CHAMPION_VERSION_TAG = "cord.gate.champion_version"
#: The classifier's own NLL on the candidate's evaluation split (the gate's baseline), and
#: whether the candidate was worse than it ("true"/"false").
UNCALIBRATED_NLL_TAG = "cord.gate.uncalibrated_nll"
HARMS_TAG = "cord.gate.harms"
#: Version tag: the ``@champion`` when this version was registered ("" for none).
PREVIOUS_CHAMPION_TAG = "cord.registration.previous_champion"
#: Run tag: why a run FAILED.
ERROR_TAG = "cord.error"
#: Version tag saying what the graph's ``scores`` input holds ("logits" or "probs").
INPUT_KIND_TAG = "cord.input_kind"
#: Version tag with the number of classes K the graph reads.
N_CLASSES_TAG = "cord.n_classes"
#: Version (and run) tag of a prior-shift candidate registered without labels
#: (:mod:`flows.monitor.label_free.candidate`): "true".
LABEL_FREE_TAG = "cord.label_free"
#: Version tag: the verdict of the labels that later met a label-free candidate's batch.
#: Until it exists, ``promote`` refuses the version without its override.
LABEL_FREE_VERDICT_TAG = "cord.label_free.verdict"
#: Version tag of a label-free candidate: the version whose graph it moved to new priors.
LABEL_FREE_SOURCE_TAG = "cord.label_free.source_version"


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


def name_filter(name: str) -> str:
    """The ``search_model_versions`` filter that selects registered model ``name``.

    MLflow's search grammar has no escape inside a string literal: the value is the text
    between the outer quotes, verbatim (``'o''brien'`` searches for ``o''brien``), and a
    literal may be single- or double-quoted. So the literal takes the quote the name does
    not hold. A name holding both kinds cannot be written as an equality at all; it becomes
    a ``LIKE`` pattern with each single quote as the one-character wildcard ``_``, which may
    also match other names (as may ``%`` or ``_`` in it): :func:`model_versions` keeps only
    the exact name.
    """
    if "'" not in name:
        return f"name = '{name}'"
    if '"' not in name:
        return f'name = "{name}"'
    return "name LIKE '{}'".format(name.replace("'", "_"))


def model_versions(client, name: str) -> list:
    """Every version of registered model ``name`` (none when the model does not exist)."""
    return [mv for mv in client.search_model_versions(name_filter(name)) if mv.name == name]


def _run_or_none(client, run_id: str | None):
    from mlflow.exceptions import MlflowException

    if not run_id:
        return None
    try:
        return client.get_run(run_id)
    except MlflowException:
        return None


def _owner_alive(run) -> bool:
    """Liveness of the process that owns ``run`` (see :mod:`flows.store.owner`); a run that no
    longer exists has no owner left."""
    if run is None:
        return False
    return owner.alive(run.data.tags, last_activity=run.info.start_time / 1000.0)


def mark_abandoned(client, run, why: str) -> None:
    """Mark ``run`` FAILED with a ``cord.error`` tag saying why (unless already FAILED)."""
    if run is None or run.info.status == "FAILED":
        return
    client.set_tag(run.info.run_id, ERROR_TAG, why)
    client.set_terminated(run.info.run_id, "FAILED")


def clean_up(client, name: str, experiment_id: str | None) -> list[str]:
    """Undo what dead owners left behind for model ``name``; returns what was done, in words.

    Called under the model's registry lock (:mod:`flows.store.lock`). Decides by liveness of
    the owning process (:func:`flows.store.owner.alive`), never by appearance, so a live
    concurrent run, wherever it is in its flow, is never touched:

    - a pending version of a dead owner: if it holds ``@champion`` the alias goes back to
      the champion recorded on the version at registration (or is removed when there was
      none); then the version is deleted and its run marked FAILED;
    - a RUNNING run of the model's experiment with a dead owner: marked FAILED with a
      ``cord.error`` tag saying it was abandoned;
    - a PENDING logged model whose source run's owner is dead: finalized as FAILED.
    """
    from mlflow.entities import LoggedModelStatus

    done: list[str] = []
    runs: dict[str, object] = {}

    def run_of(run_id):
        if run_id not in runs:
            runs[run_id] = _run_or_none(client, run_id)
        return runs[run_id]

    for mv in model_versions(client, name):
        if mv.tags.get(REGISTRATION_TAG) != PENDING:
            continue
        run = run_of(mv.run_id)
        if _owner_alive(run):
            continue
        version = str(mv.version)
        holder = champion_version(client, name)
        if holder is not None and str(holder.version) == version:
            previous = mv.tags.get(PREVIOUS_CHAMPION_TAG) or None
            if previous is not None and _version_exists(client, name, previous):
                client.set_registered_model_alias(name, CHAMPION, previous)
                done.append(f"@champion moved back from abandoned v{version} to v{previous}")
            else:
                client.delete_registered_model_alias(name, CHAMPION)
                done.append(f"@champion removed from abandoned v{version}")
        client.delete_model_version(name, version)
        done.append(f"deleted pending v{version} of a dead run")
        mark_abandoned(client, run, f"abandoned: its process died while v{version} was "
                                    "pending; the version was withdrawn by clean-up")
    if experiment_id is None:
        return done
    for run in client.search_runs([experiment_id], "attributes.status = 'RUNNING'"):
        if not _owner_alive(run):
            who = owner.Owner.from_record(run.data.tags)
            mark_abandoned(client, run, "abandoned: its process "
                                        f"({who.describe() if who else 'unknown'}) is gone")
            done.append(f"marked abandoned run {run.info.run_id} FAILED")
    for model in _pending_logged_models(client, experiment_id):
        if not _owner_alive(run_of(model.source_run_id)):
            client.finalize_logged_model(model.model_id, LoggedModelStatus.FAILED)
            done.append(f"marked pending logged model {model.model_id} FAILED")
    return done


def _pending_logged_models(client, experiment_id: str) -> list:
    """PENDING logged models of the experiment. Filtered here: the stores' search does not
    filter on status (``status = 'PENDING'`` matches nothing on MLflow 3.17)."""
    from mlflow.entities import LoggedModelStatus

    found, token = [], None
    while True:
        page = client.search_logged_models([experiment_id], page_token=token)
        found += [m for m in page if m.status == LoggedModelStatus.PENDING]
        token = page.token
        if not token:
            return found


def _version_exists(client, name: str, version: str) -> bool:
    from mlflow.exceptions import MlflowException

    try:
        client.get_model_version(name, version)
        return True
    except MlflowException:
        return False


def register_version(client, name: str, run_id: str, model_uri: str, model_id: str | None,
                     tags: dict[str, str], previous_champion: str | None):
    """Create the version of ``run_id``'s model, pending until :func:`complete_version`.

    ``previous_champion`` (the ``@champion`` read under the registry lock) is recorded on
    the version, so a clean-up after a crash knows where the alias goes back. Idempotent
    per run: when a version of this run already exists (a retried call whose first
    attempt reached the store), that version is returned.
    """
    ensure_registered_model(client, name)
    for mv in model_versions(client, name):
        if mv.run_id == run_id:
            return mv
    return client.create_model_version(
        name, source=model_uri, run_id=run_id, model_id=model_id,
        tags={**tags, REGISTRATION_TAG: PENDING,
              PREVIOUS_CHAMPION_TAG: previous_champion or ""},
    )


def run_registered_model(client, model_uri: str, scores: np.ndarray) -> dict[str, np.ndarray]:
    """Run the registered version ``models:/NAME/VERSION`` (or ``@ALIAS``) of ``client``'s
    store on ``scores``; returns every graph output by name (``repaired``, ``calibrated``,
    ``original``, ``label``, ``confidence``).

    Only the version's ONNX graph is downloaded, checked against the digest its run recorded
    and run by onnxruntime (:mod:`flows.store.graphs`); nothing stored with the model is
    executed, so this never goes through ``mlflow.pyfunc.load_model``.
    """
    from flows.store import graphs

    name, version = graphs.version_of(client, model_uri)
    return graphs.run_version(client, name, version, scores)


def record_decision(client, name: str, version: str, decision) -> None:
    """Record ``decision`` and both NLLs as tags of the (still pending) ``version``."""
    client.set_model_version_tag(name, version, DECISION_TAG, decision.label)
    client.set_model_version_tag(name, version, REASON_TAG, decision.reason)
    client.set_model_version_tag(name, version, CANDIDATE_NLL_TAG, repr(decision.candidate_nll))
    client.set_model_version_tag(name, version, CHAMPION_NLL_TAG, repr(decision.champion_nll))
    client.set_model_version_tag(name, version, CHAMPION_VERSION_TAG,
                                 str(decision.champion_version))
    client.set_model_version_tag(name, version, UNCALIBRATED_NLL_TAG,
                                 repr(decision.uncalibrated_nll))
    client.set_model_version_tag(name, version, HARMS_TAG, str(decision.harms).lower())


def move_alias(client, name: str, version: str, decision) -> None:
    """Point ``@champion`` at ``version`` when it was promoted (it is still pending: a crash
    from here until :func:`complete_version` is undone by :func:`clean_up`)."""
    if decision.promote:
        client.set_registered_model_alias(name, CHAMPION, version)


def complete_version(client, name: str, version: str) -> None:
    """The last write of a recalibration: the version is complete."""
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


def record_failure(client, entry: dict) -> None:
    """Write a failed run's record: withdraw its version if still there and pending, tag
    the run with ``cord.error`` and terminate it (FAILED, or KILLED on an interrupt).

    ``entry`` holds ``run_id``, ``model_name``, ``version``, ``previous_champion``,
    ``error`` and ``status``; the flow writes it at once, or the journal replays it.
    Safe to apply twice.
    """
    from mlflow.exceptions import MlflowException

    name, version = entry["model_name"], entry.get("version")
    if version is not None:
        try:
            mv = client.get_model_version(name, version)
        except MlflowException:
            mv = None
        if mv is not None and mv.run_id == entry["run_id"] and (
                mv.tags.get(REGISTRATION_TAG) == PENDING):
            withdraw_version(client, name, version, entry.get("previous_champion"))
    run = _run_or_none(client, entry["run_id"])
    if run is None:
        return
    client.set_tag(entry["run_id"], ERROR_TAG, redact(entry["error"])[:5000])
    client.set_terminated(entry["run_id"], entry.get("status", "FAILED"))

