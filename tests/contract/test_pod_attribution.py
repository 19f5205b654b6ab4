"""Pod attribution through the kubelet pod-resources API, against a real gRPC server on a unix socket,
with GPUs and MIG devices from the simulated NVML under real pynvml."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

pytest.importorskip("grpc", reason="pod-resources needs the k8s extra (grpcio), installed with .[test]")

from gpumond.agent.app import pod_resources_client  # noqa: E402
from gpumond.agent.jobs import JobAttributor  # noqa: E402
from gpumond.agent.podresources.client import PodResourcesClient  # noqa: E402
from gpumond.agent.sampler import Sampler  # noqa: E402
from tests.agent_sampler import node_sampler  # noqa: E402
from gpumond.config.agent import PodResourcesConfig  # noqa: E402
from gpumond.nvml.sim import ManualClock, Scenario  # noqa: E402
from tests.fakes import HostProcess  # noqa: E402
from tests.podresources_server import PodResourcesServer, pod  # noqa: E402

MIG = Scenario.model_validate({"gpus": [{"index": 1, "mig": ["3g.40gb", "1g.10gb", "1g.10gb"]}]})
POD_UID = "1a2b3c4d-0000-4000-8000-00000000abcd"
WAIT_S = 10.0
POD_UID_A = "9f8e7d6c-0000-4000-8000-00000000beef"
PROCS = {4242: HostProcess({"GPUMOND_JOB_ID": "llama-70b"}), 5000: HostProcess({}), 6000: HostProcess({})}
CGROUPS = {4242: "0::/user.slice\n", 5000: f"0::/kubepods/burstable/pod{POD_UID}/abc\n",
           6000: f"0::/kubepods/pod{POD_UID_A}/def\n"}


def attributor() -> JobAttributor:
    return JobAttributor(process_factory=PROCS.__getitem__, cgroup_reader=CGROUPS.__getitem__)


@pytest.fixture
def node(make_session):
    """Two simulated GPUs, GPU 1 in MIG mode; GPU 0 runs pid 4242 (env job), MIG devices 0 and 1 run
    pids 6000 and 5000 (no job variable, pod cgroups)."""
    sim, session, _ = make_session(gpus=2, scenario=MIG)
    sim.set_processes(0, [4242])
    sim.set_mig_processes(1, 0, [6000])
    sim.set_mig_processes(1, 1, [5000])
    return sim, session


def job_rows(sampler: Sampler) -> set[tuple[tuple[str, str], ...]]:
    rows = set()
    for r in sampler.slow_cycle():
        rows |= {tuple(s.labels) for s in r.series if s.name == "gpumond_gpu_job_info"}
    return rows


def result(sampler: Sampler, name: str):
    return next(r for r in sampler._slow if r.source == name)  # noqa: SLF001 - the cycle's own results


def parent_rows(g1) -> set[tuple[tuple[str, str], ...]]:
    """A MIG-enabled GPU lists every instance's processes (as NVML does), so its own rows name their jobs."""
    return {(("gpu", "1"), ("uuid", g1.uuid), ("job", f"k8s-pod/{uid}")) for uid in (POD_UID, POD_UID_A)}


def fallback_rows(sim) -> set[tuple[tuple[str, str], ...]]:
    """What attribution by process alone gives: the env job on GPU 0, the cgroup pod on MIG device 1."""
    g0, g1 = sim.gpus[0], sim.gpus[1]
    m0, m1 = g1.mig[0], g1.mig[1]
    return {
        (("gpu", "0"), ("uuid", g0.uuid), ("job", "llama-70b")),
        (("gpu", "1"), ("uuid", g1.uuid), ("mig_uuid", m0.uuid), ("gpu_instance", "1"),
         ("compute_instance", "0"), ("profile", "3g.40gb"), ("job", f"k8s-pod/{POD_UID_A}")),
        (("gpu", "1"), ("uuid", g1.uuid), ("mig_uuid", m1.uuid), ("gpu_instance", "2"),
         ("compute_instance", "0"), ("profile", "1g.10gb"), ("job", f"k8s-pod/{POD_UID}")),
    } | parent_rows(g1)


def kubelet_pods(sim):
    g0, g1 = sim.gpus[0], sim.gpus[1]
    return [
        pod("ml", "trainer-0", ("main", "nvidia.com/gpu", [g0.uuid])),
        # mixed MIG strategy: one resource per profile, MIG UUIDs as ids; a time-sliced replica id
        pod("ml", "infer-a", ("srv", "nvidia.com/mig-3g.40gb", [g1.mig[0].uuid])),
        pod("batch", "infer-b", ("srv", "nvidia.com/mig-1g.10gb", [g1.mig[2].uuid + "::1"])),
        # not ours: another node's GPU, a non-NVIDIA resource whose id looks like an index, a bad name
        pod("ml", "elsewhere", ("main", "nvidia.com/gpu", ["GPU-00000000-0000-4000-8000-000000000000"])),
        pod("ml", "nic", ("main", "example.com/nic", ["0"])),
        pod("ml", "bad\x07name", ("main", "nvidia.com/gpu", [g0.uuid])),
    ]


