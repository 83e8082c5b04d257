"""Micro-batching of ``cord-ops serve``'s scoring requests: one session run scores every
request waiting for it, up to ``max_rows`` rows, waiting at most ``window`` seconds for
requests still being read; a lone request never waits. Each version has its own lane, so a
rollout's candidate never slows the champion's requests."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from flows.serve.metrics import Metrics
from flows.serve.served_model import OUTPUTS, ServedModel

#: The micro-batching lane of the served (champion) version's requests.
MAIN_LANE = "main"


# ---------------------------------------------------------------- micro-batching
@dataclass(eq=False)
class _Pending:
    model: ServedModel
    scores: np.ndarray
    future: asyncio.Future


class _Lane:
    """One batching loop with its own worker thread (see :class:`MicroBatcher`)."""

    def __init__(self, name: str):
        self.queue: asyncio.Queue[_Pending] = asyncio.Queue()
        self.executor = ThreadPoolExecutor(max_workers=1,
                                           thread_name_prefix=f"onnxruntime-{name}")
        self.task: asyncio.Task | None = None


class MicroBatcher:
    """Scores queued requests together: one onnxruntime run per version per batch.

    The batch loop takes every request already queued; while requests are still being
    read (``arriving``) and the batch is under ``max_rows``, it waits up to ``window``
    seconds for them. Runs happen on a worker thread (onnxruntime releases the GIL and
    uses its own intra-op threads), so the event loop keeps reading requests meanwhile.

    Each *lane* (``score(..., lane=)``) has its own queue, loop and worker thread. The
    champion's requests use :data:`MAIN_LANE`; a rollout's candidate uses another, so a
    candidate whose runs are slow delays only the requests it answers: on one shared
    thread every champion request queued behind a slow candidate run would wait for it,
    the champion's latency would rise with the candidate's and the rollout's p99 ratio
    (candidate over champion) could not see the slowness.
    """

    def __init__(self, window: float, max_rows: int, metrics: Metrics):
        self.window, self.max_rows, self.metrics = window, max_rows, metrics
        self.arriving = 0
        self._lanes: dict[str, _Lane] = {}

    def start(self) -> None:
        self._lane(MAIN_LANE)

    def _lane(self, name: str) -> _Lane:
        lane = self._lanes.get(name)
        if lane is None:
            lane = self._lanes[name] = _Lane(name)
            lane.task = asyncio.get_running_loop().create_task(self._loop(lane))
        return lane

    async def stop(self) -> None:
        for lane in self._lanes.values():
            if lane.task is not None:
                lane.task.cancel()
            lane.executor.shutdown(wait=False, cancel_futures=True)

    async def score(self, model: ServedModel, scores: np.ndarray,
                    lane: str = MAIN_LANE) -> dict[str, np.ndarray]:
        future = asyncio.get_running_loop().create_future()
        self._lane(lane).queue.put_nowait(_Pending(model, scores, future))
        return await future

    async def _collect(self, lane: _Lane) -> list[_Pending]:
        batch = [await lane.queue.get()]
        rows = batch[0].scores.shape[0]
        deadline = asyncio.get_running_loop().time() + self.window
        while rows < self.max_rows:
            if lane.queue.empty():
                remaining = deadline - asyncio.get_running_loop().time()
                if self.arriving <= 0 or remaining <= 0:
                    break
                try:
                    item = await asyncio.wait_for(lane.queue.get(), remaining)
                except TimeoutError:
                    break
            else:
                item = lane.queue.get_nowait()
            batch.append(item)
            rows += item.scores.shape[0]
        return batch

    async def _loop(self, lane: _Lane) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._collect(lane)
            groups: dict[int, list[_Pending]] = {}
            for item in batch:  # one run per version: a request never mixes versions
                groups.setdefault(id(item.model), []).append(item)
            for items in groups.values():
                try:
                    outputs = await loop.run_in_executor(lane.executor, _run_group, items)
                except Exception as exc:
                    for item in items:
                        if not item.future.done():
                            item.future.set_exception(exc)
                    continue
                self.metrics.batch_rows.observe(sum(i.scores.shape[0] for i in items))
                for item, result in zip(items, outputs, strict=True):
                    if not item.future.done():
                        item.future.set_result(result)


def _run_group(items: list[_Pending]) -> list[dict[str, np.ndarray]]:
    from onnx_export.runtime import run_host

    session = items[0].model.session
    scores = items[0].scores if len(items) == 1 else np.concatenate([i.scores for i in items])
    # On a CUDA session (--provider cuda) run_host binds the input on the GPU and the
    # outputs to host memory.
    values = run_host(session, scores, list(OUTPUTS))
    results, start = [], 0
    for item in items:
        stop = start + item.scores.shape[0]
        results.append({name: value[start:stop] for name, value in zip(OUTPUTS, values,
                                                                         strict=True)})
        start = stop
    return results
