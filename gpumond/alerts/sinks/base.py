"""What every sink shares: the protocol, the snapshot it is handed, its worker thread, HTTP, backoff, metrics.

A sink is handed the whole current picture (`Snapshot`) and reconciles towards it on its own thread, so
`publish()` is a swap under a lock: a sink that is down, slow or hostile never blocks sampling, policy or
detection, and a delivery that failed is simply retried against the newest picture (nothing is lost while
the work stays within the sink's queue bound).
"""

from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

import httpx

from gpumond.alerts.model import Alert
from gpumond.alerts.sinks.deadline import RequestDeadline
from gpumond.web.client import Access, AccessError, http_client
from gpumond.wire.retry import Backoff, parse_retry_after, retryable
from gpumond.types import Series

log = logging.getLogger("gpumond.alerts")

SINK_METRICS: dict[str, tuple[str, str]] = {
    "gpumond_alert_sink_sent_total": ("counter", "Notifications a sink delivered (an Alertmanager POST counts one)."),
    "gpumond_alert_sink_failed_total": ("counter", "Delivery attempts that failed (each retry counts)."),
    "gpumond_alert_sink_dropped_total": ("counter", "Notifications given up: over the queue bound or refused "
                                                    "by the receiver (400)."),
    "gpumond_alert_sink_queue_depth": ("gauge", "Notifications waiting for delivery."),
    "gpumond_alert_sink_last_success_timestamp_seconds": ("gauge", "Unix time of the sink's last delivery."),
}
_MAX_RESPONSE_BYTES = 64 * 1024  # a hostile receiver cannot make us read more than this
_SEVERITY_RANK = {"critical": 0, "error": 1, "warning": 2, "info": 3}


