"""A reporter's counters, as one immutable snapshot."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Stats:
    """What the reporter has done so far; failed_pushes counts every request that did not succeed."""

    pushed_steps: int = 0
    dropped_steps: int = 0  # queue overflow + batches the service rejected + left unsent at close
    failed_pushes: int = 0
    queue_len: int = 0
    comm_waits_dropped: int = 0  # steps sent without their comm wait: its GPU timing was not read in time
    last_error: str | None = None
