"""The relay's counters and what it still owes each rank: the drops it reports in its next answer to that rank."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable

from gpumond.types import Series

RELAY_METRICS: dict[str, tuple[str, str]] = {
    "gpumond_relay_ranks": ("gauge", "Ranks that pushed to this node's relay in the last minute."),
    "gpumond_relay_steps_received_total": ("counter", "Steps the relay took from its node's ranks (answered 202)."),
    "gpumond_relay_steps_forwarded_total": ("counter", "Steps the rules service stored from the relay's batches."),
    "gpumond_relay_buffer_bytes": ("gauge", "Bytes the pushes held for the rules service cost the agent's memory "
                                            "(each push's line, credential and bookkeeping; relay.buffer_max_bytes "
                                            "bounds it)."),
    "gpumond_relay_buffer_oldest_age_seconds": ("gauge", "How long the oldest held push has waited (relay."
                                                         "buffer_max_age_s bounds it); 0 when none is held."),
    "gpumond_relay_steps_dropped_total": ("counter", "Steps the relay dropped, by reason: buffer_full and too_old "
                                                     "(oldest first, for room or age), refused (the rules service "
                                                     "refused them for good). Each rank is told in its next answer."),
    "gpumond_relay_upstream_errors_total": ("counter", "Batches to the rules service that failed, by kind: connect, "
                                                       "timeout, tls, http_429, http_5xx (retried with backoff), "
                                                       "http_4xx (refused), bad_answer."),
    "gpumond_relay_conflicts_total": ("counter", "Pushes whose stated field (job, node, gpu_uuid) differs from what "
                                                 "the agent finds; the rank's wins."),
    "gpumond_relay_early_rounds_total": ("counter", "Sending rounds started early, for the jobs whose ranks pushed "
                                                    "early (after a step that stood out), on top of one per relay."
                                                    "interval_s; at most one a second."),
}
DROP_REASONS = ("buffer_full", "too_old", "refused")
ERROR_KINDS = ("connect", "timeout", "tls", "http_429", "http_5xx", "http_4xx", "bad_answer")
RANKS_WINDOW_S = 60.0
# Ranks whose drops are owed at most: a node runs tens of ranks; past this the oldest debts are forgotten.
MAX_OWED = 65_536
# Ranks remembered for gpumond_relay_ranks at most, likewise: any client reaching the relay names its own ranks.
MAX_SEEN = 65_536


class RelayStats:
    """Counters (any thread, under one lock), the ranks seen recently, and the drops owed to each rank."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self.received = 0
        self.forwarded = 0
        self.dropped: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.early_rounds = 0
        self._seen: dict[tuple[str, int], float] = {}  # rank → its last push, least recent first
        self._owed: dict[tuple[str, int], Counter[str]] = {}

    def took(self, rank: tuple[str, int], steps: int) -> None:
        now = self._clock()
        with self._lock:
            self.received += steps
            self._seen.pop(rank, None)  # re-inserted last: the dict stays ordered by last push
            self._seen[rank] = now
            # Forgotten here, not only when /metrics is scraped (an agent may be scraped rarely, or never).
            self._forget_seen(now)
            while len(self._seen) > MAX_SEEN:
                del self._seen[next(iter(self._seen))]

    def forwarded_steps(self, n: int) -> None:
        with self._lock:
            self.forwarded += n

    def error(self, kind: str) -> None:
        with self._lock:
            self.errors[kind] += 1

    def early_round(self) -> None:
        with self._lock:
            self.early_rounds += 1

    def lost(self, rank: tuple[str, int], steps: int, reason: str, *, counted: bool = True) -> None:
        """`steps` of `rank` will never reach the service, for `reason`: owed to the rank's next answer, and counted
        in the relay's drops unless the service dropped them itself (`counted` False: the service counts those)."""
        if steps <= 0:
            return
        with self._lock:
            if counted:
                self.dropped[reason] += steps
            owed = self._owed.get(rank)
            if owed is None:
                if len(self._owed) >= MAX_OWED:
                    del self._owed[next(iter(self._owed))]
                owed = self._owed[rank] = Counter()
            # The rank hears the relay's own reasons as relay_<reason>, the service's under the service's names.
            owed[f"relay_{reason}" if counted else reason] += steps

    def owed(self, rank: tuple[str, int], most: int) -> dict[str, int]:
        """The drops to report in an answer carrying `most` steps: at most that many (the SDK counts a report
        against the push it answers); the rest waits for the next answer."""
        with self._lock:
            owed = self._owed.get(rank)
            if not owed or most <= 0:
                return {}
            out: dict[str, int] = {}
            for reason in list(owed):
                n = min(owed[reason], most)
                if n:
                    out[reason] = n
                    owed[reason] -= n
                    most -= n
                if owed[reason] <= 0:
                    del owed[reason]
            if not owed:
                del self._owed[rank]
            return out

    def _forget_seen(self, now: float) -> None:
        """Drop the ranks whose last push is older than the window (under the lock): the oldest are first."""
        while self._seen:
            rank, last = next(iter(self._seen.items()))
            if now - last <= RANKS_WINDOW_S:
                return
            del self._seen[rank]

    def series(self, buffer_bytes: int, oldest_age_s: float, conflicts: Counter[str]) -> list[Series]:
        """The RELAY_METRICS series."""
        now = self._clock()
        with self._lock:
            self._forget_seen(now)
            out = [Series("gpumond_relay_ranks", (), float(len(self._seen))),
                   Series("gpumond_relay_steps_received_total", (), float(self.received)),
                   Series("gpumond_relay_steps_forwarded_total", (), float(self.forwarded)),
                   Series("gpumond_relay_buffer_bytes", (), float(buffer_bytes)),
                   Series("gpumond_relay_buffer_oldest_age_seconds", (), oldest_age_s)]
            out += [Series("gpumond_relay_steps_dropped_total", (("reason", r),), float(self.dropped[r]))
                    for r in DROP_REASONS]
            out += [Series("gpumond_relay_upstream_errors_total", (("kind", k),), float(self.errors[k]))
                    for k in ERROR_KINDS]
            out.append(Series("gpumond_relay_early_rounds_total", (), float(self.early_rounds)))
        out += [Series("gpumond_relay_conflicts_total", (("field", f),), float(conflicts[f]))
                for f in ("job", "node", "gpu_uuid")]
        return out
