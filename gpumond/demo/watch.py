"""What the demo watches, turned into story events: agents' alerts and power caps, the rules service's findings.

The pure parts (`Roster`, `alert_changes`, `cap_changes`, `finding_changes`) take what was seen before and
what is seen now, and return the events in between; the watchers only fetch and remember.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpumond.alerts.catalogue import ALERTS
from gpumond.demo.evidence import describe
from gpumond.demo.job import ClockFactors
from gpumond.demo.story import Event, Place
from gpumond.rules.types import Finding

Metrics = Mapping[str, Sequence[Any]]  # family name → prometheus_client samples (labels, value)


class Roster:
    """Who is where: GPU UUID ↔ (node, GPU index) from the agents' gpumond_gpu_info, and the job's ranks."""

    def __init__(self, ranks: Sequence[tuple[str, int, str]]) -> None:
        self.ranks = tuple(ranks)  # rank → (node, gpu index, uuid)
        self._by_uuid = {u: Place(n, g, r) for r, (n, g, u) in enumerate(ranks)}
        self._by_gpu = {(n, g): Place(n, g, r) for r, (n, g, _) in enumerate(ranks)}

    @classmethod
    def from_gpu_info(cls, per_node: Iterable[tuple[str, Metrics]]) -> Roster:
        """Ranks fill nodes in order, GPUs by index (as DemoPlan.rank_of says)."""
        ranks: list[tuple[str, int, str]] = []
        for node, m in per_node:
            info = sorted(m.get("gpumond_gpu_info", []), key=lambda s: int(s.labels["gpu"]))
            ranks += [(node, int(s.labels["gpu"]), s.labels["uuid"]) for s in info]
        return cls(ranks)

    def place(self, *, node: str | None = None, gpu: int | None = None, rank: int | None = None,
              uuid: str | None = None) -> Place:
        """The fullest place the given parts name (a UUID or a node's GPU index also gives the rank)."""
        known = (self._by_uuid.get(uuid) if uuid else None) or \
            (self._by_gpu.get((node, gpu)) if node is not None and gpu is not None else None)
        if known is None and rank is not None and 0 <= rank < len(self.ranks):
            n, g, _ = self.ranks[rank]
            known = Place(n, g, rank)
        if known is not None:
            return known
        return Place(node, gpu, rank)


# ----- agents: alerts and the thermal cap ----------------------------------------------------------

AlertKey = tuple[str, str, str, str]  # node, alertname, gpu index, xid


def _alert_detail(name: str, xid: str) -> tuple[str, ...]:
    spec = ALERTS.get(name)
    if name == "GpuXidCritical" and xid:
        from gpumond.agent.policy.xid_table import xid_info  # data only: the XID catalogue

        info = xid_info(int(xid))
        return (f"XID {xid}: {info.meaning}", f"what to do: {info.action}")
    return (spec.meaning,) if spec else ()


def alert_changes(node: str, before: frozenset[AlertKey], m: Metrics, roster: Roster,
                  t_s: float) -> tuple[frozenset[AlertKey], list[Event]]:
    """Alerts that appeared (firing) or went away (resolved) on one node's /metrics since `before`."""
    now = frozenset((node, s.labels.get("alertname", ""), s.labels.get("gpu", ""), s.labels.get("xid", ""))
                    for s in m.get("gpumond_alert_active", []))
    mine = {k for k in before if k[0] == node}
    events = []
    for key in sorted(now - mine):
        _, name, gpu, xid = key
        place = roster.place(node=node, gpu=int(gpu) if gpu.isdigit() else None)
        events.append(Event(t_s, "alert", name, "firing", place, _alert_detail(name, xid)))
    for key in sorted(mine - now):
        _, name, gpu, _ = key
        place = roster.place(node=node, gpu=int(gpu) if gpu.isdigit() else None)
        events.append(Event(t_s, "alert", name, "resolved", place))
    return (frozenset(before - mine) | now), events


def _by_gpu(m: Metrics, name: str) -> dict[str, float]:
    return {s.labels["gpu"]: float(s.value) for s in m.get(name, []) if "gpu" in s.labels}


@dataclass(frozen=True, slots=True)
class CapState:
    """A GPU's power limit as first seen (its normal limit) and as last reported in an event."""

    normal_w: float
    shown_w: float


def cap_changes(node: str, before: Mapping[str, CapState], m: Metrics, roster: Roster, t_s: float,
                min_step_w: float = 25.0) -> tuple[dict[str, CapState], list[Event]]:
    """The thermal policy's power cap: `firing` when it cuts (and on each move of ≥ min_step_w while capped),
    `resolved` when the limit is back where it started."""
    temps = _by_gpu(m, "gpumond_gpu_temperature_celsius")
    defaults = _by_gpu(m, "gpumond_gpu_power_limit_default_watts")
    state = dict(before)
    events = []
    for gpu, limit in sorted(_by_gpu(m, "gpumond_gpu_power_limit_watts").items()):
        old = state.get(gpu)
        if old is None:
            # The normal limit is the board's default (the demo sets no persistent limit), not the first reading:
            # on a loaded machine the first look can come after the policy's first cut, which is then still told.
            normal = defaults.get(gpu, limit)
            old = state[gpu] = CapState(normal, normal)
        capped_before = old.shown_w < old.normal_w - 0.5
        back = limit >= old.normal_w - 0.5
        if back and not capped_before:
            continue
        if not back and abs(limit - old.shown_w) < min_step_w and capped_before:
            continue
        if not back and not capped_before and old.normal_w - limit < min_step_w:
            continue
        temp = f" (temperature {temps[gpu]:.0f} °C)" if gpu in temps else ""
        verb = "cut" if limit < old.shown_w else "given back"
        detail = f"power limit {old.shown_w:.0f} W → {limit:.0f} W, {verb}{temp}"
        events.append(Event(t_s, "action", "thermal_cap", "resolved" if back else "firing",
                            roster.place(node=node, gpu=int(gpu)), (detail,)))
        state[gpu] = CapState(old.normal_w, limit)
    return state, events


def clock_factors(node: str, m: Metrics, factors: ClockFactors) -> None:
    """Feed the simulated job: a GPU at a fraction of its maximum clock computes that much slower."""
    maxes = _by_gpu(m, "gpumond_gpu_sm_clock_max_hertz")
    for gpu, hz in _by_gpu(m, "gpumond_gpu_sm_clock_hertz").items():
        if hz > 0 and gpu in maxes:
            factors.set(node, int(gpu), max(1.0, maxes[gpu] / hz))


# ----- the rules service's findings ---------------------------------------------------------------

FindingKey = tuple[str, str, str | None, int | None, str | None]


def finding_changes(before: Mapping[FindingKey, str], findings: Iterable[Finding], roster: Roster,
                    t_s: float, *, power: bool = True) -> tuple[dict[FindingKey, str], list[Event]]:
    """Findings that changed state since `before` (key → pending|firing), and those that went away.

    Only pass the demo's own job: the roster knows its ranks, not another job's.
    """
    now: dict[FindingKey, str] = {}
    events = []
    places: dict[FindingKey, Place] = {}
    for f in findings:
        key = (f.kind, f.job, f.node, f.rank, f.gpu_uuid)
        now[key] = f.state
        places[key] = roster.place(node=f.node, rank=f.rank, uuid=f.gpu_uuid)
        if before.get(key) != f.state:
            detail = describe(f.kind, f.evidence, f.node, power=power) if f.state == "firing" else ()
            events.append(Event(t_s, "finding", f.kind, f.state, places[key], detail))
    for key in [k for k in before if k not in now]:
        kind, _, node, rank, uuid = key
        state = "resolved" if before[key] == "firing" else "dropped"
        events.append(Event(t_s, "finding", kind, state, roster.place(node=node, rank=rank, uuid=uuid)))
    return now, events


# ----- the rules service's fleet remediation (dry run in the demo) -------------------------------------

def drain_changes(before: Mapping[str, str], records: Mapping[str, Any], roster: Roster,
                  t_s: float) -> tuple[dict[str, str], list[Event]]:
    """Nodes remediation holds (node → reason): `firing` when it drains (or, dry run, would), `resolved` when it
    returns the node."""
    now = {node: r.reason for node, r in records.items()}
    events = []
    for node in sorted(set(now) - set(before)):
        r = records[node]
        verb = "would drain (dry run)" if r.dry_run else "drained"
        events.append(Event(t_s, "action", "drain", "firing", roster.place(node=node),
                            (f"{verb}: {r.reason}", f"conditions: {', '.join(r.conditions)}; "
                             f"see: gpumond remediation list")))
    for node in sorted(set(before) - set(now)):
        events.append(Event(t_s, "action", "drain", "resolved", roster.place(node=node)))
    return now, events


class Watch:
    """Polls every source once per call and records what changed; remembers only what the next diff needs."""

    def __init__(self, agents: Sequence[tuple[str, Callable[[], Metrics]]], findings: Callable[[], Iterable[Finding]],
                 job: str, roster: Roster, factors: ClockFactors, record: Callable[[Event], object],
                 on_foreign_job: Callable[[str], object] = lambda job: None, speed: float = 1.0,
                 drains: Callable[[], Mapping[str, Any]] = dict) -> None:
        self._agents = agents
        self._drains = drains
        self._drained: dict[str, str] = {}
        self._power = speed == 1.0  # see evidence.describe
        self._job = job
        self._on_foreign = on_foreign_job
        self._foreign: set[str] = set()
        self._findings = findings
        self._roster = roster
        self._factors = factors
        self._record = record
        self._alerts: frozenset[AlertKey] = frozenset()
        self._caps: dict[str, dict[str, CapState]] = {}
        self._seen: dict[FindingKey, str] = {}

    def poll(self, t_s: float) -> None:
        """One round: every agent (a failed scrape is skipped; the next round tries again), then findings."""
        for node, metrics in self._agents:
            try:
                m = metrics()
            except (OSError, ValueError):  # unreachable, or a scrape cut short: skip this round
                continue
            clock_factors(node, m, self._factors)
            self._caps[node], caps = cap_changes(node, self._caps.get(node, {}), m, self._roster, t_s)
            self._alerts, alerts = alert_changes(node, self._alerts, m, self._roster, t_s)
            for e in caps + alerts:
                self._record(e)
        ours = []
        for f in self._findings():
            if f.job == self._job:
                ours.append(f)
            elif f.job not in self._foreign and len(self._foreign) < 10:
                self._foreign.add(f.job)
                self._on_foreign(f.job)
        self._seen, found = finding_changes(self._seen, ours, self._roster, t_s, power=self._power)
        self._drained, drained = drain_changes(self._drained, self._drains(), self._roster, t_s)
        for e in found + drained:
            self._record(e)