def severity_rank(alert: Alert) -> int:
    """0 for critical … 3 for info: lower is more urgent."""
    return _SEVERITY_RANK.get(alert.severity, 3)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What a sink reconciles towards: firing alerts and recently resolved ones (wall-clock times)."""

    alerts: tuple[Alert, ...]
    now: float
    generator_urls: Mapping[str, str]  # fingerprint → generatorURL


class Sink(Protocol):
    """A destination for alerts; one file each under gpumond/alerts/sinks/."""

    name: str
    target: str  # what the operator recognises (a host:port), never a secret

    def publish(self, snapshot: Snapshot) -> None: ...

    def start(self) -> None: ...

    def stop(self, timeout_s: float = 5.0) -> None: ...

    def series(self) -> list[Series]: ...


@dataclass(frozen=True, slots=True)
class Outcome:
    """How one delivery went: ok; retry (after the receiver's Retry-After, if any); or rejected for good."""

    ok: bool
    retry: bool = False
    retry_after_s: float | None = None
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Answer:
    """An HTTP answer, its body cut at a bound."""

    status: int
    headers: Mapping[str, str]
    body: str


def safe_target(url: str) -> str:
    """host:port of a URL, without userinfo, path or query (Slack's path and PagerDuty keys are secrets)."""
    parts = urlsplit(url)
    host = parts.hostname or "?"
    return f"{host}:{parts.port}" if parts.port else host


def classify(answer: Answer, refusal: Callable[[Answer], str], now_wall: float) -> Outcome:
    """Slack's and PagerDuty's common answers: 2xx delivered; 408, 429 and 5xx retried (after Retry-After, if
    any); any other 4xx a refusal that the same payload would get again (never retried), worded by `refusal`."""
    if 200 <= answer.status < 300:
        return Outcome(True)
    if retryable(answer.status):
        reason = "HTTP 429 (rate limited)" if answer.status == 429 else f"HTTP {answer.status}"
        return Outcome(False, retry=True, retry_after_s=parse_retry_after(answer.headers.get("retry-after"),
                                                                          now_wall), reason=reason)
    return Outcome(False, reason=f"HTTP {answer.status}: {refusal(answer)}")


def sink_backoff() -> Backoff:
    """A sink's retry schedule: from 1 s, doubling, to 60 s."""
    return Backoff(base_s=1.0, cap_s=60.0)


class WorkerSink(ABC):
    """A sink's thread: waits for a new snapshot or its next due time, then calls `step()`.

    Subclasses implement `step(snapshot, now) -> next due time or None` and `depth()`; they deliver with
    `post()` and count with `sent` / `failed` / `dropped`.
    """

    name = "sink"

    def __init__(self, target: str, *, timeout_s: float, client: httpx.Client | None = None,
                 clock: Callable[[], float] = time.time, backoff: Backoff | None = None,
                 access: Access | None = None) -> None:
        self.target = target
        self.timeout_s = timeout_s  # the whole request, connect to last byte (RequestDeadline)
        self.access = access if access is not None else Access()  # TLS and credentials (gpumond.web.client)
        self._access_problem: str | None = None
        # Keep-alive off: every request connects, so RequestDeadline sees (and can cut) its socket.
        self._client = client or http_client(self.access,
                                             timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 5.0)),
                                             limits=httpx.Limits(max_keepalive_connections=0))
        self._clock = clock
        self.backoff = backoff or sink_backoff()
        self._cv = threading.Condition()
        self._snapshot: Snapshot | None = None
        self._fresh = False
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.sent = 0
        self.failed = 0
        self.dropped = 0
        self.last_success: float | None = None

    # ----- the daemon's side -------------------------------------------------------------------------
    def publish(self, snapshot: Snapshot) -> None:
        """Hand over the newest picture; never blocks on delivery."""
        with self._cv:
            self._snapshot = snapshot
            self._fresh = True
            self._cv.notify()

    def start(self) -> None:
        """Start the delivery thread."""
        self._thread = threading.Thread(target=self._run, name=f"gpumond-sink-{self.name}-{self.target}",
                                        daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the thread (a delivery in flight is bounded by the HTTP timeout) and close the client."""
        with self._cv:
            self._stopping = True
            self._cv.notify()
        if self._thread is not None:
            self._thread.join(timeout_s)
        self._client.close()

    def series(self) -> list[Series]:
        """This sink's delivery metrics."""
        labels = (("sink", self.name), ("target", self.target))
        out = [Series("gpumond_alert_sink_sent_total", labels, float(self.sent)),
               Series("gpumond_alert_sink_failed_total", labels, float(self.failed)),
               Series("gpumond_alert_sink_dropped_total", labels, float(self.dropped)),
               Series("gpumond_alert_sink_queue_depth", labels, float(self.depth()))]
        if self.last_success is not None:
            out.append(Series("gpumond_alert_sink_last_success_timestamp_seconds", labels, self.last_success))
        return out

    # ----- the worker's side -------------------------------------------------------------------------
    def _run(self) -> None:
        due: float | None = None
        while True:
            with self._cv:
                while not self._stopping and not self._fresh and (due is None or self._clock() < due):
                    self._cv.wait(None if due is None else max(0.0, min(due - self._clock(), 60.0)))
                if self._stopping:
                    return
                snapshot, self._fresh = self._snapshot, False
            if snapshot is None:
                due = None
                continue
            try:
                due = self.step(snapshot, self._clock())
            except Exception:  # a bug in one sink must not kill its thread; logged, retried later
                log.exception("alert sink failed", extra={"sink": self.name, "target": self.target})
                due = self._clock() + self.backoff.next_delay()

    @abstractmethod
    def step(self, snapshot: Snapshot, now: float) -> float | None:
        """Deliver what is due; return when to run again (None: only on a new snapshot)."""

    @abstractmethod
    def depth(self) -> int:
        """Notifications waiting for delivery."""

    def post(self, url: str, body: object, headers: Mapping[str, str] | None = None) -> Answer | str:
        """POST JSON; the answer, or one line saying why there is none (never the URL: it may be a secret).

        The whole request, from connect to the last byte of the answer, gets `timeout_s` (a total deadline)."""
        problem = self.access.refresh()  # rotated certificate files: in place for the next connection
        if problem != self._access_problem:
            if problem:
                log.warning("changed certificate files not used (the previous ones stay)",
                            extra={"sink": self.name, "target": self.target, "error": problem})
            self._access_problem = problem
        try:
            headers = {**self.access.headers(), **(headers or {})}  # the secret file as it is now
        except AccessError as e:
            return str(e)
        deadline = RequestDeadline(self.timeout_s)
        late = f"timed out (no complete answer within {self.timeout_s:g} s)"
        try:
            with self._client.stream("POST", url, json=body, headers=headers,
                                     extensions={"trace": deadline.trace}) as r:
                chunks: list[bytes] = []
                size = 0
                for chunk in r.iter_bytes():
                    chunks.append(chunk)
                    size += len(chunk)
                    if size >= _MAX_RESPONSE_BYTES:
                        break
                    if deadline.passed():
                        return late
                text = b"".join(chunks)[:_MAX_RESPONSE_BYTES].decode("utf-8", "replace")
                return Answer(r.status_code, {k.lower(): v for k, v in r.headers.items()}, text)
        except httpx.TimeoutException:
            return late if deadline.passed() else "timed out"
        except httpx.HTTPError as e:
            return late if deadline.expired else f"{type(e).__name__}"
        except OSError as e:
            return late if deadline.expired else f"{type(e).__name__}: {e.strerror or ''}".strip()
        finally:
            deadline.cancel()

    def succeeded(self, count: int = 1) -> None:
        """Count a delivery."""
        self.sent += count
        self.last_success = self._clock()
        self.backoff.reset()

    def failed_retry(self, outcome: Outcome, now: float) -> float:
        """Count a failed attempt; when to try again (the receiver's Retry-After wins over our backoff)."""
        self.failed += 1
        delay = self.backoff.after_failure(outcome.retry_after_s)
        log.warning("alert delivery failed; will retry", extra={"sink": self.name, "target": self.target,
                                                               "reason": outcome.reason, "retry_in_s": round(delay, 1)})
        return now + delay


def by_urgency(alerts: Sequence[Alert]) -> list[Alert]:
    """Most urgent first, then oldest first."""
    return sorted(alerts, key=lambda a: (severity_rank(a), a.starts_at, a.fingerprint))
