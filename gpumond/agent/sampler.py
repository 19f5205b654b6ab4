"""The sample cycle: read each source in isolation, assemble an immutable snapshot, render it once."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace

from gpumond import __version__
from gpumond.agent.exposition import Rendered, Renderer
from gpumond.agent.readings import Series, Snapshot, SourceResult
from gpumond.agent.sources.base import Cycle, Tiers, run_sources, self_series
from gpumond.nvml.session import GpuIdentity, NvmlSession, TierRead

log = logging.getLogger("gpumond.agent")


def _down(read: TierRead, idents: Iterable[GpuIdentity]) -> frozenset[str]:
    """Index labels of the GPUs this read found down (all of them when NVML itself was down)."""
    if not read.nvml_up:
        return frozenset(str(i.index) for i in idents)
    return frozenset(str(g.identity.index) for g in read.gpus if not g.up)


def _without(results: tuple[SourceResult, ...], gpus: frozenset[str]) -> tuple[SourceResult, ...]:
    """`results` minus the per-GPU series of `gpus` (their sources' health kept)."""
    if not gpus:
        return results
    return tuple(replace(r, series=tuple(s for s in r.series if dict(s.labels).get("gpu") not in gpus))
                 for r in results)


class Sampler:
    """Owns the latest rendered exposition; the scheduler calls fast_cycle and slow_cycle."""

    def __init__(
        self,
        session: NvmlSession,
        sources: Tiers,
        *,
        renderer: Renderer | None = None,
        server: Callable[[], Iterable[Series]] | None = None,
        clock: Callable[[], float] = time.time,
        timer: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._session = session
        self._fast_sources, self._slow_sources = sources
        self._renderer = renderer or Renderer()
        self._server = server  # the HTTP server's own series (its connection counters), read each fast cycle
        self._slow_read: TierRead | None = None
        self._clock = clock
        self._timer = timer
        self._slow: tuple[SourceResult, ...] = ()
        self._workloads: Mapping[str, tuple[str, ...]] = {}  # GPU UUID → what runs on it, for alert text
        # GPUs (index labels) whose slow-tier and job series are withheld: down in a fast read since the last
        # slow read that found them up. A lost GPU exports up=0 and its identity, never last values.
        self._withheld: frozenset[str] = frozenset()
        self._withheld_lock = threading.Lock()
        self._slow_lock = threading.Lock()  # the scheduled slow cycle and a refresh from the fast one never overlap
        # GPUs (indexes) already given an early slow read since they came back: one each, not one per fast cycle
        # while their slow reads keep failing.
        self._refreshed: frozenset[int] = frozenset()
        self.latest: Rendered | None = None
        self.last_snapshot: Snapshot | None = None
        self.cycles = 0

    @property
    def slow_read(self) -> TierRead | None:
        """The last slow-tier read (limits, constraints, thresholds, ECC), for the policy's views."""
        return self._slow_read

    def slow_cycle(self) -> tuple[SourceResult, ...]:
        """ECC, remaps, limits, thresholds and job attribution; kept until the next slow cycle."""
        with self._slow_lock:
            cycle = Cycle(workloads=self._workloads)
            results = run_sources(self._slow_sources[:1], cycle, self._timer)  # NVML first: the others use its read
            if cycle.read is not None:
                self._slow_read = cycle.read
                with self._withheld_lock:
                    self._withheld = _down(cycle.read, self._session.identities)
            results += run_sources(self._slow_sources[1:], cycle, self._timer)
            self._workloads = cycle.workloads  # renewed by the jobs source, when it ran and answered
            self._slow = tuple(results)
            return self._slow

    def fast_cycle(self) -> Rendered:
        """Temperatures, power, clocks, utilization, XIDs, host; then render everything once."""
        cycle = Cycle()
        results = run_sources(self._fast_sources[:1], cycle, self._timer)  # NVML first: the others use its read
        if cycle.read is not None and self._refresh_due(cycle.read):
            self.slow_cycle()
        cycle.slow_read, cycle.workloads = self._slow_read, self._workloads
        results += run_sources(self._fast_sources[1:], cycle, self._timer)
        if cycle.read is not None:
            with self._withheld_lock:
                self._withheld |= _down(cycle.read, self._session.identities)
        results.extend(_without(self._slow, self._withheld))
        snapshot = Snapshot(self._clock(), tuple(results))
        extra = self_series(results)
        if self._server is not None:
            extra += self._server()
        extra.append(Series("gpumond_build_info", (("version", __version__),), 1.0))
        self.latest = self._renderer.render(snapshot, extra)
        self.last_snapshot = snapshot
        self.cycles += 1
        return self.latest

    def _refresh_due(self, fast: TierRead) -> bool:
        """Whether a GPU answers that the last slow read did not (back from lost, NVML back, or never read).

        Until its next slow read such a GPU has no ECC, remap or limit values, and an alert on them would
        resolve for want of data, then fire again as a new page: so its slow read is taken at once, once.
        """
        if not fast.nvml_up:
            self._refreshed = frozenset()
            return False
        up = {g.identity.index for g in fast.gpus if g.up}
        self._refreshed &= up  # a GPU seen down again may be refreshed again when it returns
        slow = self._slow_read
        in_slow = {g.identity.index for g in slow.gpus if g.up} if slow is not None and slow.nvml_up else set()
        with self._withheld_lock:  # down since that slow read: its values for them are withheld
            in_slow -= {int(i) for i in self._withheld}
        missing = up - in_slow - self._refreshed
        if not missing:
            return False
        self._refreshed |= missing
        return True
