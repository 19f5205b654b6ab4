"""The demo push token the example config ships is public: a service that accepts it says so at start."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import yaml

from gpumond.config.rules import RulesConfig
from gpumond.rules.service import EXAMPLE_TOKEN, RulesService

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "rules.yaml"


def test_the_constant_is_the_token_the_example_ships() -> None:
    assert yaml.safe_load(EXAMPLE.read_text())["tokens"] == [EXAMPLE_TOKEN]


@pytest.mark.parametrize("tokens, warned", [([EXAMPLE_TOKEN], True), (["t" * 32], False)])
def test_a_service_accepting_the_example_token_warns_at_start(tokens, warned, tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="gpumond.rules")
    cfg = RulesConfig.model_validate({"tokens": tokens, "state_dir": str(tmp_path)})
    service = RulesService(cfg)
    service.start()
    try:
        said = [r for r in caplog.records if "demo push token" in r.getMessage()]
        assert len(said) == (1 if warned else 0)
        assert all(EXAMPLE_TOKEN not in r.getMessage() for r in caplog.records)  # never echoed
    finally:
        service.stop()
