"""The `http:` section reaches the connection guard whole, in both daemons' configs."""

from __future__ import annotations

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
