"""The server's micro-batcher in-process, on real onnxruntime sessions: its lanes (a
rollout candidate's slow runs must not hold the champion's requests), its row cap, and a
failing run that fails only its own version's requests."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest
from scipy.special import softmax

from cord_ops import CORD
from cord_ops.calibrators import make_calibrator
from flows.serve.batcher import MicroBatcher
from flows.serve.contract import InputContract
from flows.serve.metrics import Metrics
from flows.serve.served_model import OUTPUTS, ServedModel, verify
from onnx_export import export_onnx, open_session

WAIT = 20.0  # seconds: far above any run here; reached only when a request is stuck


class _Gated:
    """A real session whose runs wait for ``release`` (and say when one has started)."""

    def __init__(self, session):
        self.session = session
        self.started, self.release = threading.Event(), threading.Event()

    def run(self, outputs, feeds):
        self.started.set()
        if not self.release.wait(WAIT):
            raise TimeoutError("the test never released the gated session")
        return self.session.run(outputs, feeds)

    def __getattr__(self, name):
        return getattr(self.session, name)


class _Broken:
    """A real session's interface whose runs fail, as a graph that breaks at run time."""

    def __init__(self, session):
        self.session = session

    def run(self, outputs, feeds):
        raise RuntimeError("onnxruntime: a node failed")

    def __getattr__(self, name):
        return getattr(self.session, name)


@pytest.fixture(scope="module")
def fitted(digits):
    calibrator = make_calibrator("ts").fit(digits.scores, digits.labels)
    cord = CORD().fit(softmax(digits.scores, axis=1), calibrator.predict_proba(digits.scores))
    graph = export_onnx(calibrator, cord, 10, input_kind="logits", dtype="float32")
    return calibrator, cord, graph


def _served(version: str, fitted, wrap=None) -> ServedModel:
    calibrator, cord, graph = fitted
    session = open_session(graph, provider="cpu")
    contract = InputContract(10, "logits", "float32")
    report = verify(session, contract, (calibrator, cord))
    return ServedModel("m", version, None, contract, repr(cord.eta_), "ts",
                       wrap(session) if wrap else session, ("CPUExecutionProvider",), report)


def _alone(model: ServedModel, scores: np.ndarray) -> dict[str, np.ndarray]:
    session = getattr(model.session, "session", model.session)
    return dict(zip(OUTPUTS, session.run(list(OUTPUTS), {"scores": scores}), strict=True))


def _rows(digits, start: int, n: int) -> np.ndarray:
    return np.ascontiguousarray(digits.scores[start:start + n], dtype=np.float32)


def test_a_blocked_candidate_lane_does_not_hold_the_champion_lane(digits, fitted):
    champion = _served("1", fitted)
    candidate = _served("2", fitted, wrap=_Gated)
    gate = candidate.session
    champion_rows, candidate_rows = _rows(digits, 0, 7), _rows(digits, 100, 5)

    async def scenario():
        batcher = MicroBatcher(window=0.001, max_rows=64, metrics=Metrics())
        batcher.start()
        try:
            held = asyncio.ensure_future(batcher.score(candidate, candidate_rows,
                                                       lane="candidate"))
            started = await asyncio.to_thread(gate.started.wait, WAIT)
            assert started, "the candidate's run never started"
            # On a shared worker thread this request would queue behind the held run.
            answer = await asyncio.wait_for(batcher.score(champion, champion_rows), WAIT / 2)
            still_held = not held.done()
            gate.release.set()
            return answer, still_held, await asyncio.wait_for(held, WAIT)
        finally:
            gate.release.set()
            await batcher.stop()

    answer, still_held, late = asyncio.run(scenario())
    assert still_held  # the champion was answered while the candidate's run was blocked
    np.testing.assert_array_equal(answer["label"], _alone(champion, champion_rows)["label"])
    np.testing.assert_array_equal(late["label"], _alone(candidate, candidate_rows)["label"])
    assert answer["label"].shape == (7,) and late["label"].shape == (5,)


def test_a_batch_stops_taking_requests_once_it_reaches_max_rows(digits, fitted):
    model = _served("1", fitted)
    requests = [_rows(digits, 10 * i, 10) for i in range(12)]
    metrics = Metrics()

    async def scenario():
        # 12 requests of 10 rows queued at once, cap 30: the batch stops at 30 rows, so
        # four runs of three requests (taking a fourth at exactly 30 would make three of 40).
        batcher = MicroBatcher(window=5.0, max_rows=30, metrics=metrics)
        batcher.start()
        batcher.arriving = 1
        try:
            return await asyncio.gather(*(batcher.score(model, s) for s in requests))
        finally:
            await batcher.stop()

    results = asyncio.run(scenario())
    sample = metrics.registry.get_sample_value
    assert sample("cord_serve_batch_rows_count") == 4
    assert sample("cord_serve_batch_rows_sum") == 120
    assert sample("cord_serve_batch_rows_bucket", {"le": "16.0"}) == 0
    assert sample("cord_serve_batch_rows_bucket", {"le": "32.0"}) == 4
    for scores, result in zip(requests, results, strict=True):
        expected = _alone(model, scores)
        np.testing.assert_array_equal(result["label"], expected["label"])
        np.testing.assert_allclose(result["repaired"], expected["repaired"], rtol=0, atol=1e-6)


def test_a_failing_run_fails_only_its_versions_requests_and_the_lane_goes_on(digits, fitted):
    good, broken = _served("1", fitted), _served("2", fitted, wrap=_Broken)
    metrics = Metrics()

    async def scenario():
        batcher = MicroBatcher(window=0.05, max_rows=4096, metrics=metrics)
        batcher.start()
        batcher.arriving = 1
        try:
            # The broken version's request is queued first, so its group runs first.
            first = await asyncio.wait_for(asyncio.gather(
                *(batcher.score(good if i % 2 else broken, _rows(digits, 3 * i, 3))
                  for i in range(6)), return_exceptions=True), WAIT)
            batcher.arriving = 0
            after = await asyncio.wait_for(batcher.score(good, _rows(digits, 50, 4)), WAIT)
            return first, after
        finally:
            await batcher.stop()

    first, after = asyncio.run(scenario())
    failed = first[0::2]
    assert all(isinstance(o, RuntimeError) and "a node failed" in str(o) for o in failed)
    for i, outcome in zip(range(1, 6, 2), first[1::2], strict=True):
        np.testing.assert_array_equal(outcome["label"],
                                      _alone(good, _rows(digits, 3 * i, 3))["label"])
    np.testing.assert_array_equal(after["label"], _alone(good, _rows(digits, 50, 4))["label"])
    # One run of the good version's three requests, then the later one; the failed run
    # is not counted as scored rows.
    assert metrics.registry.get_sample_value("cord_serve_batch_rows_count") == 2
    assert metrics.registry.get_sample_value("cord_serve_batch_rows_sum") == 9 + 4

