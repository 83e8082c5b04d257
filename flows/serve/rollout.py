"""The serving side of a staged rollout: ``cord-ops serve`` follows the model's rollout
record (:mod:`flows.promotion.rollout_record`) beside ``@champion``.

- A :class:`RolloutController` thread reads the record every poll interval, loads and
  verifies the candidate as the follower loads a champion
  (:func:`flows.serve.served_model.load_version`: a graph that fails to load or verify is
  never served, and ends the rollout), and judges the current step several times a second with
  :func:`flows.promotion.rollout_steps.decide`; a step change, the promotion and a rollback are
  written back through :func:`flows.promotion.rollout_record.transition` (registry lock,
  compare on the record's revision), so every server of the model moves together.
- **Shadow** (the step's fraction is 0): the champion answers; the request's rows and
  answer are put on a bounded queue (``--shadow-queue``) *after* the answer is ready, and a
  worker thread scores them with the candidate and compares (top-1, max |diff|,
  confidence, invariants). A full queue drops the copy and counts it: shadow work never
  waits on, or slows the answer to, a request beyond sharing the CPU.
- **Canary**: a request whose key (header ``X-Rollout-Key``, else the client's address)
  hashes under the step's fraction (:func:`flows.promotion.rollout_steps.routes_to_candidate`) is
  answered by the candidate (batched on a worker thread of its own, :data:`CANDIDATE_LANE`,
  so a slow candidate delays only its callers and the p99 ratio sees it), after the
  answer passed the invariants every repaired answer
  keeps (finite, sums to 1, keeps its input's top-1); an answer that fails them, or a
  candidate error, is replaced by the champion's answer (the request never fails) and is
  a breach that rolls the rollout back. The champion scores a copy of each candidate
  answer off the request's path for the agreement figures.
- A candidate deleted from the registry, or whose model files are gone from the artifact
  store, is rolled back at the next poll (it could not be promoted, and only the servers
  that loaded it before could still serve it).
- Every answer names the one version that produced it; ``/rollout`` and ``/metrics``
  expose the figures per version.

Nothing is process-wide: the controller's metrics live in the server's registry.
"""

from __future__ import annotations

import collections
import queue
import sys
import threading
import time
from dataclasses import dataclass, field, replace

import numpy as np

from flows.promotion import rollout_record, rollout_steps
from flows.promotion.rollout_steps import Budget, Decision, Figures, Plan
from flows.serve.served_model import OUTPUTS, VersionRejected, load_version

KEY_HEADER = "X-Rollout-Key"
#: The candidate's micro-batching lane (its own worker thread: a slow candidate run does
#: not hold up the champion's answers; flows.serve.batcher.MicroBatcher).
CANDIDATE_LANE = "candidate"
DEFAULT_SHADOW_QUEUE = 1024
#: Seconds between judgements of the current step (a breach is acted on within this).
JUDGE_INTERVAL = 0.25
#: Latency samples kept per version and step for the p99 (the most recent).
LATENCY_WINDOW = 20_000
#: Rows the shadow worker scores in one onnxruntime run.
SHADOW_BATCH_ROWS = 4096
#: After a canary step has its minimum comparisons, one canary answer in this many is
#: still compared with the champion's.
MIRROR_EVERY = 10
#: Niceness of the shadow worker thread (Linux threads carry their own): shadow scoring
#: yields the CPU to the threads answering requests.
SHADOW_NICENESS = 10
#: Input values a disagreement's log line shows (the row can have K = 1000 columns).
LOGGED_VALUES = 12


def _log(message: str) -> None:
    print(f"cord-ops serve: rollout: {message}", file=sys.stderr, flush=True)


