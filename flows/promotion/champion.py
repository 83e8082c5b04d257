"""The registry side of the champion gate: scoring the registered ``@champion`` on a
candidate's evaluation split (:func:`score_champion`) and finding its pinned reference split
(:func:`champion_reference`), and the registered-model tags of champion health and history
(append-only; :func:`champion_timeline` reads it). The rules that weigh the scores are
:mod:`flows.promotion.rules`.
"""

from __future__ import annotations

import json
import math

import numpy as np

from cord_ops import data, metrics
from flows.errors import CordOpsError, in_words
from flows.promotion.rules import ChampionScore
from flows.store import reference, registry, retries

#: Registered-model tags.
HEALTH_TAG = "cord.champion.health"
HISTORY_TAG = "cord.champion.history"
HEALTHY = "ok"
#: Entries kept in the champion history (a tag value holds at most 100,000 characters).
HISTORY_LIMIT = 50


class ChampionUnhealthyError(CordOpsError, RuntimeError):
    """``@champion`` of a model cannot be scored; the registry needs an operator."""

    def __init__(self, model_name: str, version: str, problem: str, candidate: str | None = None):
        self.model_name, self.version, self.problem = model_name, version, problem
        extra = f"; candidate v{candidate} registered as rejected" if candidate else ""
        super().__init__(
            f"champion v{version} of '{model_name}' cannot be scored ({problem}){extra}; "
            f"fix with `cord-ops promote --model-name {model_name} --version N --reason TEXT` "
            f"or `cord-ops rollback --model-name {model_name}`")


def health_message(version: str, problem: str | None) -> str:
    """The value of :data:`HEALTH_TAG`: "ok" or "v<N> cannot be scored: <problem>"."""
    return HEALTHY if problem is None else f"v{version} cannot be scored: {problem}"[:5000]


def record_health(client, name: str, version: str, problem: str | None,
                  attempts: int = 3) -> None:
    """Set the registered-model health tag (only when it changes, to spare the store).

    Processes that write a model's first health tag at once race on MLflow's insert of
    the tag row (:func:`flows.store.retries.is_insert_race`): the loser reads the
    winner's value and writes again only when it still differs. Other errors propagate.
    """
    from mlflow.exceptions import MlflowException

    value = health_message(version, problem)
    for attempt in range(attempts):
        if client.get_registered_model(name).tags.get(HEALTH_TAG) == value:
            return
        try:
            client.set_registered_model_tag(name, HEALTH_TAG, value)
            return
        except MlflowException as exc:
            if not retries.is_insert_race(exc) or attempt == attempts - 1:
                raise


def read_history(client, name: str) -> list[dict]:
    """The champion history (oldest first), [] when never recorded or unreadable.

    Append-only: one row per move of ``@champion`` (``how``: ``gate``, ``promote`` or
    ``rollback``; ``version`` the new holder, ``from`` the previous one, ``by``, ``at``,
    ``reason``). Rows are never edited or removed, except the oldest beyond
    :data:`HISTORY_LIMIT` (the tag's size)."""
    return parse_history(client.get_registered_model(name).tags.get(HISTORY_TAG))


def parse_history(raw: str | None) -> list[dict]:
    """The rows of a :data:`HISTORY_TAG` value (:func:`read_history`), [] when unreadable."""
    try:
        history = json.loads(raw) if raw else []
    except json.JSONDecodeError:
        return []
    if not isinstance(history, list):
        return []
    return [h for h in history if isinstance(h, dict) and "version" in h]


def write_history(client, name: str, history: list[dict]) -> None:
    client.set_registered_model_tag(name, HISTORY_TAG,
                                    json.dumps(history[-HISTORY_LIMIT:], separators=(",", ":")))


def push_history(client, name: str, entry: dict) -> None:
    """Append one move of the alias. Written *before* the alias moves: a crash in between
    leaves a row for a version that never held it, which :func:`champion_timeline` drops
    (it is not the alias holder), never a champion missing from the history."""
    write_history(client, name, [*read_history(client, name), entry])


