"""What the agent's sources are built from, and how a source module registers itself.

The agent builds each optional dependency the config asks for (and the node can give: a kubelet socket, the
grpc modules) and starts and stops those with a lifecycle; a source module only says, from these parts,
whether its source is enabled and how it is built.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from gpumond.agent.attribution import JobLookup
from gpumond.agent.dcgm import DcgmCompat
from gpumond.agent.podresources.client import PodSnapshot
from gpumond.agent.policy.view import GpuView
from gpumond.agent.readings import HostReading, Series
from gpumond.agent.sources.base import Source
from gpumond.nvml.session import GpuIdentity, NvmlSession


class PodSource(Protocol):
    """The kubelet pod-resources client's reading side (never blocks)."""

    error: str | None

    def snapshot(self) -> PodSnapshot | None: ...


class PolicySource(Protocol):
    """The policy engine's cycle: acts on the views, returns its own series."""

    def cycle(self, views: Sequence[GpuView], xid_counts: Mapping[tuple[int, int], int]) -> Iterable[Series]: ...


class HostSource(Protocol):
    """The host's CPU, memory and disk evidence."""

    def read(self) -> HostReading: ...


class XidSource(Protocol):
    """The XID watcher thread's counts (never blocks)."""

    healthy: bool
    error: str | None

    def counts(self) -> dict[tuple[int, int], int]: ...

    def last(self) -> dict[int, int]: ...


@dataclass(frozen=True)
class NodeParts:
    """The NVML session and each optional dependency this node's config asked for (None: not asked for)."""

    session: NvmlSession
    hostname: str
    nvlink_per_link: bool = False  # each NVLink's counters beside the per-GPU totals
    identities: Callable[[Iterable[GpuIdentity]], None] | None = None  # told the GPUs after every slow read
    xid: XidSource | None = None
    jobs: JobLookup | None = None
    pods: PodSource | None = None
    host: HostSource | None = None
    policy: PolicySource | None = None
    dcgm: DcgmCompat | None = None

    def idents(self) -> dict[int, GpuIdentity]:
        """The session's GPUs by index."""
        return {i.index: i for i in self.session.identities}


def always(parts: NodeParts) -> bool:
    """The enable rule of a source every node has."""
    return True


@dataclass(frozen=True)
class Registration:
    """One source as its module declares it: its tier, when it is enabled, how it is built."""

    tier: Literal["fast", "slow"]
    build: Callable[[NodeParts], Source]
    enabled: Callable[[NodeParts], bool] = always
