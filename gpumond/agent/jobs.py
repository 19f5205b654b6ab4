"""Job attribution: which training jobs own the host PIDs that NVML reports on a GPU."""

from __future__ import annotations

import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import psutil

from gpumond.wire.identity import JOB_ENV_VARS, first_env

# Launcher -> wrapper -> trainer -> dataloader worker is about as deep as real stacks go;
# the bound keeps a lookup cheap and stops it wandering into unrelated system daemons.
MAX_PARENT_DEPTH = 4
# NVML lists a GPU's processes every cycle, so an entry left untouched for several
# cycles belongs to a process that has exited (or left the GPU) and only occupies the
# cache. Callers attributing less often than every few minutes should raise this.
IDLE_EVICT_S = 300.0

# The pod UID as kubelet writes it into cgroup paths, in both drivers:
#   cgroupfs: /kubepods/burstable/pod1a2b3c4d-..../<container>
#   systemd:  /kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1a2b3c4d_...slice/...
# Static (mirror) pods carry a 32-hex-digit hash instead of a dashed UUID.
_POD_UID = re.compile(
    r"(?:^|[/\-])pod"
    r"(?P<uid>[0-9a-fA-F]{8}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{12}"
    r"|[0-9a-fA-F]{32})"
    r"(?=\.slice|/|:|$)"
)

# A process that exited, or whose /proc entry vanished under us.
_VANISHED = (psutil.NoSuchProcess, FileNotFoundError, ProcessLookupError)
# A process we may not read (another user without CAP_SYS_PTRACE), or /proc misbehaving.
_DENIED = (psutil.AccessDenied, PermissionError, OSError)


class ProcessLike(Protocol):
    """The slice of `psutil.Process` that attribution reads."""

    def create_time(self) -> float: ...

    def environ(self) -> dict[str, str]: ...

    def ppid(self) -> int: ...


@dataclass(frozen=True, slots=True)
class AttributionStats:
    """Counters for the attribution cache and the lookups it could not complete."""

    cache_size: int
    hits: int
    misses: int
    denied: int
    vanished: int


def read_proc_cgroup(pid: int) -> str:
    """Return the text of /proc/PID/cgroup."""
    return Path(f"/proc/{pid}/cgroup").read_text(encoding="utf-8", errors="replace")


def pod_uid_from_cgroup(text: str) -> str | None:
    """Return the Kubernetes pod UID in a /proc/PID/cgroup text (v1 or v2), or None."""
    for line in text.splitlines():
        # hierarchy-id:controllers:path — the path itself may contain ':' (containerd scopes).
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        match = _POD_UID.search(parts[2])
        if match:
            # The systemd driver cannot put '-' inside a slice name, so it writes '_'.
            return match.group("uid").replace("_", "-").lower()
    return None


@dataclass(slots=True)
class _Entry:
    create_time: float
    job: str | None
    last_seen: float
    from_env: bool = False  # the job came from the environment, not from the pod's cgroup