class StepStats:
    """What this server saw at one step; written by request handlers and the shadow
    worker, read by the judge (one lock)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.attempts = self.requests = self.errors = self.rows = 0
        self.disagreements = self.dropped = 0
        self.max_abs_diff = 0.0
        self.confidence_diff_sum = 0.0
        self.latency = {"candidate": collections.deque(maxlen=LATENCY_WINDOW),
                        "champion": collections.deque(maxlen=LATENCY_WINDOW)}

    def attempt(self) -> None:
        with self._lock:
            self.attempts += 1

    def error(self) -> None:
        with self._lock:
            self.errors += 1

    def drop(self) -> None:
        with self._lock:
            self.dropped += 1

    def timed(self, role: str, seconds: float) -> None:
        with self._lock:
            self.latency[role].append(seconds)

    def disagreed(self, rows: int, of_rows: int) -> None:
        """``rows`` of ``of_rows`` changed their decision in an answer that was not
        compared with the champion's (a canary answer replaced before it was sent)."""
        with self._lock:
            self.disagreements += rows
            self.rows += of_rows

    def compared(self, comparison: rollout_steps.Comparison) -> None:
        with self._lock:
            self.requests += 1
            self.rows += comparison.rows
            self.disagreements += len(comparison.disagreeing)
            self.max_abs_diff = max(self.max_abs_diff, comparison.max_abs_diff)
            self.confidence_diff_sum += comparison.confidence_diff_sum

    def figures(self) -> Figures:
        with self._lock:
            p99 = {role: float(np.percentile(np.fromiter(v, float), 99)) if v else None
                   for role, v in self.latency.items()}
            return Figures(requests=self.requests, errors=self.errors,
                           attempts=self.attempts, rows=self.rows,
                           disagreements=self.disagreements, max_abs_diff=self.max_abs_diff,
                           confidence_shift=(self.confidence_diff_sum / self.rows
                                             if self.rows else 0.0),
                           candidate_p99=p99["candidate"], champion_p99=p99["champion"],
                           candidate_latency_samples=len(self.latency["candidate"]),
                           champion_latency_samples=len(self.latency["champion"]),
                           dropped=self.dropped)


@dataclass(frozen=True, eq=False)
class ActiveStep:
    """The step this server routes by; replaced whole (one reference) on every change."""

    rollout_id: str
    revision: int
    index: int
    plan: Plan
    budget: Budget
    started: float
    champion: str
    candidate: object  # flows.serve.served_model.ServedModel
    stats: StepStats = field(default_factory=StepStats)
    #: The rollout ended promoted: keep routing at this step until the follower serves the
    #: candidate as champion, and judge no more.
    final: bool = False

    @property
    def fraction(self) -> float:
        return self.plan.fractions[self.index]


@dataclass(eq=False)
class _Copy:
    """A request's rows and answer, for the other version to score off the path."""

    step: ActiveStep
    target: object  # the ServedModel that scores the copy
    scores: np.ndarray
    answer: dict
    answered_by: str  # "champion" or "candidate"
    key: str


def repaired_sum_tolerance(model) -> float:
    """How far a repaired row may sum from 1 (as :func:`flows.serve.served_model.verify` allows)."""
    from onnx_export.parity import FIXED_PARITY_TOLERANCE

    return max(FIXED_PARITY_TOLERANCE[str(model.contract.dtype)], 1e-6) * \
        model.contract.n_classes


def _as_input(model, scores: np.ndarray) -> np.ndarray | None:
    """``scores`` in ``model``'s input dtype (versions may differ in float type), or None
    when a value does not fit it."""
    if scores.dtype == model.contract.dtype:
        return scores
    with np.errstate(over="ignore"):
        cast = scores.astype(model.contract.dtype)
    return cast if np.isfinite(cast).all() else None


def _row_text(values) -> str:
    """An input row for a log line (its first :data:`LOGGED_VALUES` values)."""
    values = np.asarray(values, dtype=np.float64)
    shown = ", ".join(f"{v:.6g}" for v in values[:LOGGED_VALUES])
    more = f", ... ({values.size} values)" if values.size > LOGGED_VALUES else ""
    return f"input [{shown}{more}]"


