"""Build the configured telemetry source from the rules config's `telemetry` section."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpumond.rules.telemetry import promql, scrape
from gpumond.web.client import build_access, field_of
from gpumond.rules.telemetry.promql import PrometheusSource
from gpumond.rules.telemetry.scrape import ScrapeSource
from gpumond.rules.types import TelemetrySource


def build_source(telemetry: Any) -> TelemetrySource | None:
    """`prometheus` when it has a url, else `scrape` when it has targets or file_sd, else None.

    Accepts a plain mapping or any object with the same attributes (the pydantic model), so the
    shape `{scrape: {targets, file_sd, timeout_s, …}, prometheus: {url, timeout_s, lookback_s, …}}`
    is the only contract.
    """
    if telemetry is None:
        return None
    prom = field_of(telemetry, "prometheus")
    url = field_of(prom, "url")
    if url:
        return PrometheusSource(
            str(url),  # a pydantic URL type stringifies to the URL
            timeout_s=_number(prom, "timeout_s", promql.DEFAULT_TIMEOUT_S),
            lookback_s=_number(prom, "lookback_s", promql.DEFAULT_LOOKBACK_S),
            detail_s=_number(prom, "detail_s", promql.DEFAULT_DETAIL_S),
            access=build_access(prom, "telemetry.prometheus"),
        )
    spec = field_of(telemetry, "scrape")
    targets = [str(t) for t in (field_of(spec, "targets") or ())]
    file_sd = field_of(spec, "file_sd")
    if targets or file_sd:
        return ScrapeSource(
            targets,
            file_sd=Path(file_sd) if file_sd else None,
            timeout_s=_number(spec, "timeout_s", scrape.DEFAULT_TIMEOUT_S),
            scheme=str(field_of(spec, "scheme") or "http"),
            access=build_access(spec, "telemetry.scrape"),
        )
    return None


def _number(obj: Any, name: str, default: float) -> float:
    value = field_of(obj, name)
    return default if value is None else float(value)
