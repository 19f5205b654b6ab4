"""Per-step intervals timed by events, read back without ever waiting for them.

A timer marks intervals with events (`begin()`, `end()`), closes each step's intervals under a ticket
(`close_step()`), and later calls `poll()`, which hands every step whose events have all completed to
`sink(ticket, seconds)`, oldest first, and never blocks: on a GPU an event is asked `query()`, never
synchronised. A step still incomplete `max_lag` steps later is dropped (`sink(ticket, None)`) and
counted, so a reader that falls behind costs a measurement, not a stall.

The events are the only thing that differs between the host and a GPU: `HostEvent` (a clock reading,
complete at once) and gpumond.job.torch's CUDA event satisfy the same `Event` protocol, so the logic
here is tested on CPU with a deterministic fake GPU timeline.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Hashable
from typing import Protocol

log = logging.getLogger("gpumond.job")

__all__ = ["Event", "HostEvent", "Intervals"]


class Event(Protocol):
    """A point on a timeline: recorded now, complete once the timeline has reached it."""

    def record(self) -> None:
        """Mark the point (on a GPU: enqueue it on the current stream; must not block)."""

    def query(self) -> bool:
        """Whether the timeline has reached the point (must not block)."""

    def elapsed_s(self, end: Event) -> float:
        """Seconds from this point to `end`; called only once both are complete."""


class HostEvent:
    """An event on the host's monotonic clock: complete as soon as it is recorded."""

    __slots__ = ("_clock", "t")

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.t = 0.0

    def record(self) -> None:
        self.t = self._clock()

    def query(self) -> bool:
        return True

    def elapsed_s(self, end: Event) -> float:
        assert isinstance(end, HostEvent)
        return end.t - self.t


Pair = tuple[Event, Event]


class Intervals:
    """The intervals of each step, in flight until their events complete; see the module docstring.

    Used from one thread at a time (the training thread, or autograd's while the training thread is
    blocked in backward()): no locking.
    """

    def __init__(self, new_event: Callable[[], Event], sink: Callable[[Hashable, float | None], None], *,
                 max_lag: int = 8) -> None:
        if max_lag < 1:
            raise ValueError(f"max_lag must be at least 1 step (got {max_lag})")
        self._new = new_event
        self._sink = sink
        self._max_lag = max_lag
        self._start: Event | None = None
        self._open: list[Pair] = []  # the current step's finished intervals
        self._flight: deque[tuple[Hashable, list[Pair], int]] = deque()  # (ticket, intervals, step number)
        self._free: list[Event] = []  # events of read steps, for reuse (one allocation per event, not per step)
        self._steps = 0
        self.read = 0
        self.dropped = 0

    @property
    def in_flight(self) -> int:
        """Closed steps not read yet."""
        return len(self._flight)

    def _event(self) -> Event:
        return self._free.pop() if self._free else self._new()

    def begin(self) -> None:
        """Start an interval now (again: a second begin() before end() moves the start)."""
        if self._start is None:
            self._start = self._event()
        self._start.record()

    def end(self) -> None:
        """End the interval begun last; without one, nothing."""
        start = self._start
        if start is None:
            return
        stop = self._event()
        stop.record()
        self._open.append((start, stop))
        self._start = None

    def discard(self) -> None:
        """Forget the current step's intervals (a step that will not be closed: it raised, or is not timed)."""
        # Not reused: on a GPU they may not have completed yet.
        self._start = None
        self._open = []

    def close_step(self, ticket: Hashable) -> bool:
        """The current step's intervals are all marked: read them under `ticket`. False if it had none."""
        self._start = None
        if not self._open:
            return False
        self._flight.append((ticket, self._open, self._steps))
        self._open = []
        self._steps += 1
        return True

    def poll(self) -> None:
        """Hand over every completed step, oldest first; drop the oldest ones that are too far behind."""
        flight = self._flight
        while flight:
            ticket, pairs, number = flight[0]
            try:
                done = all(stop.query() and start.query() for start, stop in pairs)
                seconds = sum(start.elapsed_s(stop) for start, stop in pairs) if done else None
            except Exception as exc:  # an event that cannot be read: this step is lost, not training
                log.debug("gpumond: step interval unreadable: %r", exc)
                done, seconds = True, None
            if not done and self._steps - number <= self._max_lag:
                return  # in order on one stream: nothing after it is complete either
            flight.popleft()
            if done and seconds is not None:
                for start, stop in pairs:
                    self._free += (start, stop)
                self.read += 1
                self._sink(ticket, max(seconds, 0.0))
            else:
                self.dropped += 1
                self._sink(ticket, None)

    def cancel(self) -> None:
        """Give up every step in flight (`sink(ticket, None)` each), e.g. when timing is removed."""
        self.discard()
        while self._flight:
            ticket, _, _ = self._flight.popleft()
            self.dropped += 1
            self._sink(ticket, None)
