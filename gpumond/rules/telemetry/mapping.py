"""Pure mapping of one agent's parsed exposition to GPU and host samples."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from prometheus_client.metrics_core import Metric

from gpumond.rules.telemetry import signals
from gpumond.rules.telemetry.mig import MigRow, mig_row, mig_samples
from gpumond.rules.types import AgentAlert, GpuSample, HostSample


@dataclass(frozen=True, slots=True)
class AgentReading:
    """What one agent's /metrics said: its node name, its GPUs and its host evidence."""

    node: str
    gpus: tuple[GpuSample, ...]
    host: HostSample | None
    hostname: str | None  # the agent's own name for its node (gpumond_gpu_info{hostname})
    alerts: tuple[AgentAlert, ...] = ()  # what the agent has firing (gpumond_alert_active)


@dataclass(slots=True)
class _Gpu:
    gpu: str = ""
    up: float | None = None
    values: dict[str, float] = field(default_factory=dict)
    jobs: set[str] = field(default_factory=set)


def read_agent(families: Iterable[Metric], *, t: float, fallback_node: str,
               node: str | None = None) -> AgentReading:
    """Map parsed families to samples; node = `node` (operator's), else the agent's hostname, else fallback."""
    gpus: dict[str, _Gpu] = {}
    host: dict[str, float] = {}
    hostname: str | None = None
    migs: list[MigRow] = []
    mig_jobs: dict[str, set[str]] = {}
    firing: list[dict[str, str]] = []
    for family in families:
        # Match on sample names: the parser may or may not strip `_total` from a counter family's name.
        for s in family.samples:
            name, labels, value = s.name, s.labels, float(s.value)
            if name == signals.ALERT_ACTIVE:
                if value == 1 and labels.get("alertname"):
                    firing.append(dict(labels))
                continue
            host_key = signals.host_signal(name)
            if host_key is not None:
                if math.isfinite(value):
                    host[host_key] = value
                continue
            uuid = labels.get("uuid")
            if not uuid or not name.startswith("gpumond_gpu_"):
                continue
            if "mig_uuid" in labels:  # a MIG device's series: it becomes a sample of its own below
                row = mig_row(labels)
                if row is not None and name == signals.MIG_INFO:
                    migs.append(row)
                elif row is not None and name == signals.JOB_INFO and value == 1 and labels.get("job"):
                    mig_jobs.setdefault(row.uuid, set()).add(labels["job"])
                continue
            g = gpus.get(uuid)
            if g is None:
                g = gpus[uuid] = _Gpu()
            g.gpu = g.gpu or labels.get("gpu", "")
            if name == signals.INFO:
                hostname = hostname or labels.get("hostname") or None
            elif name == signals.GPU_UP:
                g.up = value
            elif name == signals.JOB_INFO:
                if value == 1 and labels.get("job"):
                    g.jobs.add(labels["job"])
            else:
                key = signals.gpu_signal(name, labels)
                # NaN / Inf carry no reading; the agent never sends them, but a proxy might.
                if key is not None and math.isfinite(value):
                    g.values[key] = value
    node_name = node or hostname or fallback_node
    samples = tuple(
        # A GPU whose gpumond_gpu_up is missing is not known to be readable, so it is not up.
        GpuSample(uuid=uuid, node=node_name, gpu=g.gpu, t=t, up=g.up == 1, values=dict(g.values),
                  jobs=tuple(sorted(g.jobs)))
        for uuid, g in sorted(gpus.items(), key=lambda kv: (gpu_order(kv[1].gpu), kv[0]))
    )
    samples += tuple(mig_samples(samples, migs, mig_jobs))
    return AgentReading(node=node_name, gpus=samples,
                        host=HostSample(node=node_name, t=t, values=host) if host else None,
                        hostname=hostname,
                        alerts=tuple(AgentAlert(node=node_name, labels=labels) for labels in firing))


def gpu_order(gpu: str) -> tuple[int, str]:
    """Sort key for GPU indices: 0, 1, …, 10 rather than 0, 1, 10, 2."""
    return (int(gpu), "") if gpu.isdigit() else (1 << 30, gpu)
