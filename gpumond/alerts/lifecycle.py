"""Alert lifecycle: conditions in, pending → firing → resolved alerts out, on an injected clock."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from gpumond.alerts.model import Alert, AlertState, Condition, Pairs

# Prometheus keeps re-sending a resolved alert for 15 minutes so that every Alertmanager
# replica (and a sink that was briefly down) hears the resolve.
KEEP_RESOLVED_S = 900.0


@dataclass(frozen=True, slots=True)
class _Tracked:
    labels: Pairs
    annotations: Pairs
    for_s: float
    active_since: float
    fired_at: float | None = None
    resolved_at: float | None = None

    @property
    def state(self) -> AlertState:
        if self.resolved_at is not None:
            return "resolved"
        return "pending" if self.fired_at is None else "firing"

    def alert(self) -> Alert:
        starts = self.fired_at if self.fired_at is not None else self.active_since
        return Alert(self.labels, self.annotations, starts, self.resolved_at, self.state)


@dataclass(frozen=True, slots=True)
class Transition:
    """An alert changed state; `old` None = it is new, `new` None = a pending alert went away."""

    alert: Alert
    old: AlertState | None
    new: AlertState | None


@dataclass(frozen=True, slots=True)
class AlertTracker:
    """Immutable alert state: `update(conditions, now)` returns the next tracker and what changed."""

    keep_resolved_s: float = KEEP_RESOLVED_S
    _entries: tuple[tuple[str, _Tracked], ...] = ()

    def update(self, conditions: Iterable[Condition], now: float) -> tuple[AlertTracker, tuple[Transition, ...]]:
        """Advance to `now` given every condition true now (each fingerprint at most once)."""
        current: dict[str, Condition] = {}
        for condition in conditions:
            fp = condition.fingerprint
            if fp in current:
                raise ValueError(f"two conditions share the labels {dict(condition.labels)}")
            current[fp] = condition
        old = dict(self._entries)
        entries: dict[str, _Tracked] = {}
        changes: list[Transition] = []
        for fp, condition in current.items():
            before = old.get(fp)
            if before is None or before.state == "resolved":
                # A condition that comes back after resolving is a new alert with a new start.
                tracked = _Tracked(condition.labels, condition.annotations, condition.for_s, now)
            else:
                tracked = _Tracked(condition.labels, condition.annotations, condition.for_s,
                                   before.active_since, before.fired_at)
            if tracked.fired_at is None and now - tracked.active_since >= tracked.for_s:
                tracked = replace(tracked, fired_at=now)
            entries[fp] = tracked
            old_state = before.state if before is not None else None
            if old_state != tracked.state:
                changes.append(Transition(tracked.alert(), old_state, tracked.state))
        for fp, before in old.items():
            if fp in current:
                continue
            if before.state == "firing":
                resolved = replace(before, resolved_at=now)
                entries[fp] = resolved
                changes.append(Transition(resolved.alert(), "firing", "resolved"))
            elif before.state == "pending":
                # Like Prometheus: a condition that did not last never existed as an alert.
                changes.append(Transition(before.alert(), "pending", None))
            elif now - (before.resolved_at or now) < self.keep_resolved_s:
                entries[fp] = before
        tracker = AlertTracker(self.keep_resolved_s, tuple(sorted(entries.items())))
        return tracker, tuple(changes)

    @property
    def alerts(self) -> tuple[Alert, ...]:
        """Every alert held: pending, firing, and resolved ones still being announced."""
        return tuple(t.alert() for _, t in self._entries)

    @property
    def pending(self) -> tuple[Alert, ...]:
        """Conditions true now that have not yet lasted their `for_s`."""
        return tuple(a for a in self.alerts if a.state == "pending")

    @property
    def firing(self) -> tuple[Alert, ...]:
        """Alerts firing now."""
        return tuple(a for a in self.alerts if a.state == "firing")

    @property
    def resolved(self) -> tuple[Alert, ...]:
        """Resolved alerts kept for `keep_resolved_s` so sinks can send the resolve."""
        return tuple(a for a in self.alerts if a.state == "resolved")

