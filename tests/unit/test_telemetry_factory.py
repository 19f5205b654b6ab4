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


def test_tls_and_credentials_from_the_config_and_one_line_for_a_missing_file(tmp_path: Path) -> None:
    from gpumond.config.rules import load_rules_config
    from gpumond.rules.service import RulesService, RulesStartError
    from gpumond.web.client import AccessError
    from tests.pki import CA

    ca = CA(tmp_path)
    client = ca.issue("client", client=True)
    password = tmp_path / "password"
    password.write_text("s3cret\n")
    spec = {"targets": ["gpu-node-01:9480"], "scheme": "https",
            "tls_config": {"ca_file": str(ca.path), "cert_file": str(client.cert), "key_file": str(client.key)},
            "basic_auth": {"username": "rules", "password_file": str(password)}}
    src = build_source({"scrape": spec})
    try:
        assert isinstance(src, ScrapeSource)
        assert src._static[0].url == "https://gpu-node-01:9480/metrics"
        assert src._headers["Accept-Encoding"] == "gzip"
        assert src._access.headers() == {"Authorization": "Basic cnVsZXM6czNjcmV0"}  # rules:s3cret
    finally:
        _close(src)
    with pytest.raises(AccessError, match=r"basic_auth.password_file: cannot read .*/nope: No such file"):
        build_source({"scrape": {**spec, "basic_auth": {"username": "rules", "password_file": str(tmp_path / "nope")}}})
    cfg = tmp_path / "rules.yaml"
    cfg.write_text(f"tokens: [rules-token-0123456789]\nstate_dir: {tmp_path}\ntelemetry:\n  prometheus:\n"
                   f"    url: https://prometheus:9090\n    tls_config: {{ca_file: {tmp_path / 'missing.crt'}}}\n")
    with pytest.raises(RulesStartError, match=r"telemetry.prometheus.tls_config: CA file .*missing.crt: no such file"):
        RulesService(load_rules_config(cfg, env={}))
