"""The relay's buffer: pushes a rank handed over, held in arrival order per batch key until the rules service takes
them, bounded by bytes (what each costs the agent's memory) and by age; what does not fit goes oldest first, and is
returned to be counted and reported.

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
    gone: bool = field(default=False)  # dropped while a send had it in hand

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

    def add(self, entry: Entry) -> list[Entry]:
        """Hold `entry`; the entries dropped (oldest first) to keep within max_bytes. An entry larger than the whole
        buffer is refused by the caller before it gets here."""
        with self._lock:
            self._queues.setdefault(entry.key, deque()).append(entry)
            self._order.append(entry)
            self.bytes += entry.size
            self.count += 1
            dropped = []
            while self.bytes > self.max_bytes:
                dropped.append(self._drop_oldest())
            return dropped

    def expire(self) -> list[Entry]:
        """Drop (and return) what has waited longer than max_age_s."""
        limit = self._clock() - self.max_age_s
        with self._lock:
            dropped = []
            while self._oldest() is not None and self._order[0].received < limit:
                dropped.append(self._drop_oldest())
            return dropped

    def keys(self) -> list[BatchKey]:
        """The keys holding entries, in the order they first arrived."""
        with self._lock:
            return [k for k, q in self._queues.items() if q]

    def take(self, key: BatchKey, max_bytes: int) -> list[Entry]:
        """The oldest entries of `key`, at least one, up to `max_bytes` of lines; they stay held until `done`."""
        with self._lock:
            queue = self._queues.get(key, ())
            out: list[Entry] = []
            size = 0
            for entry in queue:
                if out and size + len(entry.line) + 1 > max_bytes:
                    break
                out.append(entry)
                size += len(entry.line) + 1
            return out

    def done(self, entries: list[Entry]) -> None:
        """`entries` (the front of their key's queue, as `take` gave them) were delivered or refused for good."""
        with self._lock:
            for entry in entries:
                if entry.gone:
                    continue  # dropped for room while its send was in flight: already counted
                queue = self._queues[entry.key]
                queue.remove(entry)  # the front, unless an older one was dropped meanwhile: short either way
                if not queue:
                    del self._queues[entry.key]
                entry.gone = True
                self.bytes -= entry.size
                self.count -= 1

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

    def _drop_oldest(self) -> Entry:
        entry = self._oldest()
        assert entry is not None, "bytes > 0 means an entry is held"
        self._order.popleft()
        queue = self._queues[entry.key]
        queue.popleft() if queue and queue[0] is entry else queue.remove(entry)
        if not queue:
            del self._queues[entry.key]
        entry.gone = True
        self.bytes -= entry.size
        self.count -= 1
        return entry
