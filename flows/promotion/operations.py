"""What an operator does to a registered model by hand: see its state, promote a version,
roll ``@champion`` back.

- :func:`status` collects the champion, its health (registered-model tag
  ``cord.champion.health``) and the recent versions with their gate decisions, NLLs and
  reasons; :func:`format_status` prints them as a table. A version an operator moved the
  alias to reads ``operator`` (the gate's own decision follows in the reason); a gate
  decision marked ``!`` was worse than the uncalibrated model.
- :func:`promote` moves ``@champion`` to a version after the checks the gate relies on
  (:func:`check_promotable`): the version finished registration, its run verified ONNX
  parity and TPCR 0, it reads the K and input kind of the current champion, its graph is
  the file its run recorded (SHA-256, :mod:`flows.store.graphs`), and run from the
  registry on its own pinned reference split it still keeps every top-1 (its NLL there,
  the figure its gate and run recorded, is reported). Who, when and why are recorded as
  version tags and in the champion history (registered-model tag ``cord.champion.history``).
- :func:`rollback` returns ``@champion`` to the champion before the current one in that
  history, after the same checks. The history is append-only: every move (gate, promote,
  rollback) is a row.

Both alias moves run inside the model's registry section (:func:`registry_section`),
the lock recalibrations take between registration and the alias move.
"""

from __future__ import annotations

import getpass
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np

from cord_ops import metrics
from cord_ops.threshold import decisions
from cord_ops.validation import top1
from flows.errors import CordOpsError, in_words
from flows.promotion import guards
from flows.promotion.champion import (
    HEALTH_TAG,
    push_history,
    read_history,
    record_health,
    rollback_target,
)
from flows.promotion.rules import DEFAULT_NLL_TOLERANCE
from flows.store import graphs, reference, registry
from onnx_export import parity

PROMOTED_BY_TAG = "cord.promoted_by"
PROMOTED_AT_TAG = "cord.promoted_at"
PROMOTION_REASON_TAG = "cord.promotion_reason"


class PromotionRefused(CordOpsError, RuntimeError):
    """A version cannot take ``@champion``; the message says why, in one line."""


class _StderrLog:
    """The lock's waiting messages, for a command line (no Prefect logger here)."""

    def info(self, message: str, *args) -> None:
        print(message % args, file=sys.stderr, flush=True)

    warning = info


@contextmanager
def registry_section(client, uri: str, name: str,
                     timeout: float | None = None) -> Iterator[None]:
    """Hold the model's registry lock (:mod:`flows.store.lock`, the one recalibrations take from
    registration to the alias move) around an operator's alias move, so a promote or
    rollback never interleaves with a gate reading and moving ``@champion``."""
    from flows.platform import temporary_server
    from flows.store import lock, owner, tracking

    folder = tracking.local_store_folder(uri)
    kind = lock.choose(folder, temporary_server.configured_api_url())
    holder = {"run_id": None, "operator": who(), **owner.Owner.current().record()}
    with lock.registry_lock(kind, name, lock.DEFAULT_TIMEOUT if timeout is None else timeout,
                            _StderrLog(), holder, client=client, store_folder=folder):
        yield


def who() -> str:
    try:
        user = getpass.getuser()
    except Exception:  # no login name in a bare container
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


# ---------------------------------------------------------------- status
@dataclass(frozen=True)
class VersionRow:
    version: str
    aliases: str
    registration: str
    decision: str
    candidate_nll: str
    champion_nll: str
    reference_nll: str
    reason: str
    #: The gate found the version worse than the uncalibrated model (``!`` in the table).
    harms: bool = False


@dataclass(frozen=True)
class Status:
    name: str
    champion: str | None
    health: str
    history: list[dict]
    rows: list[VersionRow]
    rollout: dict | None = None
    #: the champion's calibrator family and how it was chosen (version tags
    #: ``cord.calibrator`` and ``cord.select.how``), or None without a champion
    family: str | None = None


def _short(value: str | None) -> str:
    if value in (None, "None", ""):
        return "-"
    try:
        return f"{float(value):.5f}"
    except ValueError:
        return value


