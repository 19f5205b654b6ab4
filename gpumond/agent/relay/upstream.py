"""The relay's sender: each interval, every job's held pushes go to the job's rules shard in one batch per
credential, oldest first; 429 / 5xx / no answer keep them (Retry-After honoured, capped backoff with jitter),
a refusal drops them and tells their ranks."""

from __future__ import annotations

import json
import logging
import ssl
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

import httpx

from gpumond import __version__
from gpumond.agent.relay.buffer import BatchKey, Buffer, Entry
from gpumond.agent.relay.stats import RelayStats
from gpumond.web.client import Access
from gpumond.wire.batch import LineError, encode_columns_batch
from gpumond.wire.media import BATCH_COLUMNS_TYPE
from gpumond.wire.retry import Backoff, parse_retry_after, retryable
from gpumond.wire.routing import shard_endpoint
from gpumond.wire.safetext import one_line

log = logging.getLogger("gpumond.agent.relay")

PUSH_PATH = "/api/v1/push"
# The service's default limits.max_body_bytes: a batch is cut to it (a 413 from a service configured lower halves it).
MAX_BATCH_BYTES = 1_048_576
BACKOFF_BASE_S = 0.5
# Two relay intervals (the default 2 s), with full jitter (a wait anywhere in [0, cap)): once the service is back,
# a relay delivers what it held within a cap and one interval (a 30 s cap took 27 s after a 60 s outage), and a
# fleet of relays that lost it together comes back spread over the cap rather than at once. A relay tries a shard
# at most once a round (relay.interval_s) whatever the schedule, so an outage never raises its request rate above
# a healthy one's; a service that is back but loaded says so with 429 and Retry-After, which lengthens the wait.
BACKOFF_CAP_S = 4.0
BACKOFF_JITTER = 1.0
# A credential the service refused (401/403) is refused at the relay this long, in the service's words, so its
# ranks learn it as they would pushing directly; then pushes with it are tried upstream again.
REFUSAL_HOLD_S = 60.0
# Credentials held refused at most. A node's ranks push with a handful of tokens; anything on the node may send
# garbage ones, each a refusal held for REFUSAL_HOLD_S. Past this the oldest is forgotten, which costs only that its
# next push is tried upstream again (and refused there): memory stays bounded (~100 B plus the token each) whatever
# a client sends, and 4,096 is far above any node's honest count.
MAX_REFUSALS = 4096
_MAX_ANSWER_BYTES = 4 * 1024 * 1024


@dataclass(slots=True)
class _Target:
    """One upstream address (a shard): its own backoff, so a shard that is down holds only its own jobs."""

    url: str
    backoff: Backoff
    paused_until: float = float("-inf")


@dataclass(frozen=True, slots=True)
class Refusal:
    """What the service answered a credential: a rank pushing with it gets the same."""

    status: int
    message: str
    until: float


