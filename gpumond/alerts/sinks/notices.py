"""Sinks that notify people once per alert (Slack, PagerDuty): reconcile what is open with what is firing.

The sink keeps a book of the alerts it has told people about ("open notices"), saved crash-safely. Each
step compares the firing alerts with the book: a firing alert not in the book is announced, a booked
alert no longer firing gets its resolution. So a retry never duplicates, a restarted daemon resolves what
it had opened, and an alert still firing after a restart is not announced twice.
"""

from __future__ import annotations

import logging
from abc import abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from gpumond.alerts.model import Alert
from gpumond.alerts.sinks.base import Outcome, Snapshot, WorkerSink, by_urgency, severity_rank

log = logging.getLogger("gpumond.alerts")

Action = Literal["firing", "resolved"]


class NoticeBook(Protocol):
    """Where a sink keeps its open notices across restarts (the alert state file)."""

    def load(self) -> dict[str, Alert]: ...

    def save(self, notices: dict[str, Alert]) -> None: ...


class MemoryBook:
    """A book kept in memory only (no state directory): exactly once within one run."""

    def __init__(self) -> None:
        self._notices: dict[str, Alert] = {}

    def load(self) -> dict[str, Alert]:
        return dict(self._notices)

    def save(self, notices: dict[str, Alert]) -> None:
        self._notices = dict(notices)


@dataclass(frozen=True, slots=True)
class Notice:
    """One notification to send: alerts that open or resolve together (one Slack message, one PD event)."""

    action: Action
    alerts: tuple[Alert, ...]


class NoticeSink(WorkerSink):
    """Announce each firing alert once and its resolution once; subclasses say how to group and send."""

    min_interval_s = 0.0  # between two deliveries (Slack: ~1 message per second per channel)

    def __init__(self, target: str, *, book: NoticeBook, min_severity: str, queue_size: int, timeout_s: float,
                 clock: Callable[[], float], **kw: object) -> None:
        super().__init__(target, timeout_s=timeout_s, clock=clock, **kw)  # type: ignore[arg-type]
        self._book = book
        self._open = book.load()
        self._min_rank = severity_rank(Alert((("alertname", "x"), ("severity", min_severity)), (), 0.0))
        self._queue_size = queue_size
        self._given_up: set[tuple[str, Action]] = set()
        self._retry_at = 0.0
        self._next_send = 0.0
        self._depth = 0

    def wanted(self, alert: Alert) -> bool:
        """Whether this sink tells people about `alert` (severity at or above the minimum; no Watchdog)."""
        return alert.alertname != "Watchdog" and severity_rank(alert) <= self._min_rank

    def group(self, action: Action, alerts: Sequence[Alert]) -> list[Notice]:
        """Split one action's alerts into notifications (default: one per alert)."""
        return [Notice(action, (a,)) for a in alerts]

    @abstractmethod
    def deliver(self, notice: Notice, snapshot: Snapshot) -> Outcome:
        """Send one notification."""

    def depth(self) -> int:
        return self._depth

    def step(self, snapshot: Snapshot, now: float) -> float | None:
        if now < self._retry_at:
            return self._retry_at
        firing = {a.fingerprint: a for a in snapshot.alerts if a.state == "firing" and self.wanted(a)}
        resolved = {a.fingerprint: a for a in snapshot.alerts if a.state == "resolved"}
        # What was given up stays given up only while the alert stays as it was.
        self._given_up = {(fp, act) for fp, act in self._given_up
                          if (act == "firing" and fp in firing) or (act == "resolved" and fp in self._open)}
        opens = [a for fp, a in firing.items() if fp not in self._open and (fp, "firing") not in self._given_up]
        closes = [resolved.get(fp, booked) for fp, booked in self._open.items()
                  if fp not in firing and (fp, "resolved") not in self._given_up]
        opens, closes = by_urgency(opens), by_urgency(closes)
        over = len(opens) + len(closes) - self._queue_size
        if over > 0:
            # Over the bound: resolutions go first (they close pages); the least urgent new alerts are dropped.
            dropped = opens[len(opens) - over:] if over <= len(opens) else opens
            opens = opens[: len(opens) - len(dropped)]
            for a in dropped:
                self._given_up.add((a.fingerprint, "firing"))
            self.dropped += len(dropped)
            log.error("alert sink queue full; notifications dropped",
                      extra={"sink": self.name, "target": self.target, "dropped": len(dropped)})
        notices = self.group("resolved", closes) + self.group("firing", opens)
        self._depth = sum(len(n.alerts) for n in notices)
        if not notices:
            return None
        if now < self._next_send:
            return self._next_send
        notice = notices[0]
        outcome = self.deliver(notice, snapshot)
        self._next_send = now + self.min_interval_s
        if outcome.ok:
            self.succeeded()
            for a in notice.alerts:
                if notice.action == "firing":
                    self._open[a.fingerprint] = a
                else:
                    self._open.pop(a.fingerprint, None)
            self._book.save(self._open)
            self._depth -= len(notice.alerts)
            return now if len(notices) > 1 else None
        if outcome.retry:
            self._retry_at = self.failed_retry(outcome, now)
            return self._retry_at
        # Refused for good (e.g. PagerDuty's 400): retrying the same payload would be refused again.
        self.failed += 1
        self.dropped += len(notice.alerts)
        for a in notice.alerts:
            self._given_up.add((a.fingerprint, notice.action))
        log.error("alert notification refused by the receiver; not retried",
                  extra={"sink": self.name, "target": self.target, "reason": outcome.reason,
                         "alertname": notice.alerts[0].alertname, "action": notice.action})
        return now
