"""The alert pipeline both daemons use: conditions → lifecycle → enriched alerts → every sink.

The daemon calls `update(conditions, now)` from its own loop (the agent's policy cycle, the rules
service's evaluation); that call does the lifecycle, records what fires crash-safely, and hands every sink
the new picture without waiting for any delivery.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace

from gpumond.alerts.catalogue import ALERTS, runbook_url
from gpumond.alerts.lifecycle import AlertTracker, Entry, Persistence, Transition
from gpumond.alerts.model import Alert, Condition, Pairs, pairs, rfc3339
from gpumond.alerts.sinks import Sink, Snapshot
from gpumond.alerts.state import AlertStateFile
from gpumond.config.alerting import AlertingConfig
from gpumond.types import Series

ALERT_METRICS: dict[str, tuple[str, str]] = {
    "gpumond_alert_active": ("gauge", "1 for each alert the daemon has firing (labels are its identity)."),
    "gpumond_alerts": ("gauge", "Alerts held by this daemon, by state (pending, firing, resolved and still "
                                "announced)."),
}
GeneratorUrl = Callable[[Alert], str | None]

log = logging.getLogger("gpumond.alerts")


def describe_sinks(sinks: Sequence[Sink]) -> str:
    """The sinks as one operator-readable phrase, e.g. `log, alertmanager(am-0:9093), slack(webhook)`; never a
    secret (each sink's target is already redacted to a host or a word)."""
    return ", ".join(s.name if s.target == s.name else f"{s.name}({s.target})" for s in sinks)


class AlertPipeline:
    """Owns the lifecycle, the state file and the sinks of one daemon; thread-safe."""

    def __init__(self, cfg: AlertingConfig, *, sinks: Sequence[Sink], state: AlertStateFile,
                 persistence: Persistence = Persistence(), generator_url: GeneratorUrl = lambda a: None,
                 wall: Callable[[], float] = time.time) -> None:
        self.cfg = cfg
        self.sinks = tuple(sinks)
        self._state = state
        self._generator_url = generator_url
        self._wall = wall
        self._lock = threading.Lock()
        self._tracker = AlertTracker(cfg.keep_resolved_s, persistence)
        self._offset = 0.0  # wall time − daemon time at the last update
        # Wall-clock start (and end) of each alert, fixed at its transition: the daemon's clock may be monotonic
        # or simulated, and a start that moved by a microsecond between re-sends would look like a new alert.
        self._walls: dict[str, tuple[float, float | None]] = {}
        self._started = False

    @property
    def persistence(self) -> Persistence:
        """How long conditions must hold to fire, and stay quiet to resolve."""
        return self._tracker.persistence

    # ----- lifecycle of the pipeline itself ------------------------------------------------------------
    def start(self, now: float) -> None:
        """Restore what was firing before a restart (held `restart_grace_s`), then start the sinks."""
        with self._lock:
            self._offset = self._wall() - now
            recorded = self._state.firing
            self._walls.update({a.fingerprint: (a.starts_at, None) for a in recorded})
            restored = [replace(a, starts_at=a.starts_at - self._offset) for a in recorded]
            self._tracker = self._tracker.restore(restored, hold_until=now + self.cfg.restart_grace_s)
        for s in self.sinks:
            s.start()
        self._started = True
        # Said once at start: an operator who configured Slack and sees only "log" here knows before an alert.
        log.info("alert sinks on", extra={"sinks": describe_sinks(self.sinks)})

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop every sink, all at once, within `timeout_s` in all. Open notices stay open: the next start
        resolves them if they are over."""
        # One after the other, N sinks each stuck in a request would hold SIGTERM for N × timeout_s.
        stoppers = [threading.Thread(target=s.stop, args=(timeout_s,), name=f"gpumond-stop-{s.name}", daemon=True)
                    for s in self.sinks]
        for t in stoppers:
            t.start()
        deadline = time.monotonic() + timeout_s
        for t in stoppers:
            t.join(max(0.0, deadline - time.monotonic()))

    # ----- the daemon's loop ---------------------------------------------------------------------------
    def update(self, conditions: Iterable[Condition], now: float, *,
               ended: Callable[[Pairs], bool] | None = None) -> tuple[Transition, ...]:
        """Advance the lifecycle to `now` (daemon time) and hand the sinks the new picture; `ended` as for
        AlertTracker.update (absent alerts about something gone for good resolve at once)."""
        enriched = [self._enrich(c) for c in conditions]
        if self.cfg.watchdog:
            enriched.append(self._enrich(Condition.of({"alertname": "Watchdog", "severity": "info"})))
        with self._lock:
            wall_now = self._wall()
            self._offset = wall_now - now
            self._tracker, transitions = self._tracker.update(enriched, now, ended=ended)
            for t in transitions:
                fp = t.alert.fingerprint
                if t.new == "firing":
                    self._walls[fp] = (wall_now - (now - t.alert.starts_at), None)
                elif t.new == "resolved" and fp in self._walls:
                    self._walls[fp] = (self._walls[fp][0], wall_now)
            held = {a.fingerprint for a in self._tracker.alerts}
            self._walls = {fp: w for fp, w in self._walls.items() if fp in held}
            alerts = [self._to_wall(a) for a in self._tracker.alerts if a.state != "pending"]
        self._state.save_firing(alerts)
        snapshot = Snapshot(tuple(alerts), self._wall(),
                            {a.fingerprint: u for a in alerts if (u := self._generator_url(a))})
        for s in self.sinks:
            s.publish(snapshot)
        return transitions

    def _enrich(self, c: Condition) -> Condition:
        labels = dict(c.labels)
        if self.cfg.cluster:
            labels["cluster"] = self.cfg.cluster
        annotations = dict(c.annotations)
        spec = ALERTS.get(labels["alertname"])
        if spec is not None:
            annotations.setdefault("summary", spec.summary)
            annotations.setdefault("description", spec.meaning)
            annotations["runbook_url"] = runbook_url(labels["alertname"], self.cfg.runbook_base_url)
        return replace(c, labels=pairs(labels), annotations=pairs(annotations))

    def _to_wall(self, a: Alert) -> Alert:
        fixed = self._walls.get(a.fingerprint)
        if fixed is not None and a.state != "pending":
            starts, ends = fixed
            if a.state == "resolved" and ends is None:
                ends = a.ends_at + self._offset  # type: ignore[operator]
            return replace(a, starts_at=starts, ends_at=ends if a.state == "resolved" else None)
        ends = None if a.ends_at is None else a.ends_at + self._offset
        return replace(a, starts_at=a.starts_at + self._offset, ends_at=ends)

    # ----- what the daemon reads back ------------------------------------------------------------------
    def entries(self) -> tuple[Entry, ...]:
        """Every alert held with its first-seen time and payload (daemon time)."""
        with self._lock:
            return self._tracker.entries

    def alerts(self) -> tuple[Alert, ...]:
        """Every alert held (pending, firing, recently resolved), in wall-clock time."""
        with self._lock:
            return tuple(self._to_wall(a) for a in self._tracker.alerts)

    def firing(self) -> tuple[Alert, ...]:
        """Alerts firing now (daemon time)."""
        with self._lock:
            return self._tracker.firing

    def active_series(self, label_names: Sequence[str]) -> list[Series]:
        """gpumond_alert_active 1 per firing alert (Watchdog aside), labelled by `label_names` ("" when absent)."""
        return [Series("gpumond_alert_active", tuple((k, a.label(k) or "") for k in label_names), 1.0)
                for a in self.firing() if a.alertname != "Watchdog"]

    def api_json(self) -> bytes:
        """`GET /api/v1/alerts`: every alert held, in the shape of Alertmanager's v2 API."""
        out = []
        for a in self.alerts():
            out.append({"labels": dict(a.labels), "annotations": dict(a.annotations), "state": a.state,
                        "startsAt": rfc3339(a.starts_at),
                        "endsAt": None if a.ends_at is None else rfc3339(a.ends_at),
                        "fingerprint": a.fingerprint, "generatorURL": self._generator_url(a)})
        order = {"firing": 0, "pending": 1, "resolved": 2}
        out.sort(key=lambda x: (order[x["state"]], x["labels"]["alertname"], x["fingerprint"]))
        return json.dumps({"alerts": out}, separators=(",", ":")).encode()

    def series(self) -> list[Series]:
        """Alert counts by state and every sink's delivery metrics."""
        counts = {"pending": 0, "firing": 0, "resolved": 0}
        for a in self.alerts():
            counts[a.state] += 1
        out = [Series("gpumond_alerts", (("state", s),), float(n)) for s, n in counts.items()]
        for s in self.sinks:
            out += s.series()
        return out


def log_only(cfg: AlertingConfig | None = None, persistence: Persistence = Persistence()) -> AlertPipeline:
    """A pipeline with only the log sink and no state file (tests, and daemons built without alerting)."""
    from gpumond.alerts.sinks.log import LogSink

    return AlertPipeline(cfg or AlertingConfig(), sinks=[LogSink()], state=AlertStateFile(None),
                         persistence=persistence)