def polled_client(sim, tmp_path: Path) -> PodResourcesClient:
    """A client that has read kubelet_pods(sim) once from a real pod-resources server (stopped again: the
    sampler reads the client's last answer)."""
    with PodResourcesServer(tmp_path / "kubelet.sock") as kubelet:
        kubelet.pods = kubelet_pods(sim)
        client = PodResourcesClient(kubelet.socket_path, timeout_s=5.0)
        assert client.poll(), client.error
    return client


def test_gpus_and_mig_devices_get_their_pods(node, tmp_path: Path) -> None:
    sim, session = node
    rows = job_rows(node_sampler(session, hostname="n", jobs=attributor(), pods=polled_client(sim, tmp_path)))
    g0, g1 = sim.gpus[0], sim.gpus[1]

    def mig(i: int, profile: str) -> tuple[tuple[str, str], ...]:
        m = g1.mig[i]
        return (("gpu", "1"), ("uuid", g1.uuid), ("mig_uuid", m.uuid), ("gpu_instance", str(m.gpu_instance)),
                ("compute_instance", "0"), ("profile", profile))

    assert rows == {
        # the process names the job, the kubelet names the pod
        (("gpu", "0"), ("uuid", g0.uuid), ("job", "llama-70b"),
         ("pod", "trainer-0"), ("namespace", "ml"), ("container", "main")),
        # no job variable in the process: the kubelet's pod is the job (its cgroup UID is not needed)
        mig(0, "3g.40gb") + (("job", "k8s-pod/ml/infer-a"), ("pod", "infer-a"), ("namespace", "ml"),
                             ("container", "srv")),
        # no process at all: the pod is the job
        mig(2, "1g.10gb") + (("job", "k8s-pod/batch/infer-b"), ("pod", "infer-b"), ("namespace", "batch"),
                             ("container", "srv")),
        # the kubelet says nothing about MIG device 1: its process's cgroup still names the pod
        mig(1, "1g.10gb") + (("job", f"k8s-pod/{POD_UID}"),),
    } | parent_rows(g1)


def test_index_device_ids_map_to_gpus(node, tmp_path: Path) -> None:
    """deviceIDStrategy=index: an NVIDIA resource's id is the GPU index."""
    sim, session = node
    with PodResourcesServer(tmp_path / "kubelet.sock") as kubelet:
        kubelet.pods = [pod("ml", "trainer-0", ("main", "nvidia.com/gpu", ["0"]))]
        client = PodResourcesClient(kubelet.socket_path, timeout_s=5.0)
        assert client.poll(), client.error
        rows = job_rows(node_sampler(session, hostname="n", jobs=attributor(), pods=client))
    assert (("gpu", "0"), ("uuid", sim.gpus[0].uuid), ("job", "llama-70b"), ("pod", "trainer-0"),
            ("namespace", "ml"), ("container", "main")) in rows


def test_absent_socket_falls_back_and_says_why(node, tmp_path: Path) -> None:
    sim, session = node
    client = PodResourcesClient(tmp_path / "no-such.sock", timeout_s=2.0)
    assert not client.poll()
    assert client.error and client.error.startswith("UNAVAILABLE")
    sampler = node_sampler(session, hostname="n", jobs=attributor(), pods=client)
    assert job_rows(sampler) == fallback_rows(sim)
    pods = result(sampler, "pod_resources")
    assert not pods.ok and pods.error == client.error
    assert result(sampler, "jobs").ok


def test_garbage_answer_falls_back(node, tmp_path: Path) -> None:
    sim, session = node
    with PodResourcesServer(tmp_path / "kubelet.sock") as kubelet:
        kubelet.garbage = True
        client = PodResourcesClient(kubelet.socket_path, timeout_s=5.0)
        assert not client.poll()
        assert client.error and kubelet.calls == 1
        sampler = node_sampler(session, hostname="n", jobs=attributor(), pods=client)
        assert job_rows(sampler) == fallback_rows(sim)
        assert not result(sampler, "pod_resources").ok


