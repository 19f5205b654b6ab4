"""Pure: the kubelet's device allocations mapped to this node's GPU and MIG UUIDs, bounded and cleaned."""

from __future__ import annotations

from types import SimpleNamespace as NS

from gpumond.agent.attribution import DeviceJob, attribute
from gpumond.agent.podresources.assign import Allocation, PodRef, allocations, device_uuid, pods_by_device

G0 = "GPU-5b0c1a2e-3f4d-4e5f-8a9b-0c1d2e3f4a5b"
M0 = "MIG-6c1d2b3f-4a5e-4f60-9bac-1d2e3f4a5b6c"


def pod(ns, name, *containers):
    return NS(namespace=ns, name=name, containers=[
        NS(name=c, devices=[NS(resource_name=res, device_ids=ids)]) for c, res, ids in containers])


def test_allocations_skip_unusable_names_and_stop_at_the_bound() -> None:
    pods = [pod("ml", "a", ("main", "nvidia.com/gpu", [G0, M0])),
            pod("", "no-namespace", ("main", "nvidia.com/gpu", [G0])),
            pod("ml", "x" * 254, ("main", "nvidia.com/gpu", [G0])),
            pod("ml", "b", ("c\x00", "nvidia.com/gpu", [G0]), ("ok", "nvidia.com/gpu", ["", " ", G0])),
            # a line separator or a bidi override in a name would split log lines or reorder it on screen
            pod("ml\u2028x", "c", ("main", "nvidia.com/gpu", [G0])),
            pod("ml", "d\u202egpj", ("main", "nvidia.com/gpu", [G0]))]
    got = allocations(pods, max_allocations=100)
    assert [(a.ref.pod, a.ref.container, a.device_id) for a in got] == [
        ("a", "main", G0), ("a", "main", M0), ("b", "ok", G0)]
    assert len(allocations(pods, max_allocations=2)) == 2
    assert allocations([NS()], 10) == ()  # a message with nothing set


def test_device_ids_in_every_form_the_device_plugin_uses() -> None:
    ref = PodRef("ml", "a", "main")
    known, by_index = frozenset({G0, M0}), {"0": G0}
    assert device_uuid(Allocation("nvidia.com/gpu", G0, ref), known, by_index) == G0
    assert device_uuid(Allocation("nvidia.com/gpu", f"{G0}::3", ref), known, by_index) == G0  # time-slicing
    assert device_uuid(Allocation("nvidia.com/mig-1g.10gb", M0, ref), known, by_index) == M0
    assert device_uuid(Allocation("nvidia.com/gpu", "0", ref), known, by_index) == G0  # index strategy
    assert device_uuid(Allocation("example.com/fpga", "0", ref), known, by_index) is None
    assert device_uuid(Allocation("nvidia.com/gpu", "GPU-elsewhere", ref), known, by_index) is None


def test_time_sliced_pods_each_get_a_row() -> None:
    a, b = PodRef("ml", "a", "main"), PodRef("ml", "b", "main")
    pods = pods_by_device([Allocation("nvidia.com/gpu", f"{G0}::0", b), Allocation("nvidia.com/gpu", f"{G0}::1", a)],
                          [G0], {})
    assert pods == {G0: (a, b)}

    class Jobs:
        def jobs_for(self, pids, pods=True):
            return ("env-job",) if pids else ()

    assert attribute([(G0, (1,))], Jobs(), pods) == {G0: (
        DeviceJob("env-job"), DeviceJob("k8s-pod/ml/a", a), DeviceJob("k8s-pod/ml/b", b))}
    assert attribute([(G0, ())], Jobs(), {}) == {}  # nothing runs and no pod holds it: no row
