"""Each MIG device's identity, memory and (with GPM) activity: what NVML answers per instance."""

from __future__ import annotations

from gpumond.agent import gpu_series
from gpumond.agent.readings import Series
from gpumond.agent.sources.base import Cycle, Source
from gpumond.agent.sources.parts import NodeParts, Registration


def _build(parts: NodeParts) -> Source:
    session = parts.session

    def collect(cycle: Cycle) -> list[Series]:
        migs = session.mig_identities
        activity = cycle.mig_activity = session.read_mig_gpm()
        return (gpu_series.mig_info_series(migs) + gpu_series.mig_memory_series(migs, session.read_mig())
                + gpu_series.mig_activity_series(migs, activity))

    return Source("nvml_mig", collect, lambda c: c.nvml_up and bool(session.mig_identities))


NVML_MIG = Registration("fast", _build)
