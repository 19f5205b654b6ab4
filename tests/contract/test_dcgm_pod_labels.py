"""pod / namespace / container on the dcgm-exporter-compatible series, from the kubelet's pod-resources answer
(a real gRPC server on a unix socket) and the simulated NVML under real pynvml, through the sampler's cycles."""

from __future__ import annotations

import re
import shutil
import time
from collections import defaultdict
from pathlib import Path

import pytest

pytest.importorskip("grpc", reason="pod-resources needs the k8s extra (grpcio), installed with .[test]")

from gpumond.agent.dcgm import DcgmCompat, dcgm_types  # noqa: E402
from gpumond.agent.exposition import Renderer  # noqa: E402
from gpumond.agent.metrics import metric_types  # noqa: E402
from gpumond.agent.podresources.client import PodResourcesClient  # noqa: E402
from gpumond.agent.sampler import Sampler  # noqa: E402
from tests.agent_sampler import node_sampler  # noqa: E402
from gpumond.nvml.events import XidWatcher  # noqa: E402
from gpumond.nvml.sim import ManualClock, Scenario  # noqa: E402
from tests.integration.helpers import DCGM_NAMING_LINT, promtool_check_metrics  # noqa: E402
from tests.podresources_server import PodResourcesServer, pod  # noqa: E402

MIG = Scenario.model_validate({"gpus": [{"index": 1, "mig": ["3g.40gb", "1g.10gb"]}]})
WAIT_S = 10.0
POD_KEYS = ("container", "namespace", "pod")


def kubelet_pods(sim):
    """GPU 0: one container; GPU 1: MIG, a pod on a slice; GPU 2: time-sliced by two pods; GPU 3: nobody."""
    g0, g1, g2 = sim.gpus[0], sim.gpus[1], sim.gpus[2]
    return [
        pod("ml", "trainer-0", ("main", "nvidia.com/gpu", [g0.uuid])),
        pod("ml", "infer-mig", ("srv", "nvidia.com/mig-3g.40gb", [g1.mig[0].uuid])),
        pod("ml", "infer-a", ("srv", "nvidia.com/gpu", [g2.uuid + "::1"])),
        pod("batch", "infer-b", ("worker", "nvidia.com/gpu", [g2.uuid + "::2"])),
    ]


def dcgm_series(sampler: Sampler) -> dict[str, list[tuple[str, dict[str, str], float]]]:
    """GPU index → its DCGM_FI_* series in the last snapshot, as (name, labels, value)."""
    out: dict[str, list[tuple[str, dict[str, str], float]]] = defaultdict(list)
    assert sampler.last_snapshot is not None
    for r in sampler.last_snapshot.results:
        for s in r.series:
            if s.name.startswith("DCGM_FI_"):
                labels = dict(s.labels)
                out[labels["gpu"]].append((s.name, labels, s.value))
    return out


def pods_of(series: list[tuple[str, dict[str, str], float]]) -> set[tuple[str, ...]]:
    return {tuple(labels.get(k, "") for k in POD_KEYS) for _, labels, _ in series}


@pytest.fixture
def node(make_session):
    clock = ManualClock()
    sim, session, _ = make_session(gpus=4, scenario=MIG, clock=clock)
    xid = XidWatcher(session.handles, session.index_of_handle, wait_ms=50)
    xid.start()
    yield sim, session, clock, xid
    xid.stop()


