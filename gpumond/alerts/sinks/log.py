"""The log sink (always on): one structured line when an alert fires and one when it resolves."""

from __future__ import annotations

import logging

from gpumond.alerts.sinks.base import Snapshot
from gpumond.types import Series

log = logging.getLogger("gpumond.alerts")


class LogSink:
    """Logs state changes between snapshots; synchronous (a log line is not a network call)."""

    name = "log"
    target = "log"

    def __init__(self) -> None:
        self._states: dict[str, str] = {}

    def publish(self, snapshot: Snapshot) -> None:
        states = {}
        for a in snapshot.alerts:
            states[a.fingerprint] = a.state
            if self._states.get(a.fingerprint) == a.state or a.state == "pending":
                continue
            if a.state == "resolved" and a.fingerprint not in self._states:
                continue  # resolved before this sink saw it fire (restored at start): nothing to say
            if a.alertname == "Watchdog":
                continue
            level = logging.WARNING if a.state == "firing" and a.severity in ("critical", "warning") else logging.INFO
            log.log(level, f"alert {a.state}", extra={
                "alertname": a.alertname, "severity": a.severity, "fingerprint": a.fingerprint,
                **{k: v for k, v in a.labels if k not in ("alertname", "severity")},
                "summary": a.annotation("summary")})
        self._states = states

    def start(self) -> None:
        pass

    def stop(self, timeout_s: float = 5.0) -> None:
        pass

    def series(self) -> list[Series]:
        return []
