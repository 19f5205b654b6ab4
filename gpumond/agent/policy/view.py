"""What the policy sees of one GPU at one instant: an immutable view built from the latest reads."""

from __future__ import annotations

from dataclasses import dataclass


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
    # What runs on the GPU and its MIG devices (jobs, pods) at the last attribution, for alert annotations.
    workload: tuple[str, ...] = ()


# nvmlClocksEventReason* bits the policy cares about.
GPU_IDLE = 0x1
SW_POWER_CAP = 0x4
HW_SLOWDOWN = 0x8
SW_THERMAL_SLOWDOWN = 0x20
HW_THERMAL_SLOWDOWN = 0x40
HW_POWER_BRAKE_SLOWDOWN = 0x80
