"""format_validation_error: one operator line from any config model's ValidationError."""

from __future__ import annotations

import pytest
from pydantic import Field, ValidationError

from gpumond.config import AgentConfig, ConfigModel, format_validation_error


class Sink(ConfigModel):
    url: str
    timeout_s: float = Field(5.0, gt=0, le=60)


class RulesLike(ConfigModel):
    """Stands in for a later config model reusing the formatter."""

    sinks: tuple[Sink, ...] = Field((), strict=False)
    by_name: dict[str, Sink] = Field(default_factory=dict, strict=False)
    tokens: tuple[str, ...] = Field((), strict=False, max_length=2)


def line(model: type[ConfigModel], data: dict, **kwargs) -> str:
    with pytest.raises(ValidationError) as info:
        model.model_validate(data)
    return format_validation_error("cfg.yaml", info.value, **kwargs)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"sampling": {"fast_interval_s": -1}}, "sampling.fast_interval_s: must be greater than 0 (got -1)"),
        ({"sampling": {"fast_interval_s": 61.5}}, "sampling.fast_interval_s: must be at most 60 (got 61.5)"),
        ({"jobs": {"cache_size": 8}}, "jobs.cache_size: must be at least 16 (got 8)"),
        ({"jobs": {"cache_size": "big"}}, "jobs.cache_size: must be a valid integer (got 'big')"),
        ({"jobs": {"env_vars": []}}, "jobs.env_vars: must not be empty (got [])"),
        ({"jobs": {"env_vars": "X"}}, "jobs.env_vars: must be a list (got 'X')"),
        ({"jobs": {"env_vars": ["A", 3]}}, "jobs.env_vars[1]: must be a valid string (got 3)"),
        ({"sampling": 5}, "sampling: must be a mapping of keys (got 5)"),
        ({"sampling": {"xid_events": None}}, "sampling.xid_events: must be a valid boolean (got null)"),
        ({"exposition": {"nvlink_per_link": "yes"}}, "exposition.nvlink_per_link: must be a valid boolean (got 'yes')"),
        ({"exposition": {"nvlink_links": True}},
         "exposition.nvlink_links: unknown key (did you mean 'nvlink_per_link'?)"),
        ({"log": {"level": "loud"}}, "log.level: must be one of 'debug', 'info', 'warning' or 'error' (got 'loud')"),
        ({"state_dir": "rel"}, "state_dir: must be an absolute path (got 'rel')"),
        (
            {"sampling": {"fast_interval_s": 5, "slow_interval_s": 2}},
            "sampling.slow_interval_s: must be at least fast_interval_s (5) (got 2)",
        ),
        ({"listen": "::1:9480"}, "listen: an IPv6 host must be in brackets, e.g. [::1]:9480 (got '::1:9480')"),
        ({"sampling": {"slow_intervall_s": 1}}, "sampling.slow_intervall_s: unknown key (did you mean 'slow_interval_s'?)"),
        ({"http": {"max_connections": 8}}, "http.max_connections: must be at least 16 (got 8)"),
        ({"http": {"write_timeout_s": 0}}, "http.write_timeout_s: must be greater than 0 (got 0)"),
        ({"http": {"keepalive_timeout_s": "75"}}, "http.keepalive_timeout_s: must be a valid number (got '75')"),
        ({"http": {"keep_alive_s": 5}}, "http.keep_alive_s: unknown key (did you mean 'keepalive_timeout_s'?)"),
    ],
)
def test_agent_messages(data: dict, expected: str) -> None:
    assert line(AgentConfig, data) == f"cfg.yaml: {expected}"


def test_long_values_are_shortened() -> None:
    text = line(AgentConfig, {"log": {"level": "x" * 200}})
    assert len(text) < 200 and "..." in text


def test_other_models_get_paths_through_lists_and_maps() -> None:
    assert line(RulesLike, {"sinks": [{"url": "a"}, {"url": "b", "timeout": 1}]}) == (
        "cfg.yaml: sinks[1].timeout: unknown key (did you mean 'timeout_s'?)"
    )
    assert line(RulesLike, {"by_name": {"slack": {"url": "a", "timout_s": 1}}}) == (
        "cfg.yaml: by_name.slack.timout_s: unknown key (did you mean 'timeout_s'?)"
    )
    assert line(RulesLike, {"sinks": [{}]}) == "cfg.yaml: sinks[0].url: required key is missing"
    assert line(RulesLike, {"tokens": ["a", "b", "c"]}) == (
        "cfg.yaml: tokens: must have at most 2 items (got ['a', 'b', 'c'])"
    )


def test_explicit_model_overrides_lookup() -> None:
    with pytest.raises(ValidationError) as info:
        Sink.model_validate({"url": "a", "timeot_s": 1})
    assert format_validation_error("x", info.value, Sink) == "x: timeot_s: unknown key (did you mean 'timeout_s'?)"


def test_plus_more_counts_every_other_error() -> None:
    text = line(AgentConfig, {"a": 1, "b": 2, "c": 3})
    assert text.endswith("unknown key (+2 more: fix this one and check again)")
