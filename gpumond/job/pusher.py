"""The background thread: takes recorded steps off the queue and pushes them, retrying or dropping."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from types import MappingProxyType

from gpumond.job.early import EarlyPush, StepHistory, regular_after_early
from gpumond.job.payload import Record, encode_head, encoder
from gpumond.job.transport import Transport
from gpumond.wire.retry import Backoff, retryable
from gpumond.wire.safetext import one_line

log = logging.getLogger("gpumond.job")

JOIN_GRACE_S = 0.25  # a request started just before the close deadline still gets to finish
# The retry schedule: read when a pusher is made, so a test can shorten it.
BACKOFF_BASE_S = 0.5
BACKOFF_CAP_S = 30.0
# What each reason a service gives for steps it did not store means, for the one warning per reason.
SERVICE_DROP_HINTS = {
    "stale": "they ended before the service's window (window_s): this node's clock is probably behind; check NTP",
    "duplicate": "the service already holds these step numbers for this rank; pass distinct step= numbers",
    "per_rank_window": "more new steps in one push than the service keeps per rank (limits.max_steps_per_rank)",
    "steps_held": "the service holds as many steps as it may (limits.max_steps_held)",
    # From the node relay, which reports what it could not deliver in its next answer to the rank.
    "relay_buffer_full": "the node relay's buffer filled while the rules service did not take its batches "
                         "(the agent's relay.buffer_max_bytes)",
    "relay_too_old": "the node relay held them longer than its relay.buffer_max_age_s while the rules service did "
                     "not take its batches",
    "relay_refused": "the rules service refused them when the node relay forwarded them; the agent's log says why",
}
# 421: the push reached a rules replica of another shard. Misconfiguration, not an outage: retrying the same
# address cannot succeed, so the batch is dropped like any other refusal, with a line saying what to set.
MISROUTED = 421


class Pusher:
    """Owns everything after the queue: batching, the transport, retries and the counters it writes."""

    def __init__(self, queue: deque[Record], head: Mapping[str, object], transport: Transport, *,
                 interval_s: float, max_steps: int, timeout_s: float,
                 clock: Callable[[], float], wall: Callable[[], float], encoding: str = "json",
                 early: EarlyPush | None = None) -> None:
        if queue.maxlen is None:
            raise ValueError("the queue must be bounded")
        self._q = queue
        self._max_queue = queue.maxlen
        self._head = encode_head(head, encoding)
        self._encode = encoder(encoding)
        self._transport = transport
        self._interval = interval_s
        self._timeout = timeout_s
        self._clock, self._wall = clock, wall
        self.limit = max_steps  # steps per push; halved on every 413
        self.backoff = Backoff(BACKOFF_BASE_S, BACKOFF_CAP_S)
        self._pending: list[Record] = []  # the batch being sent; older than anything still queued
        # len(_pending), or more while a batch is being taken: the training thread reads it to keep the queue,
        # the held records and this batch within max_queue together (the reporter's _make_room).
        self.in_hand = 0
        self._last_post = clock()  # when the service last took a push (or the thread started)
        self.beats = 0  # heartbeats sent (pushes without steps)
        self._outage = False
        self._warned: set[object] = set()
        # Written only by this thread; the reporter reads them for its stats snapshot.
        self.taken = self.pushed = self.dropped = self.failed = 0
        # Steps the service answered it did not store, by its reason; swapped whole, so a reader needs no lock.
        self.service_dropped: Mapping[str, int] = MappingProxyType({})
        self.ended = False  # the final push (end of job) was taken by the service
        self.last_error: str | None = None
        self._closing = False
        self._deadline = 0.0
        self._wake = threading.Event()
        # Early pushes (gpumond/job/early.py; None: only the regular cadence): the steps this thread took, and
        # the duration past which the training thread asks for a push at once (written here, read there).
        self._history = None if early is None else StepHistory(early)
        self.early_above = math.inf
        self.early = 0  # pushes asked for by a step that stood out
        self._thread = threading.Thread(target=self._run, name="gpumond-job-push", daemon=True)

    @property
    def pending_len(self) -> int:
        """Steps taken off the queue but not yet pushed or dropped."""
        return len(self._pending)

    def start(self) -> None:
        """Start the daemon thread."""
        self._thread.start()

    def close(self, timeout_s: float) -> None:
        """Ask the thread to flush until `timeout_s` from now, and wait for it about that long."""
        timeout_s = max(0.0, timeout_s)
        self._deadline = time.monotonic() + timeout_s
        self._closing = True
        self._wake.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout_s + JOIN_GRACE_S)

    # ----- the thread ------------------------------------------------------------------------------
    def nudge(self) -> None:
        """A step stood out (early.push_early): push now, unless a retry's backoff is pending. Any thread."""
        self._wake.set()

    def _run(self) -> None:
        delay = self._interval
        retrying = False
        try:
            while not self._closing:
                due = time.monotonic() + delay
                woke = self._wake.wait(delay)
                if self._closing:
                    break
                if woke:
                    self._wake.clear()  # close() sets it after _closing, which the loop reads first
                    if retrying and (left := due - time.monotonic()) > 0:
                        delay = left  # the backoff stands: an early push would hammer a failing service
                        continue
                    self.early += 1
                # Woken: an early push, which a node relay forwards at once (a retry or a heartbeat never is one).
                retry_in = self._drain_safely(self._timeout, early=woke)
                retrying = retry_in is not None
                if retry_in is None and self._clock() - self._last_post >= self._interval * 0.9:
                    self._send_marker(self._timeout, final=False)
                now = time.monotonic()
                if retry_in is not None:
                    delay = retry_in
                elif woke and self._history is not None:  # an early push: the regular cadence keeps its phase
                    delay = regular_after_early(due, now, self._interval, self._history.rule) - now
                else:
                    delay = self._interval
            if self._flush_until_deadline():
                left = self._deadline - time.monotonic()
                if left > 0:
                    self._send_marker(min(self._timeout, left), final=True)
        finally:
            self._abandon()

    def _send_marker(self, timeout_s: float, *, final: bool) -> None:
        """A push without steps: a heartbeat while the process lives and has nothing to report (what tells
        the rules service a hung rank from an ended one), or, at close, the rank's final push (its end of job).
        Never retried: the next heartbeat comes one interval later, and a lost final push costs at most a
        finding resolving on its own schedule."""
        try:
            body = self._encode(self._head, (), self._wall(), self._clock(), final=final)
            reply = self._transport.post(body, timeout_s)
        except Exception as exc:  # no answer: counted like any failed request
            self.failed += 1
            self.last_error = f"{type(exc).__name__}: {exc}"
            return
        if 200 <= reply.status < 300:
            self._last_post = self._clock()
            self.last_error = None  # the service answers again: an old error would say it does not
            self.beats += 0 if final else 1
            self.ended = self.ended or final
        else:
            self.failed += 1
            self.last_error = _describe(reply.status, reply.detail)

    def _flush_until_deadline(self) -> bool:
        """Closing: keep pushing (and retrying) while the close deadline leaves time for it; True when
        everything queued was pushed (or dropped as refused), so the final push may follow."""
        while (left := self._deadline - time.monotonic()) > 0:
            retry_in = self._drain_safely(min(self._timeout, left))
            if retry_in is None:
                return True
            if retry_in >= self._deadline - time.monotonic():
                return False
            time.sleep(retry_in)
        return False

    def _abandon(self) -> None:
        """Count whatever is still held as dropped and let the connection go."""
        leftover = len(self._pending)
        self._hold([])
        while self._q:
            try:
                self._q.popleft()
            except IndexError:  # the training thread made room meanwhile: that one is counted as overflow
                break
            self.taken += 1
            leftover += 1
        self.dropped += leftover
        if leftover:
            log.warning("gpumond: %d steps were not pushed before close and are dropped", leftover)
        try:
            self._transport.close()
        except Exception:  # closing a broken connection can fail; nothing is left to do about it
            pass

    def _drain_safely(self, timeout_s: float, *, early: bool = False) -> float | None:
        """drain(), but a bug in it costs the batch in hand, never the thread."""
        try:
            return self.drain(timeout_s, early=early)
        except Exception as exc:
            self._drop(f"internal error: {exc!r}", key="internal", exc_info=True)
            return None

    # ----- one round of pushing --------------------------------------------------------------------
    def drain(self, timeout_s: float, *, early: bool = False) -> float | None:
        """Push queued steps until the queue is empty (None) or a failure asks to wait (seconds); `early`: these
        pushes are made at once after a step that stood out (Transport.post)."""
        while True:
            if not self._pending:
                self._hold(self._take())
                if not self._pending:
                    return None
            try:
                body = self._encode(self._head, self._pending, self._wall(), self._clock())
            except (TypeError, ValueError) as exc:
                self._drop(f"cannot encode steps: {exc}", key="encode")
                continue
            try:
                reply = self._transport.post(body, timeout_s, early=early)
            except Exception as exc:  # no answer at all: refused, reset, timed out, DNS
                return self._retry_later(f"{type(exc).__name__}: {exc}", None)
            if 200 <= reply.status < 300:
                self._pushed(reply.dropped)
            elif retryable(reply.status):
                return self._retry_later(_describe(reply.status, reply.detail), reply.retry_after_s)
            else:
                self._reject(reply.status, reply.detail)

    def _take(self) -> list[Record]:
        """Pop up to `limit` of the oldest queued steps (the training thread may drop the oldest meanwhile)."""
        n = min(len(self._q), self.limit)
        self.in_hand = n  # reserved before popping: the queue and this batch never exceed max_queue together
        popleft = self._q.popleft
        batch: list[Record] = []
        for _ in range(n):
            try:
                batch.append(popleft())
            except IndexError:  # the training thread dropped the oldest meanwhile (the queue was full)
                break
        n = len(batch)
        self.taken += n
        history = self._history
        if history is not None:
            for record in batch:
                history.add(record[1], record[2])
            self.early_above = history.above()
        return batch

    def _hold(self, batch: list[Record]) -> None:
        """Make `batch` the one in hand (the count follows the list: it may only shrink after it)."""
        self._pending = batch
        self.in_hand = len(batch)

    def _pushed(self, dropped: tuple[tuple[str, int], ...] = ()) -> None:
        """The batch in hand was answered 2xx: pushed, less what the service says it did not store."""
        self._last_post = self._clock()
        self.last_error = None  # failed_pushes keeps the count of what went wrong before
        sent = len(self._pending)
        lost = 0
        counts = dict(self.service_dropped)
        for reason, n in dropped:
            if reason == "duplicate" and self.backoff.failures:
                # A retry of a batch whose earlier attempt got no answer: the service stored it then.
                continue
            n = min(n, sent - lost)
            lost += n
            counts[reason] = counts.get(reason, 0) + n
            if ("service", reason) not in self._warned:
                self._warned.add(("service", reason))
                log.warning("gpumond: the rules service did not store %d steps (%s): %s (further drops for this "
                            "reason are only counted, in stats.dropped_by_service)", n, reason,
                            SERVICE_DROP_HINTS.get(reason, "see docs/rules-api.md"))
        if lost:
            self.service_dropped = MappingProxyType(counts)
            self.dropped += lost
        self.pushed += sent - lost
        self._hold([])
        if self._outage:
            log.info("gpumond: pushes resumed after %d failed attempts", self.backoff.failures)
        self._outage = False
        self.backoff.reset()

    def _retry_later(self, error: str, retry_after_s: float | None) -> float:
        """Keep the batch, count the failure, and say how long to wait before the next attempt."""
        self.failed += 1
        self.last_error = error
        if not self._outage:
            self._outage = True
            log.warning("gpumond: push to the rules service failed (%s); retrying with backoff, "
                        "queueing up to %d steps and then dropping the oldest", error, self._max_queue)
        return self.backoff.after_failure(retry_after_s)

    def _reject(self, status: int, detail: str) -> None:
        """The service refused this batch for good: drop it; a 413 also shrinks later batches."""
        self.failed += 1
        note = ""
        if status == 413:
            self.limit = max(1, len(self._pending) // 2)
            note = f"; sending at most {self.limit} steps per push from now on"
        elif status == MISROUTED:
            note = ("; this job's pushes reach a rules shard that does not evaluate it: set GPUMOND_SHARDS to "
                    "the number of rules replicas and put {shard} in GPUMOND_ENDPOINT (docs/job-sdk.md)")
        self._drop(_describe(status, detail) + note, key=status)

    def _drop(self, error: str, *, key: object, exc_info: bool = False) -> None:
        """Drop the batch in hand, counted, with one warning per kind of reason."""
        count = len(self._pending)
        self.dropped += count
        self._hold([])
        self.backoff.reset()
        self.last_error = error
        if key not in self._warned:
            self._warned.add(key)
            log.warning("gpumond: dropped %d steps: %s (further drops for this reason are only counted)",
                        count, error, exc_info=exc_info)


def _describe(status: int, detail: str) -> str:
    """`HTTP 401: <what the service said>` on one line."""
    detail = one_line(detail)
    return f"HTTP {status}: {detail}" if detail else f"HTTP {status}"
