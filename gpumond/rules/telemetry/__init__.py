"""GPU telemetry for the rules service: agents scraped directly, or a Prometheus-compatible query API."""

from gpumond.rules.telemetry.factory import build_source
from gpumond.rules.telemetry.file_sd import FileSD, parse_file_sd
from gpumond.rules.telemetry.mapping import AgentReading, read_agent
from gpumond.rules.telemetry.promql import PrometheusSource, build_queries
from gpumond.rules.telemetry.promql_join import Row, join
from gpumond.rules.telemetry.scrape import ScrapeSource
from gpumond.rules.telemetry.signals import GPU_SERIES, HOST_SERIES
from gpumond.rules.telemetry.targets import Target, parse_target

__all__ = [
    "GPU_SERIES",
    "HOST_SERIES",
    "AgentReading",
    "FileSD",
    "PrometheusSource",
    "Row",
    "ScrapeSource",
    "Target",
    "build_queries",
    "build_source",
    "join",
    "parse_file_sd",
    "parse_target",
    "read_agent",
]
