"""Immutable readings: what one sample cycle saw, handed from sources to exposition."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpumond.types import Labels, Series

__all__ = ["HostReading", "Labels", "Series", "Snapshot", "SourceResult"]


@dataclass(frozen=True, slots=True)
class SourceResult:
    """What one source produced in one cycle; a failed source still reports itself."""

    source: str
    ok: bool
    duration_s: float
    series: tuple[Series, ...] = ()
    error: str | None = None


@dataclass(frozen=True, slots=True)
class HostReading:
    """Host evidence for telling a CPU-starved data loader from a storage-starved one.

    A field the platform cannot give is None and is left out of the exposition.
    """

    cpu_utilization_ratio: float | None = None
    cpu_iowait_ratio: float | None = None
    memory_used_bytes: float | None = None
    disk_read_bytes_total: float | None = None


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything the agent knows at one instant; exposition renders exactly this."""

    taken_at: float
    results: tuple[SourceResult, ...] = field(default=())
