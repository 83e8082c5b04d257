"""The model registry side of a recalibration: register a version last, gate it against the
current ``@champion``, and clean up after crashes.

Life of a version
-----------------
1. :func:`register_version` creates it with the tag ``cord.registration=pending``, in the
   same call that creates it, after every artifact of its run is logged and ONNX parity is
   verified. A retried call finds the version of its own run instead of adding a second.
2. :func:`score_champion` runs the champion on the same evaluation split and
   :func:`decide` compares the two.
3. :func:`apply_decision` records the decision and both NLLs as version tags, moves the
   ``champion`` alias only for a winner, and finally marks the version ``complete``.

A process killed between 1 and 3 leaves a pending version that holds no alias. The next
registration of the same model deletes such versions from other runs
(:func:`discard_orphans`) and marks their runs FAILED, so a rerun leaves nothing orphaned.
A flow that fails after step 1 calls :func:`withdraw_version`, which puts the alias back
and deletes the version.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cord_ops import metrics

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


@dataclass(frozen=True)
class GateDecision:
    """Outcome of the champion gate.

    ``promote`` is True only when the candidate changes no top-1 decision (TPCR 0), its
    ONNX parity check passed and its NLL is no worse than the champion's on the same
    evaluation split (or there is no champion). ``champion_nll`` is None without a
    champion; ``reason`` says in words why.
    """

    promote: bool
    reason: str
    candidate_nll: float
    champion_nll: float | None
    champion_version: str | None

    @property
    def label(self) -> str:
        return "promoted" if self.promote else "rejected"


@dataclass(frozen=True)
class ChampionScore:
    """The current champion's version and its NLL on the candidate's evaluation split."""

    version: str
    nll: float | None
    problem: str | None = None


def decide(candidate_nll: float, candidate_tpcr: float, parity_ok: bool,
           champion: ChampionScore | None, promote: bool = True) -> GateDecision:
    """The champion gate as a pure function of the measured numbers.

    Rejects (never promotes) on a top-1 change, a failed parity check, a champion that could
    not be scored on the split, an NLL above the champion's, or ``promote=False``.
    """
    champion_nll = None if champion is None else champion.nll
    champion_version = None if champion is None else champion.version

    def verdict(ok: bool, reason: str) -> GateDecision:
        return GateDecision(ok, reason, float(candidate_nll), champion_nll, champion_version)

    if candidate_tpcr != 0.0:
        return verdict(False, f"repaired output changes top-1 decisions (TPCR {candidate_tpcr!r})")
    if not parity_ok:
        return verdict(False, "ONNX parity check failed")
    if champion is not None and champion.problem is not None:
        return verdict(False, f"champion v{champion.version} could not be scored on this "
                              f"evaluation split ({champion.problem})")
    if champion is not None and not candidate_nll <= champion.nll:
        return verdict(False, f"NLL {candidate_nll:.6g} is worse than champion "
                              f"v{champion.version}'s {champion.nll:.6g}")
    if not promote:
        return verdict(False, "gates passed but promotion is switched off (promote=False)")
    if champion is None:
        return verdict(True, "no champion yet; TPCR 0 and parity verified")
    return verdict(True, f"NLL {candidate_nll:.6g} <= champion v{champion.version}'s "
                         f"{champion.nll:.6g}; TPCR 0 and parity verified")


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


def run_registered_model(tracking_uri: str, model_uri: str,
                         scores: np.ndarray) -> dict[str, np.ndarray]:
    """Load a registered graph of the store at ``tracking_uri`` with
    ``mlflow.pyfunc.load_model`` (the path a serving system takes) and run it on ``scores``,
    fed in the dtype its signature declares. The model is downloaded explicitly from that
    store, not through MLflow's process-wide tracking URI."""
    import tempfile

    import mlflow.pyfunc

    from flows import tracking

    with tempfile.TemporaryDirectory(prefix="cord-ops-model-") as tmp:
        model = mlflow.pyfunc.load_model(str(tracking.download(tracking_uri, model_uri, tmp)))
    spec = model.metadata.get_input_schema().inputs[0]
    outputs = model.predict({spec.name: np.asarray(scores, dtype=spec.type)})
    return {name: np.asarray(value) for name, value in outputs.items()}


def score_champion(client, name: str, champion: str | None, scores: np.ndarray,
                   labels: np.ndarray, input_kind: str) -> ChampionScore | None:
    """Run version ``champion`` of ``name`` (the ``@champion`` of the moment the candidate
    was registered) from the registry on ``scores`` and return its NLL.

    Addressing the version rather than the alias keeps a retried gate idempotent: once the
    alias has moved to the candidate, a retry still compares against the old champion.
    None when there was no champion. A champion that cannot run on the split (it reads
    another ``input_kind`` or K, a broken artifact) comes back with ``problem`` set, which
    the gate treats as a rejection rather than a win.
    """
    if champion is None:
        return None
    expected = client.get_model_version(name, champion).tags.get(INPUT_KIND_TAG)
    if expected not in (None, input_kind):  # None: registered without the tag; try it
        return ChampionScore(champion, None, f"it reads {expected}, this split holds "
                                             f"{input_kind}")
    try:
        outputs = run_registered_model(client.tracking_uri, f"models:/{name}/{champion}",
                                       scores)
        nll = metrics.nll(outputs["repaired"].astype(np.float64), labels)
    except Exception as exc:  # any failure to score the champion is a reason to reject
        return ChampionScore(champion, None, f"{type(exc).__name__}: {exc}")
    return ChampionScore(champion, nll)


def apply_decision(client, name: str, version: str, decision: GateDecision) -> None:
    """Record ``decision`` on ``version``; move ``@champion`` there only if it was promoted.

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
