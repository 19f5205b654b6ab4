"""What every scheduler backend is and raises; the backends import this, not the package that chooses them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from gpumond.rules.remediation.plan import NodeStatus


class BackendError(RuntimeError):
    """A scheduler call failed; one line naming the node and what to check."""


class NotOurs(BackendError):
    """The node is drained by someone else now: gpumond must not touch it."""


class Backend(Protocol):
    """A scheduler's nodes: read them, drain one with a reason, return one gpumond drained to service."""

    name: str

    def nodes(self) -> Mapping[str, NodeStatus]: ...

    def drain(self, node: str, reason: str, fatal: bool) -> None: ...

    def resume(self, node: str) -> None: ...