def verdict(version: str, tags: dict, rollout: dict | None) -> tuple[str, str]:
    """(decision, reason) of a version as its registry tags and the model's last rollout
    record stand now, the latest word first: an operator's move of ``@champion`` to it
    (``operator``: promote, rollback or a rollout's promotion), a rollout of it under way
    or ended otherwise, the labels' verdict on a label-free candidate, else the gate's
    decision. The reason gives the standing word, then, after ``|``, the earlier ones."""
    gate = decision = tags.get(registry.DECISION_TAG, "-")
    reason = tags.get(registry.REASON_TAG, "-")
    words: list[str] = []  # the later words, newest first
    labelled = tags.get(registry.LABEL_FREE_VERDICT_TAG)
    if tags.get(registry.LABEL_FREE_TAG) == "true" and labelled:
        decision = "labels: better" if labelled.startswith("better") else "labels: no"
        words.append(f"labels: {labelled}")
    if rollout is not None and str(rollout.get("version")) == str(version):
        state = rollout.get("state")
        if state == "active":
            decision = "rolling out"
            words.insert(0, f"rollout {rollout.get('id')} under way")
        elif state != "promoted":  # a promoted rollout is the operator move below
            decision = "rolled back" if state == "rolled_back" else f"rollout {state}"
            words.insert(0, f"rollout {rollout.get('id')} {state} at "
                            f"{rollout.get('ended_at')}: {rollout.get('outcome')}")
    manual = tags.get(PROMOTED_BY_TAG)
    if manual:  # an operator moved the alias here: that is the decision that stands
        decision = "operator"
        words.insert(0, f"{tags.get(PROMOTION_REASON_TAG)} (by {manual} at "
                        f"{tags.get(PROMOTED_AT_TAG)})")
    if not words:
        return decision, reason
    return decision, " | ".join([*words, f"gate: {gate}: {reason}"])


def status(client, name: str, limit: int = 10, rollout: dict | None = None) -> Status:
    """The state of registered model ``name`` (raises LookupError when it does not exist);
    ``rollout``: its rollout record (:func:`flows.promotion.rollout_record.read`), whose outcome is
    part of its version's verdict (:func:`verdict`)."""
    from mlflow.exceptions import MlflowException

    try:
        model = client.get_registered_model(name)
    except MlflowException:
        raise LookupError(f"no registered model named '{name}'") from None
    holder = registry.champion_version(client, name)
    versions = sorted(registry.model_versions(client, name),
                      key=lambda mv: int(mv.version), reverse=True)[:limit]
    aliases: dict[str, list[str]] = {}
    for alias, version in model.aliases.items():
        aliases.setdefault(str(version), []).append(alias)
    rows = []
    for mv in versions:
        tags = mv.tags
        ref = "-"
        if tags.get("cord.gate.reference_version"):
            problem = tags.get("cord.gate.reference_problem", "none")
            ref = (f"{_short(tags.get('cord.gate.reference_candidate_nll'))} vs "
                   f"{_short(tags.get('cord.gate.reference_champion_nll'))}"
                   if problem == "none" else "not used")
        harms = guards.harms(tags)
        decision, reason = verdict(str(mv.version), tags, rollout)
        rows.append(VersionRow(
            str(mv.version), ",".join(sorted(aliases.get(str(mv.version), []))) or "-",
            tags.get(registry.REGISTRATION_TAG, "-"), decision + ("!" if harms else ""),
            _short(tags.get(registry.CANDIDATE_NLL_TAG)),
            _short(tags.get(registry.CHAMPION_NLL_TAG)), ref, reason, harms))
    family = None
    if holder is not None:
        tags = holder.tags or {}
        family = (f"{tags.get('cord.calibrator', 'unknown')} "
                  f"({tags.get('cord.select.how', 'how it was chosen is not recorded')})")
    return Status(name, None if holder is None else str(holder.version),
                  model.tags.get(HEALTH_TAG, "unknown (not checked yet)"),
                  read_history(client, name), rows, rollout, family)


def _fit(line: str, width: int | None) -> tuple[str, bool]:
    if width is None or len(line) <= width:
        return line, False
    return line[:max(width - 4, 1)] + " ...", True


