"""build_source: from the rules config's telemetry section (a mapping or a model) to a source."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from gpumond.rules.telemetry import PrometheusSource, ScrapeSource, build_source
from gpumond.rules.types import TelemetrySource


def _close(source: TelemetrySource | None) -> None:
    if source is not None:
        source.close()


def test_scrape_from_a_plain_mapping() -> None:
    src = build_source({"scrape": {"targets": ["gpu-node-01:9480"], "file_sd": None, "interval_s": 5,
                                   "timeout_s": 2}, "prometheus": None})
    try:
        assert isinstance(src, ScrapeSource) and src.name == "scrape"
        assert src._timeout_s == 2.0
    finally:
        _close(src)


def test_prometheus_wins_when_it_has_a_url() -> None:
    src = build_source({"scrape": {"targets": ["gpu-node-01:9480"]},
                        "prometheus": {"url": "http://prometheus:9090/", "interval_s": 15, "timeout_s": 3}})
    try:
        assert isinstance(src, PrometheusSource) and src.name == "prometheus"
        assert src.url == "http://prometheus:9090" and src._timeout_s == 3.0
    finally:
        _close(src)


def test_any_object_with_the_attributes_works(tmp_path: Path) -> None:
    # What a pydantic model looks like from here: attributes, a URL object that str() turns into the URL.
    class Url:
        def __str__(self) -> str:
            return "http://vm:8428"

    model = SimpleNamespace(scrape=SimpleNamespace(targets=(), file_sd=tmp_path / "sd.json", timeout_s=None),
                            prometheus=None)
    src = build_source(model)
    try:
        assert isinstance(src, ScrapeSource) and src._file_sd is not None
        assert src._file_sd.path == tmp_path / "sd.json"
    finally:
        _close(src)
    src = build_source(SimpleNamespace(scrape=None, prometheus=SimpleNamespace(url=Url(), timeout_s=None)))
    try:
        assert isinstance(src, PrometheusSource) and src.url == "http://vm:8428"
    finally:
        _close(src)


@pytest.mark.parametrize("telemetry", [None, {}, {"scrape": None, "prometheus": None},
                                       {"scrape": {"targets": [], "file_sd": None}},
                                       {"prometheus": {"url": ""}}])
def test_nothing_configured_is_none(telemetry: object) -> None:
    assert build_source(telemetry) is None


def test_a_bad_static_target_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="gpu-node-01"):
        build_source({"scrape": {"targets": ["gpu-node-01"]}})
