"""PagerDuty Events API v2: one trigger per alert and one resolve, dedup_key = the alert's fingerprint."""

from __future__ import annotations

import json
from collections.abc import Callable

from gpumond.alerts.model import Alert, rfc3339
from gpumond.alerts.sinks.base import Answer, Outcome, Snapshot, safe_target
from gpumond.alerts.sinks.base import classify as http_classify
from gpumond.alerts.sinks.notices import Notice, NoticeBook, NoticeSink
from gpumond.config.alerting import PagerDutyConfig
from gpumond.web.client import build_access
from gpumond.wire.safetext import one_line, shorten

SUMMARY_MAX = 1024  # PagerDuty refuses longer summaries
_DETAIL_MAX = 4000


def pagerduty_event(alert: Alert, action: str, routing_key: str, generator_url: str | None) -> dict[str, object]:
    """The Events API v2 body for one alert: trigger while firing, resolve when over."""
    event: dict[str, object] = {"routing_key": routing_key, "event_action": "trigger" if action == "firing"
                                else "resolve", "dedup_key": alert.fingerprint}
    if action != "firing":
        return event
    labels = dict(alert.labels)
    summary = alert.annotation("summary") or alert.alertname
    details: dict[str, object] = {"labels": labels}
    for key in ("description", "evidence", "runbook_url"):
        value = alert.annotation(key)
        if value:
            details[key] = shorten(value, _DETAIL_MAX)
    event["payload"] = {
        "summary": shorten(f"[{alert.severity.upper()}] {summary}", SUMMARY_MAX),
        "source": labels.get("node") or labels.get("job") or "gpumond",
        "severity": alert.severity,  # gpumond's severities are exactly PagerDuty's four
        "timestamp": rfc3339(alert.starts_at),
        "component": labels.get("uuid") or labels.get("job") or labels["alertname"],
        "group": labels.get("cluster") or labels.get("job") or labels.get("node") or "gpumond",
        "class": labels["alertname"],
        "custom_details": details,
    }
    links = [{"href": u, "text": t} for u, t in ((alert.annotation("runbook_url"), "Runbook"),
                                                  (generator_url, "Source")) if u]
    if links:
        event["links"] = links
    event["client"] = "gpumond"
    if generator_url:
        event["client_url"] = generator_url
    return event


class PagerDutySink(NoticeSink):
    """Triggers and resolves PagerDuty incidents; no retry on 400, backoff on 429 / 5xx / network errors."""

    name = "pagerduty"

    def __init__(self, cfg: PagerDutyConfig, *, book: NoticeBook, queue_size: int,
                 clock: Callable[[], float], **kw: object) -> None:
        super().__init__(safe_target(cfg.url), book=book, min_severity=cfg.min_severity, queue_size=queue_size,
                         timeout_s=cfg.timeout_s, clock=clock, access=build_access(cfg, "alerting.pagerduty"),
                         **kw)
        self._url = cfg.url
        self._key = cfg.routing_key or ""

    def deliver(self, notice: Notice, snapshot: Snapshot) -> Outcome:
        (alert,) = notice.alerts
        body = pagerduty_event(alert, notice.action, self._key, snapshot.generator_urls.get(alert.fingerprint))
        answer = self.post(self._url, body)
        if isinstance(answer, str):
            return Outcome(False, retry=True, reason=answer)
        return classify(answer, self._clock())


def classify(answer: Answer, now_wall: float) -> Outcome:
    """PagerDuty's documented answers: 202 accepted; 400 invalid (never retried); 408, 429 and 5xx retried."""
    return http_classify(answer, lambda a: _errors(a.body), now_wall)


def _errors(body: str) -> str:
    try:
        data = json.loads(body)
    except ValueError:
        return one_line(body, 200)
    if isinstance(data, dict):
        errors = data.get("errors")
        if isinstance(errors, list) and errors:
            return one_line("; ".join(str(e) for e in errors), 200)
        return one_line(data.get("message", ""), 200)
    return ""
