"""The `alerting:` section, the same in agent.yaml and rules.yaml: where alerts go and how."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar, Literal, Self

from pydantic import Field, model_validator

from gpumond.config.errors import ConfigError, FieldProblem
from gpumond.config.types import AbsolutePath, ConfigModel, HttpUrl, SecretText
from gpumond.config.http_client import HttpClientConfig

SLACK_ENV = "GPUMOND_SLACK_WEBHOOK_URL"
PAGERDUTY_ENV = "GPUMOND_PAGERDUTY_ROUTING_KEY"
_ROUTING_KEY = re.compile(r"[A-Za-z0-9]{32}")  # ASCII only: str.isalnum() accepts look-alike letters
Severity = Literal["critical", "error", "warning", "info"]


class AlertmanagerConfig(HttpClientConfig):
    """Alertmanager replicas; every one gets every alert (that is how Alertmanager HA deduplicates)."""

    urls: tuple[HttpUrl, ...] = Field(min_length=1, strict=False)
    # Firing alerts are re-sent this often with endsAt = now + 4 × max(this, evaluation interval), so
    # Alertmanager resolves them by itself if gpumond dies (Prometheus's --rules.alert.resend-delay is 1m).
    resend_interval_s: float = Field(60.0, ge=1, le=3600)
    timeout_s: float = Field(10.0, gt=0, le=120)
    # tls_config / basic_auth / authorization (HttpClientConfig): an Alertmanager behind TLS (its own CA, a client
    # certificate) or read-side authentication; the secret files are read again when they change.


class _PagingConfig(HttpClientConfig):
    """A paging service whose secret (`SECRET`) is given inline, as `<SECRET>_file`, or by the environment; reached
    through the same client settings as every sink (a relay with a private CA or its own credentials)."""

    SECRET: ClassVar[str]  # the key holding the secret
    ENV: ClassVar[str]  # the environment variable that may hold it instead

    def refusal(self, secret: str) -> str | None:
        """Why `secret` cannot be this service's (None: it may be)."""
        return None

    @model_validator(mode="after")
    def _inline_or_file(self) -> Self:
        if getattr(self, self.SECRET) is not None and getattr(self, f"{self.SECRET}_file") is not None:
            raise FieldProblem(f"{self.SECRET}_file", f"set only one of {self.SECRET} and {self.SECRET}_file")
        return self


class SlackConfig(_PagingConfig):
    """A Slack incoming webhook: inline, in a file, or from GPUMOND_SLACK_WEBHOOK_URL (it is a secret)."""

    SECRET, ENV = "webhook_url", SLACK_ENV
    webhook_url: SecretText | None = Field(None, repr=False)
    webhook_url_file: AbsolutePath | None = None
    min_severity: Severity = "warning"
    timeout_s: float = Field(10.0, gt=0, le=120)

    def refusal(self, secret: str) -> str | None:
        return None if secret.startswith(("https://", "http://")) else "must be an http:// or https:// URL"


class PagerDutyConfig(_PagingConfig):
    """PagerDuty Events API v2: routing key inline, in a file, or from GPUMOND_PAGERDUTY_ROUTING_KEY."""

    SECRET, ENV = "routing_key", PAGERDUTY_ENV
    routing_key: SecretText | None = Field(None, repr=False)
    routing_key_file: AbsolutePath | None = None
    url: HttpUrl = "https://events.pagerduty.com/v2/enqueue"
    min_severity: Severity = "warning"
    timeout_s: float = Field(10.0, gt=0, le=120)

    def refusal(self, secret: str) -> str | None:
        return None if _ROUTING_KEY.fullmatch(secret) else ("must be the 32-character integration key of an "
                                                             "Events API v2 integration")


class AlertingConfig(ConfigModel):
    """Alert sinks (each off when null; the log is always on) and what every alert carries."""

    alertmanager: AlertmanagerConfig | None = None
    slack: SlackConfig | None = None
    pagerduty: PagerDutyConfig | None = None
    cluster: str | None = Field(None, min_length=1, max_length=128)  # a `cluster` label on every alert
    # Base of generatorURL links (default: http://<node or host name>:<listen port>).
    external_url: HttpUrl | None = None
    runbook_base_url: HttpUrl = "https://github.com/gpumond/gpumond/blob/main/docs/runbooks"
    # A firing alert recorded before a restart is held this long before it may resolve, so a daemon whose
    # detectors are still filling their windows does not resolve and then re-page what is still true.
    restart_grace_s: float = Field(120.0, ge=0, le=86_400)
    keep_resolved_s: float = Field(900.0, ge=0, le=86_400)  # resolved alerts re-sent to Alertmanager this long
    watchdog: bool = False  # an always-firing `Watchdog` alert for a dead-man's switch (Alertmanager only)
    queue_size: int = Field(1000, ge=1, le=100_000)  # per sink: notifications awaiting delivery


def resolve_alerting(cfg: AlertingConfig, source: str, env: Mapping[str, str] | None = None) -> AlertingConfig:
    """`cfg` with Slack / PagerDuty secrets read from their files or the environment; ConfigError names the gap.

    The environment alone turns a sink on (a Kubernetes Secret as env), with the section's defaults.
    """
    env = os.environ if env is None else env
    update: dict[str, object] = {}
    for name, kind in (("slack", SlackConfig), ("pagerduty", PagerDutyConfig)):
        sink: _PagingConfig | None = getattr(cfg, name)
        if sink is None and env.get(kind.ENV, "").strip():
            sink = kind()
        if sink is not None:
            secret = _secret(sink, env.get(kind.ENV), source, f"alerting.{name}")
            problem = sink.refusal(secret)
            if problem:
                raise ConfigError(source, f"alerting.{name}.{kind.SECRET}: {problem}")
            update[name] = sink.model_copy(update={kind.SECRET: secret})
    return cfg.model_copy(update=update)


def _secret(sink: _PagingConfig, from_env: str | None, source: str, section: str) -> str:
    key = sink.SECRET
    inline, file = getattr(sink, key), getattr(sink, f"{key}_file")
    if inline:
        return inline
    if file is not None:
        try:
            text = file.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as e:
            reason = getattr(e, "strerror", None) or "not UTF-8 text"
            raise ConfigError(source, f"{section}.{key}_file: cannot read {file}: {reason}") from None
        if not text:
            raise ConfigError(source, f"{section}.{key}_file: {file} is empty")
        return text
    if from_env and from_env.strip():
        return from_env.strip()
    raise ConfigError(source, f"{section}: set {key}, {key}_file or the environment variable {sink.ENV}")