def format_status(report: Status, width: int | None = None, rollout_line: str | None = None
                  ) -> str:
    """The status as text: a header, then one row per version (newest first). With
    ``width``, every line is cut to that many characters, and a last line says so (the
    JSON form, :func:`status_json`, has every word); ``rollout_line`` is the header's
    rollout line."""
    champion = "none" if report.champion is None else f"v{report.champion}"
    trail = " -> ".join(f"v{h['version']}" + (f" ({h['how']})" if h.get("how") not in
                                               (None, "gate") else "")
                        + (f" [{', '.join('--' + o for o in h['overrides'])}]"
                           if h.get("overrides") else "")
                        for h in report.history[-8:]) or "-"
    lines = [f"model:    {report.name}",
             f"champion: {champion}",
             *([f"family:   {report.family}"] if report.family is not None else []),
             f"health:   {report.health}",
             f"history:  {trail}",
             *([f"rollout:  {rollout_line}"] if rollout_line is not None else []),
             ""]
    header = ("version", "aliases", "state", "decision", "cand NLL", "champ NLL",
              "ref NLL (cand vs champ)", "reason")
    widths = (7, 9, 9, 15, 9, 9, 23)
    lines.append(" ".join(f"{h:<{w}}" for h, w in zip(header[:-1], widths, strict=True))
                 + " " + header[-1])
    lines.append("-" * (sum(widths) + len(widths) + 6))
    for row in report.rows:
        cells = (f"v{row.version}", row.aliases, row.registration, row.decision,
                 row.candidate_nll, row.champion_nll, row.reference_nll)
        lines.append(" ".join(f"{c:<{w}}" for c, w in zip(cells, widths, strict=True))
                     + " " + row.reason)
    if not report.rows:
        lines.append("(no versions)")
    if any(row.harms for row in report.rows):
        lines.append("! worse than the uncalibrated model (the gate's do-no-harm rule)")
    fitted = [_fit(line, width) for line in lines]
    out = [line for line, _ in fitted]
    if any(cut for _, cut in fitted):
        out.append(f"(lines cut at {width} characters; `--json` prints every word)")
    return "\n".join(out)


def status_json(report: Status) -> dict:
    """The status as one JSON object: every field of :func:`status`, uncut."""
    from dataclasses import asdict

    return asdict(report)


# ---------------------------------------------------------------- checks
def check_promotable(client, name: str, version: str, allow_label_free: bool = False,
                     allow_harm: bool = False) -> float:
    """The checks an alias move needs; returns the version's NLL on its reference split.

    First the guards of :mod:`flows.promotion.guards` on the version's tags: a label-free
    candidate no labels have judged needs ``allow_label_free``, a version the gate found
    worse than the uncalibrated model needs ``allow_harm``. Raises
    :class:`PromotionRefused` naming the first failed check.
    """
    from mlflow.exceptions import MlflowException

    try:
        mv = client.get_model_version(name, version)
    except MlflowException:
        raise PromotionRefused(f"{name} has no version {version}") from None
    tags = mv.tags
    problem = guards.refusal(version, tags, allow_harm=allow_harm,
                             allow_label_free=allow_label_free)
    if problem is not None:
        raise PromotionRefused(problem)
    if not mv.run_id:
        raise PromotionRefused(f"v{version} has no run to check")
    run = client.get_run(mv.run_id)
    logged = run.data.metrics
    dtype = run.data.tags.get("cord.dtype", "float32")
    diff, agreement = logged.get("onnx.max_abs_diff"), logged.get("onnx.argmax_agreement")
    tolerance = logged.get("onnx.tolerance",
                           parity.FIXED_PARITY_TOLERANCE.get(dtype, parity.FIXED_PARITY_TOLERANCE[
                               "float32"]))
    if diff is None or agreement is None or not (diff <= tolerance and agreement == 1.0):
        raise PromotionRefused(f"v{version}'s run did not verify ONNX parity "
                               f"(max abs diff {diff}, argmax agreement {agreement})")
    if logged.get("cord.tpcr") != 0.0:
        raise PromotionRefused(f"v{version} changes top-1 decisions "
                               f"(cord.tpcr {logged.get('cord.tpcr')})")
    kind = tags.get(registry.INPUT_KIND_TAG)
    holder = registry.champion_version(client, name)
    if holder is not None and str(holder.version) != str(version):
        held_kind = holder.tags.get(registry.INPUT_KIND_TAG)
        held_k = holder.tags.get(registry.N_CLASSES_TAG)
        k = tags.get(registry.N_CLASSES_TAG)
        if held_kind is not None and held_kind != kind:
            raise PromotionRefused(f"v{version} reads {kind} but @champion v{holder.version} "
                                   f"reads {held_kind}: its clients would send the wrong input")
        if held_k is not None and k is not None and held_k != k:
            raise PromotionRefused(f"v{version} reads {k} classes but @champion "
                                   f"v{holder.version} reads {held_k}")
    try:
        split = reference.load_reference_split(client, mv.run_id)
    except reference.ReferenceUnavailable as exc:
        raise PromotionRefused(f"v{version}: no reference split to check it on ({exc})") from None
    if kind is not None and split.input_kind != kind:
        raise PromotionRefused(f"v{version} reads {kind} but its reference split holds "
                               f"{split.input_kind}")
    # Integrity is the graph's digest, checked as it loads (a metric is no integrity check:
    # rounding moves it); the NLL is the served graph's on the split its gate measured.
    try:
        outputs = registry.run_registered_model(client, f"models:/{name}/{version}",
                                                 split.scores)
        repaired = np.asarray(outputs["repaired"], dtype=np.float64)
        nll = metrics.nll(repaired, split.labels)
    except graphs.GraphRejected as exc:
        raise PromotionRefused(str(exc)[:1000]) from None
    except Exception as exc:
        raise PromotionRefused(f"v{version} cannot be run from the registry "
                               f"({in_words(exc)})"[:1000]) from None
    # a version fitted to keep a binary decision threshold is held to the decisions at it
    t = tags.get("cord.decision_threshold")
    t = None if t is None else float(t)
    kept = (top1(split.scores) if t is None else decisions(split.probabilities(), t))
    if repaired.shape != split.scores.shape or not np.array_equal(decisions(repaired, t), kept):
        raise PromotionRefused(f"v{version} changes top-1 decisions on its reference split")
    return nll


