"""Which nodes a fetch asks about: the targets of what the detectors need (a TelemetryNeed), at two cadences.

At fleet scale a query's cost on the server is the series it selects (benchmarks/fleet_scale.py: ~11–30 µs of
VictoriaMetrics CPU each, whether it answers them or not), so what narrows the selection is what saves. The
detectors read the GPUs of their replica's jobs only (their windows, their nodes' host evidence); what every
node's state feeds is fleet remediation, which reads each GPU's `up`, each target's `up` and the agents' alerts.

- **A detail fetch** asks what a fetch asked before (promql_tiers decides the tiers), except that the GPU values,
  the jobs on each GPU and the host evidence are asked only of the targets that hold a needed GPU (a label
  matcher on `instance`), when those are at most half the fleet's targets: a shard whose jobs sit on few nodes
  stops paying for the rest. The identity, each GPU's `up`, each target's `up`, MIG devices, the max clock and
  power limit and the agents' alerts stay fleet-wide. A GPU outside the selection gets a sample without values.
- **Between detail fetches** (`detail_s` > 0): every fetch asks each target's `up` and the agents' alerts of the
  whole fleet, and everything about the targets that hold a GPU under suspicion (a GPU in a finding, pending or
  firing) but what the last refresh keeps; the other GPUs and hosts are passed on as their last sample, the same object, which a store
  already holds (GpuStore skips it). So a suspect's samples are what a fetch of everything gives at that instant,
  every fetch, and everyone else's at the detail cadence: the evidence for what is already suspected stays fresh,
  and what is new is seen within `detail_s`. A target that went down is seen at once (its node absent, its GPUs
  not passed on); a GPU that joined, left or went down without its target, at the next detail fetch.

`detail_s` 0 makes every fetch a detail fetch: the detectors' input then equals a fetch of everything's, for
every GPU they read (tests/unit/test_telemetry_promql_need.py holds the two equal).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence

from gpumond.rules.telemetry import signals
from gpumond.rules.telemetry.promql_join import Joined, Row, TargetKey
from gpumond.rules.telemetry.promql_tiers import (
    POWER_LIMIT,
    SM_CLOCK_MAX,
    regex_literal,
)
from gpumond.rules.types import GpuSample, HostSample, TelemetryNeed

# Longer matchers are not sent: VictoriaMetrics refuses a query over -search.maxQueryLen (16 KiB by default), and
# a selection that long is most of a fleet anyway.
MAX_MATCHER_CHARS = 8192
# The queries a detail fetch narrows to the needed targets: what only the detectors read. The throttle reasons
# only in their between-refreshes form (`… != 0`): their refresh keeps a row of every GPU (promql_tiers).
NARROWED = frozenset(m for m, _ in signals.GPU_SERIES.values() if m not in (SM_CLOCK_MAX, POWER_LIMIT)) \
    | {signals.JOB_INFO, signals.CLOCKS_EVENT_MASK} | frozenset(signals.HOST_SERIES.values())
# What a fetch between detail fetches asks about the suspects' targets: everything a GPU or host sample holds but
# what the last refresh keeps (MIG devices, the max clock, the power limit: promql_tiers.REUSED).
SUSPECT_KEYS = NARROWED | {signals.GPU_UP}
_NOT_EQUAL_ZERO = " != 0"


def targets_of(identity: Sequence[Row], uuids: Collection[str]) -> frozenset[TargetKey]:
    """The targets (job, instance) whose identity names one of `uuids`."""
    return frozenset((r.labels.get("job", ""), r.labels.get("instance", "")) for r in identity
                     if r.labels.get("uuid") in uuids)


def uuids_on(identity: Sequence[Row], targets: Collection[TargetKey]) -> frozenset[str]:
    """The GPUs whose identity names one of `targets`."""
    return frozenset(r.labels.get("uuid", "") for r in identity
                     if (r.labels.get("job", ""), r.labels.get("instance", "")) in targets)


def instance_matcher(targets: Iterable[TargetKey]) -> str:
    """`instance=~"…"`: the instances of `targets`, matched literally."""
    return f'instance=~"{"|".join(sorted({regex_literal(i) for _, i in targets}))}"'


def selection(identity: Sequence[Row] | None, uuids: Collection[str]) -> str | None:
    """The matcher that selects the targets holding `uuids`; None to ask the whole fleet (no identity yet, or they
    are more than half its targets, or the matcher would be too long); "" when none holds one."""
    if identity is None:
        return None
    mine = targets_of(identity, uuids)
    if not mine:
        return ""
    fleet = {(r.labels.get("job", ""), r.labels.get("instance", "")) for r in identity}
    matcher = instance_matcher(mine)
    return None if 2 * len(mine) > len(fleet) or len(matcher) > MAX_MATCHER_CHARS else matcher


def narrowed(planned: Mapping[str, str], full: Mapping[str, str], narrow: Mapping[str, str] | None,
             keys: Collection[str] = NARROWED) -> dict[str, str]:
    """The queries to send for `planned` (promql_tiers' plan, whose forms come from `full`): each of `keys` in its
    form from `narrow` (build_queries with a matcher), left out when `narrow` is empty (nothing needed); the rest
    as planned. A query in a form neither gives (a refresh's throttle rows) is sent as planned."""
    if narrow is None:
        return dict(planned)
    out = {}
    for key, query in planned.items():
        if key not in keys:
            out[key] = query
        elif not narrow:
            continue
        elif query == full[key]:
            out[key] = narrow[key] if key not in (signals.CLOCKS_EVENT, signals.CLOCKS_EVENT_MASK) else query
        elif query == full[key] + _NOT_EQUAL_ZERO:
            out[key] = narrow[key] + _NOT_EQUAL_ZERO
        else:
            out[key] = query
    return out


class Cadence:
    """When the next detail fetch is due, and the last sample of every GPU and host to pass on until then."""

    def __init__(self, detail_s: float) -> None:
        if detail_s < 0:
            raise ValueError("detail_s must be >= 0 (0 asks every GPU's values every fetch)")
        self.detail_s = float(detail_s)
        self._at: float | None = None
        self._gpus: dict[str, GpuSample] = {}
        self._hosts: dict[str, HostSample] = {}

    def due(self, t: float, need: TelemetryNeed | None, identity: Sequence[Row] | None) -> bool:
        """Whether the fetch at `t` is a detail fetch; a clock that went back makes it one too."""
        return (need is None or identity is None or self._at is None or self.detail_s == 0
                or not 0 <= t - self._at < self.detail_s)

    def detailed(self, t: float, joined: Joined) -> None:
        """A detail fetch at `t` answered `joined`: what is passed on until the next one."""
        self._at = t
        self._gpus = {g.uuid: g for g in joined.gpus}
        self._hosts = {h.node: h for h in joined.hosts}

    def forget(self) -> None:
        """The next fetch is a detail fetch (the last one failed: nothing of it is passed on)."""
        self._at = None
        self._gpus, self._hosts = {}, {}

    def between(self, fresh: Joined) -> tuple[tuple[GpuSample, ...], tuple[HostSample, ...]]:
        """`fresh` (the suspects' samples) with every other GPU's and host's last sample, except those of absent
        nodes; the fresh ones are passed on from now."""
        self._gpus.update((g.uuid, g) for g in fresh.gpus)
        self._hosts.update((h.node, h) for h in fresh.hosts)
        absent = fresh.absent_nodes
        if absent:
            self._gpus = {u: g for u, g in self._gpus.items() if g.node not in absent}
            self._hosts = {n: h for n, h in self._hosts.items() if n not in absent}
        return tuple(self._gpus.values()), tuple(self._hosts.values())


def suspect_queries(narrow: Mapping[str, str]) -> dict[str, str]:
    """What a fetch between detail fetches asks of the suspects' targets: every GPU and host query, in full."""
    return {key: narrow[key] for key in sorted(SUSPECT_KEYS | {signals.CLOCKS_EVENT})}

