"""Job attribution against a fake process table: env precedence, cgroups, parent walk, cache, errors."""

from __future__ import annotations

from dataclasses import dataclass, field

import psutil
import pytest

from gpumond.agent.jobs import (
    IDLE_EVICT_S,
    MAX_PARENT_DEPTH,
    AttributionStats,
    JobAttributor,
    pod_uid_from_cgroup,
)
from tests.fakes import FakeClock

UID = "1a2b3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d"
CONTAINER = "9f8e7d6c5b4a39281706f5e4d3c2b1a09f8e7d6c5b4a39281706f5e4d3c2b1a0"
NOT_K8S = "0::/user.slice/user-1000.slice/session-3.scope\n"


@dataclass
class Spec:
    env: dict[str, str] = field(default_factory=dict)
    ppid: int = 1
    created: float = 1000.0
    cgroup: str = NOT_K8S
    error: Exception | None = None  # raised by every process method
    env_error: Exception | None = None


class FakeProcess:
    """Just enough of psutil.Process, backed by a FakeHost spec."""

    def __init__(self, host: FakeHost, spec: Spec) -> None:
        self._host = host
        self._spec = spec

    def _check(self) -> None:
        if self._spec.error is not None:
            raise self._spec.error

    def create_time(self) -> float:
        self._check()
        return self._spec.created

    def ppid(self) -> int:
        self._check()
        return self._spec.ppid

    def environ(self) -> dict[str, str]:
        self._check()
        self._host.environ_reads += 1
        if self._spec.env_error is not None:
            raise self._spec.env_error
        return dict(self._spec.env)


class FakeHost:
    """A process table the attributor reads through its injected factory and cgroup reader."""

    def __init__(self) -> None:
        self.procs: dict[int, Spec] = {}
        self.environ_reads = 0
        self.cgroup_error: Exception | None = None

    def add(self, pid: int, **kwargs: object) -> Spec:
        self.procs[pid] = Spec(**kwargs)  # type: ignore[arg-type]
        return self.procs[pid]

    def process(self, pid: int) -> FakeProcess:
        if pid not in self.procs:
            raise psutil.NoSuchProcess(pid)
        return FakeProcess(self, self.procs[pid])

    def read_cgroup(self, pid: int) -> str:
        if self.cgroup_error is not None:
            raise self.cgroup_error
        if pid not in self.procs:
            raise FileNotFoundError(f"/proc/{pid}/cgroup")
        return self.procs[pid].cgroup


@pytest.fixture
def host() -> FakeHost:
    return FakeHost()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(0.0)


@pytest.fixture
def make(host: FakeHost, clock: FakeClock):
    def factory(**kwargs: object) -> JobAttributor:
        return JobAttributor(
            process_factory=host.process, clock=clock, cgroup_reader=host.read_cgroup, **kwargs
        )

    return factory


# --- environment ---------------------------------------------------------------------


# --- cgroups -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        # cgroup v1, cgroupfs driver, several controllers
        f"12:memory:/kubepods/burstable/pod{UID}/{CONTAINER}\n"
        f"11:cpu,cpuacct:/kubepods/burstable/pod{UID}/{CONTAINER}\n",
        # cgroup v1, guaranteed QoS has no class directory
        f"4:devices:/kubepods/pod{UID}/{CONTAINER}\n",
        # cgroup v2, systemd driver, '_' standing for '-'
        "0::/kubepods.slice/kubepods-besteffort.slice/"
        f"kubepods-besteffort-pod{UID.replace('-', '_')}.slice/cri-containerd-{CONTAINER}.scope\n",
        # systemd driver, guaranteed QoS
        f"0::/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/crio-{CONTAINER}.scope\n",
        # cgroup v1 systemd driver, named hierarchy line first
        "1:name=systemd:/kubepods.slice/kubepods-burstable.slice/"
        f"kubepods-burstable-pod{UID.replace('-', '_')}.slice/docker-{CONTAINER}.scope\n",
        # containerd nested under its service unit: ':' inside the path
        "0::/system.slice/containerd.service/"
        f"kubepods-burstable-pod{UID.replace('-', '_')}.slice:cri-containerd:{CONTAINER}\n",
        # kind / kubelet.slice layout, upper-case hex normalised
        "0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
        f"kubelet-kubepods-besteffort-pod{UID.upper().replace('-', '_')}.slice/cri-containerd-{CONTAINER}.scope\n",
    ],
)
def test_pod_uid_from_cgroup_layouts(text: str) -> None:
    assert pod_uid_from_cgroup(text) == UID


def test_static_pod_hash_uid() -> None:
    static = "5e4bcd0e0f6b2b8f8a1e0f0e4f1e2d3c"
    assert pod_uid_from_cgroup(f"0::/kubepods/besteffort/pod{static}/{CONTAINER}\n") == static


@pytest.mark.parametrize(
    "text",
    [
        "",
        NOT_K8S,
        f"0::/system.slice/docker-{CONTAINER}.scope\n",
        f"0::/machine.slice/libpod-{CONTAINER}.scope\n",  # podman: "pod" inside a word
        "0::/user.slice/user-1000.slice/user@1000.service/app.slice/podman-12345.scope\n",
        "9:name=systemd:/\n8:pids:/\n0::/\n",
        "garbage without colons\n",
    ],
)
def test_no_pod_uid_outside_kubernetes(text: str) -> None:
    assert pod_uid_from_cgroup(text) is None