def test_attributed_gpus_carry_pod_labels_on_every_dcgm_series(node, tmp_path: Path) -> None:
    sim, session, clock, xid = node
    sim.inject({"kind": "xid", "gpu": 0, "code": 48})
    deadline = time.monotonic() + WAIT_S
    while xid.last().get(0) != 48 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert xid.last().get(0) == 48, "the XID watcher never saw the injected XID"
    with PodResourcesServer(tmp_path / "kubelet.sock") as kubelet:
        kubelet.pods = kubelet_pods(sim)
        client = PodResourcesClient(kubelet.socket_path, timeout_s=5.0, interval_s=10.0, clock=clock.now)
        assert client.poll(), client.error
    dcgm = DcgmCompat(hostname="n")
    sampler = node_sampler(session, hostname="n", pods=client, xid=xid, dcgm=dcgm,
                      renderer=Renderer(types=metric_types() | dcgm_types()))
    sampler.slow_cycle()
    sampler.fast_cycle()
    by_gpu = dcgm_series(sampler)

    # GPU 0, one container: every DCGM series (fast tier, slow tier, XID gauge) names it, once.
    names = {n for n, _, _ in by_gpu["0"]}
    assert {"DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_XID_ERRORS",
            "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"} <= names
    assert pods_of(by_gpu["0"]) == {("main", "ml", "trainer-0")}
    assert len(by_gpu["0"]) == len(names)
    assert ("DCGM_FI_DEV_XID_ERRORS", 48.0) in {(n, v) for n, _, v in by_gpu["0"]}

    # GPU 2, time-sliced: each series once per container, same value (dcgm-exporter --kubernetes-virtual-gpus).
    shared = defaultdict(set)
    for n, labels, v in by_gpu["2"]:
        shared[n].add((labels["pod"], labels["namespace"], labels["container"], v))
    assert shared.keys() == names
    for n, rows in shared.items():
        assert {r[:3] for r in rows} == {("infer-a", "ml", "srv"), ("infer-b", "batch", "worker")}, n
        assert len({r[3] for r in rows}) == 1, n

    # GPU 1 (its pod holds a MIG slice, not the board) and GPU 3 (nobody): no pod labels, as dcgm-exporter.
    assert pods_of(by_gpu["1"]) == {("", "", "")} and pods_of(by_gpu["3"]) == {("", "", "")}

    # gpumond's own series keep their labels: pods are on gpumond_gpu_job_info only.
    own = [s for r in sampler.last_snapshot.results for s in r.series if s.name.startswith("gpumond_gpu_")]
    assert own and not any(k in dict(s.labels) for s in own for k in POD_KEYS)

    # And in the scrape itself.
    text = sampler.latest.plain.decode()
    line = next(ln for ln in text.splitlines() if ln.startswith("DCGM_FI_DEV_GPU_TEMP{") and 'gpu="0"' in ln)
    labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
    assert (labels["container"], labels["namespace"], labels["pod"]) == ("main", "ml", "trainer-0")
    assert labels["UUID"] == sim.gpus[0].uuid and labels["Hostname"] == "n"

    # promtool's linter says nothing new about the pod labels (only dcgm-exporter's own naming, kept on purpose).
    if shutil.which("promtool") is not None:
        rc, output = promtool_check_metrics(text)
        unexpected = [ln for ln in output.strip().splitlines() if not DCGM_NAMING_LINT.match(ln)]
        assert unexpected == [], f"promtool check metrics (exit {rc}):\n{output}"


def test_pod_labels_go_when_the_kubelet_answer_does(node, tmp_path: Path) -> None:
    """A stale answer (the pod may be gone) drops the labels from the next slow cycle on, fast series too."""
    sim, session, clock, xid = node
    with PodResourcesServer(tmp_path / "kubelet.sock") as kubelet:
        kubelet.pods = kubelet_pods(sim)
        client = PodResourcesClient(kubelet.socket_path, timeout_s=5.0, interval_s=10.0, clock=clock.now)
        assert client.poll(), client.error
    sampler = node_sampler(session, hostname="n", pods=client, xid=xid, dcgm=DcgmCompat(hostname="n"))
    sampler.slow_cycle()
    sampler.fast_cycle()
    assert pods_of(dcgm_series(sampler)["0"]) == {("main", "ml", "trainer-0")}
    clock.advance(3 * 10.0 + 5.0 + 1.0)
    sampler.fast_cycle()  # between slow cycles the last slow cycle's pods stand
    assert pods_of(dcgm_series(sampler)["0"]) == {("main", "ml", "trainer-0")}
    sampler.slow_cycle()
    sampler.fast_cycle()
    by_gpu = dcgm_series(sampler)
    assert all(pods_of(series) == {("", "", "")} for series in by_gpu.values())
    # one series per GPU and metric again
    for series in by_gpu.values():
        assert len(series) == len({n for n, _, _ in series})


def test_without_pod_resources_nothing_changes(node) -> None:
    _, session, _, xid = node
    sampler = node_sampler(session, hostname="n", xid=xid, dcgm=DcgmCompat(hostname="n"))
    sampler.slow_cycle()
    sampler.fast_cycle()
    by_gpu = dcgm_series(sampler)
    assert sorted(by_gpu) == ["0", "1", "2", "3"]
    assert all(pods_of(series) == {("", "", "")} for series in by_gpu.values())


class BrokenDcgm(DcgmCompat):
    """A compatibility layer whose conversion raises, as a bug in it would."""

    def tier_series(self, read, driver_version):
        raise RuntimeError("bug in the dcgm catalogue")


def test_a_failing_dcgm_layer_fails_only_itself(node) -> None:
    _, session, _, xid = node
    sampler = node_sampler(session, hostname="n", xid=xid, dcgm=BrokenDcgm(hostname="n"))
    sampler.slow_cycle()
    sampler.fast_cycle()
    assert sampler.last_snapshot is not None
    ok = {r.source: r.ok for r in sampler.last_snapshot.results}
    assert ok == {"nvml_fast": True, "dcgm_compat_fast": False, "nvml_mig": True, "xid": True, "nvml_slow": True,
                  "dcgm_compat_slow": False}
    names = {s.name for r in sampler.last_snapshot.results for s in r.series}
    assert "gpumond_gpu_temperature_celsius" in names and "gpumond_gpu_power_limit_watts" in names
    assert not any(n.startswith("DCGM_FI_") for n in names)