def champion_timeline(history: list[dict], holder: str | None) -> list[str]:
    """The versions that held ``@champion``, oldest first, ending at ``holder``.

    Each row adds its ``version``; the next row's ``from`` says whether that version
    really took the alias: when it names another version, the row was written and the
    alias move never happened (a crash in between), so that version is dropped, and a
    ``from`` not yet in the timeline (a champion from before the history, an alias set
    outside cord-ops) is added. Rows after the holder's last appearance never held the
    alias either; a holder missing from the history is the only entry. A rollback
    returns to the last entry before the holder, so a second rollback undoes the first.
    Rows without ``from`` (written before it was recorded) are taken as they stand.
    """
    timeline: list[str] = []
    unconfirmed = False  # the last entry came from a row no later row confirmed yet
    for row in history:
        if "from" in row:
            before = None if row["from"] is None else str(row["from"])
            if unconfirmed and timeline and timeline[-1] != before:
                timeline.pop()
            if before is not None and (not timeline or timeline[-1] != before):
                timeline.append(before)
        version = str(row["version"])
        if not timeline or timeline[-1] != version:
            timeline.append(version)
        unconfirmed = True
    if holder is None:
        return []
    if holder not in timeline:
        return [holder]
    return timeline[:len(timeline) - timeline[::-1].index(holder)]


def rollback_target(history: list[dict], holder: str | None, exists) -> str | None:
    """The version a rollback returns ``@champion`` to: the last champion before
    ``holder`` in the timeline (:func:`champion_timeline`) that still ``exists``
    (a predicate on a version string; versions deleted since are skipped), else None."""
    for candidate in reversed(champion_timeline(history, holder)[:-1]):
        if candidate != holder and exists(candidate):
            return candidate
    return None


# ---------------------------------------------------------------- scoring from the registry
def score_champion(client, name: str, champion: str | None, scores: np.ndarray,
                   labels: np.ndarray, input_kind: str) -> ChampionScore | None:
    """Run version ``champion`` of ``name`` (the ``@champion`` of the moment the candidate
    was registered) from the registry on ``scores`` and return its NLL.

    Addressing the version rather than the alias keeps a retried gate idempotent: once the
    alias has moved to the candidate, a retry still compares against the old champion.
    None when there was no champion. A champion that cannot run on the split (it reads
    another ``input_kind`` or K, a broken artifact, a foreign model) comes back with
    ``problem`` set, which the gate treats as a rejection and a health problem.
    """
    if champion is None:
        return None
    expected = client.get_model_version(name, champion).tags.get(registry.INPUT_KIND_TAG)
    if expected not in (None, input_kind):  # None: registered without the tag; try it
        return ChampionScore(champion, None, f"it reads {expected}, this split holds "
                                             f"{input_kind}")
    try:
        outputs = registry.run_registered_model(client, f"models:/{name}/{champion}",
                                                 scores)
        repaired = np.asarray(outputs["repaired"], dtype=np.float64)
        if repaired.shape != (len(labels), scores.shape[1]):
            raise ValueError(f"'repaired' has shape {repaired.shape}, expected "
                             f"{(len(labels), scores.shape[1])}")
        nll = metrics.nll(repaired, labels)
    except Exception as exc:  # any failure to score the champion is a reason to reject
        return ChampionScore(champion, None, in_words(exc)[:1000])
    if not math.isfinite(nll):
        return ChampionScore(champion, None, f"its NLL on this split is {nll!r}")
    return ChampionScore(champion, nll)


def champion_reference(client, name: str, champion: str | None, n_classes: int,
                       input_kind: str) -> tuple[data.Dataset | None, str | None]:
    """(the champion's pinned reference split, None) when it is available and compatible
    with a candidate of ``n_classes`` / ``input_kind``, else (None, why not)."""
    if champion is None:
        return None, None
    run_id = client.get_model_version(name, champion).run_id
    try:
        split = reference.load_reference_split(client, run_id)
    except reference.ReferenceUnavailable as exc:
        return None, f"unavailable: {exc}"
    if split.n_classes != n_classes or split.input_kind != input_kind:
        return None, (f"incompatible: it holds {split.n_classes} classes of {split.input_kind}, "
                      f"the candidate reads {n_classes} of {input_kind}")
    return split, None
