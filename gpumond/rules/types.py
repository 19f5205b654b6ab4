"""Shared vocabulary of the rules service: what ingest stores, what telemetry sources return, what detectors emit."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np

# The push's values are defined with the push's checks (shared with the agent's relay); the rules service's
# vocabulary includes them under these names.
from gpumond.push.values import RankInfo as RankInfo, StepColumns as StepColumns, StepRecord as StepRecord


# ----- from training jobs (push API): StepRecord, RankInfo and StepColumns live with the push's checks ------
@dataclass(frozen=True, slots=True)
class RankWindow:
    """A rank's recent steps, oldest first, bounded in time and count."""

    info: RankInfo
    # A tuple where a window is built from records; the store's is a read-only Sequence over `columns`
    # (gpumond.rules.columns.StepView) that makes each StepRecord when read, with `samples` None.
    steps: Sequence[StepRecord]
    last_push: float  # unix seconds of the last accepted push
    # The same steps as arrays, when whoever built the window keeps them (the store, the simulator);
    # detectors fall back to reading `steps` when any window of a job lacks them.
    columns: StepColumns | None = field(default=None, compare=False)
    # Unix seconds of the last push that carried no steps: the SDK's heartbeat, sent while the process lives
    # and has nothing to report (a hung rank keeps sending it; a crashed one cannot). None: never seen.
    last_beat: float | None = None
    # The rank said it is ending (`"final": true`, sent by the SDK's close(), at exit and on SIGTERM).
    ended: bool = False
    # Samples (or tokens) the rank's new steps reported in total since the store first held it (0: none
    # reported): only grows, so the energy ledger counts the job's progress from its increase.
    samples: int = 0


# ----- from GPU telemetry (agents or Prometheus) --------------------------------------------------
# Keys of GpuSample.values, in base units, named after the agent's metrics without prefix/unit noise:
GPU_SIGNALS = (
    "sm_clock_hz",  # gpumond_gpu_sm_clock_hertz
    "sm_clock_max_hz",  # gpumond_gpu_sm_clock_max_hertz
    "power_w",  # gpumond_gpu_power_watts
    "power_limit_w",  # gpumond_gpu_power_limit_watts
    "utilization",  # gpumond_gpu_utilization_ratio (0–1)
    "temperature_c",  # gpumond_gpu_temperature_celsius
    "throttle_hw_thermal",  # gpumond_gpu_clocks_event_active{reason="hw_thermal_slowdown"} (0/1)
    "throttle_sw_thermal",  # …{reason="sw_thermal_slowdown"}
    "throttle_hw_slowdown",  # …{reason="hw_slowdown"}
    "throttle_sw_power_cap",  # …{reason="sw_power_cap"}
    "throttle_hw_power_brake",  # …{reason="hw_power_brake_slowdown"}
    "energy_j",  # gpumond_gpu_energy_joules_total: exact mean power over a window, immune to sampling aliasing
    "sm_active",  # gpumond_gpu_sm_active_ratio (GPM, Hopper and later): share of SMs doing work, 0–1
    "tensor_active",  # gpumond_gpu_tensor_active_ratio{precision="any"} (GPM)
    "nvlink_replays_total",  # gpumond_gpu_nvlink_errors_total{type="replay"}: all links of the GPU
)
HOST_SIGNALS = (
    "cpu_utilization",  # gpumond_host_cpu_utilization_ratio
    "cpu_iowait",  # gpumond_host_cpu_iowait_ratio
    "disk_read_bytes_total",  # gpumond_host_disk_read_bytes_total
    "memory_used_bytes",  # gpumond_host_memory_used_bytes
)


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One GPU at one instant, as a telemetry source saw it. A signal the agent did not export is absent."""

    uuid: str
    node: str
    gpu: str  # index on its node
    t: float  # unix seconds
    up: bool
    values: Mapping[str, float] = field(default_factory=dict)
    jobs: tuple[str, ...] = ()  # from gpumond_gpu_job_info
    # A MIG device (uuid `MIG-…`): its parent GPU, whose board-wide telemetry `values` are, and its
    # profile, which decides its peers (gpumond_gpu_mig_info). None for a whole GPU.
    parent_uuid: str | None = None
    mig_profile: str | None = None
    gpu_instance: int | None = None
    compute_instance: int | None = None


@dataclass(frozen=True, slots=True, eq=False)
class GpuColumns:
    """A GPU's samples as one read-only float64 matrix, oldest first, aligned 1:1 with its GpuWindow.

    Rows: t, up (1.0/0.0), which signals were present (bit j for GPU_SIGNALS[j]: a NaN there is a value the
    agent sent, elsewhere an absent signal), then one row per signal of GPU_SIGNALS (NaN where absent).
    One matrix, so the store writes a sample with one assignment and a job's GPUs concatenate in one call.
    """

    data: np.ndarray  # (SAMPLE_ROWS, n)

    @property
    def t(self) -> np.ndarray:
        return self.data[0]

    @property
    def up(self) -> np.ndarray:
        return self.data[1] != 0.0

    @property
    def present(self) -> np.ndarray:
        return self.data[2].astype(np.int64)

    @property
    def values(self) -> np.ndarray:
        """(len(GPU_SIGNALS), n)."""
        return self.data[3:]

    def signal(self, name: str) -> np.ndarray:
        return self.data[3 + GPU_SIGNALS.index(name)]

    def __len__(self) -> int:
        return self.data.shape[1]


SAMPLE_ROWS = 3 + len(GPU_SIGNALS)


class GpuWindow(tuple):  # noqa: SLOT001 - a tuple subclass cannot have non-empty __slots__
    """A GPU's samples, oldest first: a tuple of GpuSample (every Sequence[GpuSample] reader is unchanged)
    that may also carry the same samples as GpuColumns, for the detectors."""

    columns: GpuColumns | None

    def __new__(cls, samples: Iterable[GpuSample] = (), columns: GpuColumns | None = None) -> GpuWindow:
        window = super().__new__(cls, samples)
        window.columns = columns
        return window


@dataclass(frozen=True, slots=True)
class HostSample:
    """One node's host evidence at one instant."""

    node: str
    t: float
    values: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class AgentAlert:
    """One alert an agent has firing (its gpumond_alert_active series): the node it came from and its labels."""

    node: str
    labels: Mapping[str, str] = field(default_factory=dict)

    def label(self, name: str) -> str:
        """The label's value, "" when absent."""
        return self.labels.get(name, "")