def test_pod_uid_becomes_job_when_environment_has_none(host: FakeHost, make) -> None:
    host.add(10, cgroup=f"0::/kubepods/burstable/pod{UID}/{CONTAINER}\n")
    assert make().jobs_for([10]) == (f"k8s-pod/{UID}",)
    assert make(kubernetes_pods=False).jobs_for([10]) == ()


def test_environment_beats_pod(host: FakeHost, make) -> None:
    pod = f"0::/kubepods/burstable/pod{UID}/{CONTAINER}\n"
    host.add(10, env={"TORCHELASTIC_RUN_ID": "run-9"}, cgroup=pod)
    assert make().jobs_for([10]) == ("run-9",)


def test_launcher_environment_beats_wrapper_pod(host: FakeHost, make) -> None:
    pod = f"0::/kubepods/burstable/pod{UID}/{CONTAINER}\n"
    host.add(20, env={"GPUMOND_JOB_ID": "llama-70b-r3"}, cgroup=pod, created=1.0)
    host.add(21, ppid=20, cgroup=pod, created=2.0)
    assert make().jobs_for([21]) == ("llama-70b-r3",)


# --- parent walk ---------------------------------------------------------------------


def test_worker_inherits_job_from_parent(host: FakeHost, make) -> None:
    host.add(100, env={"SLURM_JOB_ID": "123456"}, created=1.0)
    host.add(101, ppid=100, created=2.0)
    host.add(102, ppid=101, created=3.0)
    assert make().jobs_for([102]) == ("123456",)


def test_parent_walk_is_bounded(host: FakeHost, make) -> None:
    host.add(100, env={"SLURM_JOB_ID": "123456"}, created=1.0)
    for depth in range(1, MAX_PARENT_DEPTH + 2):
        host.add(100 + depth, ppid=100 + depth - 1, created=1.0 + depth)
    at_limit = 100 + MAX_PARENT_DEPTH
    beyond = at_limit + 1
    attributor = make()
    assert attributor.jobs_for([at_limit]) == ("123456",)
    assert attributor.jobs_for([beyond]) == ()


def test_walk_stops_at_init(host: FakeHost, make) -> None:
    host.add(1, env={"SLURM_JOB_ID": "not-a-job"}, ppid=0, created=0.0)
    host.add(50, ppid=1)
    assert make().jobs_for([50]) == ()


def test_reused_parent_pid_is_not_followed(host: FakeHost, make) -> None:
    # The real parent exited; an unrelated, younger process now holds its PID.
    host.add(200, env={"SLURM_JOB_ID": "someone-else"}, created=500.0)
    host.add(201, ppid=200, created=100.0)
    assert make().jobs_for([201]) == ()


def test_parent_that_vanished_ends_walk_without_failing(host: FakeHost, make) -> None:
    pod = f"0::/kubepods/pod{UID}/{CONTAINER}\n"
    host.add(300, ppid=299, cgroup=pod)  # 299 is not in the table
    attributor = make()
    assert attributor.jobs_for([300]) == (f"k8s-pod/{UID}",)
    assert attributor.stats.vanished == 0
    assert attributor.stats.cache_size == 1


# --- jobs_for and cache --------------------------------------------------------------


def test_jobs_are_sorted_and_deduplicated(host: FakeHost, make) -> None:
    host.add(1, ppid=0, created=0.0)
    host.add(10, env={"SLURM_JOB_ID": "b"})
    host.add(11, env={"SLURM_JOB_ID": "b"})
    host.add(12, env={"SLURM_JOB_ID": "a"})
    host.add(13)
    assert make().jobs_for([10, 11, 12, 13, 0, -5]) == ("a", "b")


def test_cache_hit_skips_environment_read(host: FakeHost, make) -> None:
    host.add(10, env={"SLURM_JOB_ID": "7"})
    attributor = make()
    assert attributor.jobs_for([10]) == ("7",)
    reads = host.environ_reads
    assert attributor.jobs_for([10]) == ("7",)
    assert host.environ_reads == reads
    assert attributor.stats == AttributionStats(cache_size=1, hits=1, misses=1, denied=0, vanished=0)


def test_no_job_result_is_cached_too(host: FakeHost, make) -> None:
    host.add(10)
    attributor = make()
    attributor.jobs_for([10])
    attributor.jobs_for([10])
    assert attributor.stats.hits == 1


def test_reused_pid_is_looked_up_afresh(host: FakeHost, make) -> None:
    host.add(10, env={"SLURM_JOB_ID": "old"}, created=100.0)
    attributor = make()
    assert attributor.jobs_for([10]) == ("old",)
    host.add(10, env={"SLURM_JOB_ID": "new"}, created=200.0)
    assert attributor.jobs_for([10]) == ("new",)
    stats = attributor.stats
    assert (stats.hits, stats.misses, stats.cache_size) == (0, 2, 1)


