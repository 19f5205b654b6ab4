"""The relay's buffer: pushes a rank handed over, held in arrival order per batch key until the rules service takes
them, bounded by bytes (what each costs the agent's memory) and by age; what does not fit goes oldest first, and is
returned to be counted and reported. What a send has in hand is never dropped: its fate is the service's answer,
so a push is never both reported lost to its rank and counted delivered.

Pure bookkeeping under one lock (the listener adds on the event loop, the sender takes on its thread); no I/O.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

# A batch goes per job and per credential: the service judges a batch's pushes under the one Authorization it
# carries, so ranks with different tokens never share one (a rank cannot push under another's token).
BatchKey = tuple[str, str | None]  # (job, the rank's Authorization header value or None)
# What holding one push costs the agent besides its line, credential and job: the Entry, its tuples, the bytes and
# str headers, the float, two deque slots (~390 B measured with tracemalloc on CPython 3.11), rounded up. Counted in
# the byte bound, so that relay.buffer_max_bytes bounds memory: a client sending tiny pushes with an 8 KiB
# Authorization header would otherwise hold ~80x the bound.
ENTRY_OVERHEAD = 512


@dataclass(slots=True, eq=False)
class Entry:
    """One push as it will be forwarded: a batch line, its steps, who sent it and when it arrived."""

    key: BatchKey
    rank: tuple[str, int]  # (job, rank): where drops are reported
    line: bytes
    steps: int
    received: float  # the relay's monotonic clock
    attempts: int = 0  # sends that got no usable answer (a later "duplicate" from the service is then no loss)
    gone: bool = field(default=False)  # no longer held (delivered, refused or dropped)
    in_flight: bool = field(default=False)  # a send has it in hand (between `take` and `release` / `done`)

    @property
    def size(self) -> int:
        """What holding it costs, in bytes, as the buffer's bound counts it."""
        return len(self.line) + len(self.key[1] or "") + len(self.key[0]) + ENTRY_OVERHEAD


class Buffer:
    """Held pushes, per key in arrival order; `add` and `expire` return what they dropped (oldest first)."""

    def __init__(self, max_bytes: int, max_age_s: float, clock: Callable[[], float]) -> None:
        self.max_bytes = max_bytes
        self.max_age_s = max_age_s
        self._clock = clock
        self._lock = threading.Lock()
        self._queues: dict[BatchKey, deque[Entry]] = {}
        self._order: deque[Entry] = deque()  # every held entry in arrival order (dropped ones skipped lazily)
        self.bytes = 0
        self.count = 0
        self._in_flight_bytes = 0

    def add(self, entry: Entry) -> list[Entry]:
        """Hold `entry`; the entries dropped (oldest first, never one a send has in hand) to keep within max_bytes.
        When the room cannot be made without those, `entry` itself is not held and is returned alone: the caller
        refuses it, as one larger than the whole buffer."""
        with self._lock:
            if self._in_flight_bytes + entry.size > self.max_bytes:
                return [entry]
            self._queues.setdefault(entry.key, deque()).append(entry)
            self._order.append(entry)
            self.bytes += entry.size
            self.count += 1
            dropped = []
            while self.bytes > self.max_bytes:
                dropped.append(self._drop(self._oldest_idle()))
            return dropped

    def expire(self) -> list[Entry]:
        """Drop (and return) what has waited longer than max_age_s and no send has in hand."""
        limit = self._clock() - self.max_age_s
        with self._lock:
            dropped = []
            while (oldest := self._oldest_idle()) is not None and oldest.received < limit:
                dropped.append(self._drop(oldest))
            return dropped

    def keys(self) -> list[BatchKey]:
        """The keys holding entries, in the order they first arrived."""
        with self._lock:
            return [k for k, q in self._queues.items() if q]

    def take(self, key: BatchKey, max_bytes: int) -> list[Entry]:
        """The oldest entries of `key`, at least one, up to `max_bytes` of lines, now in a send's hand: they stay held,
        and are not dropped, until `done` or `release`."""
        with self._lock:
            queue = self._queues.get(key, ())
            out: list[Entry] = []
            size = 0
            for entry in queue:
                if out and size + len(entry.line) + 1 > max_bytes:
                    break
                out.append(entry)
                size += len(entry.line) + 1
            for entry in out:
                if not entry.in_flight:
                    entry.in_flight = True
                    self._in_flight_bytes += entry.size
            return out

    def release(self, entries: list[Entry]) -> None:
        """The send is over and `entries` still held (not answered, or to be sent again): droppable again."""
        with self._lock:
            for entry in entries:
                self._land(entry)

    def done(self, entries: list[Entry]) -> None:
        """`entries` (the front of their key's queue, as `take` gave them) were delivered or refused for good."""
        with self._lock:
            for entry in entries:
                if not entry.gone:
                    self._drop(entry)

    def held(self) -> list[Entry]:
        """Every held entry, oldest first."""
        with self._lock:
            return [e for e in self._order if not e.gone]

    def oldest_age(self) -> float:
        """Seconds the oldest held entry has waited (0 when empty)."""
        with self._lock:
            oldest = self._oldest()
            return 0.0 if oldest is None else max(0.0, self._clock() - oldest.received)

    def _oldest(self) -> Entry | None:
        while self._order and self._order[0].gone:
            self._order.popleft()
        return self._order[0] if self._order else None

    def _oldest_idle(self) -> Entry | None:
        """The oldest held entry no send has in hand (those are at most one batch, near the front)."""
        self._oldest()
        return next((e for e in self._order if not e.gone and not e.in_flight), None)

    def _land(self, entry: Entry) -> None:
        if entry.in_flight:
            entry.in_flight = False
            self._in_flight_bytes -= entry.size

    def _drop(self, entry: Entry | None) -> Entry:
        """No longer hold `entry` (it leaves `_order` lazily, when it reaches the front)."""
        assert entry is not None, "over the bound with room to make means an idle entry is held"
        self._land(entry)
        queue = self._queues[entry.key]
        queue.popleft() if queue and queue[0] is entry else queue.remove(entry)
        if not queue:
            del self._queues[entry.key]
        entry.gone = True
        self.bytes -= entry.size
        self.count -= 1
        return entry
