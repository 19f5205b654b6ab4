"""The one place a source is registered: every source module's registration, in the order they run.

Each tier runs its enabled sources in this order; NVML first (the others use its read), the pod check before
the slow dcgm-compatible and job sources (they label with its pods), the MIG source before the dcgm-compatible
MIG one (it reads the MIG activity once).
"""

from __future__ import annotations

from gpumond.agent.sources import (
    dcgm_compat,
    host,
    jobs,
    nvml,
    nvml_mig,
    pod_resources,
    policy,
    xid,
)
from gpumond.agent.sources.base import Tiers
from gpumond.agent.sources.parts import NodeParts, Registration

REGISTERED: tuple[Registration, ...] = (
    nvml.FAST,
    nvml.SLOW,
    pod_resources.POD_RESOURCES,
    dcgm_compat.FAST,
    dcgm_compat.SLOW,
    policy.POLICY,
    nvml_mig.NVML_MIG,
    dcgm_compat.MIG,
    xid.XID,
    host.HOST,
    jobs.JOBS,
)


def build(parts: NodeParts, registered: tuple[Registration, ...] = REGISTERED) -> Tiers:
    """This node's sources: each registered one its parts enable, built, per tier in registration order."""
    enabled = [r for r in registered if r.enabled(parts)]
    return Tiers(fast=tuple(r.build(parts) for r in enabled if r.tier == "fast"),
                 slow=tuple(r.build(parts) for r in enabled if r.tier == "slow"))
