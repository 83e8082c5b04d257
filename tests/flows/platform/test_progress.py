"""Progress lines: done/total, the ETA at the average pace, a bar only on a terminal."""

from __future__ import annotations

import io

import pytest

from flows.platform.progress import Progress, format_seconds


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_plain_lines_give_done_of_total_and_the_eta_at_the_average_pace():
    clock, out = Clock(), io.StringIO()
    progress = Progress(4, "reproduce", stream=out, every=0.0, clock=clock)
    progress.start()
    clock.now += 30.0
    progress.advance(note="cifar10_resnet56/vs/seed0")
    clock.now += 10.0
    progress.advance()
    lines = out.getvalue().splitlines()
    assert lines[0] == "reproduce: 0/4 cells (0%), 0 s elapsed, ETA --"
    # one cell in 30 s: three more take 90 s
    assert lines[1] == "reproduce: 1/4 cells (25%), 30 s elapsed, ETA 1 min 30 s  " \
                       "cifar10_resnet56/vs/seed0"
    # two cells in 40 s: two more take 40 s
    assert lines[2] == "reproduce: 2/4 cells (50%), 40 s elapsed, ETA 40 s"
    assert "\r" not in out.getvalue() and "[" not in out.getvalue()


def test_plain_lines_are_rate_limited_but_the_last_one_always_comes():
    clock, out = Clock(), io.StringIO()
    progress = Progress(3, "bench", unit="steps", stream=out, every=5.0, clock=clock)
    progress.start()
    for _ in range(3):
        clock.now += 1.0
        progress.advance()
    lines = out.getvalue().splitlines()
    assert lines == ["bench: 0/3 steps (0%), 0 s elapsed, ETA --",
                     "bench: 3/3 steps (100%), 3 s elapsed, ETA 0 s"]


def test_a_terminal_gets_one_bar_redrawn_in_place():
    clock, out = Clock(), Terminal()
    progress = Progress(2, "reproduce", stream=out, clock=clock)
    progress.start()
    clock.now += 5.0
    progress.advance()
    clock.now += 5.0
    progress.advance()
    text = out.getvalue()
    assert text.count("\n") == 1 and text.endswith("\n")  # one line, closed at the end
    frames = text.rstrip("\n").split("\r\033[K")[1:]
    assert frames[1] == "reproduce: [############............] 1/2 cells (50%), 5 s elapsed, " \
                        "ETA 5 s"
    assert frames[2].startswith("reproduce: [########################] 2/2 cells (100%)")


@pytest.mark.parametrize(("seconds", "text"), [(0.4, "0 s"), (59.6, "1 min 00 s"),
                                               (185, "3 min 05 s"), (3720, "1 h 02 min")])
def test_format_seconds(seconds, text):
    assert format_seconds(seconds) == text
