"""The demo's story: what was planted, what was observed, and how the two match. Pure, apart from `Timeline`.

A planted fault (`Planted`) sits on a place a person knows (node, GPU index, rank) for a span of demo time.
Everything the demo observes is an `Event` of one kind:

- `finding`: the rules service's finding (name = finding kind);
- `alert`: an agent's alert (name = alertname);
- `action`: the agent's policy acting (name = `thermal_cap`), or the rules service's remediation draining a
  node (name = `drain`; dry run in the demo);
- `page`: a notification a sink delivered (name = alertname, `via` = the sink, e.g. `pagerduty`).

An event's signal (`finding:straggler`, `alert:GpuXidCritical`) and place say which fault it belongs to; a
signal's life from first `firing` to `resolved` at one place is an `Episode`. A page belongs to the episode
of the alert it notifies about (a rules-service alert is its finding kind, see gpumond.alerts.catalogue), so
adding pages is: turn each received notification into `Event(kind="page", ...)` and `Timeline.record` it.
"""

from __future__ import annotations

import textwrap
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from gpumond.alerts.catalogue import ALERTS

Kind = Literal["finding", "alert", "action", "page"]
# Alerts that announce an action rather than a signal of their own: their pages belong to the action's
# episode (the summary's "node drain" row), as a finding's alert's pages belong to the finding.
_ACTION_ALERTS = {"GpumondNodeDrained": "action:drain"}
# `dropped`: a pending finding that went quiet without ever firing (not news, not a false alarm).
State = Literal["pending", "firing", "resolved", "dropped"]


@dataclass(frozen=True, slots=True)
class Place:
    """Where something is, in the words a person uses: node, GPU index, training rank. All None: the job."""

    node: str | None = None
    gpu: int | None = None
    rank: int | None = None

    def __str__(self) -> str:
        if self.node is None and self.rank is None:
            return "whole job"
        parts = [p for p in (self.node, self.gpu is not None and f"GPU {self.gpu}",
                             self.rank is not None and f"rank {self.rank}") if p]
        return " · ".join(str(p) for p in parts)

    def covers(self, other: Place) -> bool:
        """Whether an event at `other` is about this (a fault's) place: same rank, same GPU, or same node."""
        if other.rank is not None:
            return other.rank == self.rank
        if other.node is None:
            return False  # job-wide: decided by the signal alone
        if other.gpu is None:
            return other.node == self.node
        return (other.node, other.gpu) == (self.node, self.gpu)


@dataclass(frozen=True, slots=True)
class Planted:
    """One planted fault: what, where, when (demo seconds), and which signals mean it was found.

    `expect`: every one must fire for the fault to count as found. `related`: consequences that may fire
    (not false alarms; awaited to resolve like the expected ones). `lasting`: signals that only an
    operator's action clears (signal → why), so the demo does not wait for them to resolve.
    """

    key: str
    what: str
    place: Place
    start_s: float
    end_s: float
    expect: tuple[str, ...]
    related: tuple[str, ...] = ()
    lasting: Mapping[str, str] = field(default_factory=dict)
    hint: str = ""  # what a reader should expect to see, in a sentence

    @property
    def signals(self) -> frozenset[str]:
        """Every signal this fault may explain."""
        return frozenset(self.expect) | frozenset(self.related) | frozenset(self.lasting)


@dataclass(frozen=True, slots=True)
class Event:
    """Something observed at `t_s` demo seconds; `fault` is the key of the planted fault it matches."""

    t_s: float
    kind: Kind
    name: str
    state: State
    place: Place
    detail: tuple[str, ...] = ()  # evidence, one readable line each
    via: str | None = None  # pages: the sink that delivered it
    fault: str | None = None

    @property
    def signal(self) -> str:
        """`kind:name`; a page stands for the signal it notifies about."""
        if self.kind != "page":
            return f"{self.kind}:{self.name}"
        if self.name in _ACTION_ALERTS:
            return _ACTION_ALERTS[self.name]
        spec = ALERTS.get(self.name)
        if spec is not None and spec.finding_kind:
            return f"finding:{spec.finding_kind}"
        return f"alert:{self.name}"


@dataclass(frozen=True, slots=True)
class Episode:
    """One signal's life at one place: first fired, resolved (None: still firing), and its pages."""

    signal: str
    place: Place
    fault: str | None
    fired_s: float
    resolved_s: float | None = None
    fired: int = 1  # times it (re)fired after resolving
    pages: int = 0  # `firing` notifications delivered for it


