"""The NVML calls behind the field catalogue: the table of readers, each listing alternatives, preferred first."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pynvml

from gpumond.nvml import nvlink
from gpumond.nvml.gpm import GpmSampler
from gpumond.nvml.reader import Call, Reader, Values, field_value

# Field ids read in one batched nvmlDeviceGetFieldValues call per GPU per fast cycle.
FAST_FIELDS: Mapping[int, str] = {
    pynvml.NVML_FI_DEV_MEMORY_TEMP: "memory_temp",
    pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP: "ev_sw_power_cap",
    pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST: "ev_sync_boost",
    pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN: "ev_sw_thermal",
    pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN: "ev_hw_thermal",
    pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN: "ev_hw_power_brake",
}
_FAST_FIELD_IDS = list(FAST_FIELDS)


def _fields(ids: list[int], names: Mapping[int, str]) -> Callable[[Any], Values]:
    def read(h: Any) -> Values:
        out: dict[str, float] = {}
        for entry in pynvml.nvmlDeviceGetFieldValues(h, ids):
            ret = entry.nvmlReturn
            if ret == pynvml.NVML_SUCCESS:
                out[names[entry.fieldId]] = field_value(entry)
            elif ret == pynvml.NVML_ERROR_GPU_IS_LOST:
                # The batch call "succeeded" but the GPU is gone: surface it like any other call.
                raise pynvml.NVMLError(ret)
            # Any other per-entry failure (NotSupported above all) leaves that value out.
        if not out:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return out

    return read


def _single_field(field_id: int, key: str) -> Callable[[Any], Values]:
    def read(h: Any) -> Values:
        (entry,) = pynvml.nvmlDeviceGetFieldValues(h, [field_id])
        if entry.nvmlReturn != pynvml.NVML_SUCCESS:
            raise pynvml.NVMLError(entry.nvmlReturn)
        return {key: field_value(entry)}  # milliwatts, like nvmlDeviceGetPowerUsage

    return read


def _ecc(h: Any) -> Values:
    c, u = pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    vol, agg = pynvml.NVML_VOLATILE_ECC, pynvml.NVML_AGGREGATE_ECC
    get = pynvml.nvmlDeviceGetTotalEccErrors
    return {
        "corrected_volatile": get(h, c, vol),
        "uncorrected_volatile": get(h, u, vol),
        "corrected_aggregate": get(h, c, agg),
        "uncorrected_aggregate": get(h, u, agg),
    }


def _remapped(h: Any) -> Values:
    corr, unc, pending, failure = pynvml.nvmlDeviceGetRemappedRows(h)
    return {"correctable": corr, "uncorrectable": unc, "pending": pending, "failure": failure}


def _retired(h: Any) -> Values:
    get = pynvml.nvmlDeviceGetRetiredPages
    return {
        "single_bit": len(get(h, pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)),
        "double_bit": len(get(h, pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)),
    }


def _thresholds(h: Any) -> Values:
    out: dict[str, float] = {}
    wanted = {
        "slowdown": pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN,
        "shutdown": pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN,
        "gpu_max": pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX,
    }
    for key, which in wanted.items():
        try:
            out[key] = pynvml.nvmlDeviceGetTemperatureThreshold(h, which)
        except pynvml.NVMLError_NotSupported:
            continue  # boards report a subset; the others are simply absent
    if not out:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
    return out


def _utilization(h: Any) -> Values:
    u = pynvml.nvmlDeviceGetUtilizationRates(h)
    return {"gpu": u.gpu, "memory": u.memory}


def _memory_v2(h: Any) -> Values:
    m = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
    return {"used": m.used, "total": m.total, "free": m.free, "reserved": m.reserved}


def _memory_v1(h: Any) -> Values:
    m = pynvml.nvmlDeviceGetMemoryInfo(h)
    return {"used": m.used, "total": m.total, "free": m.free}


def _constraints(h: Any) -> Values:
    lo, hi = pynvml.nvmlDeviceGetPowerManagementLimitConstraints(h)
    return {"min": lo, "max": hi}


_GPU = pynvml.NVML_TEMPERATURE_GPU
_SM, _MEM = pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_MEM

_STATELESS: tuple[Reader, ...] = (
    Reader("temperature", "fast", (
        Call("nvmlDeviceGetTemperatureV", lambda h: {"gpu": pynvml.nvmlDeviceGetTemperatureV(h, _GPU)}),
        Call("nvmlDeviceGetTemperature", lambda h: {"gpu": pynvml.nvmlDeviceGetTemperature(h, _GPU)}),
    )),
    Reader("fields_fast", "fast", (
        Call("nvmlDeviceGetFieldValues", _fields(_FAST_FIELD_IDS, FAST_FIELDS)),
    )),
    Reader("power", "fast", (
        Call("nvmlDeviceGetFieldValues(POWER_AVERAGE)",
             _single_field(pynvml.NVML_FI_DEV_POWER_AVERAGE, "watts")),
        Call("nvmlDeviceGetPowerUsage", lambda h: {"watts": pynvml.nvmlDeviceGetPowerUsage(h)}),
    )),
    Reader("power_limit", "fast", (
        Call("nvmlDeviceGetEnforcedPowerLimit", lambda h: {"enforced": pynvml.nvmlDeviceGetEnforcedPowerLimit(h)}),
    )),
    # What was asked of the driver (by us, nvidia-smi -pl, or the default); policy drift is judged on this.
    Reader("power_limit_requested", "fast", (
        Call("nvmlDeviceGetPowerManagementLimit",
             lambda h: {"requested": pynvml.nvmlDeviceGetPowerManagementLimit(h)}),
    )),
    Reader("energy", "fast", (
        Call("nvmlDeviceGetTotalEnergyConsumption",
             lambda h: {"total": pynvml.nvmlDeviceGetTotalEnergyConsumption(h)}),
    )),
    Reader("sm_clock", "fast", (
        Call("nvmlDeviceGetClockInfo(SM)", lambda h: {"current": pynvml.nvmlDeviceGetClockInfo(h, _SM)}),
    )),
    Reader("mem_clock", "fast", (
        Call("nvmlDeviceGetClockInfo(MEM)", lambda h: {"current": pynvml.nvmlDeviceGetClockInfo(h, _MEM)}),
    )),
    Reader("utilization", "fast", (Call("nvmlDeviceGetUtilizationRates", _utilization),)),
    Reader("memory", "fast", (
        Call("nvmlDeviceGetMemoryInfo_v2", _memory_v2),
        Call("nvmlDeviceGetMemoryInfo", _memory_v1),
    )),
    Reader("clocks_event", "fast", (
        Call("nvmlDeviceGetCurrentClocksEventReasons",
             lambda h: {"mask": pynvml.nvmlDeviceGetCurrentClocksEventReasons(h)}),
        Call("nvmlDeviceGetCurrentClocksThrottleReasons",
             lambda h: {"mask": pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h)}),
    )),
    Reader("limit_constraints", "slow", (
        Call("nvmlDeviceGetPowerManagementLimitConstraints", _constraints),
    )),
    Reader("limit_default", "slow", (
        Call("nvmlDeviceGetPowerManagementDefaultLimit",
             lambda h: {"default": pynvml.nvmlDeviceGetPowerManagementDefaultLimit(h)}),
    )),
    Reader("sm_clock_max", "slow", (
        Call("nvmlDeviceGetMaxClockInfo(SM)", lambda h: {"max": pynvml.nvmlDeviceGetMaxClockInfo(h, _SM)}),
    )),
    Reader("thresholds", "slow", (Call("nvmlDeviceGetTemperatureThreshold", _thresholds),)),
    Reader("ecc", "slow", (Call("nvmlDeviceGetTotalEccErrors", _ecc),)),
    Reader("remapped_rows", "slow", (Call("nvmlDeviceGetRemappedRows", _remapped),)),
    Reader("retired_pages", "slow", (Call("nvmlDeviceGetRetiredPages", _retired),)),
    # [utilization %, sampling period µs]. Slow tier: training fleets seldom use the video engines, and this keeps
    # the fast cycle's driver calls as they were; dcgm-exporter reads its ENC/DEC_UTIL every 30 s by default too.
    Reader("encoder", "slow", (
        Call("nvmlDeviceGetEncoderUtilization", lambda h: {"util": pynvml.nvmlDeviceGetEncoderUtilization(h)[0]}),
    )),
    Reader("decoder", "slow", (
        Call("nvmlDeviceGetDecoderUtilization", lambda h: {"util": pynvml.nvmlDeviceGetDecoderUtilization(h)[0]}),
    )),
    Reader("pcie_replay", "slow", (
        Call("nvmlDeviceGetPcieReplayCounter", lambda h: {"count": pynvml.nvmlDeviceGetPcieReplayCounter(h)}),
    )),
)


# Per-link reads in the slow tier: 18 links × 8 GPUs every second would double the fast cycle's cost
# (benchmarks/results/agent_sample_cycle.md), and GPM gives the total NVLink bytes/s every fast cycle.
_NVLINK: tuple[Reader, ...] = (
    Reader("nvlink_state", "slow", (Call("nvmlDeviceGetNvLinkState", nvlink.read_state),)),
    Reader("nvlink_throughput", "slow", (
        Call("nvmlDeviceGetFieldValues(NVLINK_THROUGHPUT_DATA)", nvlink.read_throughput),)),
    Reader("nvlink_errors", "slow", (Call("nvmlDeviceGetNvLinkErrorCounter", nvlink.read_errors),)),
)


def build_readers(gpm: GpmSampler | None = None) -> tuple[Reader, ...]:
    """Every reader, with fresh state where a reader keeps some (`gpm`: its samples): one set per session."""
    gpm = gpm if gpm is not None else GpmSampler()
    # Two samples per fast interval (the previous cycle's and this one's): rates over the whole interval.
    return (*_STATELESS, Reader("gpm", "fast", (Call("nvmlGpmMetricsGet", gpm.read),), release=gpm.release),
            *_NVLINK)


# The readers' names, tiers and calls, for the catalogue and docs (a session builds its own with build_readers).
READERS: tuple[Reader, ...] = build_readers()
