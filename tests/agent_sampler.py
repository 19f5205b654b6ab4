"""A sampler over a session with the sources its parts enable, as the agent builds one (tests' shorthand)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from gpumond.agent.exposition import Renderer
from gpumond.agent.sampler import Sampler
from gpumond.agent.sources.parts import NodeParts
from gpumond.agent.sources.registry import build
from gpumond.nvml.session import NvmlSession


def node_sampler(session: NvmlSession, *, renderer: Renderer | None = None,
                 clock: Callable[[], float] = time.time, timer: Callable[[], float] = time.perf_counter,
                 **parts: Any) -> Sampler:
    """`parts` are NodeParts' fields (hostname, xid, jobs, pods, host, policy, dcgm, nvlink_per_link, …)."""
    return Sampler(session, build(NodeParts(session, **parts)), renderer=renderer, clock=clock, timer=timer)
