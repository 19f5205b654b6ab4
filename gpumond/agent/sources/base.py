"""What a collector is, and how each runs isolated, timed and counted.

The sampler holds the built `Source`s of each tier and runs each through `run_source`, so a failing source
fails only itself (`gpumond_collector_success{collector}`), never a scrape. A source that needs what an
earlier one read this cycle (the NVML read, the kubelet's pods) or what the sampler keeps between cycles (the
last slow read, what runs on each GPU) finds it on the `Cycle`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from gpumond.agent.podresources.assign import PodRef
from gpumond.agent.readings import Series, SourceResult
from gpumond.nvml.session import TierRead

log = logging.getLogger("gpumond.agent")


class PartialFailure(RuntimeError):
    """A source failed but still has series worth exporting (e.g. gpu_up 0 while NVML is down)."""

    def __init__(self, message: str, series: Iterable[Series]) -> None:
        super().__init__(message)
        self.series = tuple(series)


@dataclass(slots=True)
class Cycle:
    """What one cycle's earlier sources read for the later ones."""

    read: TierRead | None = None  # this tier's NVML read (the nvml source runs first)
    pods: Mapping[str, tuple[PodRef, ...]] | None = None  # device UUID → containers (slow tier; None: unknown)
    # MIG UUID → this fast cycle's GPM activity of the instance (read once: a second read would start a new
    # interval); set by the MIG source, read by the dcgm-compatible one.
    mig_activity: Mapping[str, Mapping[str, float]] | None = None
    # Kept by the sampler between cycles: the last slow-tier read (limits, thresholds, ECC), for the fast tier,
    # and what runs on each GPU (UUID → workloads, for alert text), which the slow tier's jobs source renews.
    slow_read: TierRead | None = None
    workloads: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def nvml_up(self) -> bool:
        """Whether this cycle's NVML read answered."""
        return self.read is not None and self.read.nvml_up


def _always(cycle: Cycle) -> bool:
    return True


@dataclass(frozen=True, slots=True)
class Source:
    """One collector: its name (the `collector` label), what it emits, and whether it runs this cycle."""

    name: str
    collect: Callable[[Cycle], Iterable[Series]]
    runs: Callable[[Cycle], bool] = _always


class Tiers(NamedTuple):
    """The built sources of each tier, in the order they run; each tier's first is its NVML read."""

    fast: tuple[Source, ...]
    slow: tuple[Source, ...]


def run_sources(sources: Iterable[Source], cycle: Cycle,
                timer: Callable[[], float] = time.perf_counter) -> list[SourceResult]:
    """Each source that runs this cycle, in order, isolated by `run_source`."""
    return [run_source(s.name, lambda s=s: s.collect(cycle), timer) for s in sources if s.runs(cycle)]


def run_source(name: str, produce: Callable[[], Iterable[Series]],
               timer: Callable[[], float] = time.perf_counter) -> SourceResult:
    """Run `produce`; an exception fails only this source (prometheus-client would fail the whole scrape)."""
    start = timer()
    try:
        series = tuple(produce())
    except PartialFailure as e:
        return SourceResult(name, False, timer() - start, e.series, str(e))
    except Exception as e:
        log.warning("collector failed", extra={"collector": name, "error": repr(e)})
        return SourceResult(name, False, timer() - start, (), repr(e))
    return SourceResult(name, True, timer() - start, series)


def self_series(results: Iterable[SourceResult]) -> list[Series]:
    """gpumond_collector_success / _duration_seconds for each source."""
    out = []
    for r in results:
        labels = (("collector", r.source),)
        out.append(Series("gpumond_collector_success", labels, 1.0 if r.ok else 0.0))
        out.append(Series("gpumond_collector_duration_seconds", labels, r.duration_s))
    return out