class JobAttributor:
    """Maps host PIDs to job ids from the process environment or the Kubernetes pod cgroup.

    Results are cached per (pid, create_time), so a reused PID is looked up afresh.
    A process that exited or may not be read contributes no job and is counted in
    `stats` (vanished / denied); `jobs_for` never raises for it.
    """

    def __init__(
        self,
        env_vars: Sequence[str] = JOB_ENV_VARS,
        kubernetes_pods: bool = True,
        cache_size: int = 4096,
        process_factory: Callable[[int], ProcessLike] = psutil.Process,
        clock: Callable[[], float] = time.monotonic,
        cgroup_reader: Callable[[int], str] = read_proc_cgroup,
        idle_evict_s: float = IDLE_EVICT_S,
    ) -> None:
        if cache_size < 1:
            raise ValueError(f"cache_size must be at least 1, got {cache_size}")
        if idle_evict_s <= 0:
            raise ValueError(f"idle_evict_s must be positive, got {idle_evict_s}")
        self._env_vars = tuple(env_vars)
        self._kubernetes_pods = kubernetes_pods
        self._cache_cap = cache_size
        self._process = process_factory
        self._clock = clock
        self._read_cgroup = cgroup_reader
        self._idle_evict_s = idle_evict_s
        # One entry per pid, holding the create_time it was resolved for: a lookup for
        # the same pid with another create_time is a reused PID and replaces the entry.
        # Least recently seen first, so both the size cap and idle eviction pop the front.
        self._cache: OrderedDict[int, _Entry] = OrderedDict()
        self._hits = self._misses = self._denied = self._vanished = 0
        # Sampling tiers may share one attributor from scheduler threads.
        self._lock = threading.Lock()

    @property
    def stats(self) -> AttributionStats:
        """Current cache size and lookup counters since construction."""
        with self._lock:
            return AttributionStats(
                len(self._cache), self._hits, self._misses, self._denied, self._vanished
            )

    def jobs_for(self, pids: Iterable[int], pods: bool = True) -> tuple[str, ...]:
        """Return the sorted, de-duplicated job ids found for these pids.

        `pods=False` keeps only ids from the environment: the caller knows the pod better (pod-resources).
        """
        with self._lock:
            now = self._clock()
            jobs: set[str] = set()
            for pid in pids:
                job, from_env = self._job_for(pid, now)
                if job is not None and (pods or from_env):
                    jobs.add(job)
            self._evict_idle(now)
            return tuple(sorted(jobs))

    def _job_for(self, pid: int, now: float) -> tuple[str | None, bool]:
        if pid <= 0:
            return None, False
        try:
            process = self._process(pid)
            create_time = process.create_time()
            entry = self._cache.get(pid)
            if entry is not None and entry.create_time == create_time:
                self._hits += 1
                entry.last_seen = now
                self._cache.move_to_end(pid)
                return entry.job, entry.from_env
            self._misses += 1
            lineage, walked = self._lineage(pid, process, create_time)
            job, from_env, readable = self._resolve(lineage)
        except _VANISHED:
            self._vanished += 1
            self._cache.pop(pid, None)
            return None, False
        except _DENIED:
            self._denied += 1
            return None, False
        if not (walked and readable):
            # Something in the lineage was unreadable: use what was found, but do not
            # remember it, since the unread part might have named a different job.
            self._denied += 1
            return job, from_env
        self._cache[pid] = _Entry(create_time, job, now, from_env)
        self._cache.move_to_end(pid)
        while len(self._cache) > self._cache_cap:
            self._cache.popitem(last=False)
        return job, from_env

    def _lineage(
        self, pid: int, process: ProcessLike, create_time: float
    ) -> tuple[list[tuple[int, ProcessLike]], bool]:
        """The process and up to MAX_PARENT_DEPTH ancestors; False if a step was denied."""
        lineage = [(pid, process)]
        child_created = create_time
        for _ in range(MAX_PARENT_DEPTH):
            child_pid, child = lineage[-1]
            try:
                ppid = child.ppid()
                # 1 is the host's init and 0 the kernel: neither belongs to a job.
                if ppid <= 1 or ppid == child_pid:
                    break
                parent = self._process(ppid)
                parent_created = parent.create_time()
            except _VANISHED:
                # The parent exited: the child now hangs off init, so the lineage ends here.
                break
            except _DENIED:
                return lineage, False
            # A parent younger than its child is a reused PID, not the real parent.
            if parent_created > child_created:
                break
            lineage.append((ppid, parent))
            child_created = parent_created
        return lineage, True

    def _resolve(self, lineage: list[tuple[int, ProcessLike]]) -> tuple[str | None, bool, bool]:
        """The job for lineage[0], whether the environment named it, and False if a member could not be read."""
        complete = True
        # The environment wins over the pod anywhere in the lineage: it is the id the
        # job's SDK reports, and a wrapper without it must not hide its launcher's id.
        readers: list[Callable[[int, ProcessLike], str | None]] = [self._job_from_env]
        if self._kubernetes_pods:
            readers.append(self._job_from_pod)
        for reader in readers:
            for index, (pid, process) in enumerate(lineage):
                try:
                    job = reader(pid, process)
                except _VANISHED:
                    if index == 0:
                        raise
                    break  # an ancestor exited mid-lookup; the rest of the lineage went with it
                except _DENIED:
                    complete = False
                    continue
                if job is not None:
                    return job, reader == self._job_from_env, complete
        return None, False, complete

    def _job_from_env(self, pid: int, process: ProcessLike) -> str | None:
        found = first_env(process.environ(), self._env_vars)
        return None if found is None else found[1]

    def _job_from_pod(self, pid: int, process: ProcessLike) -> str | None:
        uid = pod_uid_from_cgroup(self._read_cgroup(pid))
        return None if uid is None else f"k8s-pod/{uid}"

    def _evict_idle(self, now: float) -> None:
        # Entries are kept least recently seen first, so the idle ones are at the front.
        while self._cache:
            entry = next(iter(self._cache.values()))
            if now - entry.last_seen <= self._idle_evict_s:
                break
            self._cache.popitem(last=False)
