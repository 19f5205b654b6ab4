"""The local policy's cycle (limits, thermal capping, alerts) on this fast read and the last slow read.

Runs only while NVML answers; its series are the policy engine's own.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpumond.agent.policy.view import build_views
from gpumond.agent.readings import Series
from gpumond.agent.sources.base import Cycle, Source
from gpumond.agent.sources.parts import NodeParts, Registration


def _build(parts: NodeParts) -> Source:
    policy, xid = parts.policy, parts.xid
    assert policy is not None

    def collect(cycle: Cycle) -> Iterable[Series]:
        assert cycle.read is not None
        views = build_views(cycle.read, cycle.slow_read, cycle.workloads)
        return policy.cycle(views, xid.counts() if xid is not None else {})

    return Source("policy", collect, lambda c: c.nvml_up)


POLICY = Registration("fast", _build, lambda p: p.policy is not None)