def match(event: Event, faults: Sequence[Planted]) -> Planted | None:
    """The planted fault an event is about, or None (a false alarm if it fires).

    Same signal and same place, at or after the fault began. A job-wide event (no node, no rank) goes to the
    fault that explains it and was active then (the earliest started); else the one that began last before it.
    """
    signal = event.signal
    fits = [f for f in faults if signal in f.signals and event.t_s >= f.start_s
            and (f.place.covers(event.place) or (event.place.node is None and event.place.rank is None))]
    if not fits:
        return None
    active = [f for f in fits if f.start_s <= event.t_s <= f.end_s]
    if active:
        return min(active, key=lambda f: f.start_s)
    return max(fits, key=lambda f: f.start_s)


def episodes(events: Iterable[Event]) -> list[Episode]:
    """Fold events into episodes, in the order they first fired; pending and dropped events never fire one."""
    out: list[Episode] = []
    open_: dict[tuple[str, Place], int] = {}
    last: dict[tuple[str, Place], int] = {}
    early: dict[tuple[str, Place], int] = {}  # pages that arrived before the watcher saw their signal fire
    for e in events:
        key = (e.signal, e.place)
        if e.kind == "page":
            i = open_.get(key, last.get(key))
            if e.state == "firing":
                if i is not None:
                    out[i] = replace(out[i], pages=out[i].pages + 1)
                else:
                    early[key] = early.get(key, 0) + 1
            continue
        if e.state == "firing":
            if key in open_:
                continue
            i = last.get(key)
            if i is not None and out[i].fault == e.fault:
                out[i] = replace(out[i], resolved_s=None, fired=out[i].fired + 1)
            else:
                out.append(Episode(e.signal, e.place, e.fault, e.t_s, pages=early.pop(key, 0)))
                i = len(out) - 1
            open_[key] = last[key] = i
        elif e.state == "resolved" and key in open_:
            i = open_.pop(key)
            out[i] = replace(out[i], resolved_s=e.t_s)
    return out


@dataclass(frozen=True, slots=True)
class Outcome:
    """A planted fault against what was observed."""

    fault: Planted
    episodes: tuple[Episode, ...]
    missing: tuple[str, ...]  # expected signals that never fired
    open: tuple[Episode, ...]  # fired, not resolved, and not a `lasting` signal

    @property
    def found(self) -> bool:
        return not self.missing

    @property
    def pages(self) -> int:
        return sum(e.pages for e in self.episodes)

    def resolved(self, now_s: float) -> bool:
        """Found, over, and everything it set off has cleared (except what only an operator clears)."""
        return self.found and now_s >= self.fault.end_s and not self.open


def outcomes(faults: Sequence[Planted], events: Iterable[Event]) -> list[Outcome]:
    """Each planted fault with its episodes."""
    eps = episodes(events)
    out = []
    for f in faults:
        mine = tuple(e for e in eps if e.fault == f.key)
        fired = {e.signal for e in mine}
        out.append(Outcome(f, mine, tuple(s for s in f.expect if s not in fired),
                           tuple(e for e in mine if e.resolved_s is None and e.signal not in f.lasting)))
    return out


def false_alarms(events: Iterable[Event]) -> list[Episode]:
    """Episodes that fired with no planted fault behind them."""
    return [e for e in episodes(events) if e.fault is None]


def held_back(events: Iterable[Event]) -> list[tuple[str, Place]]:
    """Unplanted (signal, place)s that went pending and never fired: what the k-of-n persistence kept quiet."""
    pending: dict[tuple[str, Place], None] = {}
    fired = set()
    for e in events:
        if e.kind == "page" or e.fault is not None:
            continue
        if e.state == "pending":
            pending.setdefault((e.signal, e.place))
        elif e.state == "firing":
            fired.add((e.signal, e.place))
    return [k for k in pending if k not in fired]


def complete(faults: Sequence[Planted], events: Iterable[Event], now_s: float) -> bool:
    """Every planted fault found, over and resolved."""
    return all(o.resolved(now_s) for o in outcomes(faults, events))


def waiting_for(faults: Sequence[Planted], events: Iterable[Event], now_s: float) -> list[str]:
    """What the story still waits for, one phrase per unfinished fault (empty when complete)."""
    out = []
    for o in outcomes(faults, events):
        f = o.fault
        if now_s < f.start_s:
            out.append(f"{f.key} to start at {f.start_s:.0f} s")
            continue
        parts = []
        if o.missing:
            parts.append("to find " + ", ".join(_signal_name(s) for s in o.missing))
        if now_s < f.end_s:
            parts.append(f"to end at {f.end_s:.0f} s")
        if o.open:
            parts.append(", ".join(_signal_name(e.signal) for e in o.open) + " to resolve")
        if parts:
            out.append(f"{f.key} on {f.place}: " + "; ".join(parts))
    return out


