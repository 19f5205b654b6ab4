"""Configuration models and loaders; the only package that reads config files."""

from gpumond.config.agent import (
    AgentConfig,
    HostConfig,
    JobsConfig,
    LogConfig,
    SamplingConfig,
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
    "SamplingConfig",
    "format_validation_error",
    "load_agent_config",
    "load_config",
    "read_yaml_mapping",
]
