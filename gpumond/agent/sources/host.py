"""Host evidence (CPU, iowait, memory, disk reads): what tells a starved rank's node from a busy one."""

from __future__ import annotations

from gpumond.agent.readings import HostReading, Series
from gpumond.agent.sources.base import Source
from gpumond.agent.sources.parts import NodeParts, Registration

_HOST_FIELDS = (
    ("cpu_utilization_ratio", "gpumond_host_cpu_utilization_ratio"),
    ("cpu_iowait_ratio", "gpumond_host_cpu_iowait_ratio"),
    ("memory_used_bytes", "gpumond_host_memory_used_bytes"),
    ("disk_read_bytes_total", "gpumond_host_disk_read_bytes_total"),
)


def host_series(r: HostReading) -> list[Series]:
    """Host evidence; a value the platform lacks is left out."""
    return [Series(metric, (), float(v)) for attr, metric in _HOST_FIELDS if (v := getattr(r, attr)) is not None]


def _build(parts: NodeParts) -> Source:
    host = parts.host
    assert host is not None
    return Source("host", lambda c: host_series(host.read()))


HOST = Registration("fast", _build, lambda p: p.host is not None)
