"""The kubelet's last pod-resources answer mapped to this node's GPU and MIG UUIDs, for the later sources.

Emits nothing of its own; fails (so `gpumond_collector_success{collector="pod_resources"}` says so) while there
is no answer. Enabled when the agent has a pod-resources client (jobs on, and the kubelet socket there).
"""

from __future__ import annotations

from gpumond.agent.podresources.assign import pods_by_device
from gpumond.agent.readings import Series
from gpumond.agent.sources.base import Cycle, PartialFailure, Source
from gpumond.agent.sources.parts import NodeParts, Registration


def _build(parts: NodeParts) -> Source:
    pods, session = parts.pods, parts.session
    assert pods is not None

    def collect(cycle: Cycle) -> list[Series]:
        snap = pods.snapshot()
        if snap is None:
            raise PartialFailure(pods.error or "no pod-resources answer yet", ())
        idents = parts.idents()
        uuids = [i.uuid for i in idents.values()] + [m.uuid for m in session.mig_identities]
        cycle.pods = pods_by_device(snap.allocations, uuids, {str(i): g.uuid for i, g in idents.items()})
        return []

    return Source("pod_resources", collect)


POD_RESOURCES = Registration("slow", _build, lambda p: p.pods is not None)
