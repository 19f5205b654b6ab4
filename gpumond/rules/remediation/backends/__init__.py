"""Where drains happen: one module per scheduler, chosen by `remediation.backend`, registered here."""

from __future__ import annotations

from gpumond.config.remediation import RemediationConfig
from gpumond.rules.remediation.backends.base import Backend, BackendError, NotOurs

__all__ = ["Backend", "BackendError", "NotOurs", "build_backend"]


def build_backend(cfg: RemediationConfig) -> Backend | None:
    """The configured backend; None for `backend: none` (dry run from gpumond's own view)."""
    if cfg.backend == "slurm":
        from gpumond.rules.remediation.backends.slurm import SlurmBackend

        return SlurmBackend(cfg.slurm)
    if cfg.backend == "kubernetes":
        from gpumond.rules.remediation.backends.kubernetes import KubernetesBackend

        return KubernetesBackend.from_config(cfg.kubernetes)
    return None