def _signal_name(signal: str) -> str:
    return _signal_words(signal).partition(" ")[2] if signal.startswith(("finding:", "alert:")) \
        else _signal_words(signal)


def _signal_words(signal: str) -> str:
    kind, _, name = signal.partition(":")
    if kind == "action" and name == "thermal_cap":
        return "thermal power cap"
    if kind == "action" and name == "drain":
        return "node drain"
    return f"{kind} {name}"


# ----- rendering ------------------------------------------------------------------------------------

_STATE_WORDS = {"pending": "pending", "firing": "FIRING", "resolved": "resolved", "dropped": "dropped"}
_ACTION_STATE_WORDS = {"pending": "pending", "firing": "acts", "resolved": "released", "dropped": "cleared"}
_DETAIL_INDENT = " " * 17  # under the event's name


def render_event(event: Event, faults: Sequence[Planted]) -> list[str]:
    """An event as lines: a headline (what, where, which planted fault) and its evidence, indented."""
    by_key = {f.key: f for f in faults}
    f = by_key.get(event.fault) if event.fault else None
    tag = {"finding": "FINDING", "alert": "ALERT", "action": "POLICY", "page": "PAGE"}[event.kind]
    words = _ACTION_STATE_WORDS if event.kind == "action" else _STATE_WORDS
    via = f" via {event.via}" if event.via else ""
    name = _signal_words(event.signal) if event.kind == "action" else event.name
    head = f"{tag:7s} {words[event.state]:8s} {name}{via} on {event.place}"
    detail = event.detail
    if event.kind == "action" and detail:  # a policy step is one line: what it did
        head, detail = f"{head}: {detail[0]}", detail[1:]
    if f is not None:
        if event.state == "resolved" and event.t_s >= f.end_s:
            head += f"  ← planted: {f.key} (+{event.t_s - f.end_s:.0f} s after it ended)"
        else:
            head += f"  ← planted: {f.key} (+{event.t_s - f.start_s:.0f} s)"
    elif event.state == "firing":
        head += "  ← not planted"
    if event.state == "dropped":
        head += "  (was pending, never fired)"
    return [head, *(_DETAIL_INDENT + line for line in detail)]


def _fmt_s(s: float) -> str:
    return f"{round(s):+d} s"  # negative: resolved before the fault ended


# What a planted fault may take to be found: the detectors' persistence plus a push and an evaluation.
_DETECT_S = 30.0


SUMMARY_WIDTH = 80  # the closing table fits a standard terminal


def render_summary(faults: Sequence[Planted], events: Sequence[Event], now_s: float,
                   width: int = SUMMARY_WIDTH) -> str:
    """The closing table, at most `width` columns: each planted fault (a line of its own) → what fired, when
    (after the fault began), when it resolved (after the fault ended); then anything that fired without being
    planted."""
    words = _signal_words
    outs = outcomes(faults, events)
    pages = any(e.kind == "page" for e in events)
    head = ["what fired", "fired", "resolved"] + (["pages"] if pages else [])
    blank = [""] * (len(head) - 1)
    rows: list[list[str] | str] = []  # a str is a fault's own line, across the table
    for o in outs:
        f = o.fault
        rows.append(f"{f.key} on {f.place}: {f.what}")
        if not o.episodes:
            if f.start_s >= now_s:  # a --duration shorter than the plan: not a miss
                what = f"not reached (planted at {f.start_s:.0f} s, the demo ended at {now_s:.0f} s)"
            elif now_s - f.start_s < _DETECT_S:
                what = f"nothing yet (it began {now_s - f.start_s:.0f} s before the end)"
            else:
                what = "NOTHING (missed)"
            rows.append([what, *blank])
        for ep in o.episodes:
            where = "" if ep.place == f.place else f" on {ep.place}"
            again = f" (fired {ep.fired}×)" if ep.fired > 1 else ""
            lasting = f" (stays {f.lasting[ep.signal]})" if ep.resolved_s is None and ep.signal in f.lasting else ""
            res = "still firing" if ep.resolved_s is None else _fmt_s(ep.resolved_s - f.end_s)
            rows.append([words(ep.signal) + where + again + lasting, _fmt_s(ep.fired_s - f.start_s), res]
                        + ([str(ep.pages)] if pages else []))
        for s in o.missing:
            if o.episodes:
                rows.append([f"{words(s)}: NOT FOUND", *blank])
    found = sum(o.found for o in outs)
    done = sum(o.resolved(now_s) for o in outs)
    fa = false_alarms(events)
    lines = [*_wrap(f"{len(outs)} faults planted: {found} found, {done} found and resolved; "
                    f"{len(fa)} false alarm{'s' if len(fa) != 1 else ''}.", width),
             *_wrap("(fired: seconds after the fault began; resolved: seconds after the fault ended)", width), "",
             _table(head, rows, width), ""]
    if fa:
        lines.append("Fired without a planted fault (false alarms):")
        for e in fa:
            lines += _wrap(f"{words(e.signal)} on {e.place} at {e.fired_s:.0f} s, "
                           + (f"resolved at {e.resolved_s:.0f} s" if e.resolved_s is not None else "still firing")
                           + (f", {e.pages} page{'s' if e.pages != 1 else ''}" if pages else ""), width, "  ")
    else:
        lines.append("Fired without a planted fault (false alarms): none.")
    quiet = held_back(events)
    if quiet:
        shown = "; ".join(f"{words(s)} on {p}" for s, p in quiet[:6]) + ("; …" if len(quiet) > 6 else "")
        lines += _wrap(f"Pending without a planted fault, never fired ({len(quiet)}; the k-of-n persistence check "
                       f"kept them quiet): {shown}", width)
    return "\n".join(lines)


