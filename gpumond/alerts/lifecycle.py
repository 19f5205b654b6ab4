"""The one alert lifecycle: conditions in, pending → firing → resolved alerts out, on an injected clock.

Both daemons use it. The agent's alerts wait `for_s` (a throttle must last 60 s) and resolve the first
update they are absent; the rules service's findings need k of the last n evaluations and `min_s` of wall
time since first seen to fire (or one evaluation, when the detector's evidence is corroborated), and `clear`
quiet evaluations spanning `clear_s` to resolve. Counts alone shrink with the evaluation interval (2 of 3
at a 1 s interval is 1 s of evidence), so the durations are what the operator states.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from gpumond.alerts.model import Alert, AlertState, Condition, Pairs

# Prometheus keeps re-sending a resolved alert for 15 minutes so that every Alertmanager
# replica (and a sink that was briefly down) hears the resolve.
KEEP_RESOLVED_S = 900.0
# Evaluations scheduled every 10 s arrive a few ms early or late: with `min_s` 10 s, the second one must count
# as 10 s after the first, not wait for a third.
_SLACK = 0.02


@dataclass(frozen=True, slots=True)
class Persistence:
    """k of the last n updates must see a condition, first seen at least `min_s` seconds ago (and its own
    `for_s`), before it fires; a firing alert resolves after `clear` consecutive updates without it, the
    last of them at least `clear_s` seconds after it was last seen.

    `look_s` > 0: updates less than `look_s` apart are one look, which sees the condition only if every
    update in it did. A condition judged on a windowed statistic (a median over the last minute) was
    validated with one look per `look_s`; judged more often, its hits would be more chances for noise
    hovering at a threshold to cross it (seen, not seen, seen, … adds up to k of n). Requiring every update
    of a look keeps its chance of a hit at most that of one update, so the false-alarm rate stays at most
    the validated one, while a condition that holds is seen at each look as before.
    """

    k: int = 1
    n: int = 1
    clear: int = 1
    min_s: float = 0.0
    clear_s: float = 0.0
    look_s: float = 0.0

    def __post_init__(self) -> None:
        if not 1 <= self.k <= self.n or self.clear < 1:
            raise ValueError("need 1 <= k <= n and clear >= 1")
        if self.min_s < 0 or self.clear_s < 0 or self.look_s < 0:
            raise ValueError("min_s, clear_s and look_s must not be negative")

    def hit(self, hits: tuple[bool, ...], look_at: float | None, seen_in_look: bool, seen: bool,
            now: float) -> tuple[tuple[bool, ...], float, bool]:
        """(hits, when the current look began, whether any update in it saw the condition) after one update."""
        if look_at is not None and hits and now - look_at < self.look_s * (1 - _SLACK):
            return hits[:-1] + (hits[-1] and seen,), look_at, seen_in_look or seen
        return (hits + (seen,))[-self.n:], now, seen


@dataclass(frozen=True, slots=True)
class Entry:
    """One tracked alert with what the lifecycle knows beyond the Alert: when its condition was first seen,
    and the payload of the condition that last fed it (None after a restart)."""

    alert: Alert
    active_since: float
    payload: object = None


@dataclass(frozen=True, slots=True)
class _Tracked:
    labels: Pairs
    annotations: Pairs
    for_s: float
    active_since: float
    hits: tuple[bool, ...]
    fired_at: float | None = None
    resolved_at: float | None = None
    quiet: int = 0
    hold_until: float | None = None  # restored after a restart: may not resolve before this
    payload: object = None
    seen_at: float | None = None  # the last update that saw the condition (None: restored, never seen)
    look_at: float | None = None  # when the current look began (Persistence.look_s)
    seen_in_look: bool = False  # some update of the current look saw the condition (keeps a pending one)

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
    persistence: Persistence = Persistence()
    _entries: tuple[tuple[str, _Tracked], ...] = ()

    def update(self, conditions: Iterable[Condition], now: float, *,
               ended: Callable[[Pairs], bool] | None = None) -> tuple[AlertTracker, tuple[Transition, ...]]:
        """Advance to `now` given every condition true now (each fingerprint at most once).

        `ended(labels)` says that what an absent alert is about has gone for good (a training job that told
        the service it ended): such an alert resolves now, without waiting out `clear` and `clear_s`.
        """
        p = self.persistence
        current: dict[str, Condition] = {}
        for condition in conditions:
            fp = condition.fingerprint
            if fp in current:
                raise ValueError(f"two conditions share the labels {dict(condition.labels)}")
            current[fp] = condition
        old = dict(self._entries)
        entries: dict[str, _Tracked] = {}
        changes: list[Transition] = []
        for fp, c in current.items():
            before = old.get(fp)
            if before is None or before.state == "resolved":
                # A condition that comes back after resolving is a new alert with a new start.
                t = _Tracked(c.labels, c.annotations, c.for_s, now, (True,), payload=c.payload, seen_at=now,
                             look_at=now, seen_in_look=True)
            else:
                hits, look_at, seen_in_look = p.hit(before.hits, before.look_at, before.seen_in_look, True, now)
                t = replace(before, annotations=c.annotations, for_s=c.for_s, hits=hits, quiet=0,
                            payload=c.payload, seen_at=now, look_at=look_at, seen_in_look=seen_in_look)
            held_s = now - t.active_since
            due = c.immediate or (sum(t.hits) >= p.k and held_s >= t.for_s and held_s >= p.min_s * (1 - _SLACK))
            if t.fired_at is None and due:
                t = replace(t, fired_at=now)
            entries[fp] = t
            old_state = before.state if before is not None else None
            if old_state != t.state:
                changes.append(Transition(t.alert(), old_state, t.state))
        for fp, before in old.items():
            if fp in current:
                continue
            hits, look_at, seen_in_look = p.hit(before.hits, before.look_at, before.seen_in_look, False, now)
            if before.state == "firing":
                t = replace(before, hits=hits, look_at=look_at, seen_in_look=seen_in_look, quiet=before.quiet + 1)
                held = t.hold_until is not None and now < t.hold_until
                recent = t.seen_at is not None and now - t.seen_at < p.clear_s * (1 - _SLACK)
                if (ended is not None and ended(t.labels)) or (t.quiet >= p.clear and not held and not recent):
                    t = replace(t, resolved_at=now)
                    changes.append(Transition(t.alert(), "firing", "resolved"))
                entries[fp] = t
            elif before.state == "pending":
                t = replace(before, hits=hits, look_at=look_at, seen_in_look=seen_in_look)
                if (any(t.hits) or seen_in_look) and not (ended is not None and ended(t.labels)):
                    entries[fp] = t
                else:
                    # Like Prometheus: a condition that did not last never existed as an alert.
                    changes.append(Transition(before.alert(), "pending", None))
            elif now - (before.resolved_at or now) < self.keep_resolved_s:
                entries[fp] = before
        tracker = replace(self, _entries=tuple(sorted(entries.items())))
        return tracker, tuple(changes)

    def restore(self, alerts: Iterable[Alert], hold_until: float) -> AlertTracker:
        """Seed firing alerts recorded before a restart: they keep their start and identity (so sinks do not
        notify them again), and resolve like any other once absent, but not before `hold_until`."""
        entries = dict(self._entries)
        for a in alerts:
            if a.state == "firing" and a.fingerprint not in entries:
                entries[a.fingerprint] = _Tracked(a.labels, a.annotations, 0.0, a.starts_at,
                                                  (True,) * self.persistence.n, fired_at=a.starts_at,
                                                  hold_until=hold_until)
        return replace(self, _entries=tuple(sorted(entries.items())))

    @property
    def entries(self) -> tuple[Entry, ...]:
        """Every alert held, with when its condition was first seen and its last payload."""
        return tuple(Entry(t.alert(), t.active_since, t.payload) for _, t in self._entries)

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
