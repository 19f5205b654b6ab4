"""The NVML read of each tier: every GPU's fields from the catalogue (GPM, NVLink and ECC among them).

Each tier's first source: the others find its read on the cycle. The fast one also exports each GPU's
identity, `gpumond_gpu_up` and NVML's error counts; the slow one re-enumerates MIG and records the GPUs'
identities.
"""

from __future__ import annotations

from gpumond.agent import gpu_series
from gpumond.agent.readings import Series
from gpumond.agent.sources.base import Cycle, PartialFailure, Source
from gpumond.agent.sources.parts import NodeParts, Registration


def _fast(parts: NodeParts) -> Source:
    session = parts.session

    def collect(cycle: Cycle) -> list[Series]:
        read = cycle.read = session.read("fast")
        idents = parts.idents()
        out = gpu_series.tier_series(read, with_up=True)
        out.extend(gpu_series.info_series(idents.values(), parts.hostname))
        out.extend(gpu_series.error_series(session.errors_total, idents))
        if not read.nvml_up:
            # NVML unusable is this collector failing, even though it still reports up=0 per GPU.
            raise PartialFailure(read.error or "nvml unavailable", out)
        return out

    return Source("nvml_fast", collect)


def _slow(parts: NodeParts) -> Source:
    session = parts.session

    def collect(cycle: Cycle) -> list[Series]:
        read = cycle.read = session.read("slow")
        session.discover_mig()  # MIG can be reconfigured at any time; enumerating is cheap
        if parts.identities is not None:
            parts.identities(session.identities)
        return gpu_series.tier_series(read, with_up=False, per_link=parts.nvlink_per_link)

    return Source("nvml_slow", collect)


FAST = Registration("fast", _fast)
SLOW = Registration("slow", _slow)
