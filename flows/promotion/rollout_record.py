"""A staged rollout's state, kept in the registry: ``cord-ops rollout start | status |
abort`` write it, every ``cord-ops serve`` of the model follows it.

The state is one JSON record in the registered-model tag ``cord.rollout`` (schema 1) and
the alias ``@challenger`` on the candidate while the rollout is active; nothing lives in a
server process, so a rollout survives a restart of ``serve`` and every server of the model
follows the same plan and step. Record fields: ``id`` (salt of the sticky routing),
``version``, ``champion`` (the ``@champion`` it started against), ``plan``
(:class:`flows.promotion.rollout_steps.Plan`), ``budget``
(:class:`flows.promotion.rollout_steps.Budget`),
``step`` and ``step_started`` (epoch seconds), ``state`` (``active``, ``promoted``,
``rolled_back``, ``aborted``), ``revision`` (bumped by every write), who/when/why it
started, and ``events`` (every step change, the end and its reason).

Every write happens inside the model's registry section (:func:`flows.promotion.operations.
registry_section`, the lock recalibrations and ``promote`` take) and re-reads the record
first: a server moves a step only from the revision it judged (:func:`transition`), so
two servers that judge the same step at once move it once. The end of a passed rollout
moves ``@champion`` after :func:`flows.promotion.operations.check_promotable` and appends a
``rollout`` row (who started it, when, why and the evidence) to the champion history.
"""

from __future__ import annotations

import json
import time
import uuid

from flows.errors import CordOpsError
from flows.promotion import guards, operations
from flows.promotion.champion import push_history
from flows.promotion.rollout_steps import (  # noqa: F401 (the record's names, re-exported)
    ABORTED,
    ACTIVE,
    PROMOTED,
    ROLLED_BACK,
    ROLLOUT_TAG,
    SCHEMA,
    Budget,
    Plan,
    active_refusal,
    record_of,
)
from flows.store import registry

CHALLENGER = "challenger"
#: Events kept in the record (the tag holds at most 100,000 characters).
EVENT_LIMIT = 40
#: How long a server waits for the registry lock to move a step (a recalibration holds
#: it for seconds; the server retries at its next judgement).
SERVER_LOCK_TIMEOUT = 30.0


class RolloutRefused(CordOpsError, RuntimeError):
    """A rollout command cannot be carried out; the message says why, in one line."""


def read(client, name: str) -> dict | None:
    """The rollout record of ``name`` (the last one, active or ended), or None."""
    return record_of(client.get_registered_model(name).tags.get(ROLLOUT_TAG))


def plan_of(record: dict) -> Plan:
    p = record["plan"]
    plan = Plan(tuple(float(f) for f in p["fractions"]), int(p["min_requests"]),
                float(p["min_seconds"]))
    plan.check()
    return plan


def budget_of(record: dict) -> Budget:
    return Budget.from_dict(record["budget"])


def write(client, name: str, record: dict) -> None:
    """Store ``record`` as the model's rollout record (its revision bumped); callers hold
    the registry section."""
    record["revision"] = int(record.get("revision", 0)) + 1
    record["events"] = record["events"][-EVENT_LIMIT:]
    client.set_registered_model_tag(name, ROLLOUT_TAG,
                                    json.dumps(record, separators=(",", ":")))


def _event(record: dict, what: str, why: str, by: str) -> None:
    record["events"].append({"at": operations.now(), "by": by, "what": what,
                             "step": record["step"], "why": why[:500]})


def _drop_challenger(client, name: str, version: str) -> None:
    from mlflow.exceptions import MlflowException

    try:
        if str(client.get_model_version_by_alias(name, CHALLENGER).version) == str(version):
            client.delete_registered_model_alias(name, CHALLENGER)
    except MlflowException:
        pass  # already gone


