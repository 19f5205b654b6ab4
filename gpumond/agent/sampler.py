"""The sample cycle: read each source in isolation, assemble an immutable snapshot, render it once."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Protocol

from gpumond import __version__
from gpumond.agent import gpu_series
from gpumond.agent.attribution import JobLookup, attribute, workloads
from gpumond.agent.podresources.assign import pods_by_device
from gpumond.agent.podresources.client import PodSnapshot
from gpumond.agent.dcgm import DcgmCompat
from gpumond.agent.exposition import Rendered, Renderer
from gpumond.agent.readings import HostReading, Series, Snapshot, SourceResult
from gpumond.agent.sources import Cycle, PartialFailure, Source, run_sources, self_series
from gpumond.agent.policy.view import GpuView, build_views
from gpumond.nvml.session import GpuIdentity, NvmlSession, TierRead

log = logging.getLogger("gpumond.agent")


class PodSource(Protocol):
    """The kubelet pod-resources client's reading side (never blocks)."""

    error: str | None

    def snapshot(self) -> PodSnapshot | None: ...


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
        *,
        hostname: str,
        renderer: Renderer | None = None,
        xid: XidSource | None = None,
        jobs: JobLookup | None = None,
        pods: PodSource | None = None,
        host: HostSource | None = None,
        policy: PolicySource | None = None,
        dcgm: DcgmCompat | None = None,
        nvlink_per_link: bool = False,
        identities: Callable[[Iterable[GpuIdentity]], None] | None = None,
        server: Callable[[], Iterable[Series]] | None = None,
        clock: Callable[[], float] = time.time,
        timer: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._session = session
        self._hostname = hostname
        self._renderer = renderer or Renderer()
        self._xid = xid
        self._jobs = jobs
        self._pods = pods
        self._host = host
        self._policy = policy
        self._dcgm = dcgm
        self._per_link = nvlink_per_link  # each NVLink's counters beside the per-GPU totals
        self._record_identities = identities  # told the GPUs' identities after every slow read
        self._server = server  # the HTTP server's own series (its connection counters), read each fast cycle
        self._slow_read: TierRead | None = None
        self._clock = clock
        self._timer = timer
        self._slow: tuple[SourceResult, ...] = ()
        self._workloads: dict[str, tuple[str, ...]] = {}  # GPU UUID → what runs on it, for alert text
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
        self._register()

    @property
    def slow_read(self) -> TierRead | None:
        """The last slow-tier read (limits, constraints, thresholds, ECC), for the policy's views."""
        return self._slow_read

    def _idents(self) -> dict[int, GpuIdentity]:
        return {i.index: i for i in self._session.identities}

    def slow_cycle(self) -> tuple[SourceResult, ...]:
        """ECC, remaps, limits, thresholds and job attribution; kept until the next slow cycle."""
        with self._slow_lock:
            self._slow = tuple(run_sources(self._slow_sources, Cycle(), self._timer))
            return self._slow

    def fast_cycle(self) -> Rendered:
        """Temperatures, power, clocks, utilization, XIDs, host; then render everything once."""
        cycle = Cycle()
        results = run_sources(self._fast_sources[:1], cycle, self._timer)  # NVML first: the others use its read
        if cycle.read is not None and self._refresh_due(cycle.read):
            self.slow_cycle()
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

    # ----- the sources, in the order they run ----------------------------------------------------------
    def _register(self) -> None:
        """The fast and slow tiers' sources; an optional one is registered only when it was given."""
        fast = [Source("nvml_fast", self._fast_nvml)]
        slow = [Source("nvml_slow", self._slow_nvml)]
        if self._pods is not None:
            slow.append(Source("pod_resources", self._pod_check))
        if self._dcgm is not None:
            # After the pod check, so this cycle's slow DCGM series already carry this cycle's pods; the fast
            # tier's reuse them until the next slow cycle (the kubelet is never called from the fast tier).
            fast.append(Source("dcgm_compat_fast", self._dcgm_fast, lambda c: c.read is not None))
            slow.append(Source("dcgm_compat_slow", self._dcgm_slow))
        if self._policy is not None:
            fast.append(Source("policy", self._policy_cycle, lambda c: c.nvml_up))
        fast.append(Source("nvml_mig", self._mig_series, lambda c: c.nvml_up and bool(self._session.mig_identities)))
        if self._dcgm is not None:
            fast.append(Source("dcgm_compat_mig", self._dcgm_mig, lambda c: bool(c.mig_activity)))
        if self._xid is not None:
            fast.append(Source("xid", self._xid_series))
        if self._host is not None:
            host = self._host
            fast.append(Source("host", lambda c: host_series(host.read())))
        if self._jobs is not None:
            slow.append(Source("jobs", self._attribution))
        self._fast_sources, self._slow_sources = tuple(fast), tuple(slow)

    def _slow_nvml(self, cycle: Cycle) -> list[Series]:
        read = cycle.read = self._slow_read = self._session.read("slow")
        with self._withheld_lock:
            self._withheld = _down(read, self._session.identities)
        self._session.discover_mig()  # MIG can be reconfigured at any time; enumerating is cheap
        if self._record_identities is not None:
            self._record_identities(self._session.identities)
        return gpu_series.tier_series(read, with_up=False, per_link=self._per_link)

    def _pod_check(self, cycle: Cycle) -> list[Series]:
        """The kubelet's last answer mapped to this node's GPU and MIG UUIDs; fails when there is none."""
        assert self._pods is not None
        snap = self._pods.snapshot()
        if snap is None:
            raise PartialFailure(self._pods.error or "no pod-resources answer yet", ())
        idents = self._idents()
        uuids = [i.uuid for i in idents.values()] + [m.uuid for m in self._session.mig_identities]
        cycle.pods = pods_by_device(snap.allocations, uuids, {str(i): g.uuid for i, g in idents.items()})
        return []

    def _dcgm_slow(self, cycle: Cycle) -> list[Series]:
        assert self._dcgm is not None
        self._dcgm.set_pods(cycle.pods)
        return [] if cycle.read is None else self._dcgm.tier_series(cycle.read, self._session.driver_version)

    def _dcgm_fast(self, cycle: Cycle) -> list[Series]:
        assert self._dcgm is not None and cycle.read is not None
        out = self._dcgm.tier_series(cycle.read, self._session.driver_version)
        if self._xid is not None:
            out += self._dcgm.xid_series(self._xid.last(), self._idents().values(), self._session.driver_version)
        return out

    def _dcgm_mig(self, cycle: Cycle) -> list[Series]:
        assert self._dcgm is not None and cycle.mig_activity is not None
        return self._dcgm.mig_series(self._session.mig_identities, cycle.mig_activity, self._idents(),
                                     self._session.driver_version)

    def _attribution(self, cycle: Cycle) -> list[Series]:
        assert self._jobs is not None
        idents = self._idents()
        pids = self._session.compute_pids()
        migs = self._session.mig_identities
        # Every known GPU, not only those whose processes NVML listed: the kubelet may name its pod anyway.
        devices = [(ident.uuid, pids.get(index, ())) for index, ident in sorted(idents.items())]
        if migs:
            mig_pids = self._session.mig_compute_pids()
            devices += [(m.uuid, mig_pids.get(m.uuid, ())) for m in migs]
        found = attribute(devices, self._jobs, cycle.pods)
        self._workloads = workloads(found, idents.values(), migs)
        return gpu_series.job_series(found, idents, migs)

    def _policy_cycle(self, cycle: Cycle) -> Iterable[Series]:
        assert self._policy is not None and cycle.read is not None
        views = build_views(cycle.read, self._slow_read, self._workloads)
        return self._policy.cycle(views, self._xid.counts() if self._xid is not None else {})

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

    def _fast_nvml(self, cycle: Cycle) -> list[Series]:
        read = cycle.read = self._session.read("fast")
        idents = self._idents()
        out = gpu_series.tier_series(read, with_up=True)
        out.extend(gpu_series.info_series(idents.values(), self._hostname))
        out.extend(gpu_series.error_series(self._session.errors_total, idents))
        if not read.nvml_up:
            # NVML unusable is this collector failing, even though it still reports up=0 per GPU.
            raise PartialFailure(read.error or "nvml unavailable", out)
        return out

    def _mig_series(self, cycle: Cycle) -> list[Series]:
        """Each MIG device's identity, memory and (with GPM) activity: what NVML answers per instance."""
        migs = self._session.mig_identities
        activity = cycle.mig_activity = self._session.read_mig_gpm()
        return (gpu_series.mig_info_series(migs) + gpu_series.mig_memory_series(migs, self._session.read_mig())
                + gpu_series.mig_activity_series(migs, activity))

    def _xid_series(self, cycle: Cycle) -> list[Series]:
        assert self._xid is not None
        out = gpu_series.xid_series(self._xid.counts(), self._idents())
        if not self._xid.healthy:
            raise PartialFailure(self._xid.error or "xid watcher not running", out)
        return out

