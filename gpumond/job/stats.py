"""A reporter's counters, as one immutable snapshot."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType


@dataclass(frozen=True, slots=True)
class Stats:
    """What the reporter has done so far; failed_pushes counts every request that did not succeed."""

    pushed_steps: int = 0  # steps the service stored
    dropped_steps: int = 0  # queue overflow + batches the service rejected + steps it did not store + left at close
    failed_pushes: int = 0
    queue_len: int = 0
    comm_waits_dropped: int = 0  # steps sent without their comm wait: its GPU timing was not read in time
    last_error: str | None = None  # the latest failure; None again once the service takes a push
    # Steps in accepted pushes that the service did not store, by its reason (stale, duplicate, …); in dropped_steps.
    dropped_by_service: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
