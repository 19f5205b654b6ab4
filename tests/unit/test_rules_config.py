"""RulesConfig and load_rules_config: defaults, bounds, token sources, one-line errors that never show a secret."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from gpumond.config.errors import ConfigError, validation_problem
from gpumond.config.rules import NO_TOKENS, TOKENS_ENV, RulesConfig, Shard, load_rules_config

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "rules.yaml"
TOKEN = "s3cr3t-token-0123456789"
OTHER = "another.token_ABCDEFGH~+/=="


def problem(data: dict) -> str:
    with pytest.raises(ValidationError) as info:
        RulesConfig.model_validate(data)
    line = validation_problem(info.value, RulesConfig)
    assert "\n" not in line
    return line


def load_error(path: Path | None, env: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        load_rules_config(path, env=env or {})
    text = str(info.value)
    assert "\n" not in text
    return text


@pytest.fixture
def write(tmp_path: Path):
    def _write(data: dict | str) -> Path:
        path = tmp_path / "rules.yaml"
        path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
        return path

    return _write


def test_defaults_match_the_documented_values() -> None:
    c = RulesConfig.default()
    assert str(c.listen) == "0.0.0.0:9481"
    assert c.tokens == () and c.tokens_file is None and c.allow_unauthenticated is False
    assert c.telemetry.scrape.targets == () and c.telemetry.scrape.file_sd is None
    assert (c.telemetry.scrape.interval_s, c.telemetry.scrape.timeout_s) == (5, 2)
    assert c.telemetry.prometheus is None
    assert (c.evaluation_interval_s, c.window_s, c.expire_after_s) == (5, 300, 900)
    limits = c.limits
    assert (limits.max_body_bytes, limits.max_steps_per_push, limits.max_string_len) == (1_048_576, 4096, 256)
    assert (limits.pushes_per_second_per_client, limits.burst) == (50, 100)
    assert (limits.max_jobs, limits.max_ranks, limits.max_gpus, limits.max_steps_per_rank) == (2048, 65536, 65536, 2048)
    assert c.alerting.alertmanager is None and c.alerting.slack is None and c.alerting.pagerduty is None
    assert c.shard is None
    assert (c.log.level, c.log.format) == ("info", "logfmt")


def test_the_shipped_example_is_the_defaults() -> None:
    data = yaml.safe_load(EXAMPLE.read_text())
    # Every key at its default, except the ones marked DEV that make the example runnable as written on a
    # developer machine: loopback only, the public demo token, and the local simulated agent as the target.
    assert data["listen"] == "127.0.0.1:9481" and data["tokens"] == ["insecure-demo-token-replace-me"]
    assert data["telemetry"]["scrape"]["targets"] == ["127.0.0.1:9480"] and "state_dir" not in data
    default = RulesConfig.default()
    example = RulesConfig.model_validate(data)
    scrape = example.telemetry.scrape.model_copy(update={"targets": default.telemetry.scrape.targets})
    telemetry = example.telemetry.model_copy(update={"scrape": scrape})
    assert example.model_copy(update={"tokens": (), "listen": default.listen, "telemetry": telemetry}) == default


def test_no_tokens_anywhere_is_refused_with_the_documented_line(write) -> None:
    path = write({})
    assert load_error(path) == f"{path}: {NO_TOKENS}"
    assert NO_TOKENS == ("tokens: no push tokens configured (set tokens, tokens_file or GPUMOND_RULES_TOKENS, "
                         "or allow_unauthenticated: true for a demo)")
    assert load_error(None).endswith(NO_TOKENS)


def test_allow_unauthenticated_makes_a_tokenless_config_valid(write) -> None:
    config = load_rules_config(write({"allow_unauthenticated": True}), env={})
    assert config.tokens == () and config.allow_unauthenticated


def test_tokens_from_yaml_file_and_environment_are_merged_without_duplicates(write, tmp_path: Path) -> None:
    tokens_file = tmp_path / "tokens"
    tokens_file.write_text(f"# push tokens\n\n{OTHER}   # team a\n  {TOKEN}\n")
    path = write({"tokens": [TOKEN], "tokens_file": str(tokens_file)})
    env_token = "env-token-ABCDEFGHIJKL"
    config = load_rules_config(path, env={TOKENS_ENV: f" {env_token} , ,{TOKEN}"})
    assert config.tokens == (TOKEN, OTHER, env_token)


def test_tokens_from_the_environment_alone_are_enough() -> None:
    assert load_rules_config(None, env={TOKENS_ENV: TOKEN}).tokens == (TOKEN,)


def test_tokens_file_problems_name_the_file_and_line_but_not_the_token(write, tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    assert load_error(write({"tokens_file": str(missing)})).endswith(
        f"tokens_file: cannot read {missing}: No such file or directory")
    bad = tmp_path / "tokens"
    bad.write_text(f"{TOKEN}\nshort-secret\n")
    text = load_error(write({"tokens_file": str(bad)}))
    assert f"tokens_file: {bad} line 2: must be 16-512 characters" in text
    assert "short-secret" not in text


def test_a_bad_environment_token_is_named_but_not_shown() -> None:
    text = load_error(None, env={TOKENS_ENV: f"{TOKEN},has space in it-xxxxxxxx"})
    assert f"{TOKENS_ENV}: item 1: must be 16-512 characters" in text
    assert "has space" not in text


@pytest.mark.parametrize("tokens", [["short"], "a-string-not-a-list-xxxxxxx", [TOKEN, "with space xxxxxxxxxxx"], [42]])
def test_a_bad_inline_token_is_never_echoed(tokens: object) -> None:
    line = problem({"tokens": tokens})
    assert line.startswith("tokens: ") and line.endswith("(got <hidden>)")
    for secret in ("short", "a-string", "with space"):
        assert secret not in line


def test_tokens_are_not_in_the_repr() -> None:
    config = RulesConfig.model_validate({"tokens": [TOKEN]})
    assert TOKEN not in repr(config) and TOKEN not in str(config)


def test_tokens_file_must_be_absolute() -> None:
    assert problem({"tokens_file": "tokens.txt"}) == "tokens_file: must be an absolute path (got 'tokens.txt')"


def test_only_one_telemetry_source() -> None:
    line = problem({"telemetry": {"scrape": {"targets": ["gpu-01:9480"]}, "prometheus": {"url": "http://p:9090"}}})
    assert line.startswith("telemetry.prometheus: set telemetry.scrape (targets or file_sd) or "
                           "telemetry.prometheus, not both")
    both_sd = {"telemetry": {"scrape": {"file_sd": "/etc/sd.json"}, "prometheus": {"url": "http://p:9090"}}}
    assert problem(both_sd).startswith("telemetry.prometheus: set")
    only_prom = RulesConfig.model_validate({"telemetry": {"prometheus": {"url": "https://vm:8428/"}}})
    assert only_prom.telemetry.prometheus is not None
    assert only_prom.telemetry.prometheus.url == "https://vm:8428"
    assert not only_prom.telemetry.scrape.enabled


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"telemetry": {"scrape": {"targets": ["gpu-01"]}}}, "telemetry.scrape.targets: 'gpu-01': must be HOST:PORT"),
        ({"telemetry": {"scrape": {"targets": ["a:1", "a:1"]}}}, "telemetry.scrape.targets: a target is listed twice"),
        ({"telemetry": {"scrape": {"timeout_s": 6}}}, "telemetry.scrape.timeout_s: must be at most interval_s (5)"),
        ({"telemetry": {"scrape": {"file_sd": "sd.json"}}}, "telemetry.scrape.file_sd: must be an absolute path"),
        ({"telemetry": {"prometheus": {"url": "prometheus:9090"}}}, "telemetry.prometheus.url: must be an http://"),
        ({"telemetry": {"prometheus": {}}}, "telemetry.prometheus.url: required key is missing"),
        ({"window_s": 1200}, "expire_after_s: must be at least window_s (1200)"),
        ({"evaluation_interval_s": 0}, "evaluation_interval_s: must be greater than 0"),
        ({"limits": {"max_jobs": 0}}, "limits.max_jobs: must be at least 1"),
        ({"limits": {"max_body_bytes": "1MB"}}, "limits.max_body_bytes: must be a valid integer"),
        ({"limits": {"max_job": 3}}, "limits.max_job: unknown key (did you mean 'max_jobs'?)"),
        ({"shard": "4/4"}, "shard: I must be from 0 to 3 (shards count from 0)"),
        ({"shard": "1"}, 'shard: must be "I/N"'),
        ({"alerting": {"alertmanager": {"urls": []}}}, "alerting.alertmanager.urls: must not be empty"),
        ({"alerting": {"alertmanager": {"urls": ["am:9093"]}}}, "alerting.alertmanager.urls[0]: must be an http://"),
        ({"alerting": {"slack": {"webhook_url": "https://x", "webhook_url_file": "/k"}}},
         "alerting.slack.webhook_url_file: set only one of webhook_url and webhook_url_file"),
        ({"alerting": {"pagerduty": {"routing_key": "k", "routing_key_file": "/k"}}},
         "alerting.pagerduty.routing_key_file: set only one of routing_key and routing_key_file"),
        ({"log": {"level": "loud"}}, "log.level: must be one of"),
    ],
)
def test_errors_name_the_field(data: dict, expected: str) -> None:
    assert problem(data).startswith(expected)


def test_alerting_shapes_from_the_design() -> None:
    config = RulesConfig.model_validate({"alerting": {
        "alertmanager": {"urls": ["http://alertmanager:9093/"]},
        "slack": {"webhook_url_file": "/etc/gpumond/slack"},
        "pagerduty": {"routing_key": "R0UT1NG"},
    }})
    assert config.alerting.alertmanager.urls == ("http://alertmanager:9093",)
    assert config.alerting.slack.webhook_url is None
    assert config.alerting.pagerduty.url == "https://events.pagerduty.com/v2/enqueue"
    assert "R0UT1NG" not in repr(config)


def test_a_bad_webhook_url_is_not_echoed() -> None:
    line = problem({"alerting": {"slack": {"webhook_url": 12345}}})
    assert line == "alerting.slack.webhook_url: must be a non-empty string (got <hidden>)"


def test_shard_parses_and_prints() -> None:
    config = RulesConfig.model_validate({"shard": "2/8"})
    assert config.shard == Shard(2, 8) and str(config.shard) == "2/8"
    assert config.model_dump(mode="json")["shard"] == "2/8"


def test_config_is_frozen() -> None:
    config = RulesConfig.default()
    with pytest.raises(ValidationError):
        config.window_s = 1  # type: ignore[misc]


def test_yaml_errors_come_through_load_config(write) -> None:
    text = load_error(write("limits: {max_jobs: 1\n"), env={TOKENS_ENV: TOKEN})
    assert "could not parse YAML" in text
    text = load_error(write({"lsiten": "0.0.0.0:1"}), env={TOKENS_ENV: TOKEN})
    assert text.endswith("lsiten: unknown key (did you mean 'listen'?)")