def test_cache_is_bounded_lru(host: FakeHost, make) -> None:
    for pid in (10, 11, 12):
        host.add(pid, env={"SLURM_JOB_ID": str(pid)})
    attributor = make(cache_size=2)
    attributor.jobs_for([10, 11])
    attributor.jobs_for([10])  # 10 is now the most recent, 11 the least
    attributor.jobs_for([12])  # evicts 11
    assert attributor.stats.cache_size == 2
    before = attributor.stats
    attributor.jobs_for([10])
    attributor.jobs_for([11])
    after = attributor.stats
    assert (after.hits - before.hits, after.misses - before.misses) == (1, 1)


def test_exited_process_is_evicted(host: FakeHost, make) -> None:
    host.add(10, env={"SLURM_JOB_ID": "7"})
    attributor = make()
    attributor.jobs_for([10])
    del host.procs[10]
    assert attributor.jobs_for([10]) == ()
    assert attributor.stats.cache_size == 0
    assert attributor.stats.vanished == 1


def test_idle_entries_are_evicted(host: FakeHost, clock: FakeClock, make) -> None:
    host.add(10, env={"SLURM_JOB_ID": "7"})
    host.add(11, env={"SLURM_JOB_ID": "8"})
    attributor = make()
    attributor.jobs_for([10, 11])
    clock.now += IDLE_EVICT_S / 2
    attributor.jobs_for([11])
    clock.now += IDLE_EVICT_S / 2 + 1
    attributor.jobs_for([])
    assert attributor.stats.cache_size == 1  # 10 went idle, 11 was seen recently
    clock.now += IDLE_EVICT_S
    attributor.jobs_for([])
    assert attributor.stats.cache_size == 0


def test_idle_eviction_follows_the_configured_age(host: FakeHost, clock: FakeClock, make) -> None:
    host.add(10, env={"SLURM_JOB_ID": "7"})
    attributor = make(idle_evict_s=3 * 3600)  # attribution every hour
    attributor.jobs_for([10])
    clock.now += 3600
    attributor.jobs_for([10])
    assert attributor.stats.hits == 1


@pytest.mark.parametrize("kwargs", [{"cache_size": 0}, {"idle_evict_s": 0}])
def test_bounds_must_be_positive(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        JobAttributor(**kwargs)


# --- tolerated errors ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "counter"),
    [
        (psutil.NoSuchProcess(10), "vanished"),
        (psutil.ZombieProcess(10), "vanished"),
        (ProcessLookupError(), "vanished"),
        (psutil.AccessDenied(10), "denied"),
        (PermissionError(13, "Permission denied"), "denied"),
        (OSError(5, "Input/output error"), "denied"),
    ],
)
def test_unreadable_process_contributes_nothing_and_is_counted(
    host: FakeHost, make, error: Exception, counter: str
) -> None:
    host.add(10, error=error)
    host.add(11, env={"SLURM_JOB_ID": "7"})
    attributor = make()
    assert attributor.jobs_for([10, 11]) == ("7",)
    assert getattr(attributor.stats, counter) == 1
    assert attributor.stats.cache_size == 1  # only the readable one


@pytest.mark.parametrize(
    ("error", "counter"),
    [
        (psutil.ZombieProcess(10), "vanished"),
        (psutil.AccessDenied(10), "denied"),
        (PermissionError(13, "Permission denied"), "denied"),
    ],
)
def test_environment_read_errors_are_tolerated(
    host: FakeHost, make, error: Exception, counter: str
) -> None:
    host.add(10, env_error=error)
    attributor = make(kubernetes_pods=False)
    assert attributor.jobs_for([10]) == ()
    assert getattr(attributor.stats, counter) == 1


def test_missing_pid_is_counted_as_vanished(make) -> None:
    attributor = make()
    assert attributor.jobs_for([4242]) == ()
    assert attributor.stats.vanished == 1


def test_denied_lookup_is_retried_not_cached(host: FakeHost, make) -> None:
    host.add(10, env_error=psutil.AccessDenied(10))
    attributor = make(kubernetes_pods=False)
    attributor.jobs_for([10])
    attributor.jobs_for([10])
    assert attributor.stats.denied == 2
    assert attributor.stats.cache_size == 0


def test_denied_environment_still_allows_parent_and_pod(host: FakeHost, make) -> None:
    pod = f"0::/kubepods/pod{UID}/{CONTAINER}\n"
    host.add(10, env_error=psutil.AccessDenied(10), cgroup=pod)
    attributor = make()
    assert attributor.jobs_for([10]) == (f"k8s-pod/{UID}",)
    assert attributor.stats.denied == 1

    host.add(20, env={"SLURM_JOB_ID": "55"}, created=1.0)
    host.add(21, ppid=20, env_error=psutil.AccessDenied(21), created=2.0)
    assert attributor.jobs_for([21]) == ("55",)


def test_cgroup_read_errors_are_tolerated(host: FakeHost, make) -> None:
    host.add(10)
    host.cgroup_error = PermissionError(13, "Permission denied")
    attributor = make()
    assert attributor.jobs_for([10]) == ()
    assert attributor.stats.denied == 1
