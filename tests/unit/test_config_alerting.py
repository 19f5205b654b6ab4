"""resolve_alerting: Slack / PagerDuty secrets from inline values, files or the environment, never echoed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpumond.config.alerting import PAGERDUTY_ENV, SLACK_ENV, AlertingConfig, resolve_alerting
from gpumond.config.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
# Distinctive enough that finding it anywhere means a leak.
SLACK_SECRET = "https://hooks.slack.example/services/T0SECRET/B0SECRET/zQx7LeakCanaryWebhook"
PD_SECRET = "Zq9LeakCanary0RoutingKey12345678"
assert len(PD_SECRET) == 32 and PD_SECRET.isalnum()


def cfg(**sections: object) -> AlertingConfig:
    return AlertingConfig.model_validate(sections)


def resolve(c: AlertingConfig, env: dict[str, str] | None = None) -> AlertingConfig:
    return resolve_alerting(c, "agent.yaml", env or {})


def error(c: AlertingConfig, env: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as e:
        resolve(c, env)
    text = str(e.value)
    assert "\n" not in text and text.startswith("agent.yaml: ")
    return text


def no_leak(*texts: str) -> None:
    for text in texts:
        for secret in (SLACK_SECRET, PD_SECRET, "LeakCanary"):
            assert secret not in text


# ----- files ---------------------------------------------------------------------------------------
def test_secret_files_are_read_and_stripped(tmp_path: Path) -> None:
    (tmp_path / "slack").write_text(f"  {SLACK_SECRET}\n")
    (tmp_path / "pd").write_text(f"{PD_SECRET}\n")
    out = resolve(cfg(slack={"webhook_url_file": str(tmp_path / "slack")},
                      pagerduty={"routing_key_file": str(tmp_path / "pd"), "min_severity": "critical"}))
    assert out.slack is not None and out.slack.webhook_url == SLACK_SECRET
    assert out.pagerduty is not None and out.pagerduty.routing_key == PD_SECRET
    assert out.pagerduty.min_severity == "critical"  # the rest of the section is kept
    no_leak(repr(out), str(out), repr(out.slack), repr(out.pagerduty))


def test_a_file_wins_over_the_environment(tmp_path: Path) -> None:
    (tmp_path / "pd").write_text(PD_SECRET)
    out = resolve(cfg(pagerduty={"routing_key_file": str(tmp_path / "pd")}), {PAGERDUTY_ENV: "b" * 32})
    assert out.pagerduty.routing_key == PD_SECRET  # type: ignore[union-attr]


def test_inline_values_are_kept() -> None:
    out = resolve(cfg(slack={"webhook_url": SLACK_SECRET}, pagerduty={"routing_key": PD_SECRET}))
    assert (out.slack.webhook_url, out.pagerduty.routing_key) == (SLACK_SECRET, PD_SECRET)  # type: ignore[union-attr]
    no_leak(repr(out))


@pytest.mark.parametrize("section, key", [("slack", "webhook_url"), ("pagerduty", "routing_key")])
@pytest.mark.parametrize("content", ["", "  \n\n"])
def test_empty_secret_file_names_the_key(tmp_path: Path, section: str, key: str, content: str) -> None:
    f = tmp_path / "secret"
    f.write_text(content)
    text = error(cfg(**{section: {f"{key}_file": str(f)}}))
    assert f"alerting.{section}.{key}_file" in text and "is empty" in text and str(f) in text


@pytest.mark.parametrize("section, key", [("slack", "webhook_url"), ("pagerduty", "routing_key")])
def test_unreadable_secret_file_names_the_key(tmp_path: Path, section: str, key: str) -> None:
    for path, reason in ((tmp_path / "missing", "No such file"), (tmp_path, "directory")):
        text = error(cfg(**{section: {f"{key}_file": str(path)}}))
        assert f"alerting.{section}.{key}_file: cannot read {path}" in text and reason in text


def test_secret_file_that_is_not_text_names_the_key_without_its_bytes(tmp_path: Path) -> None:
    f = tmp_path / "pd"
    f.write_bytes(PD_SECRET.encode() + b"\xff\xfe")
    text = error(cfg(pagerduty={"routing_key_file": str(f)}))
    assert "alerting.pagerduty.routing_key_file" in text and "not UTF-8" in text
    no_leak(text)


# ----- the environment ------------------------------------------------------------------------------
def test_environment_alone_turns_slack_on() -> None:
    out = resolve(AlertingConfig(), {SLACK_ENV: f" {SLACK_SECRET} "})
    assert out.slack is not None and out.slack.webhook_url == SLACK_SECRET
    assert out.slack.min_severity == "warning" and out.pagerduty is None
    no_leak(repr(out))


def test_environment_alone_turns_pagerduty_on() -> None:
    out = resolve(AlertingConfig(), {PAGERDUTY_ENV: PD_SECRET})
    assert out.pagerduty is not None and out.pagerduty.routing_key == PD_SECRET
    assert out.pagerduty.url == "https://events.pagerduty.com/v2/enqueue" and out.slack is None


def test_blank_environment_turns_nothing_on() -> None:
    out = resolve(AlertingConfig(), {SLACK_ENV: "  ", PAGERDUTY_ENV: ""})
    assert out.slack is None and out.pagerduty is None


def test_nothing_configured_is_unchanged() -> None:
    c = AlertingConfig()
    assert resolve(c) == c


@pytest.mark.parametrize("section, key, env", [("slack", "webhook_url", SLACK_ENV),
                                               ("pagerduty", "routing_key", PAGERDUTY_ENV)])
def test_section_without_a_secret_names_the_three_ways(section: str, key: str, env: str) -> None:
    text = error(cfg(**{section: {}}))
    assert text == f"agent.yaml: alerting.{section}: set {key}, {key}_file or the environment variable {env}"


def test_uses_os_environ_when_env_is_not_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PAGERDUTY_ENV, PD_SECRET)
    monkeypatch.delenv(SLACK_ENV, raising=False)
    assert resolve_alerting(AlertingConfig(), "x").pagerduty.routing_key == PD_SECRET  # type: ignore[union-attr]


# ----- what a secret must look like -----------------------------------------------------------------
@pytest.mark.parametrize("key", [
    PD_SECRET[:31],  # one short
    PD_SECRET + "9",  # one long
    PD_SECRET[:31] + "-",
    PD_SECRET[:15] + " " + PD_SECRET[16:],
    "LeakCanary" + "_" * 22,
])
def test_routing_key_that_is_not_32_alphanumerics_is_refused(key: str, tmp_path: Path) -> None:
    for source in ("inline", "file", "env"):
        if source == "inline":
            c, env = cfg(pagerduty={"routing_key": key}), {}
        elif source == "file":
            (tmp_path / "pd").write_text(key)
            c, env = cfg(pagerduty={"routing_key_file": str(tmp_path / "pd")}), {}
        else:
            c, env = AlertingConfig(), {PAGERDUTY_ENV: key}
        text = error(c, env)
        assert "alerting.pagerduty.routing_key: must be the 32-character integration key" in text
        assert key.strip() not in text
        no_leak(text)


def test_routing_key_with_non_ascii_letters_is_refused() -> None:
    key = "а" * 32  # Cyrillic a, looks like Latin a
    with pytest.raises(ConfigError):
        resolve(cfg(pagerduty={"routing_key": key}))


@pytest.mark.parametrize("url", ["hooks.slack.com/services/LeakCanary", "ftp://LeakCanary.example/x"])
def test_slack_webhook_must_be_a_url_and_is_not_echoed(url: str) -> None:
    text = error(AlertingConfig(), {SLACK_ENV: url})
    assert "alerting.slack.webhook_url: must be an http:// or https:// URL" in text
    no_leak(text)


@pytest.mark.parametrize("sections", [
    {"slack": {"webhook_url": SLACK_SECRET, "webhook_url_file": "/etc/gpumond/slack"}},
    {"pagerduty": {"routing_key": PD_SECRET, "routing_key_file": "/etc/gpumond/pd"}},
    {"slack": {"webhook_url": [SLACK_SECRET]}},
    {"pagerduty": {"routing_key": {"k": PD_SECRET}}},
    {"slack": {"webhook_url": SLACK_SECRET, "min_severity": "loud"}},
    {"pagerduty": {"routing_key": PD_SECRET, "routing_ky": 1}},
])
def test_validation_errors_never_show_the_secret(sections: dict) -> None:
    from pydantic import ValidationError

    from gpumond.config.agent import AgentConfig
    from gpumond.config.errors import validation_problem

    with pytest.raises(ValidationError) as e:
        AgentConfig.model_validate({"alerting": sections})
    no_leak(validation_problem(e.value, AgentConfig), str(e.value), repr(e.value))


def test_config_error_objects_do_not_carry_the_secret() -> None:
    with pytest.raises(ConfigError) as e:
        resolve(AlertingConfig(), {PAGERDUTY_ENV: PD_SECRET + "x", SLACK_ENV: SLACK_SECRET})
    no_leak(str(e.value), repr(e.value), e.value.problem, e.value.source)


# ----- gpumond check-config ---------------------------------------------------------------------------
def test_check_config_with_an_unreadable_secret_file_exits_2_with_one_line(tmp_path: Path) -> None:
    f = tmp_path / "agent.yaml"
    f.write_text("alerting:\n  slack:\n    webhook_url_file: /nonexistent\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUMOND_")}
    p = subprocess.run([sys.executable, "-m", "gpumond.cli", "check-config", str(f)], capture_output=True,
                       text=True, timeout=60, env=env, cwd=REPO)
    assert p.returncode == 2, p.stdout + p.stderr
    lines = p.stderr.splitlines()
    assert len(lines) == 1, p.stderr
    assert str(f) in lines[0] and "alerting.slack.webhook_url_file" in lines[0] and "/nonexistent" in lines[0]
    assert p.stdout == ""