def test_slow_kubelet_never_holds_up_sampling(node, tmp_path: Path) -> None:
    """The kubelet holds the call: the poller's thread waits, the slow cycle does not (it falls back)."""
    sim, session = node
    with PodResourcesServer(tmp_path / "kubelet.sock") as kubelet:
        kubelet.pods = kubelet_pods(sim)
        kubelet.hold.clear()
        client = PodResourcesClient(kubelet.socket_path, timeout_s=20.0, interval_s=60.0)
        client.start()
        try:
            deadline = time.monotonic() + WAIT_S
            while kubelet.calls == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert kubelet.calls == 1, "the poller never called the kubelet"
            sampler = node_sampler(session, hostname="n", jobs=attributor(), pods=client)
            assert job_rows(sampler) == fallback_rows(sim)  # returned while the call is still held
            assert client.polls == 1 and client.snapshot() is None
            kubelet.hold.set()
            deadline = time.monotonic() + WAIT_S
            while client.snapshot() is None and time.monotonic() < deadline:
                time.sleep(0.01)
            assert ("pod", "trainer-0") in {kv for row in job_rows(sampler) for kv in row}
        finally:
            kubelet.hold.set()
            client.stop()


def test_an_old_answer_is_dropped(node, tmp_path: Path) -> None:
    sim, session = node
    clock = ManualClock()
    with PodResourcesServer(tmp_path / "kubelet.sock") as kubelet:
        kubelet.pods = kubelet_pods(sim)
        client = PodResourcesClient(kubelet.socket_path, timeout_s=5.0, interval_s=10.0, clock=clock.now)
        assert client.poll()
    sampler = node_sampler(session, hostname="n", jobs=attributor(), pods=client)
    assert ("pod", "trainer-0") in {kv for row in job_rows(sampler) for kv in row}
    clock.advance(3 * 10.0 + 5.0 + 1.0)  # three missed polls and a deadline: the pod may be gone
    assert job_rows(sampler) == fallback_rows(sim)


def test_client_for_config_says_in_one_line_why_not(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert pod_resources_client(PodResourcesConfig(enabled=False)) is None
    caplog.set_level(logging.INFO, logger="gpumond.agent")
    absent = tmp_path / "kubelet.sock"
    assert pod_resources_client(PodResourcesConfig(socket=absent)) is None  # auto on a node without kubelet
    assert [r.getMessage() for r in caplog.records] == [
        "pod-resources socket not found: attributing GPUs by process only (not a Kubernetes node?)"]
    caplog.clear()
    no_grpc = "ModuleNotFoundError: No module named 'grpc' (install the Kubernetes extra: pip install 'gpumond[k8s]')"
    assert pod_resources_client(PodResourcesConfig(enabled=True, socket=absent), loader=lambda: no_grpc) is None
    (record,) = caplog.records
    assert record.levelno == logging.WARNING and record.error == no_grpc  # type: ignore[attr-defined]
    assert record.getMessage() == "pod-resources configured but unusable: attributing GPUs by process only"
    made = pod_resources_client(PodResourcesConfig(enabled=True, socket=absent, timeout_s=1.0, interval_s=5.0))
    assert isinstance(made, PodResourcesClient) and made.socket_path == absent


class RecordingPolicy:
    """A policy that only remembers the views it was given (what alerts are written from)."""

    def __init__(self) -> None:
        self.views = []

    def cycle(self, views, xid_counts):
        self.views = list(views)
        return ()


def test_the_policy_sees_what_runs_on_each_gpu_and_its_slices(node, tmp_path: Path) -> None:
    sim, session = node
    policy = RecordingPolicy()
    sampler = node_sampler(session, hostname="n", jobs=attributor(), pods=polled_client(sim, tmp_path), policy=policy)
    sampler.slow_cycle()
    sampler.fast_cycle()
    by_gpu = {v.index: v.workload for v in policy.views}
    assert by_gpu[0] == ("job llama-70b (pod ml/trainer-0, container main)",)
    g1 = sim.gpus[1]
    assert f"job k8s-pod/ml/infer-a (pod ml/infer-a, container srv) on MIG 3g.40gb {g1.mig[0].uuid}" in by_gpu[1]
    assert f"job k8s-pod/{POD_UID} on MIG 1g.10gb {g1.mig[1].uuid}" in by_gpu[1]


def test_a_failing_kubelet_is_asked_again_after_a_doubling_back_off_that_an_answer_resets(tmp_path: Path) -> None:
    client = PodResourcesClient(tmp_path / "kubelet.sock", timeout_s=2.0, interval_s=10.0, max_backoff_s=30.0)
    waits = []
    for _ in range(4):
        assert not client.poll()
        waits.append(client.next_poll_s)
    assert waits == [10.0, 20.0, 30.0, 30.0]  # interval_s doubling, capped at max_backoff_s
    with PodResourcesServer(tmp_path / "kubelet.sock"):
        assert client.poll(), client.error
        assert client.next_poll_s == 10.0
    assert not client.poll() and client.next_poll_s == 10.0  # the back-off starts afresh
