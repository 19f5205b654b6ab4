"""The agent's own alert rules: GPU views (and new XIDs) in, alert conditions out. Pure.

Durations are the AlertTracker's job (each condition carries its `for_s`); this module only
says what is true now, and remembers what must outlive one sample: the last ECC counters
(to see an increase) and recent events (an XID or an ECC increase stays active for
`cfg.event_hold_s`, since an event has no "still true" of its own).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace

from gpumond.agent.policy.view import (
    HW_POWER_BRAKE_SLOWDOWN,
    HW_SLOWDOWN,
    HW_THERMAL_SLOWDOWN,
    SW_THERMAL_SLOWDOWN,
    GpuView,
)
from gpumond.agent.policy.xid_table import xid_info
from gpumond.alerts.catalogue import ALERTS
from gpumond.alerts.model import Condition, rfc3339
from gpumond.config import PolicyAlertsConfig

LOST_FOR_S = 15.0  # one failed read is not a lost GPU; XID 79 alerts at once anyway
NVLINK_DOWN_FOR_S = 10.0  # a link retraining comes back within seconds; one that stays down is a fault
# Replays per second on one link, between two readings of its counter, that count as "rising". A healthy link
# replays rarely (a few an hour); a degraded one thousands per second, and every collective through it slows.
NVLINK_REPLAY_PER_S = 1.0


# Clock-event bits → alert, checked in this order.
_THROTTLES = (
    (HW_THERMAL_SLOWDOWN, "GpuHwThermalSlowdown"),
    (HW_POWER_BRAKE_SLOWDOWN, "GpuHwPowerBrakeSlowdown"),
    (SW_THERMAL_SLOWDOWN, "GpuSwThermalSlowdown"),
)


@dataclass(frozen=True, slots=True)
class EventRecord:
    """Events of one kind on one GPU within the hold: when, and how many.

    `first_at`/`last_at` are on the daemon's clock (monotonic on real GPUs), which times the hold;
    `first_wall`/`last_wall` are the same instants in Unix time, which is what a message may print.
    """

    gpu: int
    uuid: str
    first_at: float
    last_at: float
    count: float
    first_wall: float = 0.0
    last_wall: float = 0.0


@dataclass(frozen=True, slots=True)
class AgentAlertState:
    """What the rules remember between samples; start from `AgentAlertState()`."""

    ecc_counts: tuple[tuple[str, float | None, float | None], ...] = ()  # (uuid, volatile, aggregate)
    ecc_events: tuple[EventRecord, ...] = ()
    xid_events: tuple[tuple[int, EventRecord], ...] = ()  # (xid, record)
    nvlink_seen_up: frozenset[tuple[str, int]] = frozenset()  # (uuid, link) seen active: only those can go down
    nvlink_replays: tuple[tuple[str, int, float, float], ...] = ()  # (uuid, link, count, when it last changed)
    nvlink_events: tuple[tuple[int, EventRecord], ...] = ()  # (link, record) of replay-rate rises


def agent_conditions(
    views: Sequence[GpuView], prev: AgentAlertState, new_xids: Sequence[tuple[int, int]], node: str,
    cfg: PolicyAlertsConfig, now: float, *, at_floor: Collection[str] = frozenset(), wall: float | None = None,
    not_recorded: str | None = None,
) -> tuple[AgentAlertState, list[Condition]]:
    """Conditions true now for this node's GPUs.

    `new_xids` are (gpu index, xid) events seen since the last call; `at_floor` holds the
    UUIDs whose thermal controller is pinned at its floor (ThermalState.at_floor). `now` is the
    daemon's clock (it times holds and durations); `wall` is Unix time at the same instant, the
    time printed in messages (None: `now` is already Unix time). `not_recorded` says why the policy
    cannot write its records now (None while it can).
    """
    wall_now = now if wall is None else wall
    state = _track_ecc(prev, views, now, wall_now, cfg.event_hold_s)
    state = _track_xids(state, views, new_xids, now, wall_now, cfg.event_hold_s)
    state = _track_nvlink(state, views, now, wall_now, cfg.event_hold_s)
    conditions: list[Condition] = []
    for view in views:
        on = view.workload
        if not view.up:
            conditions.append(_condition("GpuLost", view.index, view.uuid, node, LOST_FOR_S, workload=on))
            continue
        conditions += _throttles(view, node, cfg)
        if view.remap_failed:
            conditions.append(_condition("GpuRowRemapFailed", view.index, view.uuid, node, 0.0, _values(view),
                                         workload=on))
        if view.remap_pending:
            conditions.append(_condition("GpuRowRemapPending", view.index, view.uuid, node, 0.0, _values(view),
                                         workload=on))
        for link, active in view.nvlink_up:
            if not active and (view.uuid, link) in state.nvlink_seen_up:
                conditions.append(_condition("GpuNvLinkDown", view.index, view.uuid, node, NVLINK_DOWN_FOR_S,
                                             f"NVLink {link} is inactive.", workload=on, link=link))
        if view.uuid in at_floor:
            conditions.append(_condition("GpuPowerCapAtFloor", view.index, view.uuid, node, cfg.floor_after_s,
                                         _values(view), workload=on))
    if not_recorded is not None:
        spec = ALERTS["GpumondPolicyNotRecorded"]
        conditions.append(Condition.of(
            {"alertname": "GpumondPolicyNotRecorded", "severity": spec.severity, "node": node},
            {"summary": f"{node}: {spec.summary}", "description": f"{spec.meaning} {not_recorded}"}, 0.0))
    by_uuid = {v.uuid: v for v in views}
    for record in state.ecc_events:
        view = by_uuid.get(record.uuid)
        counters = ""
        if view is not None and view.ecc_uncorrected_volatile is not None:
            counters = f" Counters now: volatile {view.ecc_uncorrected_volatile:g}"
            if view.ecc_uncorrected_aggregate is not None:
                counters += f", aggregate {view.ecc_uncorrected_aggregate:g}"
            counters += "."
        conditions.append(_condition("GpuEccUncorrectedIncreasing", record.gpu, record.uuid, node, 0.0,
                                     f"{record.count:g} new error(s) {_span(record)}.{counters}",
                                     workload=view.workload if view is not None else ()))
    for link, record in state.nvlink_events:
        view = by_uuid.get(record.uuid)
        conditions.append(_condition(
            "GpuNvLinkErrorsIncreasing", record.gpu, record.uuid, node, 0.0,
            f"NVLink {link}: {record.count:g} replays {_span(record)} (alerting from {NVLINK_REPLAY_PER_S:g}/s).",
            workload=view.workload if view is not None else (), link=link))
    for code, record in state.xid_events:
        info = xid_info(code)
        view = by_uuid.get(record.uuid)
        conditions.append(_condition(
            "GpuXidCritical", record.gpu, record.uuid, node, 0.0,
            f"XID {code}: {info.meaning}; {record.count:g} time(s) {_span(record)}. {info.action}",
            severity=info.severity, xid=code, workload=view.workload if view is not None else (),
        ))
    return state, conditions


def _throttles(view: GpuView, node: str, cfg: PolicyAlertsConfig) -> list[Condition]:
    mask = view.clocks_event_mask or 0
    found = [name for bit, name in _THROTTLES if mask & bit]
    # HwSlowdown is also raised alongside the thermal and power-brake reasons; alone, it
    # means another hardware protection (e.g. power draw too high for the board).
    if mask & HW_SLOWDOWN and not mask & (HW_THERMAL_SLOWDOWN | HW_POWER_BRAKE_SLOWDOWN):
        found.append("GpuHwSlowdown")
    return [_condition(name, view.index, view.uuid, node, cfg.throttle_after_s, _values(view),
                       workload=view.workload) for name in found]


def _track_ecc(state: AgentAlertState, views: Sequence[GpuView], now: float, wall: float,
               hold_s: float) -> AgentAlertState:
    """Update counter baselines; a rise is an event, a drop (driver reload, reset) a new baseline."""
    counts = {uuid: (vol, agg) for uuid, vol, agg in state.ecc_counts}
    events = {r.uuid: r for r in state.ecc_events if now - r.last_at < hold_s}
    for view in views:
        current = (view.ecc_uncorrected_volatile, view.ecc_uncorrected_aggregate)
        before = counts.get(view.uuid)
        if before is not None:
            rises = [c - b for b, c in zip(before, current, strict=True) if b is not None and c is not None]
            increase = max(rises, default=0.0)
            if increase > 0:
                old = events.get(view.uuid)
                events[view.uuid] = (
                    replace(old, last_at=now, last_wall=wall, count=old.count + increase, gpu=view.index) if old
                    else EventRecord(view.index, view.uuid, now, now, increase, wall, wall)
                )
        # A missing reading (lost GPU, slow tier not run yet) keeps the old baseline.
        merged = tuple(c if c is not None else b for b, c in zip(before or (None, None), current, strict=True))
        counts[view.uuid] = (merged[0], merged[1])
    return replace(
        state,
        ecc_counts=tuple(sorted((uuid, vol, agg) for uuid, (vol, agg) in counts.items())),
        ecc_events=tuple(sorted(events.values(), key=lambda r: (r.gpu, r.uuid))),
    )


def _track_xids(state: AgentAlertState, views: Sequence[GpuView], new_xids: Sequence[tuple[int, int]],
                now: float, wall: float, hold_s: float) -> AgentAlertState:
    by_index = {v.index: v.uuid for v in views}
    events = {(code, r.uuid): r for code, r in state.xid_events if now - r.last_at < hold_s}
    for gpu, code in new_xids:
        uuid = by_index.get(gpu, "unknown")
        old = events.get((code, uuid))
        events[(code, uuid)] = (replace(old, last_at=now, last_wall=wall, count=old.count + 1) if old
                                else EventRecord(gpu, uuid, now, now, 1, wall, wall))
    ordered = sorted(events.items(), key=lambda item: (item[1].gpu, item[0][0]))
    return replace(state, xid_events=tuple((code, record) for (code, _), record in ordered))


def _track_nvlink(state: AgentAlertState, views: Sequence[GpuView], now: float, wall: float,
                  hold_s: float) -> AgentAlertState:
    """Links seen active, and replay counters: a rise at NVLINK_REPLAY_PER_S or more since the counter last
    changed is an event, held like an ECC increase. The first reading, or a drop (reset), is a new baseline."""
    seen = set(state.nvlink_seen_up)
    base = {(uuid, link): (count, at) for uuid, link, count, at in state.nvlink_replays}
    events = {(r.uuid, link): r for link, r in state.nvlink_events if now - r.last_at < hold_s}
    for view in views:
        seen.update((view.uuid, link) for link, active in view.nvlink_up if active)
        for link, count in view.nvlink_replays:
            key = (view.uuid, link)
            before = base.get(key)
            if before is not None and count == before[0]:
                continue
            base[key] = (count, now)
            if before is None or count < before[0]:
                continue
            rise = count - before[0]
            if rise / max(now - before[1], 1e-9) < NVLINK_REPLAY_PER_S:
                continue
            old = events.get(key)
            events[key] = (replace(old, last_at=now, last_wall=wall, count=old.count + rise, gpu=view.index) if old
                           else EventRecord(view.index, view.uuid, now, now, rise, wall, wall))
    return replace(
        state, nvlink_seen_up=frozenset(seen),
        nvlink_replays=tuple(sorted((u, link, c, t) for (u, link), (c, t) in base.items())),
        nvlink_events=tuple((link, r) for (_, link), r in sorted(events.items(), key=lambda i: (i[1].gpu, i[0][1]))),
    )


def _condition(alertname: str, gpu: int, uuid: str, node: str, for_s: float, details: str = "",
               severity: str | None = None, xid: int | None = None, workload: tuple[str, ...] = (),
               link: int | None = None) -> Condition:
    spec = ALERTS[alertname]
    labels: dict[str, object] = {"alertname": alertname, "severity": severity or spec.severity,
                                 "node": node, "gpu": gpu, "uuid": uuid}
    if xid is not None:
        labels["xid"] = xid
    if link is not None:
        labels["link"] = link
    annotations = {
        "summary": f"GPU {gpu} on {node}: {spec.summary}" + (f" (XID {xid})" if xid is not None else ""),
        "description": f"{spec.meaning} {details}".strip(),
    }
    if workload:
        # An annotation, not a label: what runs on a GPU changes while its alert stays the same alert.
        annotations["workload"] = "; ".join(workload)
    return Condition.of(labels, annotations, for_s)


def _values(view: GpuView) -> str:
    """The GPU's current readings, for the description (labels never carry changing values)."""
    parts = []
    if view.temperature_c is not None:
        slow = f" (slowdown at {view.slowdown_c:g} °C)" if view.slowdown_c is not None else ""
        parts.append(f"temperature {view.temperature_c:g} °C{slow}")
    if view.memory_temperature_c is not None:
        parts.append(f"memory {view.memory_temperature_c:g} °C")
    if view.power_w is not None:
        limit = f" of a {view.enforced_limit_w:g} W limit" if view.enforced_limit_w is not None else ""
        parts.append(f"power {view.power_w:.0f} W{limit}")
    if view.sm_clock_hz is not None:
        parts.append(f"SM clock {view.sm_clock_hz / 1e6:.0f} MHz")
    return ("Now: " + ", ".join(parts) + ".") if parts else ""


def _span(record: EventRecord) -> str:
    """When the events happened, in Unix time: never the daemon's clock, which is monotonic on real GPUs."""
    if record.first_wall == record.last_wall:
        return f"at {rfc3339(record.last_wall)}"
    return f"from {rfc3339(record.first_wall)} to {rfc3339(record.last_wall)}"
