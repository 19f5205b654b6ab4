"""Pure: which pod and container the kubelet assigned each GPU or MIG device to.

The NVIDIA device plugin advertises `nvidia.com/gpu` (and `nvidia.com/mig-<profile>` under the `mixed`
MIG strategy) with device ids that are the GPU's NVML UUID (`GPU-…`) or, for MIG devices, the MIG UUID
(`MIG-…`); its default `deviceIDStrategy` is `uuid`. With `deviceIDStrategy: index` the ids are GPU
indices instead, and with time-slicing each replica is `<id>::<n>`. The kubelet reports those ids as it
got them, so every form is mapped back to the UUID the agent exports.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpumond.wire.safetext import UNSAFE

MAX_NAME_CHARS = 253  # the longest Kubernetes object name (a DNS subdomain)
NVIDIA_RESOURCE_PREFIX = "nvidia.com/"
_REPLICA = re.compile(r"::\d+$")


@dataclass(frozen=True, slots=True, order=True)
class PodRef:
    """A container of a pod that holds a device."""

    namespace: str
    pod: str
    container: str

    @property
    def job(self) -> str:
        """The job id a pod stands for when no process on the device names one."""
        return f"k8s-pod/{self.namespace}/{self.pod}"


@dataclass(frozen=True, slots=True)
class Allocation:
    """One device id a container holds, as the kubelet reports it."""

    resource: str
    device_id: str
    ref: PodRef


def _clean(value: object) -> str | None:
    if not isinstance(value, str):
        return None
    value = value.strip()
    if not value or len(value) > MAX_NAME_CHARS or UNSAFE.search(value):
        return None
    return value


def allocations(pod_resources: Iterable[object], max_allocations: int) -> tuple[Allocation, ...]:
    """The device allocations in a List response's `pod_resources`, at most `max_allocations`.

    Entries with an unusable name (empty, too long, control, line-separator or bidirectional characters:
    they would split log lines or reorder a name on screen) are skipped rather than exported.
    """
    out: list[Allocation] = []
    for pod in pod_resources:
        namespace, name = _clean(getattr(pod, "namespace", None)), _clean(getattr(pod, "name", None))
        if namespace is None or name is None:
            continue
        for container in getattr(pod, "containers", ()):
            cname = _clean(getattr(container, "name", None))
            if cname is None:
                continue
            ref = PodRef(namespace, name, cname)
            for devices in getattr(container, "devices", ()):
                resource = _clean(getattr(devices, "resource_name", None))
                if resource is None:
                    continue
                for device_id in getattr(devices, "device_ids", ()):
                    did = _clean(device_id)
                    if did is None:
                        continue
                    if len(out) >= max_allocations:
                        return tuple(out)
                    out.append(Allocation(resource, did, ref))
    return tuple(out)


def device_uuid(alloc: Allocation, uuids: frozenset[str], index_to_uuid: Mapping[str, str]) -> str | None:
    """The GPU or MIG UUID an allocation names on this node, or None if it names none of ours."""
    device_id = _REPLICA.sub("", alloc.device_id)  # time-slicing replicas share the device
    if device_id in uuids:
        return device_id
    if alloc.resource.startswith(NVIDIA_RESOURCE_PREFIX):
        # deviceIDStrategy=index: only trusted for NVIDIA's resources, whose indices are NVML's
        return index_to_uuid.get(device_id)
    return None


def pods_by_device(allocs: Iterable[Allocation], uuids: Iterable[str],
                   index_to_uuid: Mapping[str, str]) -> dict[str, tuple[PodRef, ...]]:
    """UUID → the containers holding it (several under time-slicing), sorted; unknown ids are dropped."""
    known = frozenset(uuids)
    found: dict[str, set[PodRef]] = {}
    for a in allocs:
        uuid = device_uuid(a, known, index_to_uuid)
        if uuid is not None:
            found.setdefault(uuid, set()).add(a.ref)
    return {uuid: tuple(sorted(refs)) for uuid, refs in found.items()}