def _wrap(text: str, width: int, indent: str = "") -> list[str]:
    return textwrap.wrap(text, width, initial_indent=indent, subsequent_indent=indent + "  ",
                         break_on_hyphens=False) or [""]


def _table(head: list[str], rows: Sequence[list[str] | str], width: int) -> str:
    """Columns under `head`, the first one wrapped so that a line fits `width`; a str row is a heading line
    across the table (wrapped), the rows under it indented."""
    cells = [r for r in rows if not isinstance(r, str)]
    rest = [max(len(r[i]) for r in [head, *cells]) for i in range(1, len(head))]
    room = width - sum(rest) - 2 * len(rest)  # what the first column may take, its indent included
    first = min(max(len(r[0]) + 2 for r in [head, *cells]), room)

    def line(parts: list[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(parts, [first, *rest], strict=True)).rstrip()

    out = [line(head), line(["-" * first, *("-" * w for w in rest)])]
    for r in rows:
        if isinstance(r, str):
            out += _wrap(r, width)
            continue
        wrapped = textwrap.wrap(r[0], first - 2, subsequent_indent="  ", break_on_hyphens=False) or [""]
        out.append(line(["  " + wrapped[0], *r[1:]]))
        out += [line(["  " + more, *([""] * len(rest))]) for more in wrapped[1:]]
    return "\n".join(out)


# ----- the one stateful part ------------------------------------------------------------------------

class Timeline:
    """The events so far, each matched to its fault as it is recorded; thread-safe (a receiver may call in).

    A signal keeps the fault its episode began with until it resolves, so a job-wide finding does not hop
    between faults while it fires.
    """

    def __init__(self, faults: Sequence[Planted], on_event: Callable[[Event], None] | None = None) -> None:
        self.faults = tuple(faults)
        self._on_event = on_event
        self._lock = threading.Lock()
        self._events: list[Event] = []
        self._open: dict[tuple[str, Place], str | None] = {}
        self._firing: set[tuple[str, Place]] = set()
        # Pages whose signal the watcher has not yet seen fire: a sink can deliver before the next poll of the
        # rules service, and a PAGE line above the FINDING it is about reads as a page for nothing.
        self._held: dict[tuple[str, Place], list[Event]] = {}

    def record(self, event: Event) -> Event:
        """Match `event` to its fault, keep it, pass it to `on_event`; returns the matched event.

        A page is kept at once (the summary counts it) but passed on only after its signal's `firing`,
        or at `flush`.
        """
        with self._lock:
            key = (event.signal, event.place)
            if key in self._open:
                fault = self._open[key]
            else:
                m = match(event, self.faults)
                fault = m.key if m else None
            released: list[Event] = []
            if event.kind != "page":
                if event.state in ("pending", "firing"):
                    self._open[key] = fault
                else:
                    self._open.pop(key, None)
                if event.state == "firing":
                    self._firing.add(key)
                    released = self._held.pop(key, [])
                else:
                    self._firing.discard(key)
            event = replace(event, fault=fault)
            self._events.append(event)
            held = event.kind == "page" and event.state == "firing" and key not in self._firing
            if held:
                self._held.setdefault(key, []).append(event)
        if self._on_event is not None:
            for e in ([] if held else [event]) + released:
                self._on_event(e)
        return event

    def flush(self) -> None:
        """Pass on the pages still held (their signal never showed firing to the watcher), oldest first."""
        with self._lock:
            held = sorted((e for pages in self._held.values() for e in pages), key=lambda e: e.t_s)
            self._held.clear()
        if self._on_event is not None:
            for e in held:
                self._on_event(e)

    @property
    def events(self) -> tuple[Event, ...]:
        with self._lock:
            return tuple(self._events)
