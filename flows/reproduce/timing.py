"""The one timing protocol of ``cord-ops bench`` and of the scripts in ``benchmarks/``.

:func:`measure` calls each callable ``repeats`` times, alternately when there are several
(a, b, a, b, ...: on a shared machine alternation exposes each to the same load), after
one discarded warm-up call of each unless ``warm_up=False``, and records every call's wall
time (``time.perf_counter``) and process CPU time (``time.process_time``, summed over the
process's threads: steadier than wall time on a loaded machine, meaningless for work done
in a subprocess). A :class:`Timing` then gives the summary a figure is defined by: the
minimum (the call least disturbed by other processes), or the median with its quartiles.

Only the standard library and numpy: ``benchmarks/`` scripts import it without pulling in
MLflow or Prefect.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Timing:
    """Seconds of each timed call (warm-up excluded) and the last call's return value."""

    wall: tuple[float, ...]
    cpu: tuple[float, ...]
    result: Any = None

    @property
    def best(self) -> float:
        """Minimum wall seconds."""
        return min(self.wall)

    @property
    def best_cpu(self) -> float:
        """Minimum process CPU seconds."""
        return min(self.cpu)

    @property
    def median(self) -> float:
        """Median wall seconds."""
        return float(np.median(self.wall))

    def quartiles(self, scale: float = 1.0) -> tuple[float, float, float]:
        """(median, Q1, Q3) of the wall times, each multiplied by ``scale``."""
        q1, median, q3 = np.quantile(np.asarray(self.wall) * scale, [0.25, 0.5, 0.75])
        return float(median), float(q1), float(q3)


def measure(*calls: Callable[[], Any], repeats: int = 1,
            warm_up: bool = True) -> list[Timing]:
    """One :class:`Timing` per callable: ``repeats`` alternating calls of each, after one
    discarded warm-up call of each when ``warm_up``."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if warm_up:
        for call in calls:
            call()
    walls: list[list[float]] = [[] for _ in calls]
    cpus: list[list[float]] = [[] for _ in calls]
    results: list[Any] = [None] * len(calls)
    for _ in range(repeats):
        for slot, call in enumerate(calls):
            start_cpu, start = time.process_time(), time.perf_counter()
            results[slot] = call()
            walls[slot].append(time.perf_counter() - start)
            cpus[slot].append(time.process_time() - start_cpu)
    return [Timing(tuple(w), tuple(c), r) for w, c, r in zip(walls, cpus, results, strict=True)]


def once(call: Callable[[], Any]) -> Timing:
    """A single call, no warm-up: for work whose first call is the measurement (a fit, a
    flow run, a cold process)."""
    return measure(call, repeats=1, warm_up=False)[0]
