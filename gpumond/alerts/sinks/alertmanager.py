"""Alertmanager `POST /api/v2/alerts`: the whole current picture to one replica, re-sent while firing.

Firing alerts carry `endsAt` as a lease (now + 4 × max(resend interval, evaluation interval), as
Prometheus does), so Alertmanager resolves them by itself if gpumond dies; resolved alerts are re-sent
for `keep_resolved_s` so one lost POST never leaves a page open. One sink per replica: Alertmanager HA
expects every sender to post to every replica, and a dead replica must not delay the others.
"""

from __future__ import annotations

from collections.abc import Callable

from gpumond.alerts.model import Alert
from gpumond.alerts.sinks.base import Outcome, Snapshot, WorkerSink, by_urgency, safe_target
from gpumond.config.alerting import AlertmanagerConfig
from gpumond.web.client import build_access
from gpumond.wire.safetext import one_line


def alertmanager_body(alerts: list[Alert], generator_urls: dict[str, str], expires_at: float) -> list[dict]:
    """The JSON array for `POST /api/v2/alerts`."""
    return [a.to_alertmanager(generator_urls.get(a.fingerprint), expires_at) for a in alerts]


class AlertmanagerSink(WorkerSink):
    """Posts every firing and recently resolved alert to one Alertmanager, on change and every resend."""

    name = "alertmanager"

    def __init__(self, url: str, cfg: AlertmanagerConfig, *, evaluation_interval_s: float, queue_size: int,
                 clock: Callable[[], float], **kw: object) -> None:
        super().__init__(safe_target(url), timeout_s=cfg.timeout_s, clock=clock,  # type: ignore[arg-type]
                         access=build_access(cfg, "alerting.alertmanager"), **kw)
        self._url = url.rstrip("/") + "/api/v2/alerts"
        self._resend_s = cfg.resend_interval_s
        self.lease_s = 4 * max(cfg.resend_interval_s, evaluation_interval_s)
        self._queue_size = queue_size
        self._sent_state: frozenset[tuple[str, str]] | None = None
        self._sent_at = float("-inf")
        self._retry_at = 0.0
        self._depth = 0

    def depth(self) -> int:
        return self._depth

    def step(self, snapshot: Snapshot, now: float) -> float | None:
        alerts = [a for a in snapshot.alerts if a.state in ("firing", "resolved")]
        state = frozenset((a.fingerprint, a.state) for a in alerts)
        changed = state != self._sent_state
        if not alerts and self._sent_state is None:
            return None  # nothing ever to say
        if now < self._retry_at:
            self._depth = len(alerts)
            return self._retry_at
        if not changed and now < self._sent_at + self._resend_s:
            self._depth = 0
            return self._sent_at + self._resend_s
        if len(alerts) > self._queue_size:
            # Most urgent first; the rest wait for capacity (counted, and logged by the caller's metrics).
            self.dropped += len(alerts) - self._queue_size
            alerts = by_urgency(alerts)[: self._queue_size]
        self._depth = len(alerts)
        answer = self.post(self._url, alertmanager_body(alerts, dict(snapshot.generator_urls), now + self.lease_s))
        if not isinstance(answer, str) and 200 <= answer.status < 300:
            self.succeeded()
            self._sent_state, self._sent_at, self._depth = state, now, 0
            return now + self._resend_s if alerts else None
        if isinstance(answer, str):
            outcome = Outcome(False, retry=True, reason=answer)
        elif answer.status >= 500 or answer.status == 429:
            outcome = Outcome(False, retry=True, reason=f"HTTP {answer.status}")
        else:
            # 400 / 422: the payload itself is wrong; retried at the next resend so a fix to the
            # receiving side is picked up, but counted and logged as a failure now.
            outcome = Outcome(False, retry=True, retry_after_s=self._resend_s,
                              reason=f"HTTP {answer.status}: {one_line(answer.body, 200)}")
        self._retry_at = self.failed_retry(outcome, now)
        return self._retry_at
