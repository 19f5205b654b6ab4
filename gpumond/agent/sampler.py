"""The sample cycle: read each source in isolation, assemble an immutable snapshot, render it once."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol

from gpumond import __version__
from gpumond.agent import gpu_series
from gpumond.agent.dcgm import DcgmCompat
from gpumond.agent.exposition import Rendered, Renderer
from gpumond.agent.readings import HostReading, Series, Snapshot, SourceResult
from gpumond.agent.sources import PartialFailure, run_source, self_series
from gpumond.agent.policy.view import GpuView
from gpumond.agent.policy.views import build_views
from gpumond.nvml.session import GpuIdentity, NvmlSession, TierRead


class JobSource(Protocol):
    def jobs_for(self, pids: Iterable[int]) -> tuple[str, ...]: ...


class PolicySource(Protocol):
    def cycle(self, views: Sequence[GpuView], xid_counts: Mapping[tuple[int, int], int]) -> Iterable[Series]: ...


class HostSource(Protocol):
    def read(self) -> HostReading: ...


class XidSource(Protocol):
    healthy: bool
    error: str | None

    def counts(self) -> dict[tuple[int, int], int]: ...

    def last(self) -> dict[int, int]: ...


_HOST_FIELDS = (
    ("cpu_utilization_ratio", "gpumond_host_cpu_utilization_ratio"),
    ("cpu_iowait_ratio", "gpumond_host_cpu_iowait_ratio"),
    ("memory_used_bytes", "gpumond_host_memory_used_bytes"),
    ("disk_read_bytes_total", "gpumond_host_disk_read_bytes_total"),
)


def host_series(r: HostReading) -> list[Series]:
    """Host evidence; a value the platform lacks is left out."""
    return [Series(metric, (), float(v)) for attr, metric in _HOST_FIELDS if (v := getattr(r, attr)) is not None]


class Sampler:
    """Owns the latest rendered exposition; the scheduler calls fast_cycle and slow_cycle."""

    def __init__(
        self,
        session: NvmlSession,
        *,
        hostname: str,
        renderer: Renderer | None = None,
        xid: XidSource | None = None,
        jobs: JobSource | None = None,
        host: HostSource | None = None,
        policy: PolicySource | None = None,
        dcgm: DcgmCompat | None = None,
        clock: Callable[[], float] = time.time,
        timer: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._session = session
        self._hostname = hostname
        self._renderer = renderer or Renderer()
        self._xid = xid
        self._jobs = jobs
        self._host = host
        self._policy = policy
        self._dcgm = dcgm
        self._slow_read: TierRead | None = None
        self._clock = clock
        self._timer = timer
        self._slow: tuple[SourceResult, ...] = ()
        self.latest: Rendered | None = None
        self.last_snapshot: Snapshot | None = None
        self.cycles = 0

    @property
    def slow_read(self) -> TierRead | None:
        """The last slow-tier read (limits, constraints, thresholds, ECC), for the policy's views."""
        return self._slow_read

    def _idents(self) -> dict[int, GpuIdentity]:
        return {i.index: i for i in self._session.identities}

    def slow_cycle(self) -> tuple[SourceResult, ...]:
        """ECC, remaps, limits, thresholds and job attribution; kept until the next slow cycle."""
        def slow() -> list[Series]:
            self._slow_read = self._session.read("slow")
            out = gpu_series.tier_series(self._slow_read, with_up=False)
            if self._dcgm is not None:
                out.extend(self._dcgm.tier_series(self._slow_read, self._session.driver_version))
            return out

        results = [run_source("nvml_slow", slow, self._timer)]
        if self._jobs is not None:
            jobs = self._jobs

            def attribute() -> list[Series]:
                pids = self._session.compute_pids()
                return gpu_series.job_series({g: jobs.jobs_for(p) for g, p in pids.items()}, self._idents())

            results.append(run_source("jobs", attribute, self._timer))
        self._slow = tuple(results)
        return self._slow

    def fast_cycle(self) -> Rendered:
        """Temperatures, power, clocks, utilization, XIDs, host; then render everything once."""
        reads: list[TierRead] = []
        results = [run_source("nvml_fast", lambda: self._fast_nvml(reads), self._timer)]
        if self._policy is not None and reads and reads[0].nvml_up:
            policy, views = self._policy, build_views(reads[0], self._slow_read)
            xids = self._xid.counts() if self._xid is not None else {}
            results.append(run_source("policy", lambda: policy.cycle(views, xids), self._timer))
        if self._xid is not None:
            results.append(run_source("xid", self._xid_series, self._timer))
        if self._host is not None:
            host = self._host
            results.append(run_source("host", lambda: host_series(host.read()), self._timer))
        results.extend(self._slow)
        snapshot = Snapshot(self._clock(), tuple(results))
        extra = self_series(results)
        extra.append(Series("gpumond_build_info", (("version", __version__),), 1.0))
        self.latest = self._renderer.render(snapshot, extra)
        self.last_snapshot = snapshot
        self.cycles += 1
        return self.latest

    def _fast_nvml(self, reads: list[TierRead]) -> list[Series]:
        read = self._session.read("fast")
        reads.append(read)
        idents = self._idents()
        out = gpu_series.tier_series(read, with_up=True)
        out.extend(gpu_series.info_series(idents.values(), self._hostname))
        out.extend(gpu_series.error_series(self._session.errors_total, idents))
        if self._dcgm is not None:
            out.extend(self._dcgm.tier_series(read, self._session.driver_version))
        if not read.nvml_up:
            # NVML unusable is this collector failing, even though it still reports up=0 per GPU.
            raise PartialFailure(read.error or "nvml unavailable", out)
        return out

    def _xid_series(self) -> list[Series]:
        assert self._xid is not None
        idents = self._idents()
        out = gpu_series.xid_series(self._xid.counts(), idents)
        if self._dcgm is not None:
            out.extend(self._dcgm.xid_series(self._xid.last(), idents.values(), self._session.driver_version))
        if not self._xid.healthy:
            raise PartialFailure(self._xid.error or "xid watcher not running", out)
        return out

