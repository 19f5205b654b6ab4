"""The agent's configuration: one frozen pydantic model per YAML section, all keys optional."""

from __future__ import annotations

import math
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, Literal

from pydantic import (BeforeValidator, Field, GetCoreSchemaHandler, PlainValidator, ValidationInfo, field_validator,
                      model_validator)
from pydantic_core import core_schema

from gpumond.config.alerting import AlertingConfig
from gpumond.config.http import HttpConfig
from gpumond.config.http_client import HttpClientConfig
from gpumond.config.types import AbsolutePath, ConfigModel, HttpUrl, ListenAddress
from gpumond.wire.identity import GPU_UUID, JOB_ENV_VARS
from gpumond.wire.routing import MAX_SHARDS, PLACEHOLDER

# 9480 stays clear of dcgm-exporter (9400) and nvidia_gpu_exporter (9835) on shared nodes.
DEFAULT_LISTEN = ListenAddress("0.0.0.0", 9480)

_ENV_VAR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _lowercase(value: Any) -> Any:
    # Operators write INFO as often as info; accept both, store one spelling.
    return value.lower() if isinstance(value, str) else value


class SamplingConfig(ConfigModel):
    """How often each sampling tier polls NVML, and how hard to retry a lost driver."""

    fast_interval_s: float = Field(1.0, gt=0, le=60)
    slow_interval_s: float = Field(30.0, gt=0, le=3600)
    xid_events: bool = True
    nvml_retry_max_s: float = Field(300.0, gt=0, le=86400)

    @field_validator("slow_interval_s")
    @classmethod
    def _not_faster_than_fast(cls, value: float, info: ValidationInfo) -> float:
        fast = info.data.get("fast_interval_s")  # absent when fast itself was invalid
        if fast is not None and value < fast:
            raise ValueError(f"must be at least fast_interval_s ({fast:g})")
        return value


def _tristate(value: Any) -> bool | str:
    # One message for the three spellings instead of pydantic's per-branch union complaints.
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() == "auto":
        return "auto"
    raise ValueError("must be true, false or auto")


class PodResourcesConfig(ConfigModel):
    """The kubelet's pod-resources gRPC API: which pod and container each GPU / MIG device was assigned to."""

    # auto: use it when the socket exists (a Kubernetes node); true: expect it and warn while it is missing.
    enabled: Annotated[bool | Literal["auto"], PlainValidator(_tristate)] = "auto"
    socket: Path = Field(Path("/var/lib/kubelet/pod-resources/kubelet.sock"), strict=False)
    timeout_s: float = Field(2.0, gt=0, le=30)  # one List call's deadline
    interval_s: float = Field(10.0, ge=1, le=3600)  # how often the kubelet is asked, off the sampling path

    @field_validator("socket")
    @classmethod
    def _absolute_socket(cls, value: Path) -> Path:
        if not value.is_absolute():
            raise ValueError("must be an absolute path")
        return value


