"""Progress of long work (``cord-ops reproduce``, ``cord-ops bench``): units done of the
total, elapsed time and an estimate of the time left.

On a terminal one line is redrawn in place as a bar; anywhere else (a log file, CI) each
update is a plain line of its own, at most one every ``every`` seconds plus the last.
The estimate assumes the remaining units cost what the finished ones did on average.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

BAR_WIDTH = 24


def format_seconds(seconds: float) -> str:
    """``42 s``, ``3 min 05 s`` or ``1 h 02 min``."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


class Progress:
    """Counts finished units of ``total`` and reports to ``stream`` (default stderr)."""

    def __init__(self, total: int, label: str, unit: str = "cells", stream=None,
                 every: float = 5.0, clock: Callable[[], float] = time.monotonic):
        if total < 0:
            raise ValueError(f"total: expected a count >= 0, got {total!r}")
        self.total, self.label, self.unit = total, label, unit
        self.stream = sys.stderr if stream is None else stream
        self.every, self.clock = every, clock
        self.done = 0
        self.started = clock()
        self._last_line = None
        isatty = getattr(self.stream, "isatty", None)
        self.terminal = bool(isatty and isatty())

    def eta(self) -> float | None:
        """Seconds left at the average pace so far; None before the first unit."""
        if self.done == 0:
            return None
        elapsed = self.clock() - self.started
        return elapsed / self.done * (self.total - self.done)

    def line(self, note: str = "") -> str:
        """The status text: label, done/total, percentage, elapsed, ETA, and ``note``."""
        elapsed = format_seconds(self.clock() - self.started)
        share = self.done / self.total if self.total else 1.0
        eta = self.eta()
        left = "ETA --" if eta is None else f"ETA {format_seconds(eta)}"
        text = (f"{self.label}: {self.done}/{self.total} {self.unit} ({share:.0%}), "
                f"{elapsed} elapsed, {left}")
        if self.terminal:
            filled = round(BAR_WIDTH * share)
            text = f"{self.label}: [{'#' * filled}{'.' * (BAR_WIDTH - filled)}] " + \
                text.removeprefix(f"{self.label}: ")
        return f"{text}  {note}" if note else text

    def advance(self, n: int = 1, note: str = "") -> None:
        """Record ``n`` more finished units and report."""
        self.done = min(self.total, self.done + n)
        now = self.clock()
        last = self.done == self.total
        if self.terminal:
            self.stream.write("\r\033[K" + self.line(note) + ("\n" if last else ""))
        elif last or self._last_line is None or now - self._last_line >= self.every:
            self.stream.write(self.line(note) + "\n")
            self._last_line = now
        self.stream.flush()

    def start(self) -> None:
        """Report the empty state (so a long first unit is not silent)."""
        self.stream.write(("\r\033[K" if self.terminal else "") + self.line() +
                          ("" if self.terminal else "\n"))
        self.stream.flush()
        self._last_line = self.clock()
