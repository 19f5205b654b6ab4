"""The agent's configuration: one frozen pydantic model per YAML section, all keys optional."""

from __future__ import annotations

import re
import socket
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, ValidationInfo, field_validator

from gpumond.config.types import ConfigModel, ListenAddress

# 9480 stays clear of dcgm-exporter (9400) and nvidia_gpu_exporter (9835) on shared nodes.
DEFAULT_LISTEN = ListenAddress("0.0.0.0", 9480)

_ENV_VAR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _lowercase(value: Any) -> Any:
    # Operators write INFO as often as info; accept both, store one spelling.
    return value.lower() if isinstance(value, str) else value


class SamplingConfig(ConfigModel):
    """How often each sampling tier polls NVML, and how hard to retry a lost driver."""

    fast_interval_s: float = Field(1.0, gt=0, le=60)
    slow_interval_s: float = Field(30.0, gt=0, le=3600)
    xid_events: bool = True
    nvml_retry_max_s: float = Field(300.0, gt=0, le=86400)

    @field_validator("slow_interval_s")
    @classmethod
    def _not_faster_than_fast(cls, value: float, info: ValidationInfo) -> float:
        fast = info.data.get("fast_interval_s")  # absent when fast itself was invalid
        if fast is not None and value < fast:
            raise ValueError(f"must be at least fast_interval_s ({fast:g})")
        return value


class JobsConfig(ConfigModel):
    """How GPU processes are attributed to training jobs."""

    enabled: bool = True
    env_vars: tuple[str, ...] = Field(
        ("SLURM_JOB_ID", "TORCHELASTIC_RUN_ID", "GPUMOND_JOB_ID"), min_length=1, strict=False
    )
    kubernetes_pods: bool = True
    cache_size: int = Field(4096, ge=16, le=1_048_576)

    @field_validator("env_vars")
    @classmethod
    def _names_are_env_vars(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            if not _ENV_VAR_NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not an environment variable name")
        return value


class HostConfig(ConfigModel):
    """Host evidence (CPU, iowait, disk, memory) exported next to the GPU series."""

    enabled: bool = True


class LogConfig(ConfigModel):
    """Log verbosity and line format."""

    level: Annotated[Literal["debug", "info", "warning", "error"], BeforeValidator(_lowercase)] = "info"
    format: Annotated[Literal["logfmt", "json"], BeforeValidator(_lowercase)] = "logfmt"


class AgentConfig(ConfigModel):
    """The whole agent config file (`agent.yaml`)."""

    listen: ListenAddress = DEFAULT_LISTEN
    # None means "this machine's hostname", resolved when the config is validated.
    node_name: str = Field(None, min_length=1, validate_default=True)  # type: ignore[assignment]
    sampling: SamplingConfig = SamplingConfig()
    jobs: JobsConfig = JobsConfig()
    host: HostConfig = HostConfig()
    state_dir: Path = Field(Path("/var/lib/gpumond"), strict=False)
    log: LogConfig = LogConfig()

    @field_validator("node_name", mode="before")
    @classmethod
    def _default_to_hostname(cls, value: Any, info: ValidationInfo) -> Any:
        if value is not None:
            return value
        # Tests pass context={"hostname": "..."}; production asks the OS.
        context = info.context or {}
        return context.get("hostname") or socket.gethostname()

    @field_validator("state_dir")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        # A relative path would depend on the daemon's working directory (/ under systemd).
        if not value.is_absolute():
            raise ValueError("must be an absolute path")
        return value

    @classmethod
    def default(cls) -> AgentConfig:
        """The configuration used when no file is given."""
        return cls.model_validate({})
