"""XID events counted per (GPU, code) by the watcher thread; failed while the watcher is not running."""

from __future__ import annotations

from gpumond.agent import gpu_series
from gpumond.agent.readings import Series
from gpumond.agent.sources.base import Cycle, PartialFailure, Source
from gpumond.agent.sources.parts import NodeParts, Registration


def _build(parts: NodeParts) -> Source:
    xid = parts.xid
    assert xid is not None

    def collect(cycle: Cycle) -> list[Series]:
        out = gpu_series.xid_series(xid.counts(), parts.idents())
        if not xid.healthy:
            raise PartialFailure(xid.error or "xid watcher not running", out)
        return out

    return Source("xid", collect)


XID = Registration("fast", _build, lambda p: p.xid is not None)