def champion_comparison(client, name: str, version: str, champion: str | None) -> str | None:
    """A warning when ``version`` is worse than ``champion``, the version whose
    ``@champion`` it would take, on ``version``'s own reference split (the split its gate
    compared them on), else None. Both graphs run from the registry; a champion that
    cannot be run on that split (another K or input kind, a broken artifact: often why it
    is being replaced) gives no warning."""
    if champion is None or str(champion) == str(version):
        return None
    run_id = client.get_model_version(name, version).run_id
    try:
        split = reference.load_reference_split(client, run_id)
    except reference.ReferenceUnavailable:
        return None  # check_promotable refuses such a version before anything moves
    scores = {}
    for held in (str(version), str(champion)):
        try:
            outputs = registry.run_registered_model(client, f"models:/{name}/{held}",
                                                     split.scores)
            scores[held] = metrics.nll(np.asarray(outputs["repaired"], dtype=np.float64),
                                       split.labels)
        except Exception:  # a champion that cannot run is no better; the checks decide
            return None
    candidate, held = scores[str(version)], scores[str(champion)]
    if candidate <= held + DEFAULT_NLL_TOLERANCE * abs(held):  # the gate's "no worse"
        return None
    return (f"v{version} is worse than v{champion}, the champion it replaces: NLL "
            f"{candidate:.6g} vs {held:.6g} on v{version}'s reference split")


# ---------------------------------------------------------------- alias moves
def move_champion(client, name: str, version: str, reason: str, how: str) -> None:
    """Tag ``version`` with who/when/why and move the alias; health becomes ok (call it
    inside :func:`registry_section`, after :func:`flows.promotion.champion.push_history`)."""
    at, by = now(), who()
    client.set_model_version_tag(name, version, PROMOTED_BY_TAG, by)
    client.set_model_version_tag(name, version, PROMOTED_AT_TAG, at)
    client.set_model_version_tag(name, version, PROMOTION_REASON_TAG, f"{how}: {reason}"[:5000])
    client.set_registered_model_alias(name, registry.CHAMPION, version)
    record_health(client, name, version, None)