# ---------------------------------------------------------------- operator commands
def start(client, uri: str, name: str, version: str, plan: Plan, budget: Budget,
          reason: str, allow_harm: bool = False, lock_timeout: float | None = None,
          allow_label_free: bool = False) -> dict:
    """Start a rollout of ``name`` v``version`` against the current ``@champion``.

    Refused (:class:`RolloutRefused`) while another rollout is active, without a champion,
    for the champion itself, for a version the gate found worse than the uncalibrated
    model (unless ``allow_harm``, the operator's explicit override) and for a version that
    fails :func:`flows.promotion.operations.check_promotable` (the checks its promotion will
    need: a broken graph is refused here, before any server loads it). A label-free
    candidate that no labels have judged passes that check only with ``allow_label_free``,
    which the record keeps so that the promotion at the end applies the same override."""
    version = str(version)
    plan.check()
    budget.check()
    if not reason or not reason.strip():
        raise RolloutRefused("--reason: say why this version should be rolled out")
    with operations.registry_section(client, uri, name, lock_timeout):
        busy = active_refusal(name, read(client, name))
        if busy is not None:
            raise RolloutRefused(busy)
        holder = registry.champion_version(client, name)
        if holder is None:
            raise RolloutRefused(f"{name} has no @champion to roll out against (use "
                                 f"`cord-ops promote --model-name {name} --version {version}`)")
        champion = str(holder.version)
        if champion == version:
            raise RolloutRefused(f"v{version} already holds @champion")
        try:
            operations.check_promotable(client, name, version, allow_label_free, allow_harm)
        except operations.PromotionRefused as exc:
            raise RolloutRefused(f"cannot roll out v{version}: {exc}") from None
        harms = guards.harms(client.get_model_version(name, version).tags)
        record = new_record(name, version, champion, plan, budget, reason,
                            operations.who(), harms_override=harms,
                            label_free_override=allow_label_free)
        warning = operations.champion_comparison(client, name, version, champion)
        if warning:
            record["warning"] = warning
        client.set_registered_model_alias(name, CHALLENGER, version)
        write(client, name, record)
    return record


def new_record(name: str, version: str, champion: str, plan: Plan, budget: Budget,
               reason: str, by: str, harms_override: bool = False,
               label_free_override: bool = False) -> dict:
    """A fresh active record at step 0 (not written; :func:`start` checks and writes it)."""
    record = {"schema": SCHEMA, "id": uuid.uuid4().hex[:12], "model": name,
              "version": str(version), "champion": str(champion),
              "plan": {"fractions": list(plan.fractions), "min_requests": plan.min_requests,
                       "min_seconds": plan.min_seconds},
              "budget": budget.to_dict(), "step": 0, "step_started": time.time(),
              "state": ACTIVE, "revision": 0, "started_by": by,
              "started_at": operations.now(), "reason": reason.strip()[:300],
              "harms_override": harms_override, "label_free_override": label_free_override,
              "events": []}
    _event(record, "start", f"{plan.describe(0)}; {reason.strip()}", by)
    return record


def abort(client, uri: str, name: str, reason: str | None = None,
          lock_timeout: float | None = None) -> dict:
    """End the active rollout of ``name``: servers stop routing to the candidate at their
    next poll; ``@champion`` is not touched."""
    text = reason.strip() if reason and reason.strip() else "no reason given"
    with operations.registry_section(client, uri, name, lock_timeout):
        record = read(client, name)
        if record is None or record["state"] != ACTIVE:
            raise RolloutRefused(f"{name}: no active rollout to abort")
        _end(client, name, record, ABORTED, f"aborted: {text}", operations.who())
    return record


def _end(client, name: str, record: dict, state: str, why: str, by: str) -> None:
    record["state"] = state
    record["ended_at"] = operations.now()
    record["outcome"] = why[:1000]
    _event(record, state, why, by)
    _drop_challenger(client, name, record["version"])
    write(client, name, record)


