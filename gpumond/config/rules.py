"""The rules service's configuration (`rules.yaml`): one frozen model per section, push tokens resolved at load."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (AfterValidator, BeforeValidator, Field, GetCoreSchemaHandler, PlainSerializer, PlainValidator,
                      ValidationInfo, field_validator)
from pydantic_core import core_schema

from gpumond.config.agent import LogConfig
from gpumond.config.alerting import AlertingConfig, resolve_alerting
from gpumond.config.errors import ConfigError
from gpumond.config.http import HttpConfig
from gpumond.config.load import load_config
from gpumond.config.remediation import RemediationConfig
from gpumond.config.tokens import read_tokens_file, token_problem
from gpumond.config.types import AbsolutePath, ConfigModel, HttpUrl, ListenAddress, SecretText, Hidden
from gpumond.config.http_client import HttpClientConfig
from gpumond.wire.routing import MAX_SHARDS

# 9481: next to the agent's 9480, clear of dcgm-exporter (9400) and nvidia_gpu_exporter (9835).
DEFAULT_LISTEN = ListenAddress("0.0.0.0", 9481)
TOKENS_ENV = "GPUMOND_RULES_TOKENS"
NO_TOKENS = ("tokens: no push tokens configured (set tokens, tokens_file or GPUMOND_RULES_TOKENS, "
             "or allow_unauthenticated: true for a demo)")

def _tokens(hidden: Hidden) -> tuple[str, ...]:
    value = hidden.value
    if not isinstance(value, (list, tuple)):
        raise ValueError("must be a list of tokens")
    for i, token in enumerate(value):
        problem = "must be a string" if not isinstance(token, str) else token_problem(token)
        if problem:
            raise ValueError(f"item {i}: {problem}")
    return tuple(dict.fromkeys(value))


Tokens = Annotated[tuple[str, ...], PlainValidator(_tokens), BeforeValidator(Hidden),
                   PlainSerializer(list, return_type=list[str])]


@dataclass(frozen=True, slots=True)
class Shard:
    """`I/N`: this replica owns the jobs whose id hashes to I modulo N (0 ≤ I < N)."""

    index: int
    count: int

    @classmethod
    def parse(cls, text: str) -> Shard:
        """Parse "I/N"; raise ValueError with an operator-facing message."""
        index, sep, count = text.strip().partition("/")
        if not sep or not index.isdecimal() or not count.isdecimal():
            raise ValueError('must be "I/N", e.g. "0/4" for the first of four replicas')
        i, n = int(index), int(count)
        if not 1 <= n <= MAX_SHARDS:
            raise ValueError(f"N must be from 1 to {MAX_SHARDS}")
        if i >= n:
            raise ValueError(f"I must be from 0 to {n - 1} (shards count from 0)")
        return cls(i, n)

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        def validate(value: Any) -> Shard:
            if isinstance(value, cls):
                return value
            if not isinstance(value, str):
                raise ValueError('must be a string "I/N", e.g. "0/4"')
            return cls.parse(value)

        return core_schema.no_info_plain_validator_function(
            validate,
            serialization=core_schema.plain_serializer_function_ser_schema(str),
            json_schema_input_schema=core_schema.str_schema(pattern=r"^\d+/\d+$"),
        )


# ----- sections ----------------------------------------------------------------------------------
class _Polled(ConfigModel):
    """A source read every `interval_s`, each read bounded by `timeout_s`, which may not exceed it."""

    @field_validator("timeout_s", check_fields=False)
    @classmethod
    def _within_interval(cls, value: float, info: ValidationInfo) -> float:
        interval = info.data.get("interval_s")
        if interval is not None and value > interval:
            raise ValueError(f"must be at most interval_s ({interval:g})")
        return value


class ScrapeConfig(_Polled, HttpClientConfig):
    """Scrape gpumond agents directly: static targets and/or a Prometheus file_sd JSON file."""

    targets: tuple[str, ...] = Field((), strict=False)
    file_sd: AbsolutePath | None = None
    interval_s: float = Field(5.0, gt=0, le=3600)
    timeout_s: float = Field(2.0, gt=0, le=600)
    # For agents serving TLS (their --web.config.file): a file_sd `__scheme__` label overrides it per target.
    scheme: Literal["http", "https"] = "http"

    @field_validator("targets")
    @classmethod
    def _host_ports(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for target in value:
            try:
                ListenAddress.parse(target)
            except ValueError as err:
                raise ValueError(f"{target!r}: {err}") from None
        if len(set(value)) != len(value):
            raise ValueError("a target is listed twice")
        return value

    @property
    def enabled(self) -> bool:
        """True when there is something to scrape."""
        return bool(self.targets) or self.file_sd is not None


class PrometheusConfig(_Polled, HttpClientConfig):
    """Read GPU telemetry from a Prometheus-compatible query API (Prometheus, Thanos, Mimir, VictoriaMetrics)."""

    url: HttpUrl
    interval_s: float = Field(15.0, gt=0, le=3600)
    timeout_s: float = Field(5.0, gt=0, le=600)
    # Every needed GPU's values at most this often; in between only the suspects' (rules/telemetry/promql_need).
    # 0: every fetch. Less than expire_after_s, which forgets a GPU whose newest sample is older.
    detail_s: float = Field(0.0, ge=0, le=300)


class TelemetryConfig(ConfigModel):
    """Where GPU telemetry comes from: at most one source; none means push data only."""

    scrape: ScrapeConfig = ScrapeConfig()
    prometheus: PrometheusConfig | None = None

    @field_validator("prometheus")
    @classmethod
    def _one_source(cls, value: PrometheusConfig | None, info: ValidationInfo) -> PrometheusConfig | None:
        scrape = info.data.get("scrape")
        if value is not None and scrape is not None and scrape.enabled:
            raise ValueError("set telemetry.scrape (targets or file_sd) or telemetry.prometheus, not both")
        return value


class LimitsConfig(ConfigModel):
    """What one push may carry and how much the service holds: a hostile client cannot exhaust memory."""

    max_body_bytes: int = Field(1_048_576, ge=1024, le=64 * 1_048_576)
    max_steps_per_push: int = Field(4096, ge=1, le=65_536)
    max_string_len: int = Field(256, ge=16, le=4096)
    pushes_per_second_per_client: float = Field(50.0, gt=0, le=1_000_000)
    burst: int = Field(100, ge=1, le=1_000_000)
    max_clients: int = Field(16_384, ge=1, le=1_048_576)
    max_jobs: int = Field(2048, ge=1, le=1_048_576)
    max_ranks: int = Field(65_536, ge=1, le=16_777_216)
    max_gpus: int = Field(65_536, ge=1, le=16_777_216)
    max_steps_per_rank: int = Field(2048, ge=1, le=1_048_576)
    max_steps_held: int = Field(16_777_216, ge=1, le=1_073_741_824)
    max_samples_per_gpu: int = Field(512, ge=1, le=65_536)
    max_clock_skew_s: float = Field(300.0, ge=0, le=86_400)


class FindingsConfig(ConfigModel):
    """How long a finding must hold before it fires, and stay quiet before it resolves: wall time, so the
    rule means the same at any evaluation interval (see docs/detectors.md, "Persistence")."""

    # A rank slower than its peers for less than this is a transient (a GC pause, a preempted CPU thread, a
    # noisy neighbour), not a straggler. Two evaluations at the default 10 s interval.
    min_duration_s: float = Field(20.0, ge=0, le=3600)
    # Quiet this long (and at least 3 evaluations) before a firing finding resolves, so it does not flap.
    resolve_after_s: float = Field(30.0, ge=0, le=86_400)


class OnStepsConfig(ConfigModel):
    """Judging a job when its steps land, between the periodic evaluations (see docs/detectors.md, "When a job
    is judged"): at most every `min_interval_s` per job, and using at most `max_busy` of one core."""

    enabled: bool = True
    # A big job has a push landing every few milliseconds: its judgements are coalesced to one per this long.
    min_interval_s: float = Field(1.0, ge=0.1, le=3600)
    # Share of one core that judgements on arrival may take; past it they wait (the periodic evaluation still
    # judges every job every evaluation_interval_s).
    max_busy: float = Field(0.5, gt=0, le=1)


class PowerSlackRulesConfig(ConfigModel):
    """Power-slack offers: lower limits for the GPUs of synchronous jobs that wait on slower peers (served on
    GET /api/v1/power/offers; agents apply them only where their policy says so)."""

    enabled: bool = True
    # A GPU's compute must still end this share of the slowest rank's compute before it; the job's step time
    # rising by more than half of it withdraws the job's offers at once.
    margin: float = Field(0.02, gt=0, le=0.5)
    # Below the lowest limit a GPU was measured at, an offer steps down at most this much.
    probe_w: float = Field(50.0, gt=0, le=500)
    # After a withdrawal, no offer for the job for this long.
    hold_s: float = Field(600.0, ge=0, le=86_400)


class RulesConfig(ConfigModel):
    """The whole rules service config file (`rules.yaml`)."""

    listen: ListenAddress = DEFAULT_LISTEN
    # After load_rules_config, `tokens` holds every accepted token: inline, tokens_file and env.
    tokens: Tokens = Field((), repr=False)
    tokens_file: AbsolutePath | None = None
    allow_unauthenticated: bool = False
    telemetry: TelemetryConfig = TelemetryConfig()
    evaluation_interval_s: float = Field(5.0, gt=0, le=3600)
    judge_on_steps: OnStepsConfig = OnStepsConfig()
    findings: FindingsConfig = FindingsConfig()
    window_s: float = Field(300.0, gt=0, le=86_400)
    limits: LimitsConfig = LimitsConfig()
    expire_after_s: float = Field(900.0, gt=0, le=7 * 86_400, validate_default=True)
    alerting: AlertingConfig = AlertingConfig()
    # Where the open alerts and notifications are kept across restarts (alerts-state.json).
    state_dir: AbsolutePath = Path("/var/lib/gpumond-rules")
    shard: Shard | None = None
    log: LogConfig = LogConfig()
    http: HttpConfig = HttpConfig()
    # TLS and read-side auth (exporter-toolkit's web config file); None: plain HTTP. --web.config.file overrides.
    web_config_file: AbsolutePath | None = None
    remediation: RemediationConfig = RemediationConfig()
    power_slack: PowerSlackRulesConfig = PowerSlackRulesConfig()


    @field_validator("expire_after_s")
    @classmethod
    def _not_shorter_than_window(cls, value: float, info: ValidationInfo) -> float:
        # A rank dropped before its window fills would never be compared with its peers.
        window = info.data.get("window_s")
        if window is not None and value < window:
            raise ValueError(f"must be at least window_s ({window:g})")
        # A GPU asked about only every detail_s must not be forgotten in between.
        prom = getattr(info.data.get("telemetry"), "prometheus", None)
        if prom is not None and value <= prom.detail_s:
            raise ValueError(f"must be more than telemetry.prometheus.detail_s ({prom.detail_s:g})")
        return value

    @classmethod
    def default(cls) -> RulesConfig:
        """Every key at its default (valid only once tokens come from the environment)."""
        return cls.model_validate({})


def load_rules_config(path: str | Path | None, env: Mapping[str, str] | None = None) -> RulesConfig:
    """Load and validate a rules config, adding tokens from tokens_file and GPUMOND_RULES_TOKENS. Raises ConfigError."""
    config = RulesConfig.default() if path is None else load_config(path, RulesConfig)
    env = os.environ if env is None else env
    config = resolve_tokens(config, str(path or "rules config"), env)
    return config.model_copy(update={"alerting": resolve_alerting(config.alerting, str(path or "rules config"),
                                                                   env)})


def resolve_tokens(config: RulesConfig, source: str, env: Mapping[str, str]) -> RulesConfig:
    """`config` with tokens_file and the environment merged into `tokens`; ConfigError when none are left."""
    tokens = list(config.tokens)
    if config.tokens_file is not None:
        tokens += read_tokens_file(config.tokens_file, source)
    for i, token in enumerate(t.strip() for t in env.get(TOKENS_ENV, "").split(",") if t.strip()):
        if problem := token_problem(token):
            raise ConfigError(source, f"{TOKENS_ENV}: item {i}: {problem}")
        tokens.append(token)
    if not tokens and not config.allow_unauthenticated:
        raise ConfigError(source, NO_TOKENS)
    return config.model_copy(update={"tokens": tuple(dict.fromkeys(tokens))})
