"""Configuration models and loaders; the only package that reads config files."""

from gpumond.config.agent import (
    AgentConfig,
    HostConfig,
    JobsConfig,
    LogConfig,
    PerGpuLimits,
    PolicyAlertsConfig,
    PolicyConfig,
    PowerLimitConfig,
    PowerSlackConfig,
    PowerSetting,
    SamplingConfig,
    ThermalConfig,
    gpu_selector_kind,
)
from gpumond.config.errors import ConfigError, format_validation_error
from gpumond.config.load import load_agent_config, load_config, read_yaml_mapping
from gpumond.config.types import ConfigModel, ListenAddress

__all__ = [
    "AgentConfig",
    "ConfigError",
    "ConfigModel",
    "HostConfig",
    "JobsConfig",
    "ListenAddress",
    "LogConfig",
    "PerGpuLimits",
    "PolicyAlertsConfig",
    "PolicyConfig",
    "PowerLimitConfig",
    "PowerSlackConfig",
    "PowerSetting",
    "SamplingConfig",
    "ThermalConfig",
    "format_validation_error",
    "gpu_selector_kind",
    "load_agent_config",
    "load_config",
    "read_yaml_mapping",
]