@dataclass(frozen=True)
class Move:
    """A hand move of ``@champion``: from, to, the overrides it relied on
    (:func:`flows.promotion.guards.overrides`), the warning of
    :func:`champion_comparison` (None when the new holder is no worse) and the new
    holder's NLL on its reference split (:func:`check_promotable`)."""

    previous: str | None
    version: str
    overrides: list[str]
    warning: str | None
    nll: float | None = None


def history_row(version: str, previous: str | None, how: str, reason: str,
                used: list[str], warning: str | None, by: str | None = None,
                **extra) -> dict:
    """One row of the champion history (:func:`flows.promotion.champion.read_history`),
    with the overrides the move used and its warning when there are any."""
    row = {"version": version, "from": previous, "how": how, "by": by or who(), "at": now(),
           "reason": reason[:300], **extra}
    if used:
        row["overrides"] = used
    if warning:
        row["warning"] = warning[:300]
    return row


def promote(client, uri: str, name: str, version: str, reason: str,
            lock_timeout: float | None = None, allow_label_free: bool = False,
            allow_harm: bool = False) -> Move:
    """Move ``@champion`` of ``name`` to ``version``.

    The operator's override of the gate: a version the gate rejected may be promoted, with
    a reason; one worse than the uncalibrated model only with ``allow_harm``, a label-free
    candidate not yet judged by labels only with ``allow_label_free``
    (:func:`check_promotable`); the history row names the overrides used and says when
    the version is worse than the champion it replaces. Raises :class:`PromotionRefused`
    when a check fails or ``reason`` is empty.
    """
    version = str(version)
    if not reason or not reason.strip():
        raise PromotionRefused("--reason: say why this version should serve")
    with registry_section(client, uri, name, lock_timeout):
        holder = registry.champion_version(client, name)
        previous = None if holder is None else str(holder.version)
        if previous == version:
            raise PromotionRefused(f"v{version} already holds @{registry.CHAMPION}")
        nll = check_promotable(client, name, version, allow_label_free, allow_harm)
        tags = client.get_model_version(name, version).tags
        used = guards.overrides(tags, allow_harm=allow_harm, allow_label_free=allow_label_free)
        warning = champion_comparison(client, name, version, previous)
        # Before the alias: see push_history.
        push_history(client, name, history_row(version, previous, "promote", reason, used,
                                                warning))
        move_champion(client, name, version, reason, "promote")
    return Move(previous, version, used, warning, nll)


def rollback(client, uri: str, name: str, reason: str | None = None,
             lock_timeout: float | None = None, allow_label_free: bool = False,
             allow_harm: bool = False) -> Move:
    """Return ``@champion`` of ``name`` to the champion before the current one in the
    history (:func:`flows.promotion.champion.champion_timeline`). The move is
    appended to the history as a ``rollback`` row, so a second rollback undoes the first
    (to go further back: ``promote --version N``). Versions deleted since are skipped; a
    target that fails :func:`check_promotable` refuses the rollback (say which, fix by
    ``promote``); a label-free candidate no labels have judged only with
    ``allow_label_free``, one worse than the uncalibrated model only with ``allow_harm``,
    as for ``promote``."""
    from mlflow.exceptions import MlflowException

    with registry_section(client, uri, name, lock_timeout):
        holder = registry.champion_version(client, name)
        current = None if holder is None else str(holder.version)
        def exists(version: str) -> bool:
            try:
                client.get_model_version(name, version)
            except MlflowException:
                return False  # deleted since it served
            return True

        target = rollback_target(read_history(client, name), current, exists)
        if target is None:
            raise PromotionRefused(f"{name}: no earlier champion recorded to roll back to "
                                   f"(use `cord-ops promote --model-name {name} --version N`)")
        try:
            nll = check_promotable(client, name, target, allow_label_free, allow_harm)
        except PromotionRefused as exc:
            raise PromotionRefused(f"cannot roll back to v{target}: {exc}") from None
        text = reason.strip() if reason and reason.strip() else "no reason given"
        tags = client.get_model_version(name, target).tags
        used = guards.overrides(tags, allow_harm=allow_harm, allow_label_free=allow_label_free)
        warning = champion_comparison(client, name, target, current)
        push_history(client, name, history_row(target, current, "rollback", text, used,
                                                warning))
        move_champion(client, name, target, text, f"rollback from v{current}")
    return Move(current, target, used, warning, nll)
