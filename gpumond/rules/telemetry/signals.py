"""Which agent series feed which telemetry signal: the one table both sources read."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

INFO = "gpumond_gpu_info"
GPU_UP = "gpumond_gpu_up"
JOB_INFO = "gpumond_gpu_job_info"
MIG_INFO = "gpumond_gpu_mig_info"
CLOCKS_EVENT = "gpumond_gpu_clocks_event_active"
# The same reasons as one bitmask series per GPU (newer agents): what a fetch asks first, CLOCKS_EVENT only for the
# GPUs without it (promql_tiers). Bits are NVML's nvmlClocksEventReason* (gpumond.nvml.catalogue.CLOCK_EVENT_REASONS).
CLOCKS_EVENT_MASK = "gpumond_gpu_clocks_event_reasons_bitmask"
TENSOR_ACTIVE = "gpumond_gpu_tensor_active_ratio"
NVLINK_ERRORS = "gpumond_gpu_nvlink_errors_total"
ALERT_ACTIVE = "gpumond_alert_active"  # what the agent has firing: remediation acts on it

# signal → (metric, value of its selecting label or None); keys are exactly types.GPU_SIGNALS. The selecting label
# of a metric is in SELECTOR_LABEL (`reason` of the clock events, `precision` of tensor activity, `type` of the
# NVLink errors).
GPU_SERIES: Mapping[str, tuple[str, str | None]] = MappingProxyType({
    "sm_clock_hz": ("gpumond_gpu_sm_clock_hertz", None),
    "sm_clock_max_hz": ("gpumond_gpu_sm_clock_max_hertz", None),
    "power_w": ("gpumond_gpu_power_watts", None),
    "power_limit_w": ("gpumond_gpu_power_limit_watts", None),
    "utilization": ("gpumond_gpu_utilization_ratio", None),
    "temperature_c": ("gpumond_gpu_temperature_celsius", None),
    "throttle_hw_thermal": (CLOCKS_EVENT, "hw_thermal_slowdown"),
    "throttle_sw_thermal": (CLOCKS_EVENT, "sw_thermal_slowdown"),
    "throttle_hw_slowdown": (CLOCKS_EVENT, "hw_slowdown"),
    "throttle_sw_power_cap": (CLOCKS_EVENT, "sw_power_cap"),
    "throttle_hw_power_brake": (CLOCKS_EVENT, "hw_power_brake_slowdown"),
    "energy_j": ("gpumond_gpu_energy_joules_total", None),
    "sm_active": ("gpumond_gpu_sm_active_ratio", None),
    "tensor_active": (TENSOR_ACTIVE, "any"),
    "nvlink_replays_total": (NVLINK_ERRORS, "replay"),
})
# reason label value → its bit in CLOCKS_EVENT_MASK, for the reasons GPU_SERIES maps.
REASON_BITS: Mapping[str, int] = MappingProxyType({
    "sw_power_cap": 0x4, "hw_slowdown": 0x8, "sw_thermal_slowdown": 0x20, "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
})
SELECTOR_LABEL: Mapping[str, str] = MappingProxyType({CLOCKS_EVENT: "reason", TENSOR_ACTIVE: "precision",
                                                      NVLINK_ERRORS: "type"})

# signal → metric; keys are exactly types.HOST_SIGNALS. Host series carry no GPU labels.
HOST_SERIES: Mapping[str, str] = MappingProxyType({
    "cpu_utilization": "gpumond_host_cpu_utilization_ratio",
    "cpu_iowait": "gpumond_host_cpu_iowait_ratio",
    "disk_read_bytes_total": "gpumond_host_disk_read_bytes_total",
    "memory_used_bytes": "gpumond_host_memory_used_bytes",
})

_GPU_BY_METRIC: dict[str, dict[str | None, str]] = {}
for _signal, (_metric, _reason) in GPU_SERIES.items():
    _GPU_BY_METRIC.setdefault(_metric, {})[_reason] = _signal
_HOST_BY_METRIC = {metric: signal for signal, metric in HOST_SERIES.items()}


def gpu_signal(metric: str, labels: Mapping[str, str]) -> str | None:
    """The GPU signal a sample feeds, or None when it feeds none."""
    by_reason = _GPU_BY_METRIC.get(metric)
    if by_reason is None:
        return None
    label = SELECTOR_LABEL.get(metric)
    return by_reason.get(labels.get(label)) if label else by_reason.get(None)


def host_signal(metric: str) -> str | None:
    """The host signal a sample feeds, or None."""
    return _HOST_BY_METRIC.get(metric)


def gpu_selectors(where: str = "") -> dict[str, str]:
    """One PromQL selector per metric behind the GPU signals, keyed by metric name; `where` (a label matcher such
    as `instance=~"…"`) is added to each."""
    out: dict[str, str] = {}
    for metric, by_reason in _GPU_BY_METRIC.items():
        values = sorted(r for r in by_reason if r is not None)
        # Only the label values we map (the agent exports ~9 clock-event reasons per GPU): not the rest.
        out[metric] = selector(metric, where, f'{SELECTOR_LABEL[metric]}=~"{"|".join(values)}"' if values else "")
    return out


def selector(metric: str, *matchers: str) -> str:
    """`metric{m1,m2}` of the matchers that are not empty; the bare name when none is."""
    inner = ",".join(m for m in matchers if m)
    return f"{metric}{{{inner}}}" if inner else metric
