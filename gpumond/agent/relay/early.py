"""When the relay sends a round early: soon after a rank's early push (the job SDK's push at once after a step that
stood out, marked by the Gpumond-Early header), for the jobs whose early pushes asked, on top of the rounds the
agent runs every relay.interval_s. Waiting for the next regular round would cost an early push up to that interval
(2 s by default) of the detection latency it exists to save.

Only the scheduling lives here; the round itself is the sender's (Sender.flush with `early`), which sends only to
shards that take the relay's batches, so an outage never raises the relay's request rate (see there).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from gpumond.agent.relay.buffer import BatchKey
from gpumond.agent.relay.stats import RelayStats

log = logging.getLogger("gpumond.agent.relay")

# A job's ranks push early within milliseconds of each other (they all see the same long step, waiting for the slowest
# rank): the round starts this long after the first of them, so that one batch carries them all, not one per rank.
COALESCE_S = 0.05
# Early rounds start at least this far apart: the SDK pushes early at most once a second per rank, so a lasting
# fault's pushes still go within about a second, and the early rounds cost the rules service at most one more batch a
# second for each job in trouble.
MIN_GAP_S = 1.0
# Jobs waiting for an early round at most; the early pushes of more go with the next regular round. Any client that
# reaches the relay names its own jobs: this bounds what it can make the relay remember, far above a node's honest
# count (a few jobs).
MAX_KEYS = 4096

# Runs a function once, after a delay in seconds (the agent's scheduler; a test's recorder).
Defer = Callable[[float, Callable[[], None]], object]


class EarlyRounds:
    """One early round at a time (pending or running): COALESCE_S after the early push that asks for it, at least
    MIN_GAP_S after the previous one started; each round sends the held pushes of the keys whose early pushes asked."""

    def __init__(self, send: Callable[[frozenset[BatchKey]], object], defer: Defer, clock: Callable[[], float],
                 stats: RelayStats) -> None:
        self._send = send
        self._defer = defer
        self._clock = clock
        self._stats = stats
        self._lock = threading.Lock()
        self._keys: set[BatchKey] = set()
        self._busy = False  # a round is scheduled or running
        self._next_at = float("-inf")  # the earliest start of the next round

    def asked(self, key: BatchKey) -> None:
        """An early push of `key` is held: have it sent soon. Any thread (the listener calls it on its event loop)."""
        with self._lock:
            if len(self._keys) < MAX_KEYS:
                self._keys.add(key)
            if self._busy:
                return  # the scheduled round takes it, or the one after the round running
            self._busy = True
        self._schedule()

    def _run(self) -> None:
        with self._lock:
            keys, self._keys = frozenset(self._keys), set()
            self._next_at = self._clock() + MIN_GAP_S
        self._stats.early_round()
        try:
            self._send(keys)
        except Exception:  # the next regular round sends what this one did not; later early rounds still come
            log.error("relay early round failed", exc_info=True)
        with self._lock:
            if not self._keys:
                self._busy = False
                return
        self._schedule()  # early pushes came while this round ran

    def _schedule(self) -> None:
        with self._lock:
            delay = max(COALESCE_S, self._next_at - self._clock())
        try:
            self._defer(delay, self._run)
        except Exception:  # a scheduler that cannot take it (stopping): the regular rounds carry these pushes
            log.warning("relay early round not scheduled", exc_info=True)
            with self._lock:
                self._busy = False
