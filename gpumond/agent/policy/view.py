"""What the policy sees of one GPU at one instant: an immutable view, and how it is built from the latest reads."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpumond.nvml.session import TierRead


@dataclass(frozen=True, slots=True)
class GpuView:
    """One GPU as the policy sees it; None means NVML did not report that value on this GPU."""

    index: int
    uuid: str
    name: str  # model name, e.g. "NVIDIA H100 80GB HBM3"
    up: bool
    temperature_c: float | None = None
    memory_temperature_c: float | None = None
    power_w: float | None = None
    enforced_limit_w: float | None = None
    limit_min_w: float | None = None
    limit_max_w: float | None = None
    limit_default_w: float | None = None
    slowdown_c: float | None = None  # NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: hardware thermal slowdown starts
    shutdown_c: float | None = None
    gpu_max_c: float | None = None  # NVML_TEMPERATURE_THRESHOLD_GPU_MAX: software thermal slowdown starts
    sm_clock_hz: float | None = None
    clocks_event_mask: int | None = None  # nvmlClocksEventReason* bits
    ecc_uncorrected_volatile: float | None = None
    ecc_uncorrected_aggregate: float | None = None
    remap_pending: bool | None = None
    remap_failed: bool | None = None
    requested_limit_w: float | None = None  # nvmlDeviceGetPowerManagementLimit: what was asked of the driver
    # NVLink (slow tier): (link, active) and (link, replay count) per link.
    nvlink_up: tuple[tuple[int, bool], ...] = ()
    nvlink_replays: tuple[tuple[int, float], ...] = ()
    # What runs on the GPU and its MIG devices (jobs, pods) at the last attribution, for alert annotations.
    workload: tuple[str, ...] = ()


# nvmlClocksEventReason* bits the policy cares about.
GPU_IDLE = 0x1
SW_POWER_CAP = 0x4
HW_SLOWDOWN = 0x8
SW_THERMAL_SLOWDOWN = 0x20
HW_THERMAL_SLOWDOWN = 0x40
HW_POWER_BRAKE_SLOWDOWN = 0x80


# (reader, key) → (GpuView field, divisor from NVML units)
_FIELDS: dict[tuple[str, str], tuple[str, float]] = {
    ("temperature", "gpu"): ("temperature_c", 1),
    ("fields_fast", "memory_temp"): ("memory_temperature_c", 1),
    ("power", "watts"): ("power_w", 1000),
    ("power_limit", "enforced"): ("enforced_limit_w", 1000),
    ("power_limit_requested", "requested"): ("requested_limit_w", 1000),
    ("limit_constraints", "min"): ("limit_min_w", 1000),
    ("limit_constraints", "max"): ("limit_max_w", 1000),
    ("limit_default", "default"): ("limit_default_w", 1000),
    ("thresholds", "slowdown"): ("slowdown_c", 1),
    ("thresholds", "shutdown"): ("shutdown_c", 1),
    ("thresholds", "gpu_max"): ("gpu_max_c", 1),
    ("sm_clock", "current"): ("sm_clock_hz", 1e-6),
    ("ecc", "uncorrected_volatile"): ("ecc_uncorrected_volatile", 1),
    ("ecc", "uncorrected_aggregate"): ("ecc_uncorrected_aggregate", 1),
}


def build_views(fast: TierRead, slow: TierRead | None,
                workloads: Mapping[str, tuple[str, ...]] | None = None) -> list[GpuView]:
    """One GpuView per GPU in the fast read; slow-tier values come from the last slow read, and what runs
    on each GPU from the last attribution (`workloads`, by UUID)."""
    slow_reads = {}
    if slow is not None:
        slow_reads = {g.identity.index: g for g in slow.gpus if g.up}
    views = []
    for g in fast.gpus:
        kw: dict[str, object] = {}
        triples = []
        if g.up:
            triples = list(g.triples())
            if g.identity.index in slow_reads:
                triples += slow_reads[g.identity.index].triples()
        links_up: list[tuple[int, bool]] = []
        replays: list[tuple[int, float]] = []
        for reader, key, value in triples:
            if reader == "nvlink_state" and key.startswith("up@"):
                links_up.append((int(key[3:]), bool(value)))
            elif reader == "nvlink_errors" and key.startswith("replay@"):
                replays.append((int(key[7:]), value))
            elif (reader, key) == ("clocks_event", "mask"):
                kw["clocks_event_mask"] = int(value)
            elif (reader, key) == ("remapped_rows", "pending"):
                kw["remap_pending"] = bool(value)
            elif (reader, key) == ("remapped_rows", "failure"):
                kw["remap_failed"] = bool(value)
            elif (reader, key) in _FIELDS:
                name, div = _FIELDS[(reader, key)]
                kw[name] = value / div
        kw["nvlink_up"], kw["nvlink_replays"] = tuple(links_up), tuple(replays)
        views.append(GpuView(index=g.identity.index, uuid=g.identity.uuid, name=g.identity.name, up=g.up,
                             workload=(workloads or {}).get(g.identity.uuid, ()), **kw))  # type: ignore[arg-type]
    return views