# ---------------------------------------------------------------- servers' moves
def transition(client, uri: str, name: str, rollout_id: str, revision: int, action: str,
               reason: str, by: str, lock_timeout: float = SERVER_LOCK_TIMEOUT) -> dict | None:
    """Carry out a server's judgement of step ``revision`` of rollout ``rollout_id``:
    ``advance`` to the next step, ``promote`` (the last step passed) or ``rollback``
    (``abort`` for a rollout whose champion moved). Returns the new record, or None when
    the record moved on meanwhile (another server judged first, an operator aborted):
    then the judgement is stale and nothing is written."""
    with operations.registry_section(client, uri, name, lock_timeout):
        record = read(client, name)
        if (record is None or record["id"] != rollout_id or record["state"] != ACTIVE
                or int(record["revision"]) != int(revision)):
            return None
        plan = plan_of(record)
        if action == "advance":
            record["step"] += 1
            record["step_started"] = time.time()
            _event(record, "advance", f"{reason} -> {plan.describe(record['step'])}", by)
            write(client, name, record)
        elif action == "rollback":
            _end(client, name, record, ROLLED_BACK, reason, by)
        elif action == "abort":
            _end(client, name, record, ABORTED, reason, by)
        elif action == "promote":
            _promote(client, name, record, reason, by)
        else:
            raise ValueError(f"action: expected advance, promote, rollback or abort, "
                             f"got {action!r}")
    return record


def _promote(client, name: str, record: dict, evidence: str, by: str) -> None:
    version = record["version"]
    holder = registry.champion_version(client, name)
    current = None if holder is None else str(holder.version)
    if current != record["champion"]:
        _end(client, name, record, ABORTED, f"@champion moved from v{record['champion']} to "
                                            f"v{current} during the rollout", by)
        return
    # Records written before an override existed have no such field: no override.
    allow = {"allow_label_free": bool(record.get("label_free_override", False)),
             "allow_harm": bool(record.get("harms_override", False))}
    try:
        operations.check_promotable(client, name, version, **allow)
    except operations.PromotionRefused as exc:
        _end(client, name, record, ROLLED_BACK, f"promotion refused: {exc}", by)
        return
    used = guards.overrides(client.get_model_version(name, version).tags, **allow)
    warning = record.get("warning")
    if warning:  # said at the start, said again where the promotion is recorded
        evidence = f"{evidence}; warning: {warning}"
    why = (f"rollout {record['id']} started by {record['started_by']} at "
           f"{record['started_at']} ({record['reason']}); {evidence}; carried out by {by}")
    # Before the alias, as every move of @champion (flows.promotion.champion.push_history).
    push_history(client, name, operations.history_row(
        version, current, "rollout", why, used, warning, by=record["started_by"],
        rollout=record["id"]))
    operations.move_champion(client, name, version, why, "rollout")
    _end(client, name, record, PROMOTED, evidence, by)


# ---------------------------------------------------------------- words
def describe(record: dict | None) -> str:
    """One line for ``status``: the rollout's state and step."""
    if record is None:
        return "none"
    plan = plan_of(record)
    steps = " -> ".join(plan.describe(i) for i in range(len(plan.fractions)))
    if record["state"] == ACTIVE:
        return (f"v{record['version']} vs v{record['champion']}: {plan.describe(record['step'])}"
                f" (step {record['step'] + 1}/{len(plan.fractions)}: {steps} -> promote; "
                f"id {record['id']}, started by {record['started_by']} at "
                f"{record['started_at']})")
    return (f"last: v{record['version']} {record['state']} at {record.get('ended_at')} "
            f"({record.get('outcome', '')})"[:400])


def format_record(record: dict | None) -> str:
    """``rollout status``: the record and its events, as text."""
    if record is None:
        return "rollout: none"
    plan, budget = plan_of(record), budget_of(record)
    lines = [f"rollout:  {record['id']} ({record['state']})",
             f"model:    {record['model']}  candidate v{record['version']}  champion "
             f"v{record['champion']}",
             f"step:     {record['step'] + 1}/{len(plan.fractions)} "
             f"{plan.describe(record['step'])}  (each step: >= {plan.min_requests} requests "
             f"compared and >= {plan.min_seconds:g} s)",
             f"budget:   error rate <= {budget.max_error_rate:g}, p99 <= "
             f"{budget.max_p99_ratio:g}x champion, |confidence shift| <= "
             f"{budget.max_confidence_shift:g}, top-1 agreement 100 %",
             f"started:  {record['started_at']} by {record['started_by']}: {record['reason']}"]
    if record["state"] != ACTIVE:
        lines.append(f"ended:    {record.get('ended_at')}: {record.get('outcome')}")
    lines.append("events:")
    lines += [f"  {e['at']} {e['what']:<11} step {e['step'] + 1} by {e['by']}: {e['why']}"
              for e in record["events"]]
    return "\n".join(lines)
