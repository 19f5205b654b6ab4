"""NVML event sets: which GPUs and event types each set listens to, and its queue.

Like the driver, an event reaches a set only if the set had registered that GPU and event
type when the event happened; earlier events are not replayed.
"""

from __future__ import annotations

import ctypes
from collections import deque
from dataclasses import dataclass, field


@dataclass
class Event:
    gpu_index: int
    event_type: int
    data: int


@dataclass
class EventSet:
    # nvmlEventSet_t is an opaque pointer too: the address of a buffer this object owns.
    _buffer: ctypes.Array = field(default_factory=lambda: ctypes.create_string_buffer(16))
    registrations: dict[int, int] = field(default_factory=dict)  # gpu index -> event-type mask
    queue: deque[Event] = field(default_factory=deque)

    @property
    def handle(self) -> int:
        return ctypes.addressof(self._buffer)


class EventHub:
    """All live event sets of one simulated NVML. Callers hold the simulator's lock."""

    def __init__(self) -> None:
        self._sets: dict[int, EventSet] = {}

    def create(self) -> EventSet:
        event_set = EventSet()
        self._sets[event_set.handle] = event_set
        return event_set

    def get(self, handle: int | None) -> EventSet | None:
        return self._sets.get(handle) if handle else None

    def free(self, handle: int | None) -> bool:
        return self._sets.pop(handle, None) is not None if handle else False

    def deliver(self, event: Event) -> bool:
        delivered = False
        for event_set in self._sets.values():
            if event_set.registrations.get(event.gpu_index, 0) & event.event_type:
                event_set.queue.append(event)
                delivered = True
        return delivered