def _threshold(model) -> float | None:
    """The binary decision threshold ``model`` keeps (its verification read it from the
    graph's metadata), or None for the argmax."""
    return (getattr(model, "verification", None) or {}).get("decision_threshold")


def _changed_decisions(outputs: dict, scores: np.ndarray, model=None) -> int:
    """Rows whose repaired top-1 or label is not the input's top-1 (the decisions at the
    binary threshold ``model`` keeps, where it keeps one)."""
    repaired = np.asarray(outputs["repaired"])
    if repaired.shape != scores.shape:
        return 0
    t = _threshold(model)
    top = rollout_steps.decisions(scores, t, "probs" if model is None
                                  else model.contract.input_kind)
    return int(np.count_nonzero((rollout_steps.decisions(repaired, t) != top)
                                | (np.asarray(outputs["label"]) != top)))


class RolloutController:
    """Follows the rollout record of the follower's model; see the module docstring."""

    def __init__(self, follower, metrics, queue_size: int = DEFAULT_SHADOW_QUEUE,
                 judge_interval: float = JUDGE_INTERVAL):
        from prometheus_client import Counter, Gauge

        from flows.store import tracking

        self.follower, self.metrics = follower, metrics
        self.client = tracking.client(follower.tracking_uri)
        self.name, self.judge_interval = follower.name, judge_interval
        self.step: ActiveStep | None = None
        self.record: dict | None = None
        self.decision: Decision | None = None
        self.last_error: str | None = None
        self._candidate = None
        self._condemned: dict[str, tuple[int, str, str]] = {}  # id -> (revision, action, why)
        self._queue: queue.Queue[_Copy] = queue.Queue(maxsize=queue_size)
        self.queue_size = queue_size
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._threads = [threading.Thread(target=self._follow, name="rollout-follower",
                                          daemon=True),
                         threading.Thread(target=self._shadow, name="rollout-shadow",
                                          daemon=True)]
        r = metrics.registry
        self.answers = Counter("cord_serve_answers", "Answers by the version that produced "
                               "them", ["version"], registry=r)
        self.shadow_scored = Counter("cord_rollout_shadow_scored", "Request copies scored "
                                     "off the request path, by the version scoring them",
                                     ["version"], registry=r)
        self.shadow_dropped = Counter("cord_rollout_shadow_dropped", "Request copies dropped "
                                      "because the shadow queue was full", registry=r)
        self.disagreements = Counter("cord_rollout_disagreements", "Rows on which the "
                                     "candidate's top-1 differs from the champion's",
                                     ["version"], registry=r)
        self.candidate_errors = Counter("cord_rollout_candidate_errors", "Candidate requests "
                                        "that failed or broke an invariant", ["version"],
                                        registry=r)
        self.fallbacks = Counter("cord_rollout_fallbacks", "Canary requests answered by the "
                                 "champion because the candidate's answer failed", registry=r)
        self.fraction = Gauge("cord_rollout_fraction", "Share of requests the candidate "
                              "answers (0: shadow; -1: no rollout)", registry=r)
        self.p99 = Gauge("cord_rollout_p99_seconds", "p99 scoring time at the current step",
                         ["version"], registry=r)
        self.compared = Gauge("cord_rollout_compared_requests", "Candidate requests compared "
                              "with the champion at the current step", registry=r)
        self.confidence_shift = Gauge("cord_rollout_confidence_shift", "Mean candidate minus "
                                      "champion confidence at the current step", registry=r)
        self.max_abs_diff = Gauge("cord_rollout_max_abs_diff", "Largest |candidate - "
                                  "champion| repaired probability at the current step",
                                  registry=r)
        self.fraction.set(-1)

    # ------------------------------------------------------------ lifecycle
    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    @staticmethod
    def key(request) -> str:
        """The sticky routing key of a request: ``X-Rollout-Key``, else its client host."""
        given = request.headers.get(KEY_HEADER)
        if given:
            return given
        return f"client:{request.client.host}" if request.client else ""

    # ------------------------------------------------------------ request path
    async def score(self, batcher, champion, scores: np.ndarray, key: str):
        """(outputs, the ServedModel that produced them) for one request."""
        step = self.step
        if step is None or step.champion != champion.version:
            outputs = await batcher.score(champion, scores)
            self.answers.labels(champion.version).inc()
            return outputs, champion
        candidate = step.candidate
        if step.fraction > 0.0 and rollout_steps.routes_to_candidate(key, step.rollout_id,
                                                                     step.fraction):
            answer = await self._canary(batcher, step, candidate, scores, key)
            if answer is not None:
                if self._mirror(step):
                    self._offer(_Copy(step, champion, scores, answer, "candidate", key))
                self.answers.labels(candidate.version).inc()
                return answer, candidate
            self.fallbacks.inc()
        began = time.perf_counter()
        outputs = await batcher.score(champion, scores)
        step.stats.timed("champion", time.perf_counter() - began)
        if step.fraction == 0.0:
            self._offer(_Copy(step, candidate, scores, outputs, "champion", key))
        self.answers.labels(champion.version).inc()
        return outputs, champion

    async def _canary(self, batcher, step: ActiveStep, candidate, scores: np.ndarray,
                      key: str) -> dict | None:
        """The candidate's answer when it keeps every invariant, else None (recorded)."""
        step.stats.attempt()
        began = time.perf_counter()
        problem = None
        rows = _as_input(candidate, scores)
        if rows is None:
            return None  # not the candidate's fault: a value its float type cannot hold
        try:
            outputs = await batcher.score(candidate, rows, lane=CANDIDATE_LANE)
        except Exception as exc:  # any failure of the candidate is its breach
            problem = f"{type(exc).__name__}: {exc}"
        else:
            ok = rollout_steps.self_consistent(outputs, scores, repaired_sum_tolerance(candidate),
                                               _threshold(candidate),
                                               candidate.contract.input_kind)
            if ok.all():
                step.stats.timed("candidate", time.perf_counter() - began)
                return outputs
            row = int(np.flatnonzero(~ok)[0])
            problem = f"answer breaks an invariant on row {row}: {_row_text(scores[row])}"
            changed = _changed_decisions(outputs, scores, candidate)
            if changed:  # a decision that is not the input's top-1: a disagreement
                step.stats.disagreed(changed, scores.shape[0])
                self.disagreements.labels(candidate.version).inc(changed)
        step.stats.error()
        self.candidate_errors.labels(candidate.version).inc()
        _log(f"v{candidate.version} failed a canary request (key {key!r}): {problem}"[:1000])
        self._wake.set()
        return None

    @staticmethod
    def _mirror(step: ActiveStep) -> bool:
        """Whether the champion scores a copy of this canary answer: every one until the
        step has its ``min_requests`` comparisons, then one in :data:`MIRROR_EVERY`. Each
        canary answer has already been checked against its input's top-1 before it was
        sent (so agreement holds for all of them); the copies add the paired figures
        (confidence shift, max |diff|) and cost the champion's CPU."""
        stats = step.stats
        return stats.requests < step.plan.min_requests or stats.attempts % MIRROR_EVERY == 0

    def _offer(self, copy: _Copy) -> None:
        try:
            self._queue.put_nowait(copy)
        except queue.Full:
            copy.step.stats.drop()
            self.shadow_dropped.inc()

    # ------------------------------------------------------------ shadow worker
    def _shadow(self) -> None:
        import os

        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), SHADOW_NICENESS)
        except (AttributeError, OSError):  # not Linux, or not allowed: run at normal priority
            pass
        while not self._stop.is_set():
            try:
                first = self._queue.get(timeout=0.5)
            except queue.Empty:
                continue
            batch, rows = [first], first.scores.shape[0]
            while rows < SHADOW_BATCH_ROWS:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                batch.append(item)
                rows += item.scores.shape[0]
            groups: dict[tuple[int, int], list[_Copy]] = {}
            for item in batch:
                groups.setdefault((id(item.step), id(item.target)), []).append(item)
            for items in groups.values():
                self._score_copies(items)

    def _score_copies(self, items: list[_Copy]) -> None:
        from onnx_export.runtime import run_host

        target, step = items[0].target, items[0].step
        cast = [_as_input(target, i.scores) for i in items]
        keep = [(i, c) for i, c in zip(items, cast, strict=True) if c is not None]
        if not keep:
            return
        began = time.perf_counter()
        try:
            stacked = np.concatenate([c for _, c in keep]) if len(keep) > 1 else keep[0][1]
            values = run_host(target.session, stacked, list(OUTPUTS))
            failure = None
        except Exception as exc:  # the candidate failing in shadow is its breach
            values, failure = None, f"{type(exc).__name__}: {exc}"
        elapsed = time.perf_counter() - began
        self.shadow_scored.labels(target.version).inc(len(keep))
        shadowing = step.fraction == 0.0  # the candidate scores the copies
        if failure is not None:
            if shadowing:
                for _ in keep:
                    step.stats.attempt()
                    step.stats.error()
                self.candidate_errors.labels(target.version).inc(len(keep))
                _log(f"v{target.version} failed in shadow: {failure}"[:1000])
                self._wake.set()
            else:
                _log(f"champion v{target.version} failed scoring a canary copy: {failure}")
            return
        start = 0
        for item, rows in keep:
            stop = start + rows.shape[0]
            other = {n: v[start:stop] for n, v in zip(OUTPUTS, values, strict=True)}
            start = stop
            champion_out, candidate_out = ((item.answer, other) if shadowing
                                           else (other, item.answer))
            if shadowing:
                step.stats.attempt()
                step.stats.timed("candidate", elapsed)
                ok = rollout_steps.self_consistent(candidate_out, item.scores,
                                                   repaired_sum_tolerance(target),
                                                   _threshold(target),
                                                   target.contract.input_kind)
                if not ok.all():
                    step.stats.error()
                    self.candidate_errors.labels(target.version).inc()
            # the candidate's threshold for both: a champion keeping another one answers
            # other labels, a disagreement either way (the gate's rule 7 keeps them equal)
            t = _threshold(step.candidate)
            comparison = rollout_steps.compare(champion_out, candidate_out, (t, t))
            step.stats.compared(comparison)
            if comparison.disagreeing:
                self.disagreements.labels(step.candidate.version).inc(
                    len(comparison.disagreeing))
                self._log_disagreement(step, item, comparison, champion_out, candidate_out)
                self._wake.set()

    def _log_disagreement(self, step, item, comparison, champion_out, candidate_out) -> None:
        row = comparison.disagreeing[0]
        _log(f"v{step.candidate.version} disagrees with champion v{step.champion} on row "
             f"{row} of a request (key {item.key!r}; {len(comparison.disagreeing)} rows): "
             f"champion top-1 {int(rollout_steps.decisions(champion_out['repaired'])[row])}, "
             f"candidate top-1 {int(rollout_steps.decisions(candidate_out['repaired'])[row])}"
             f" (label {int(candidate_out['label'][row])}); {_row_text(item.scores[row])}")

    # ------------------------------------------------------------ following the record
    def _follow(self) -> None:
        last_read = -float("inf")
        while not self._stop.is_set():
            if time.monotonic() - last_read >= self.follower.interval:
                last_read = time.monotonic()
                try:
                    self.refresh()
                except Exception as exc:  # the store is down: keep the step we have
                    self._failed("reading the rollout record", exc)
            try:
                self.judge()
            except Exception as exc:  # a failed write is retried at the next judgement
                self._failed("moving the rollout", exc)
            self._wake.wait(self.judge_interval)
            self._wake.clear()

    def _failed(self, what: str, exc: BaseException) -> None:
        message = f"{what}: {type(exc).__name__}: {exc}".splitlines()[0][:500]
        if message != self.last_error:
            _log(message)
        self.last_error = message

    def refresh(self) -> None:
        """Read the record and make :attr:`step` follow it (loading the candidate)."""
        from flows.store import registry

        record = rollout_record.read(self.client, self.name)
        self.record = record
        self.last_error = None
        served = self.follower.current
        step = self.step
        if record is None or record["state"] != rollout_record.ACTIVE:
            if (record is not None and record["state"] == rollout_record.PROMOTED
                    and step is not None and step.rollout_id == record["id"]
                    and (served is None or served.version != record["version"])):
                self.step = replace(step, final=True) if not step.final else step
            else:
                if step is not None and record is not None and step.rollout_id == record["id"]:
                    # ended elsewhere (an operator's abort, another server's judgement):
                    # say so once, as a judgement of this server's own is said
                    _log(f"rollout {record['id']} (v{record['version']}) ended elsewhere: "
                         f"{record['state'].replace('_', ' ')}"
                         f"{': ' + record['outcome'] if record.get('outcome') else ''}; "
                         "the champion answers every request"[:1000])
                self._set_step(None)
            return
        if record["id"] in self._condemned:
            return  # judged; the transition is retried by judge()
        holder = registry.champion_version(self.client, self.name)
        if holder is None or str(holder.version) != record["champion"]:
            now = None if holder is None else str(holder.version)
            self._condemn(record, "abort", f"@champion moved from v{record['champion']} to "
                                           f"v{now} during the rollout")
            return
        gone = self._candidate_gone(record["version"])
        if gone is not None:
            self._condemn(record, "rollback", gone)
            return
        if served is None or served.version != record["champion"]:
            self._set_step(None)  # the follower has not caught up with the champion yet
            return
        if self._candidate is None or self._candidate.version != record["version"]:
            try:
                self._candidate = load_version(self.client, self.follower.tracking_uri,
                                               self.name, record["version"],
                                               provider=self.follower.provider)
            except VersionRejected as exc:
                self._condemn(record, "rollback", f"candidate not served: {exc}")
                return
            _log(f"loaded candidate v{record['version']} for rollout {record['id']}")
        candidate = self._candidate
        if (candidate.contract.n_classes, candidate.contract.input_kind) != (
                served.contract.n_classes, served.contract.input_kind):
            self._condemn(record, "rollback", f"candidate v{candidate.version} reads "
                          f"{candidate.contract.n_classes} {candidate.contract.input_kind}, "
                          f"champion v{served.version} reads {served.contract.n_classes} "
                          f"{served.contract.input_kind}")
            return
        if step is None or (step.rollout_id, step.revision) != (record["id"],
                                                                record["revision"]):
            self._set_step(ActiveStep(record["id"], int(record["revision"]), int(record["step"]),
                                      rollout_record.plan_of(record),
                                      rollout_record.budget_of(record),
                                      float(record["step_started"]), record["champion"],
                                      candidate))
            _log(f"v{candidate.version} vs v{record['champion']}: "
                 f"{self.step.plan.describe(self.step.index)} (rollout {record['id']})")

    def _candidate_gone(self, version: str) -> str | None:
        """Why the candidate can no longer be promoted, when its version was deleted from
        the registry or its model files from the artifact store (a server that loaded it
        would otherwise go on serving it from memory, and a restarted one fail to load it
        at every poll); None while it is there. Any other store error propagates: an
        outage is retried at the next poll, not a reason to end the rollout."""
        import mlflow.artifacts
        from mlflow.exceptions import MlflowException

        try:  # where flows.store.graphs.fetch_graph reads the model files
            location = self.client.get_model_version_download_uri(self.name, version)
        except MlflowException as exc:
            if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
                return f"candidate v{version} was deleted from the registry during the rollout"
            raise
        files = mlflow.artifacts.list_artifacts(artifact_uri=location,
                                                tracking_uri=self.follower.tracking_uri)
        if not any(f.path.rsplit("/", 1)[-1] == "MLmodel" for f in files or ()):
            return (f"candidate v{version}'s model files are gone from the artifact store "
                    f"(no MLmodel under {location})")
        return None

    def _set_step(self, step: ActiveStep | None) -> None:
        self.step = step
        self.fraction.set(-1 if step is None else step.fraction)

    def _condemn(self, record: dict, action: str, why: str) -> None:
        """Stop routing to the candidate now; the registry write follows (and is retried)."""
        self._set_step(None)
        self._condemned[record["id"]] = (int(record["revision"]), action, why)
        _log(f"{action} of rollout {record['id']} (v{record['version']}): {why}"[:1000])
        self._wake.set()

    def judge(self) -> None:
        """Judge the current step; carry out a decision (or a pending condemnation)."""
        from flows.promotion import operations
        by = f"cord-ops serve on {operations.who()}"
        for rollout_id, (revision, action, why) in list(self._condemned.items()):
            moved = rollout_record.transition(self.client, self.follower.tracking_uri, self.name,
                                              rollout_id, revision, action, why, by)
            if moved is None:
                current = rollout_record.read(self.client, self.name)
                if (current is not None and current["id"] == rollout_id
                        and current["state"] == rollout_record.ACTIVE):
                    # Another server moved the step meanwhile: the breach seen here still
                    # ends the rollout, at the revision it has now (next judgement).
                    self._condemned[rollout_id] = (int(current["revision"]), action, why)
                    continue
            del self._condemned[rollout_id]  # written, or someone else ended it
            self.refresh()
        step = self.step
        if step is None or step.final:
            return
        figures = step.stats.figures()
        self._publish(step, figures)
        decision = rollout_steps.decide(step.plan, step.index, time.time() - step.started,
                                        figures, step.budget)
        self.decision = decision
        if decision.action == "hold":
            return
        if decision.action == "rollback":
            self._condemn({"id": step.rollout_id, "revision": step.revision,
                           "version": step.candidate.version}, "rollback", decision.reason)
            return self.judge()
        self.step = replace(step, final=True)  # no second judgement while writing
        try:
            moved = rollout_record.transition(self.client, self.follower.tracking_uri, self.name,
                                              step.rollout_id, step.revision, decision.action,
                                              decision.reason, by)
        except Exception:
            self.step = step
            raise
        if moved is not None:  # a promotion's outcome carries its warning, if any
            _log(f"{decision.action}: {moved.get('outcome') or decision.reason}"[:1000])
        if self.step is not None and self.step.rollout_id == step.rollout_id:
            self.step = step  # refresh() decides from the record what follows
        self.refresh()

    def _publish(self, step: ActiveStep, figures: Figures) -> None:
        self.compared.set(figures.requests)
        self.confidence_shift.set(figures.confidence_shift)
        self.max_abs_diff.set(figures.max_abs_diff)
        for version, value in ((step.candidate.version, figures.candidate_p99),
                               (step.champion, figures.champion_p99)):
            if value is not None:
                self.p99.labels(version).set(value)

    # ------------------------------------------------------------ /rollout
    def describe(self) -> dict:
        step = self.step
        local = None
        if step is not None:
            local = {"rollout": step.rollout_id, "step": step.index,
                     "step_name": step.plan.describe(step.index), "fraction": step.fraction,
                     "candidate": step.candidate.version, "champion": step.champion,
                     "final": step.final, "seconds_at_step": time.time() - step.started,
                     "figures": step.stats.figures().to_dict()}
        decision = self.decision
        return {"record": self.record, "summary": rollout_record.describe(self.record),
                "serving": local,
                "decision": None if decision is None else {"action": decision.action,
                                                           "reason": decision.reason},
                "shadow_queue": {"size": self._queue.qsize(), "capacity": self.queue_size},
                "key_header": KEY_HEADER, "last_error": self.last_error}
