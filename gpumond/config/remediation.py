"""`remediation:` in rules.yaml: which confirmed node faults drain a node, the blast-radius guard, the backend."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from gpumond.config.types import AbsolutePath, ConfigModel

# The conditions the rules service can act on (gpumond.rules.remediation.faults); docs/configuration.md lists them.
CONDITIONS = ("gpu_lost", "xid_critical", "row_remap_failed", "straggler_node")


class GuardConfig(ConfigModel):
    """The blast-radius guard: how much of the fleet gpumond may take out of service, and how fast."""

    # At most this many nodes drained by gpumond at once, fleet-wide (dry-run drains count too).
    max_nodes: int = Field(2, ge=1, le=100_000)
    # At most this share of one pool (a Slurm partition, a Kubernetes node pool) drained by gpumond at once.
    max_pool_fraction: float = Field(0.1, gt=0, le=1)
    # At most this many drains in any sliding hour.
    max_drains_per_hour: int = Field(5, ge=1, le=100_000)


class SlurmConfig(ConfigModel):
    """Drain and resume through Slurm's own commands (SLURM_CONF in the environment selects the cluster)."""

    scontrol: str = "scontrol"
    sinfo: str = "sinfo"
    timeout_s: float = Field(10.0, gt=0, le=300)


class KubernetesConfig(ConfigModel):
    """Cordon, taint and set a node condition through the Kubernetes API (in-cluster, or a kubeconfig)."""

    kubeconfig: AbsolutePath | None = None  # None: the pod's service account (in-cluster)
    # The node label that names a node's pool for max_pool_fraction; nodes without it form one pool "".
    pool_label: str = "gpumond.io/pool"
    # Also taint NoExecute (evicts pods without a toleration) for faults that leave a GPU unusable.
    no_execute_on_fatal: bool = False
    timeout_s: float = Field(10.0, gt=0, le=300)


class RemediationConfig(ConfigModel):
    """Turn confirmed node faults into drains and returns to service, behind the blast-radius guard."""

    # dry_run (the default) decides, logs, audits and exports what it would do and touches nothing.
    mode: Literal["off", "dry_run", "enforce"] = "dry_run"
    # none: no scheduler to read or change (dry_run only): what gpumond would drain, from its own view.
    backend: Literal["none", "slurm", "kubernetes"] = "none"
    conditions: tuple[Literal["gpu_lost", "xid_critical", "row_remap_failed", "straggler_node"], ...] = Field(
        CONDITIONS, strict=False)
    # A straggler_node finding must have been firing this long (wall time, any job on the node) to drain it.
    straggler_for_s: float = Field(900.0, ge=0, le=7 * 86_400)
    # Every condition clear this long before gpumond returns a node it drained to service.
    hold_down_s: float = Field(900.0, ge=0, le=7 * 86_400)
    interval_s: float = Field(10.0, gt=0, le=3600)
    guard: GuardConfig = GuardConfig()
    slurm: SlurmConfig = SlurmConfig()
    kubernetes: KubernetesConfig = KubernetesConfig()
    # The JSON-lines audit log; default <state_dir>/remediation-audit.jsonl.
    audit_log: AbsolutePath | None = None
    # Severity of the alerts dry run raises for what it only imagined (a breaker it would have opened, a
    # scheduler it cannot reach): warning by default, so a dry run never pages as if nodes were held.
    dry_run_severity: Literal["info", "warning", "critical"] = "warning"
    # A decided drain or return that has not been carried out for this long (the scheduler unreachable, its
    # command failing or hanging) raises GpumondRemediationBackendDown.
    backend_down_after_s: float = Field(30.0, ge=0, le=86_400)

    @field_validator("conditions")
    @classmethod
    def _no_repeats(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if len(set(value)) != len(value):
            raise ValueError("a condition is listed twice")
        return value

    @model_validator(mode="after")
    def _enforce_needs_backend(self) -> RemediationConfig:
        if self.mode == "enforce" and self.backend == "none":
            raise ValueError("mode enforce needs a backend (slurm or kubernetes); backend none can only dry-run")
        return self
