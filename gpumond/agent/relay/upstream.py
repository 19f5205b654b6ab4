"""The relay's sender: each interval, every job's held pushes go to the job's rules shard in one batch per
credential, oldest first; 429 / 5xx / no answer keep them (Retry-After honoured, capped backoff with jitter),
a refusal drops them and tells their ranks."""

from __future__ import annotations

import json
import logging
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from gpumond import __version__
from gpumond.agent.relay.buffer import BatchKey, Buffer, Entry
from gpumond.agent.relay.stats import RelayStats
from gpumond.web.client import Access
from gpumond.wire.batch import encode_batch
from gpumond.wire.media import BATCH_TYPE
from gpumond.wire.retry import Backoff, parse_retry_after, retryable
from gpumond.wire.routing import shard_endpoint
from gpumond.wire.safetext import one_line

log = logging.getLogger("gpumond.agent.relay")

PUSH_PATH = "/api/v1/push"
# The service's default limits.max_body_bytes: a batch is cut to it (a 413 from a service configured lower halves it).
MAX_BATCH_BYTES = 1_048_576
BACKOFF_BASE_S = 0.5
BACKOFF_CAP_S = 30.0
# A credential the service refused (401/403) is refused at the relay this long, in the service's words, so its
# ranks learn it as they would pushing directly; then pushes with it are tried upstream again.
REFUSAL_HOLD_S = 60.0
_MAX_ANSWER_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Refusal:
    """What the service answered a credential: a rank pushing with it gets the same."""

    status: int
    message: str
    until: float


class Sender:
    """Forwards the buffer upstream; `flush` is one round (the agent's scheduler calls it every relay.interval_s)."""

    def __init__(self, *, buffer: Buffer, stats: RelayStats, upstream: str, shards: int | None, access: Access,
                 client: httpx.Client, clock: Callable[[], float], backoff: Backoff | None = None) -> None:
        self._buffer = buffer
        self._stats = stats
        self._upstream = upstream
        self._shards = shards
        self._access = access
        self._client = client
        self._clock = clock
        self.backoff = backoff or Backoff(BACKOFF_BASE_S, BACKOFF_CAP_S)
        self.paused_until = float("-inf")
        self.max_batch_bytes = MAX_BATCH_BYTES
        self._refusals: dict[str | None, Refusal] = {}
        self._warned: set[object] = set()
        self._round = threading.Lock()  # one round at a time (the scheduler's, or the final flush at stop)

    def refusal(self, authorization: str | None) -> Refusal | None:
        """The service's standing refusal of this credential, if any."""
        found = self._refusals.get(authorization)
        if found is not None and self._clock() >= found.until:
            self._refusals.pop(authorization, None)
            return None
        return found

    def flush(self) -> bool:
        """One round: drop what is too old, then send each key's held pushes; True when nothing is left held."""
        with self._round:
            for entry in self._buffer.expire():
                self._stats.lost(entry.rank, entry.steps, "too_old")
            if self._clock() < self.paused_until:
                return False
            started = self._clock()
            for key in self._buffer.keys():
                front = None
                while (entries := self._buffer.take(key, self.max_batch_bytes)) and entries[0].received <= started:
                    if entries[0] is front:
                        break  # held by the service's answer (a cap's 429): sent again next round
                    front = entries[0]
                    if not self._send(key, entries):
                        return False  # the service asked for a pause (or is not answering): every key waits
            return self._buffer.count == 0

    def flush_until(self, deadline: float) -> None:
        """At stop: rounds until the buffer is empty or `deadline` (monotonic) passes, pausing as asked."""
        while time.monotonic() < deadline:
            if self.flush():
                return
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))

    def _send(self, key: BatchKey, entries: list[Entry]) -> bool:
        """One batch; False when the round must stop (the service is down or asked for a pause)."""
        job, authorization = key
        headers = {"Content-Type": BATCH_TYPE, "User-Agent": f"gpumond-agent-relay/{__version__}"}
        try:
            # The rank's own token passes through: the service decides what it may push, as if it pushed directly.
            # Ranks without one push under the relay's configured credential (a node-local secret), if any.
            headers.update({"Authorization": authorization} if authorization else self._access.headers())
        except Exception as e:  # a credentials file that became unreadable: counted, tried again next round
            return self._failed("bad_answer", f"relay credentials: {e}", None, entries)
        url = shard_endpoint(self._upstream, job, self._shards) + PUSH_PATH
        body = encode_batch(job, [e.line for e in entries])
        try:
            response = self._client.post(url, content=body, headers=headers)
            answer = response.content[:_MAX_ANSWER_BYTES]
        except httpx.TimeoutException as e:
            return self._failed("timeout", f"{type(e).__name__}: {e}", None, entries)
        except httpx.TransportError as e:
            kind = "tls" if isinstance(e.__context__ or e.__cause__, ssl.SSLError) else "connect"
            return self._failed(kind, f"{type(e).__name__}: {e}", None, entries)
        status = response.status_code
        if status == 202:
            return self._delivered(entries, answer)
        message = _message(answer)
        if retryable(status):
            after = parse_retry_after(response.headers.get("Retry-After"), time.time())
            return self._failed("http_429" if status == 429 else "http_5xx", f"HTTP {status}: {message}", after,
                                entries)
        self._stats.error("http_4xx")
        if status == 413 and len(entries) > 1:
            self.max_batch_bytes = max(4096, self.max_batch_bytes // 2)  # a service configured below the default
            return True
        if status in (401, 403):
            self._refusals[authorization] = Refusal(status, message, self._clock() + REFUSAL_HOLD_S)
        self._warn(status, "the rules service refused a batch; its pushes are dropped and their ranks told",
                   status=status, job=job, error=message)
        for entry in entries:
            self._stats.lost(entry.rank, entry.steps, "refused")
        self._buffer.done(entries)
        return True

    def _delivered(self, entries: list[Entry], answer: bytes) -> bool:
        try:
            results = json.loads(answer)["results"]
            if not isinstance(results, list) or len(results) != len(entries):
                raise ValueError("one result per push")
        except (ValueError, KeyError, TypeError) as e:
            # Stored or not, we cannot tell: sending again is safe (the service drops duplicates by step number).
            return self._failed("bad_answer", f"202 without a usable results list: {e}", None, entries)
        self._finish(entries, results)
        self._refusals.pop(entries[0].key[1], None)
        if self.backoff.failures:
            log.info("the rules service takes the relay's batches again", extra={"failures": self.backoff.failures})
        self.backoff.reset()
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

    def _failed(self, kind: str, error: str, retry_after_s: float | None, entries: list[Entry]) -> bool:
        self._stats.error(kind)
        for entry in entries:
            entry.attempts += 1
        delay = self.backoff.after_failure(retry_after_s)
        self.paused_until = self._clock() + delay
        if self.backoff.failures == 1:
            log.warning("the rules service does not take the relay's batches; holding them and retrying with "
                        "backoff", extra={"error": one_line(error), "retry_in_s": round(delay, 2),
                                          "buffer_bytes": self._buffer.bytes})
        return False

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
