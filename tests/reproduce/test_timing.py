"""The timing protocol shared by ``cord-ops bench`` and ``benchmarks/``: warm-up, repeats,
alternation, wall against CPU time, and the summaries figures are defined by."""

from __future__ import annotations

import time

import pytest

from flows.reproduce.timing import Timing, measure, once


def test_calls_alternate_after_one_discarded_warm_up_each():
    calls = []
    first, second = measure(lambda: calls.append("a") or len(calls),
                            lambda: calls.append("b") or len(calls), repeats=3)
    assert calls == ["a", "b"] + ["a", "b"] * 3
    assert len(first.wall) == len(first.cpu) == 3 == len(second.wall)
    assert (first.result, second.result) == (7, 8)  # the last timed call's return value


def test_once_makes_a_single_call_and_keeps_its_result():
    calls = []
    timing = once(lambda: calls.append(1) or "fitted")
    assert calls == [1] and timing.result == "fitted" and len(timing.wall) == 1


def test_wall_time_counts_sleeping_but_cpu_time_does_not():
    (timing,) = measure(lambda: time.sleep(0.05), repeats=2, warm_up=False)
    assert timing.best >= 0.05
    assert timing.best_cpu < 0.03


def test_summaries_of_recorded_times():
    timing = Timing(wall=(4.0, 1.0, 3.0, 2.0, 5.0), cpu=(0.5, 0.25, 0.5, 0.5, 0.5))
    assert (timing.best, timing.best_cpu, timing.median) == (1.0, 0.25, 3.0)
    assert timing.quartiles() == (3.0, 2.0, 4.0)
    assert timing.quartiles(scale=10.0) == (30.0, 20.0, 40.0)


def test_repeats_below_one_is_refused_before_any_call():
    calls = []
    with pytest.raises(ValueError, match="repeats must be >= 1, got 0"):
        measure(lambda: calls.append(1), repeats=0)
    assert calls == []
