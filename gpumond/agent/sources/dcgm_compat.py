"""The same reads in dcgm-exporter's names, units and labels (`exposition.dcgm_compat`), three sources.

The slow one runs after the pod check, so this cycle's slow series already carry this cycle's pods; the fast
tier's reuse them until the next slow cycle (the kubelet is never called from the fast tier). Sources of their
own: a fault in them fails only them.
"""

from __future__ import annotations

from gpumond.agent.dcgm import DcgmCompat
from gpumond.agent.readings import Series
from gpumond.agent.sources.base import Cycle, Source
from gpumond.agent.sources.parts import NodeParts, Registration


def _enabled(parts: NodeParts) -> bool:
    return parts.dcgm is not None


def _dcgm(parts: NodeParts) -> DcgmCompat:
    assert parts.dcgm is not None
    return parts.dcgm


def _fast(parts: NodeParts) -> Source:
    dcgm, session, xid = _dcgm(parts), parts.session, parts.xid

    def collect(cycle: Cycle) -> list[Series]:
        assert cycle.read is not None
        out = dcgm.tier_series(cycle.read, session.driver_version)
        if xid is not None:
            out += dcgm.xid_series(xid.last(), parts.idents().values(), session.driver_version)
        return out

    return Source("dcgm_compat_fast", collect, lambda c: c.read is not None)


def _slow(parts: NodeParts) -> Source:
    dcgm, session = _dcgm(parts), parts.session

    def collect(cycle: Cycle) -> list[Series]:
        dcgm.set_pods(cycle.pods)
        return [] if cycle.read is None else dcgm.tier_series(cycle.read, session.driver_version)

    return Source("dcgm_compat_slow", collect)


def _mig(parts: NodeParts) -> Source:
    dcgm, session = _dcgm(parts), parts.session

    def collect(cycle: Cycle) -> list[Series]:
        assert cycle.mig_activity is not None
        return dcgm.mig_series(session.mig_identities, cycle.mig_activity, parts.idents(), session.driver_version)

    return Source("dcgm_compat_mig", collect, lambda c: bool(c.mig_activity))


FAST = Registration("fast", _fast, _enabled)
SLOW = Registration("slow", _slow, _enabled)
MIG = Registration("fast", _mig, _enabled)