class Sender:
    """Forwards the buffer upstream; `flush` is one round (the agent's scheduler calls it every relay.interval_s)."""

    def __init__(self, *, buffer: Buffer, stats: RelayStats, upstream: str, shards: int | None, access: Access,
                 client: httpx.Client, clock: Callable[[], float], timer: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep,
                 backoff: Callable[[], Backoff] = lambda: Backoff(BACKOFF_BASE_S, BACKOFF_CAP_S,
                                                                  jitter=BACKOFF_JITTER)) -> None:
        self._buffer = buffer
        self._stats = stats
        self._upstream = upstream
        self._shards = shards
        self._access = access
        self._client = client
        self._clock = clock
        # The stop flush's deadline is the supervisor's real time, whatever clock ages and backoffs are read on.
        self._timer = timer
        self._sleep = sleep
        self._new_backoff = backoff
        self._targets: dict[str, _Target] = {}
        self.max_batch_bytes = MAX_BATCH_BYTES
        self._refusals: dict[str | None, Refusal] = {}  # oldest first; read on the listener's thread too
        self._refusals_lock = threading.Lock()
        self._warned: set[object] = set()
        self._round = threading.Lock()  # one round at a time (the scheduler's, or the final flush at stop)

    def refusal(self, authorization: str | None) -> Refusal | None:
        """The service's standing refusal of this credential, if any."""
        with self._refusals_lock:
            found = self._refusals.get(authorization)
            if found is not None and self._clock() >= found.until:
                self._refusals.pop(authorization, None)
                return None
            return found

    @property
    def refusals_held(self) -> int:
        """How many credentials are held refused now."""
        return len(self._refusals)

    def paused_until(self, url: str) -> float:
        """When the relay sends to this upstream address (a shard's) again (-inf: now)."""
        target = self._targets.get(url)
        return target.paused_until if target is not None else float("-inf")

    def flush(self, deadline: float | None = None, *, early: Collection[BatchKey] | None = None) -> bool:
        """One round: drop what is too old, then send each key's held pushes to its job's shard, except to a shard
        that asked for a pause or does not answer; True when nothing is left held. With `deadline` (on `timer`,
        monotonic), no send starts once it has passed and none may wait beyond it. With `early`, an early round
        (gpumond/agent/relay/early.py): only those keys, and only to shards whose last batch was taken."""
        with self._round:
            for entry in self._buffer.expire():
                self._stats.lost(entry.rank, entry.steps, "too_old")
            self._forget_refusals()
            started = self._clock()
            for key in self._buffer.keys():
                if early is not None and key not in early:
                    continue
                url = shard_endpoint(self._upstream, key[0], self._shards) + PUSH_PATH
                target = self._targets.get(url) or self._targets.setdefault(url, _Target(url, self._new_backoff()))
                if early is not None and target.backoff.failures:
                    # Early rounds come on top of the regular ones: a shard whose last batch failed (no answer, 429,
                    # 5xx: paused, or backing off with a pause already over) hears from this relay only on the
                    # regular rounds, at most once per relay.interval_s, so an outage never raises the relay's
                    # request rate, early pushes or not. Its first batch taken (reset to 0 failures) ends that.
                    continue
                front = None
                # The batch's head line and newlines stay within the service's body limit too.
                while entries := self._buffer.take(key, self.max_batch_bytes - 1024):
                    try:
                        if entries[0].received > started or started < target.paused_until:
                            break
                        if entries[0] is front:
                            break  # held by the service's answer (a cap's 429): sent again next round
                        front = entries[0]
                        timeout = self._timeout_within(deadline)
                        if timeout is None:
                            return self._buffer.count == 0  # the time is spent: what is left stays held
                        if not self._send(key, entries, url, target, timeout):
                            break  # that shard asked for a pause (or is not answering): its jobs wait, others go on
                    finally:
                        self._buffer.release(entries)  # what the send did not finish may be dropped for room again
            return self._buffer.count == 0

    def flush_until(self, deadline: float) -> None:
        """At stop: rounds until the buffer is empty or `deadline` (on `timer`, monotonic) passes, pausing as asked;
        hung shards cannot hold it past `deadline` (each send's timeouts end there)."""
        while self._timer() < deadline:
            if self.flush(deadline):
                return
            self._sleep(min(0.2, max(0.0, deadline - self._timer())))

    def _timeout_within(self, deadline: float | None) -> httpx.Timeout | None:
        """The client's timeouts, each cut to what is left before `deadline`; None when nothing is left."""
        full = self._client.timeout
        if deadline is None:
            return full
        left = deadline - self._timer()
        if left <= 0:
            return None
        return httpx.Timeout(**{part: left if limit is None else min(limit, left)
                                for part, limit in (("connect", full.connect), ("read", full.read),
                                                    ("write", full.write), ("pool", full.pool))})

    def _send(self, key: BatchKey, entries: list[Entry], url: str, target: _Target,
              timeout: httpx.Timeout) -> bool:
        """One batch; False when this shard must wait (it is down or asked for a pause)."""
        job, authorization = key
        headers = {"Content-Type": BATCH_COLUMNS_TYPE, "User-Agent": f"gpumond-agent-relay/{__version__}"}
        try:
            # The rank's own token passes through: the service decides what it may push, as if it pushed directly.
            # Ranks without one push under the relay's configured credential (a node-local secret), if any.
            headers.update({"Authorization": authorization} if authorization else self._access.headers())
        except Exception as e:  # a credentials file that became unreadable: counted, tried again next round
            return self._failed(target, "bad_answer", f"relay credentials: {e}", None, entries)
        body, entries = self._encode(job, entries)
        if body is None:
            return True
        try:
            response = self._client.post(url, content=body, headers=headers, timeout=timeout)
            answer = response.content[:_MAX_ANSWER_BYTES]
        except httpx.TimeoutException as e:
            return self._failed(target, "timeout", f"{type(e).__name__}: {e}", None, entries)
        except httpx.TransportError as e:
            kind = "tls" if isinstance(e.__context__ or e.__cause__, ssl.SSLError) else "connect"
            return self._failed(target, kind, f"{type(e).__name__}: {e}", None, entries)
        status = response.status_code
        if status == 202:
            return self._delivered(target, entries, answer)
        message = _message(answer)
        if retryable(status):
            after = parse_retry_after(response.headers.get("Retry-After"), time.time())
            return self._failed(target, "http_429" if status == 429 else "http_5xx", f"HTTP {status}: {message}", after,
                                entries)
        self._stats.error("http_4xx")
        if status == 413 and len(entries) > 1:
            self.max_batch_bytes = max(4096, self.max_batch_bytes // 2)  # a service configured below the default
            return True
        if status in (401, 403):
            self._refuse(authorization, Refusal(status, message, self._clock() + REFUSAL_HOLD_S))
        self._warn(status, "the rules service refused a batch; its pushes are dropped and their ranks told",
                   status=status, job=job, error=message)
        for entry in entries:
            self._stats.lost(entry.rank, entry.steps, "refused")
        self._buffer.done(entries)
        return True

    def _encode(self, job: str, entries: list[Entry]) -> tuple[bytes | None, list[Entry]]:
        """The columnar batch of `entries` (or of the older ones, within max_batch_bytes), and the entries it holds;
        a held push that is not a columnar push body (only a damaged held file gives one) is dropped and told."""
        while entries:
            try:
                body = encode_columns_batch(job, [e.line for e in entries])
            except LineError as err:
                bad = entries.pop(err.index)
                self._warn("unreadable", "a held push is not a columnar push body; dropped and its rank told",
                           job=job, rank=bad.rank[1], error=str(err))
                self._stats.lost(bad.rank, bad.steps, "refused")
                self._buffer.done([bad])
                continue
            if len(body) <= self.max_batch_bytes or len(entries) == 1:
                return body, entries
            # Filling a column some pushes left out (comm wait, samples) for all of them can make the batch larger
            # than its lines: the older half goes in this batch, the rest in the next.
            entries = entries[:len(entries) // 2]
        return None, entries

    def _delivered(self, target: _Target, entries: list[Entry], answer: bytes) -> bool:
        try:
            results = json.loads(answer)["results"]
            if not isinstance(results, list) or len(results) != len(entries):
                raise ValueError("one result per push")
        except (ValueError, KeyError, TypeError) as e:
            # Stored or not, we cannot tell: sending again is safe (the service drops duplicates by step number).
            return self._failed(target, "bad_answer", f"202 without a usable results list: {e}", None, entries)
        self._finish(entries, results)
        with self._refusals_lock:
            self._refusals.pop(entries[0].key[1], None)
        if target.backoff.failures:
            log.info("the rules service takes the relay's batches again", extra={"failures": target.backoff.failures})
        target.backoff.reset()
        return True

    def _finish(self, entries: list[Entry], results: list[object]) -> None:
        """Account each push by its result; keep those the service asks to send again (a cap's 429)."""
        finished = []
        for entry, result in zip(entries, results):
            result = result if isinstance(result, dict) else {"status": 502, "error": "malformed result"}
            status = result.get("status", 202)
            if status == 202:
                lost = 0
                dropped = result.get("dropped")
                for reason, n in (dropped.items() if isinstance(dropped, dict) else ()):
                    if not isinstance(n, int) or n <= 0 or (reason == "duplicate" and entry.attempts):
                        continue  # a duplicate after an unanswered attempt: that attempt stored them
                    n = min(n, entry.steps - lost)
                    lost += n
                    self._stats.lost(entry.rank, n, str(reason)[:64], counted=False)
                self._stats.forwarded_steps(entry.steps - lost)
            elif isinstance(status, int) and retryable(status):
                continue  # held: sent again next round
            else:
                self._warn(("line", status), "the rules service refused a relayed push; its rank is told",
                           status=status, job=entry.rank[0], rank=entry.rank[1], error=str(result.get("error")))
                self._stats.lost(entry.rank, entry.steps, "refused")
            finished.append(entry)
        self._buffer.done(finished)

    def _failed(self, target: _Target, kind: str, error: str, retry_after_s: float | None,
                entries: list[Entry]) -> bool:
        self._stats.error(kind)
        for entry in entries:
            entry.attempts += 1
        delay = target.backoff.after_failure(retry_after_s)
        target.paused_until = self._clock() + delay
        if target.backoff.failures == 1:
            log.warning("the rules service does not take the relay's batches; holding them and retrying with "
                        "backoff", extra={"upstream": target.url, "error": one_line(error),
                                          "retry_in_s": round(delay, 2), "buffer_bytes": self._buffer.bytes})
        return False

    def _refuse(self, authorization: str | None, refusal: Refusal) -> None:
        # Re-inserted last, so the map stays ordered by expiry (every hold is as long): the oldest go first.
        with self._refusals_lock:
            self._refusals.pop(authorization, None)
            self._refusals[authorization] = refusal
            while len(self._refusals) > MAX_REFUSALS:
                del self._refusals[next(iter(self._refusals))]

    def _forget_refusals(self) -> None:
        """Drop the expired refusals (a credential never pushed again would otherwise stay for good)."""
        now = self._clock()
        with self._refusals_lock:
            while self._refusals and next(iter(self._refusals.values())).until <= now:
                del self._refusals[next(iter(self._refusals))]

    def _warn(self, key: object, message: str, **fields: object) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message, extra={**fields, "repeats": "counted in gpumond_relay_steps_dropped_total"})


def _message(body: bytes) -> str:
    """The service's one-line reason ({"error": …}), else the start of the raw answer."""
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), str):
        return one_line(parsed["error"])[:300]
    return one_line(body[:200].decode("utf-8", "replace"))
