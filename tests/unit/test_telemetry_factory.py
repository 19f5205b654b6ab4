"""build_source: from the rules config's telemetry section to a source."""

from __future__ import annotations

from pathlib import Path

from gpumond.config.rules import TelemetryConfig
from gpumond.rules.telemetry import PrometheusSource, ScrapeSource, build_source


def build(section: dict):
    return build_source(TelemetryConfig.model_validate(section))


def test_scrape_from_targets_or_file_sd(tmp_path: Path) -> None:
    src = build({"scrape": {"targets": ["gpu-node-01:9480"], "interval_s": 5, "timeout_s": 2}})
    try:
        assert isinstance(src, ScrapeSource) and src.name == "scrape" and src._timeout_s == 2.0
    finally:
        src.close()
    src = build({"scrape": {"file_sd": str(tmp_path / "sd.json")}})
    try:
        assert isinstance(src, ScrapeSource) and src._file_sd is not None
        assert src._file_sd.path == tmp_path / "sd.json"
    finally:
        src.close()


def test_prometheus_when_configured() -> None:
    src = build({"prometheus": {"url": "http://prometheus:9090/", "interval_s": 15, "timeout_s": 3}})
    try:
        assert isinstance(src, PrometheusSource) and src.name == "prometheus"
        assert src.url == "http://prometheus:9090" and src._timeout_s == 3.0
    finally:
        src.close()


def test_nothing_configured_is_none() -> None:
    assert build({}) is None
    assert build({"scrape": {"targets": []}}) is None
