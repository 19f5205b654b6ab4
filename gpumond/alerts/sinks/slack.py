"""Slack incoming webhook: one readable message per alert group when it fires, one when it resolves."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from gpumond.alerts.model import Alert
from gpumond.alerts.sinks.base import Answer, Outcome, Snapshot
from gpumond.alerts.sinks.base import classify as http_classify
from gpumond.alerts.sinks.notices import Action, Notice, NoticeBook, NoticeSink
from gpumond.config.alerting import SlackConfig
from gpumond.web.client import build_access
from gpumond.wire.safetext import one_line, shorten

_PER_MESSAGE = 10  # alerts listed in one message; Slack allows 50 blocks and 3,000 characters per section
_SECTION_MAX = 2900
_ICON = {"critical": ":red_circle:", "error": ":large_orange_circle:", "warning": ":large_yellow_circle:",
         "info": ":information_source:"}


def where(alert: Alert) -> str:
    """Node, GPU, job and rank of an alert, the words a person knows it by."""
    lab = dict(alert.labels)
    parts = []
    if "node" in lab:
        parts.append(f"node {lab['node']}")
    if "gpu" in lab:
        parts.append(f"GPU {lab['gpu']}")
    if "job" in lab:
        parts.append(f"job {lab['job']}")
    if "rank" in lab:
        parts.append(f"rank {lab['rank']}")
    if "xid" in lab:
        parts.append(f"XID {lab['xid']}")
    return ", ".join(parts) or lab.get("cluster", "")


def _duration(seconds: float) -> str:
    s = max(0, int(seconds))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def _line(alert: Alert, action: Action, generator_url: str | None) -> str:
    summary = alert.annotation("summary") or alert.alertname
    if action == "resolved":
        lasted = f" after {_duration(alert.ends_at - alert.starts_at)}" if alert.ends_at else ""
        return f"• {summary} ({where(alert)}): resolved{lasted}"
    text = f"• *{summary}* ({where(alert)})"
    description = alert.annotation("description")
    if description:
        text += f"\n    {shorten(description, 600)}"
    links = [f"<{u}|{t}>" for u, t in ((alert.annotation("runbook_url"), "runbook"), (generator_url, "source")) if u]
    if links:
        text += f"\n    {' · '.join(links)}"
    return text


def slack_message(notice: Notice, generator_urls: dict[str, str] | None = None) -> dict[str, object]:
    """The webhook body for one notice: `text` (notifications, fallback) and `blocks` (the message)."""
    urls = generator_urls or {}
    first = notice.alerts[0]
    n = len(notice.alerts)
    if notice.action == "firing":
        title = (f"{_ICON.get(first.severity, '')} [{first.severity.upper()}] {first.alertname}"
                 f"{f' × {n}' if n > 1 else ''}")
    else:
        title = f":white_check_mark: [RESOLVED] {first.alertname}{f' × {n}' if n > 1 else ''}"
    lines = [_line(a, notice.action, urls.get(a.fingerprint)) for a in notice.alerts]
    started = datetime.fromtimestamp(first.starts_at, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    # Every alert's fingerprint, so a person (or a tool) can find each one in Alertmanager or the daemon's API.
    fingerprints = ", ".join(a.fingerprint for a in notice.alerts)
    context = f"gpumond · fingerprint{'s' if n > 1 else ''} {fingerprints} · started {started}"
    blocks: list[dict[str, object]] = [
        {"type": "header", "text": {"type": "plain_text", "text": shorten(title.replace('*', ''), 150)}}]
    section, sections = "", []
    for line in lines:
        if section and len(section) + len(line) + 1 > _SECTION_MAX:
            sections.append(section)
            section = ""
        section = f"{section}\n{line}" if section else shorten(line, _SECTION_MAX)
    sections.append(section)
    blocks += [{"type": "section", "text": {"type": "mrkdwn", "text": s}} for s in sections]
    blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": context}]})
    text = shorten(f"{title}: " + "; ".join(f"{a.annotation('summary') or a.alertname}" for a in notice.alerts),
                      3000)
    return {"text": text, "blocks": blocks}


class SlackSink(NoticeSink):
    """Posts to an incoming webhook at most about once a second; honours 429 + Retry-After."""

    name = "slack"
    min_interval_s = 1.0

    def __init__(self, cfg: SlackConfig, *, book: NoticeBook, queue_size: int, clock: Callable[[], float],
                 **kw: object) -> None:
        # The webhook URL is the secret itself: the target shown in metrics and logs is only "webhook".
        super().__init__("webhook", book=book, min_severity=cfg.min_severity, queue_size=queue_size,
                         timeout_s=cfg.timeout_s, clock=clock, access=build_access(cfg, "alerting.slack"), **kw)
        self._url = cfg.webhook_url or ""

    def group(self, action: Action, alerts: Sequence[Alert]) -> list[Notice]:
        """Alerts with the same name on the same job (or node) that change together share one message."""
        groups: dict[tuple[str, str], list[Alert]] = {}
        for a in alerts:
            groups.setdefault((a.alertname, a.label("job") or a.label("node") or ""), []).append(a)
        return [Notice(action, tuple(g[i:i + _PER_MESSAGE])) for g in groups.values()
                for i in range(0, len(g), _PER_MESSAGE)]

    def deliver(self, notice: Notice, snapshot: Snapshot) -> Outcome:
        answer = self.post(self._url, slack_message(notice, dict(snapshot.generator_urls)))
        if isinstance(answer, str):
            return Outcome(False, retry=True, reason=answer)
        return classify(answer, self._clock())


def classify(answer: Answer, now_wall: float) -> Outcome:
    """Slack's webhook answers: 200 ok; 408, 429 (Retry-After) and 5xx retried; other 4xx (invalid_payload,
    no_service, channel_not_found …) are refusals that a retry would not change."""
    return http_classify(answer, lambda a: one_line(a.body, 100), now_wall)
