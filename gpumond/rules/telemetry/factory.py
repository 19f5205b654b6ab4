"""Build the configured telemetry source from the rules config's `telemetry` section."""

from __future__ import annotations

from gpumond.config.rules import TelemetryConfig
from gpumond.rules.telemetry.promql import PrometheusSource
from gpumond.rules.telemetry.scrape import ScrapeSource
from gpumond.rules.types import TelemetrySource


def build_source(telemetry: TelemetryConfig) -> TelemetrySource | None:
    """`prometheus` when configured, else `scrape` when it has targets or file_sd, else None."""
    prom = telemetry.prometheus
    if prom is not None:
        return PrometheusSource(str(prom.url), timeout_s=prom.timeout_s)
    scrape = telemetry.scrape
    if scrape.enabled:
        return ScrapeSource(list(scrape.targets), file_sd=scrape.file_sd, timeout_s=scrape.timeout_s)
    return None
