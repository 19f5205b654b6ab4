"""The `http:` section reaches the connection guard whole, in both daemons' configs."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from gpumond.config import AgentConfig
from gpumond.config.http import HttpConfig
from gpumond.config.rules import RulesConfig
from gpumond.web.connections import ConnectionLimits

SET = {"max_connections": 100, "header_timeout_s": 1.5, "body_timeout_s": 2.5, "keepalive_timeout_s": 3.5,
       "write_timeout_s": 4.5}


def test_every_key_reaches_the_guard() -> None:
    assert ConnectionLimits.of(HttpConfig.model_validate(SET)) == ConnectionLimits(
        header_timeout_s=1.5, body_timeout_s=2.5, keepalive_timeout_s=3.5, write_timeout_s=4.5, max_connections=100)


def test_the_defaults_are_the_guards() -> None:
    assert ConnectionLimits.of(HttpConfig()) == ConnectionLimits()


def test_both_daemons_take_the_section() -> None:
    agent = AgentConfig.model_validate({"http": SET}, context={"hostname": "n"})
    rules = RulesConfig.model_validate({"http": SET, "tokens": ["t" * 32]})
    assert ConnectionLimits.of(agent.http) == ConnectionLimits.of(rules.http) == ConnectionLimits.of(HttpConfig.model_validate(SET))


@pytest.mark.parametrize("section", [
    {"telemetry": {"scrape": {"targets": ["node:9480"]}}},
    {"telemetry": {"prometheus": {"url": "https://prometheus:9090"}}},
    {"alerting": {"alertmanager": {"urls": ["https://am:9093"]}}},
    {"alerting": {"slack": {"webhook_url": "https://hooks.slack.test/x"}}},
    {"alerting": {"pagerduty": {"routing_key": "R0UT1NGKEY0123456789abcdefABCDEF"}}},
])
def test_every_http_client_section_takes_one_credential(section: dict) -> None:
    """Each client section embeds the one HttpClientConfig: basic_auth and authorization together are refused
    (never one of them silently ignored)."""
    (top, inner), = section.items()
    (name, spec), = inner.items()
    both = {"basic_auth": {"username": "u", "password_file": "/run/pw"},
            "authorization": {"credentials_file": "/run/token"}}
    with pytest.raises(ValidationError, match="set only one of basic_auth and authorization"):
        RulesConfig.model_validate({"tokens": ["t" * 32], top: {name: {**spec, **both}}})
    ok = RulesConfig.model_validate({"tokens": ["t" * 32], top: {name: {**spec, "tls_config": {"ca_file": "/ca"}}}})
    assert getattr(getattr(ok, top), name).tls_config.ca_file == Path("/ca")