class JobsConfig(ConfigModel):
    """How GPU processes are attributed to training jobs."""

    enabled: bool = True
    env_vars: tuple[str, ...] = Field(
        JOB_ENV_VARS, min_length=1, strict=False
    )
    kubernetes_pods: bool = True
    cache_size: int = Field(4096, ge=16, le=1_048_576)
    pod_resources: PodResourcesConfig = PodResourcesConfig()

    @field_validator("env_vars")
    @classmethod
    def _names_are_env_vars(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            if not _ENV_VAR_NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not an environment variable name")
        return value


class HostConfig(ConfigModel):
    """Host evidence (CPU, iowait, disk, memory) exported next to the GPU series."""

    enabled: bool = True


class DcgmCompatConfig(ConfigModel):
    """dcgm-exporter's names, units and labels next to gpumond's own, so its dashboards keep working."""

    enabled: bool = False
    # Released dcgm-exporter labels the node `Hostname`; its main branch (no release yet) says `hostname`.
    hostname_label: Literal["Hostname", "hostname"] = "Hostname"


class ExpositionConfig(ConfigModel):
    """What /metrics exports beyond gpumond's default series."""

    dcgm_compat: DcgmCompatConfig = DcgmCompatConfig()
    # Each NVLink's throughput and error counters beside the per-GPU totals (and, with dcgm_compat, DCGM's
    # per-link error fields). Off by default: on an 8-GPU H100 node (18 links each) it adds 864 series, more
    # than the rest of the exposition (benchmarks/results/agent_sample_cycle.md).
    nvlink_per_link: bool = False


class LogConfig(ConfigModel):
    """Log verbosity and line format."""

    level: Annotated[Literal["debug", "info", "warning", "error"], BeforeValidator(_lowercase)] = "info"
    format: Annotated[Literal["logfmt", "json"], BeforeValidator(_lowercase)] = "logfmt"


_PERCENT = re.compile(r"\d+(\.\d+)?%", re.ASCII)
_POWER_HINT = 'must be watts (a number) or a percentage of the default limit, e.g. "80%"'


@dataclass(frozen=True, slots=True)
class PowerSetting:
    """A requested power limit: absolute watts, or a percentage of the board's default limit."""

    watts: float | None = None
    percent: float | None = None

    @classmethod
    def parse(cls, value: Any) -> PowerSetting:
        """Read a YAML number (watts) or an "N%" string; raise ValueError for anything else."""
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ValueError(_POWER_HINT)
        if isinstance(value, str):
            if not _PERCENT.fullmatch(value):
                raise ValueError(_POWER_HINT)
            percent = float(value[:-1])
            if not 0 < percent <= 200:
                raise ValueError("a percentage must be greater than 0% and at most 200%")
            return cls(percent=percent)
        if not math.isfinite(value) or value <= 0:
            raise ValueError("watts must be a number greater than 0")
        return cls(watts=float(value))

    def __str__(self) -> str:
        if self.percent is not None:
            return f"{self.percent:g}%"
        return f"{self.watts:g} W"

    def _dump(self) -> float | str:
        return f"{self.percent:g}%" if self.percent is not None else float(self.watts or 0.0)

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(
            lambda v: v if isinstance(v, cls) else cls.parse(v),
            serialization=core_schema.plain_serializer_function_ser_schema(cls._dump),
            json_schema_input_schema=core_schema.union_schema(
                [core_schema.float_schema(gt=0), core_schema.str_schema(pattern=f"^{_PERCENT.pattern}$")]
            ),
        )


def gpu_selector_kind(selector: str) -> Literal["uuid", "index", "model"] | None:
    """What a per_gpu key names: a GPU UUID, an index, a model name; None if it is none of them."""
    if selector.upper().startswith(("GPU-", "MIG-")):
        # MIG instances share their parent's power limit, so only a whole GPU is a target.
        return "uuid" if GPU_UUID.fullmatch(selector.upper()) else None
    if selector.isdecimal():
        # "01" is almost certainly a typo for an index; refusing it keeps one spelling per GPU.
        return "index" if selector == str(int(selector)) else None
    if not selector.strip() or selector != selector.strip() or selector.lstrip("+-").isdecimal():
        return None
    return "model"


@dataclass(frozen=True, slots=True)
class PerGpuLimits:
    """`power_limit.per_gpu`: selector → PowerSetting, immutable and hashable like every section."""

    items: tuple[tuple[str, PowerSetting], ...] = ()
    # selector key → setting: the policy asks for three selectors per GPU every cycle, and a fleet-wide table of
    # UUIDs can hold tens of thousands of entries (a scan of 34,000 cost 17 ms per GPU per cycle).
    _index: Mapping[str, PowerSetting] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_index", MappingProxyType({_selector_key(k): s for k, s in self.items}))

    def get(self, selector: str) -> PowerSetting | None:
        """The setting for this exact selector (UUIDs compare case-insensitively)."""
        return self._index.get(_selector_key(selector))

    def __len__(self) -> int:
        return len(self.items)

    @classmethod
    def _from_mapping(cls, value: dict[str, PowerSetting]) -> PerGpuLimits:
        seen: dict[str, str] = {}
        for selector in value:
            if gpu_selector_kind(selector) is None:
                raise ValueError(
                    f"{selector!r} is not a GPU index (0, 1, …), a GPU UUID (GPU-xxxxxxxx-xxxx-…) "
                    "or a model name (e.g. 'NVIDIA H100 80GB HBM3')"
                )
            key = _selector_key(selector)
            if key in seen:
                raise ValueError(f"{selector!r} names the same GPUs as {seen[key]!r}")
            seen[key] = selector
        return cls(tuple(value.items()))

    @staticmethod
    def _int_keys_to_text(value: Any) -> Any:
        # YAML reads `per_gpu: {0: 350}` with an integer key; that is an index, say so.
        if not isinstance(value, dict):
            return value
        return {str(k) if isinstance(k, int) and not isinstance(k, bool) else k: v for k, v in value.items()}

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        mapping = core_schema.dict_schema(
            keys_schema=core_schema.str_schema(strict=True),
            values_schema=handler.generate_schema(PowerSetting),
        )
        return core_schema.no_info_before_validator_function(
            cls._int_keys_to_text,
            core_schema.no_info_after_validator_function(cls._from_mapping, mapping),
            serialization=core_schema.plain_serializer_function_ser_schema(
                lambda v: {k: s._dump() for k, s in v.items}
            ),
        )


def _selector_key(selector: str) -> str:
    return selector.lower() if selector.upper().startswith("GPU-") else selector


class PowerLimitConfig(ConfigModel):
    """Persistent power limits: one for every GPU, overridden per index, UUID or model name."""

    default_w: PowerSetting | None = None
    per_gpu: PerGpuLimits = Field(PerGpuLimits(), json_schema_extra={"default": {}})


class ThermalConfig(ConfigModel):
    """The closed-loop thermal power capping controller."""

    enabled: bool = True
    # None: the GPU's own slowdown threshold minus margin_c (83 °C when none is reported).
    target_c: float | None = Field(None, ge=30, le=110)
    margin_c: float = Field(5.0, ge=0, le=40)
    memory_target_c: float | None = Field(None, ge=30, le=120)
    hysteresis_c: float = Field(3.0, ge=0, le=20)
    step_w: float = Field(10.0, gt=0, le=1000)
    floor_w: float | None = Field(None, gt=0, le=10000)
    interval_s: float = Field(5.0, ge=1, le=600)


class PolicyAlertsConfig(ConfigModel):
    """How long a condition must last before the agent raises its alert."""

    throttle_after_s: float = Field(60.0, ge=0, le=86400)
    floor_after_s: float = Field(300.0, ge=0, le=86400)
    # An XID or an ECC increase is an event with no "still true": its alert stays this long after the last one.
    event_hold_s: float = Field(900.0, gt=0, le=7 * 86400)


class PowerSlackConfig(HttpClientConfig):
    """Power-slack leases: lower limits the rules service offers for GPUs that only wait on slower peers."""

    # dry_run by default: offers are computed, logged, audited and exported, and no limit changes until an
    # operator writes `mode: enforce` here (and policy.mode is enforce).
    mode: Annotated[Literal["enforce", "dry_run", "off"], BeforeValidator(_lowercase)] = "dry_run"
    # The rules service to ask (GET /api/v1/power/offers?node=…); None: no offers are asked for.
    rules_url: HttpUrl | None = None
    interval_s: float = Field(15.0, ge=1, le=3600)
    # A lease not renewed by an answer this long runs out: the GPU goes back to the limit it would otherwise have.
    lease_s: float = Field(60.0, ge=5, le=3600, validate_default=True)
    max_gpus_per_interval: int = Field(2, ge=1, le=64)
    max_step_w: float = Field(50.0, gt=0, le=1000)
    # Never lease below this (nor below NVML's minimum limit); None: NVML's minimum.
    floor_w: float | None = Field(None, gt=0, le=10000)
    # tls_config / basic_auth / authorization (HttpClientConfig): a rules service behind TLS or read-side auth
    # (its --web.config.file), in the same keys as every other HTTP client section.

    @field_validator("lease_s")
    @classmethod
    def _outlasts_an_interval(cls, value: float, info: ValidationInfo) -> float:
        interval = info.data.get("interval_s")
        if interval is not None and value < 2 * interval:
            raise ValueError(f"must be at least twice interval_s ({2 * interval:g}): one late answer must not "
                             "end every lease")
        return value


# 9482: next to the agent's 9480 and the rules service's 9481. Loopback by default: a rank on this node reaches it
# without any network exposure; the chart binds the node's own address so pods on the node reach it too.
DEFAULT_RELAY_LISTEN = ListenAddress("127.0.0.1", 9482)


def relay_listen_problem(address: ListenAddress) -> str | None:
    """Why the relay must not bind this address (None: it may). A wildcard would offer every network the node
    is on a way to push steps under the node's name; the relay is for the ranks on this node only."""
    if address.host in ("0.0.0.0", "::", ""):
        return (f"{address.host or '*'} listens on every network of the node; the relay serves this node's ranks "
                "only: give 127.0.0.1 or the node's own address (the chart passes the pod's status.podIP)")
    return None


class RelayConfig(HttpClientConfig):
    """The node-local relay: this node's ranks push to the agent, which batches them per job and pushes upstream."""

    # The rules service (may hold {shard}, routed by job as the SDK routes); None: the relay is off.
    upstream: HttpUrl | None = None
    shards: int | None = Field(None, ge=1, le=MAX_SHARDS)
    listen: ListenAddress = DEFAULT_RELAY_LISTEN
    # One batched push per job per interval: 2 s keeps detection latency well under the SDK's own 5 s.
    interval_s: float = Field(2.0, gt=0, le=60)
    # Held through an outage of the rules service: a busy node (8 ranks × 2 steps/s at ~100 B a step) sends ~1.6 KiB/s,
    # so the age bound (10 minutes, ~1 MiB) binds first; 64 MiB leaves room for nodes of many ranks or large pushes.
    # The oldest go first when either bound is reached.
    buffer_max_bytes: int = Field(64 * 1024 * 1024, ge=64 * 1024, le=4 * 1024**3)
    buffer_max_age_s: float = Field(600.0, ge=10, le=86400)
    # tls_config / basic_auth / authorization (HttpClientConfig): how the relay reaches a rules service behind TLS,
    # and the credential it sends for ranks that send no token; a rank's own token passes through unchanged instead
    # (a batch has one Authorization header: docs/job-sdk.md).

    @field_validator("listen")
    @classmethod
    def _node_only(cls, value: ListenAddress) -> ListenAddress:
        problem = relay_listen_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _shards_match_template(self) -> RelayConfig:
        # Either half without the other would send every job's batch to one shard, most to the wrong one.
        has_placeholder = self.upstream is not None and PLACEHOLDER in self.upstream
        if self.shards is not None and not has_placeholder:
            raise ValueError(f"shards is {self.shards} but upstream has no {PLACEHOLDER} to put the shard number in "
                             f"(e.g. http://gpumond-rules-{PLACEHOLDER}.gpumond-rules-shards:9481)")
        if has_placeholder and self.shards is None:
            raise ValueError(f"upstream has {PLACEHOLDER}: set shards to the number of rules replicas (N of "
                             "--shard I/N)")
        return self

    @property
    def enabled(self) -> bool:
        """Whether the agent runs the relay (an upstream is configured)."""
        return self.upstream is not None


class PolicyConfig(ConfigModel):
    """What the agent may do to the GPUs: persistent limits, thermal capping, local alerts."""

    # dry_run by default: an agent installed across a fleet acts on no hardware until an operator writes
    # `mode: enforce` (one line).
    mode: Annotated[Literal["enforce", "dry_run", "off"], BeforeValidator(_lowercase)] = "dry_run"
    restore_on_exit: bool = True
    power_limit: PowerLimitConfig = PowerLimitConfig()
    thermal: ThermalConfig = ThermalConfig()
    alerts: PolicyAlertsConfig = PolicyAlertsConfig()
    power_slack: PowerSlackConfig = PowerSlackConfig()


class AgentConfig(ConfigModel):
    """The whole agent config file (`agent.yaml`)."""

    listen: ListenAddress = DEFAULT_LISTEN
    # None means "this machine's hostname", resolved when the config is validated.
    node_name: str = Field(None, min_length=1, validate_default=True)  # type: ignore[assignment]
    sampling: SamplingConfig = SamplingConfig()
    jobs: JobsConfig = JobsConfig()
    host: HostConfig = HostConfig()
    exposition: ExpositionConfig = ExpositionConfig()
    state_dir: Path = Field(Path("/var/lib/gpumond"), strict=False)
    log: LogConfig = LogConfig()
    http: HttpConfig = HttpConfig()
    # TLS and read-side auth (exporter-toolkit's web config file); None: plain HTTP. --web.config.file overrides.
    web_config_file: AbsolutePath | None = None
    policy: PolicyConfig = PolicyConfig()
    alerting: AlertingConfig = AlertingConfig()
    relay: RelayConfig = RelayConfig()

    @field_validator("node_name", mode="before")
    @classmethod
    def _default_to_hostname(cls, value: Any, info: ValidationInfo) -> Any:
        if value is not None:
            return value
        # Tests pass context={"hostname": "..."}; production asks the OS.
        context = info.context or {}
        return context.get("hostname") or socket.gethostname()

    @field_validator("state_dir")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        # A relative path would depend on the daemon's working directory (/ under systemd).
        if not value.is_absolute():
            raise ValueError("must be an absolute path")
        return value

    @classmethod
    def default(cls) -> AgentConfig:
        """The configuration used when no file is given."""
        return cls.model_validate({})
