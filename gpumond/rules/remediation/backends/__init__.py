"""Where drains happen: one module per scheduler, chosen by `remediation.backend`, registered here."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from gpumond.config.remediation import RemediationConfig
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


def build_backend(cfg: RemediationConfig) -> Backend | None:
    """The configured backend; None for `backend: none` (dry run from gpumond's own view)."""
    if cfg.backend == "slurm":
        from gpumond.rules.remediation.backends.slurm import SlurmBackend

        return SlurmBackend(cfg.slurm)
    if cfg.backend == "kubernetes":
        from gpumond.rules.remediation.backends.kubernetes import KubernetesBackend

        return KubernetesBackend.from_config(cfg.kubernetes)
    return None
