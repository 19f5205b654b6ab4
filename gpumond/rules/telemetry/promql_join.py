"""Pure join of instant-query results (one per metric) into GPU and host samples, by uuid and target."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from gpumond.rules.telemetry import signals
from gpumond.rules.telemetry.mapping import gpu_order
from gpumond.rules.telemetry.mig import MigRow, mig_row, mig_samples
from gpumond.rules.types import AgentAlert, GpuSample, HostSample

# Keys of the results mapping besides metric names.
IDENTITY = "identity"  # last_over_time(gpumond_gpu_info[lookback]): remembers GPUs of targets gone stale
TARGETS = "targets"  # up, for the targets that expose gpumond_gpu_info

TargetKey = tuple[str, str]  # (job, instance): the labels Prometheus adds to every series of a target


@dataclass(frozen=True, slots=True)
class Row:
    """One series of an instant-vector result."""

    labels: Mapping[str, str]
    value: float


@dataclass(frozen=True, slots=True)
class Joined:
    """The GPUs and hosts of targets that are up, and the nodes of targets that are not."""

    gpus: tuple[GpuSample, ...]
    hosts: tuple[HostSample, ...]
    absent_nodes: frozenset[str]


def join(results: Mapping[str, Sequence[Row]], *, t: float) -> Joined:
    """Join by uuid; a target with up == 0, or no up and no fresh gpumond_gpu_up, makes its node absent.

    `results` maps IDENTITY, TARGETS, signals.GPU_UP, signals.JOB_INFO and each GPU / host metric name
    to its rows; a key whose query failed is missing (that signal is then absent everywhere).
    """
    identity: dict[str, tuple[TargetKey, str]] = {}  # uuid → (target, gpu index)
    nodes: dict[TargetKey, str] = {}  # one node name per target, as when scraping it
    for row in _sorted(results.get(IDENTITY, ())):
        uuid, key = row.labels.get("uuid"), _target(row.labels)
        nodes.setdefault(key, _node(row.labels))
        if uuid and uuid not in identity:  # duplicates (HA pairs, two jobs on one agent): first wins
            identity[uuid] = (key, row.labels.get("gpu", ""))

    gpu_up: dict[str, float] = {}
    fresh: set[TargetKey] = set()
    for row in results.get(signals.GPU_UP, ()):
        uuid, key = row.labels.get("uuid"), _target(row.labels)
        if uuid:
            gpu_up[uuid] = row.value
            fresh.add(key)
            nodes.setdefault(key, _node(row.labels))
            identity.setdefault(uuid, (key, row.labels.get("gpu", "")))

    up = {_target(r.labels): r.value == 1 for r in results.get(TARGETS, ())}

    def present(key: TargetKey) -> bool:
        # `up` is the scraper's word; without it (remote write that drops it) fresh series are the evidence.
        return up.get(key, key in fresh)

    values: dict[str, dict[str, float]] = {}
    for metric in dict.fromkeys(m for m, _ in signals.GPU_SERIES.values()):
        label = signals.SELECTOR_LABEL.get(metric)
        # ~400,000 rows at 33,000 GPUs: a metric without a selecting label feeds one signal, found once.
        only = None if label else signals.gpu_signal(metric, {})
        for row in results.get(metric, ()):
            uuid = row.labels.get("uuid")
            signal = only or (signals.gpu_signal(metric, row.labels) if label else None)
            if signal and uuid:
                values.setdefault(uuid, {})[signal] = row.value
    jobs: dict[str, set[str]] = {}
    mig_jobs: dict[str, set[str]] = {}
    for row in results.get(signals.JOB_INFO, ()):
        if row.labels.get("uuid") and row.labels.get("job") and row.value == 1:
            if "mig_uuid" in row.labels:  # a MIG device's job: its own sample's, not the parent's
                mig = mig_row(row.labels)
                if mig is not None:
                    mig_jobs.setdefault(mig.uuid, set()).add(row.labels["job"])
            else:
                jobs.setdefault(row.labels["uuid"], set()).add(row.labels["job"])

    gpus = tuple(
        GpuSample(uuid=uuid, node=nodes[key], gpu=gpu, t=t, up=gpu_up.get(uuid) == 1, values=values.get(uuid, {}),
                  jobs=tuple(sorted(jobs.get(uuid, ()))))
        for uuid, (key, gpu) in sorted(identity.items(), key=lambda kv: (nodes[kv[1][0]], gpu_order(kv[1][1])))
        # A GPU whose series all went stale on a live target was removed from its agent: leave it out.
        if present(key) and (uuid in gpu_up or uuid in values)
    )
    migs: dict[str, MigRow] = {}
    for row in _sorted(results.get(signals.MIG_INFO, ())):
        mig = mig_row(row.labels)
        if mig is not None:
            migs.setdefault(mig.uuid, mig)  # duplicates (HA pairs): first wins, as for GPUs
    gpus += tuple(mig_samples(gpus, migs.values(), mig_jobs))
    return Joined(gpus=gpus, hosts=_hosts(results, nodes, present, t),
                  absent_nodes=frozenset(node for key, node in nodes.items() if not present(key)))


def _hosts(results: Mapping[str, Sequence[Row]], nodes: Mapping[TargetKey, str],
           present: Callable[[TargetKey], bool], t: float) -> tuple[HostSample, ...]:
    by_target: dict[TargetKey, dict[str, float]] = {}
    for signal, metric in signals.HOST_SERIES.items():
        for row in results.get(metric, ()):
            key = _target(row.labels)
            if key in nodes and present(key):
                by_target.setdefault(key, {})[signal] = row.value
    return tuple(HostSample(node=nodes[key], t=t, values=vals) for key, vals in sorted(by_target.items()))


def mask_rows(rows: Sequence[Row]) -> list[Row]:
    """The CLOCKS_EVENT rows (uuid, reason, 0 or 1) that rows of the CLOCKS_EVENT_MASK bitmask stand for: one per
    reason the signals map, for each row with a uuid and a whole non-negative value (anything else is no reading)."""
    bits = signals.REASON_BITS.items()
    out = []
    for row in rows:
        uuid, v = row.labels.get("uuid"), row.value
        if uuid and v >= 0 and v == int(v) and v < 2**53:
            mask = int(v)
            out += [Row({"uuid": uuid, "reason": reason}, 1.0 if mask & bit else 0.0) for reason, bit in bits]
    return out


def agent_alerts(rows: Sequence[Row]) -> tuple[AgentAlert, ...]:
    """What each agent has firing (rows of gpumond_alert_active), named by node as its GPUs are."""
    return tuple(AgentAlert(node=_node(r.labels), labels={k: v for k, v in r.labels.items()
                                                          if k not in ("job", "instance", "__name__")})
                 for r in _sorted(rows) if r.value == 1 and r.labels.get("alertname"))


def _target(labels: Mapping[str, str]) -> TargetKey:
    return labels.get("job", ""), labels.get("instance", "")


def _node(labels: Mapping[str, str]) -> str:
    # Same order as scraping: an operator's `node` target label, the agent's hostname, the target's host.
    instance = labels.get("instance", "")
    return labels.get("node") or labels.get("hostname") or _host(instance) or instance or "unknown"


@functools.lru_cache(maxsize=1 << 17)
def _host(instance: str) -> str | None:
    # Cached: every series of a target repeats its instance, and at 33,000 GPUs parsing it per row was ~2 s of
    # a fetch's join (benchmarks/fleet_scale.py); a fleet has far fewer targets than the bound.
    try:
        return urlsplit("//" + instance).hostname
    except ValueError:
        return None


def _sorted(rows: Sequence[Row]) -> list[Row]:
    # Deterministic winner among duplicate uuids, whatever order the server returned.
    return sorted(rows, key=lambda r: (r.labels.get("job", ""), r.labels.get("instance", "")))
