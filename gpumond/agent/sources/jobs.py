"""Job attribution of every GPU and MIG device (`gpumond_gpu_job_info`), and the workloads alerts name.

Every known GPU, not only those whose processes NVML listed: the kubelet may name its pod anyway.
"""

from __future__ import annotations

from gpumond.agent import gpu_series
from gpumond.agent.attribution import attribute, workloads
from gpumond.agent.readings import Series
from gpumond.agent.sources.base import Cycle, Source
from gpumond.agent.sources.parts import NodeParts, Registration


def _build(parts: NodeParts) -> Source:
    jobs, session = parts.jobs, parts.session
    assert jobs is not None

    def collect(cycle: Cycle) -> list[Series]:
        idents = parts.idents()
        pids = session.compute_pids()
        migs = session.mig_identities
        devices = [(ident.uuid, pids.get(index, ())) for index, ident in sorted(idents.items())]
        if migs:
            mig_pids = session.mig_compute_pids()
            devices += [(m.uuid, mig_pids.get(m.uuid, ())) for m in migs]
        found = attribute(devices, jobs, cycle.pods)
        cycle.workloads = workloads(found, idents.values(), migs)  # kept by the sampler for the fast tier
        return gpu_series.job_series(found, idents, migs)

    return Source("jobs", collect)


JOBS = Registration("slow", _build, lambda p: p.jobs is not None)
