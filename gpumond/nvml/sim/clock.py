"""Simulated time sources.

The simulator never reads the wall clock for physics: it asks a clock for "simulated
seconds since start". `SimClock` runs from the monotonic clock (optionally faster than
real time, so a demo can show an hour of thermal behaviour in a minute); `ManualClock`
only moves when a test says so, which makes every model output reproducible.
"""

from __future__ import annotations

import threading
import time


class SimClock:
    """Simulated seconds = monotonic wall seconds since construction × speed."""

    def __init__(self, speed: float = 1.0) -> None:
        if not speed > 0:
            raise ValueError(f"speed must be > 0, got {speed!r}")
        self._speed = float(speed)
        self._start = time.monotonic()

    @property
    def speed(self) -> float:
        return self._speed

    def now(self) -> float:
        return (time.monotonic() - self._start) * self._speed


class ManualClock:
    """A clock that only moves on `advance()`; for deterministic tests."""

    speed = 1.0  # nominal; lets callers treat both clocks alike

    def __init__(self, start: float = 0.0) -> None:
        self._t = float(start)
        # advance() may run on a test thread while an event wait polls on another.
        self._lock = threading.Lock()

    def now(self) -> float:
        return self._t

    def advance(self, dt: float) -> float:
        if dt < 0:
            raise ValueError(f"a clock cannot go backwards (dt={dt!r})")
        with self._lock:
            self._t += float(dt)
            return self._t