@dataclass(frozen=True, slots=True)
class TelemetryBatch:
    """Everything one fetch returned. Nodes whose agent could not be reached are `absent` (never stragglers)."""

    t: float
    gpus: tuple[GpuSample, ...] = ()
    hosts: tuple[HostSample, ...] = ()
    absent_nodes: frozenset[str] = frozenset()
    errors: tuple[str, ...] = ()  # one line per failed target/query, for logs and /readyz
    # What each reachable agent has firing (GpuLost, GpuXidCritical, …): what remediation acts on.
    alerts: tuple[AgentAlert, ...] = ()
    alerts_known: bool = True  # False when the alerts could not be read (their query failed): keep the last


@dataclass(frozen=True, slots=True)
class TelemetryNeed:
    """What the detectors read from the next fetch: the GPUs of this replica's jobs and those read every fetch
    (`suspects`: in a finding, pending or firing, or offered a power-slack limit). A source may ask less than the
    whole fleet for it; None asks everything."""

    gpus: frozenset[str] = frozenset()
    suspects: frozenset[str] = frozenset()


class TelemetrySource(Protocol):
    """Where GPU telemetry comes from: agents scraped directly, or a Prometheus-compatible query API."""

    name: str

    def fetch(self, need: TelemetryNeed | None = None) -> TelemetryBatch: ...

    def close(self) -> None: ...


# ----- findings ----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Finding:
    """A detector's conclusion about one entity, with evidence a human can act on."""

    kind: str  # one of gpumond.alerts.catalogue.FINDING_KINDS (each kind is one alert)
    job: str
    node: str | None
    rank: int | None
    gpu_uuid: str | None
    score: float
    since: float  # unix seconds the condition was first seen
    state: Literal["pending", "firing"]
    evidence: Mapping[str, object] = field(default_factory=dict)
