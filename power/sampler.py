"""Adaptive sampling rate: fast while something moves, slow while all is steady.

Watching at 1 kHz all the time would spend the CPU the monitor is meant to
protect; watching at 10 Hz all the time would miss a short burst. The watchdog
reports activity (a latency spike, a moving p50, a power or temperature step)
and this class answers with the next sleep: the fast period for ``hold_s``
after the last activity, the slow period otherwise. Pure logic with an
injectable clock, so it is tested without sleeping.
"""

from __future__ import annotations

import time
from typing import Literal

Mode = Literal["fast", "slow"]


class AdaptiveSampler:
    def __init__(
        self,
        fast_hz: float = 1000.0,
        slow_hz: float = 10.0,
        hold_s: float = 2.0,
        force: Mode | None = None,
        clock=time.monotonic,
    ):
        if not (fast_hz > 0 and slow_hz > 0 and fast_hz >= slow_hz):
            raise ValueError(f"need fast_hz >= slow_hz > 0, got fast_hz={fast_hz}, slow_hz={slow_hz}")
        self.fast_hz, self.slow_hz, self.hold_s = fast_hz, slow_hz, hold_s
        self.force = force
        self.clock = clock
        self._last_activity = -float("inf")
        self.switches = 0  # how often the mode changed (shown by the monitor, kept in logs)
        self._mode: Mode = "slow"

    def note_activity(self, now: float | None = None) -> None:
        self._last_activity = self.clock() if now is None else now

    def mode(self, now: float | None = None) -> Mode:
        if self.force is not None:
            return self.force
        now = self.clock() if now is None else now
        m: Mode = "fast" if now - self._last_activity < self.hold_s else "slow"
        if m != self._mode:
            self.switches += 1
            self._mode = m
        return m

    def period_s(self, now: float | None = None) -> float:
        return 1.0 / (self.fast_hz if self.mode(now) == "fast" else self.slow_hz)

    def rate_hz(self, now: float | None = None) -> float:
        return self.fast_hz if self.mode(now) == "fast" else self.slow_hz


def moved(prev: float | None, cur: float | None, rel: float, abs_: float) -> bool:
    """True when a metric changed by more than ``rel`` (fraction) and more than ``abs_`` (its unit)."""
    if prev is None or cur is None:
        return prev is not cur
    d = abs(cur - prev)
    return d > abs_ and d > rel * max(abs(prev), 1e-12)
