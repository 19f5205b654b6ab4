"""The GPM symbols (nvmlGpm*): samples of a GPU's activity counters, and metrics between two samples.

As on a real Hopper GPU a sample is an opaque buffer the caller allocates (nvmlGpmSampleAlloc), fills
(nvmlGpmSampleGet, or nvmlGpmMigSampleGet for one GPU instance) and frees; nvmlGpmMetricsGet takes two
samples of the same device and answers each requested metric with its own nvmlReturn: percentages
0–100 and MiB/s, over the time between the samples. A model without GPM answers isSupportedDevice 0 and
NOT_SUPPORTED to a sample request.
"""

from __future__ import annotations

import ctypes
from ctypes import c_double, c_uint, c_void_p
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pynvml as N

from .symbols import INVALID, NOT_FOUND, NOT_SUPPORTED, OK, VERSION_MISMATCH, device, system, write_handle

if TYPE_CHECKING:
    from .gpu import SimGpu
    from .simulator import SimulatedNvml

MIB = 1024.0 * 1024.0


class GpmSupport(ctypes.Structure):
    _fields_ = [("version", c_uint), ("isSupportedDevice", c_uint)]


class _MetricInfo(ctypes.Structure):
    # pynvml declares these c_char_p; as addresses here, so what we point at is ours to keep alive.
    _fields_ = [("shortName", c_void_p), ("longName", c_void_p), ("unit", c_void_p)]


class _Metric(ctypes.Structure):
    _fields_ = [("metricId", c_uint), ("nvmlReturn", c_uint), ("value", c_double), ("metricInfo", _MetricInfo)]


class MetricsGet(ctypes.Structure):
    _fields_ = [("version", c_uint), ("numMetrics", c_uint), ("sample1", c_void_p), ("sample2", c_void_p),
                ("metrics", _Metric * N.NVML_GPM_METRIC_MAX)]


assert ctypes.sizeof(MetricsGet) == ctypes.sizeof(N.c_nvmlGpmMetricsGet_t)
assert ctypes.sizeof(GpmSupport) == ctypes.sizeof(N.c_nvmlGpmSupport_t)


@dataclass
class Sample:
    """One allocated sample buffer; empty until a SampleGet fills it."""

    buffer: Any
    gpu: int | None = None
    gpu_instance: int | None = None  # None: the whole GPU
    t: float = 0.0
    counters: dict[str, float] | None = None
    links: tuple[tuple[float, float], ...] = ()  # (rx, tx) bytes per NVLink
    share: float = 1.0  # a GPU instance's share of the bandwidth (its slices of 7)


# Activity metrics: id → (counter, scale to percent); the rest are computed in _value.
_ACTIVITY = {
    N.NVML_GPM_METRIC_GRAPHICS_UTIL: "graphics",
    N.NVML_GPM_METRIC_SM_UTIL: "sm",
    N.NVML_GPM_METRIC_SM_OCCUPANCY: "occupancy",
    N.NVML_GPM_METRIC_ANY_TENSOR_UTIL: "tensor",
    N.NVML_GPM_METRIC_HMMA_TENSOR_UTIL: "hmma",
    N.NVML_GPM_METRIC_DRAM_BW_UTIL: "dram",
    N.NVML_GPM_METRIC_FP64_UTIL: "fp64",
    N.NVML_GPM_METRIC_FP32_UTIL: "fp32",
    N.NVML_GPM_METRIC_FP16_UTIL: "fp16",
}
_ZERO_TENSOR = (N.NVML_GPM_METRIC_DFMA_TENSOR_UTIL, N.NVML_GPM_METRIC_DMMA_TENSOR_UTIL,
                N.NVML_GPM_METRIC_IMMA_TENSOR_UTIL)  # training in BF16 issues no FP64 or integer MMA
_BYTES = {N.NVML_GPM_METRIC_PCIE_RX_PER_SEC: "pcie_rx", N.NVML_GPM_METRIC_PCIE_TX_PER_SEC: "pcie_tx"}
_LINK_FIRST = N.NVML_GPM_METRIC_NVLINK_L0_RX_PER_SEC  # then L0 TX, L1 RX, … L17 TX
_LINK_LAST = N.NVML_GPM_METRIC_NVLINK_L17_TX_PER_SEC

# Names and units NVML hands back in metricInfo: static buffers, alive as long as the process.
_TEXT: dict[bytes, ctypes.Array] = {}


def _text(value: bytes) -> int:
    buf = _TEXT.get(value)
    if buf is None:
        buf = _TEXT.setdefault(value, ctypes.create_string_buffer(value))
    return ctypes.addressof(buf)


@device(c_void_p)
def nvmlGpmQueryDeviceSupport(sim: SimulatedNvml, gpu: SimGpu, out: int) -> int:
    if not out:
        return INVALID
    support = GpmSupport.from_address(out)
    if support.version != N.NVML_GPM_SUPPORT_VERSION:
        return VERSION_MISMATCH
    support.isSupportedDevice = int(gpu.spec.has_gpm)
    return OK


@system(c_void_p)
def nvmlGpmSampleAlloc(sim: SimulatedNvml, out: int) -> int:
    if not out:
        return INVALID
    buffer = ctypes.create_string_buffer(16)
    sample = Sample(buffer)
    sim._gpm_samples[ctypes.addressof(buffer)] = sample
    return write_handle(out, ctypes.addressof(buffer))


@system(c_void_p)
def nvmlGpmSampleFree(sim: SimulatedNvml, handle: int | None) -> int:
    return OK if sim._gpm_samples.pop(handle or 0, None) is not None else INVALID


def _fill(sample: Sample, gpu: SimGpu, gpu_instance: int | None, active: bool, share: float) -> int:
    sample.gpu, sample.gpu_instance, sample.t, sample.share = gpu.index, gpu_instance, gpu.t, share
    # An instance with nothing running counts nothing: its counters hold still.
    sample.counters = dict(gpu.activity) if active else None
    sample.links = tuple(zip(gpu.nvlink_rx_bytes, gpu.nvlink_tx_bytes))
    return OK


@device(c_void_p)
def nvmlGpmSampleGet(sim: SimulatedNvml, gpu: SimGpu, handle: int | None) -> int:
    sample = sim._gpm_samples.get(handle or 0)
    if sample is None:
        return INVALID
    if not gpu.spec.has_gpm:
        return NOT_SUPPORTED
    return _fill(sample, gpu, None, True, 1.0)


@device(c_uint, c_void_p)
def nvmlGpmMigSampleGet(sim: SimulatedNvml, gpu: SimGpu, gpu_instance: int, handle: int | None) -> int:
    sample = sim._gpm_samples.get(handle or 0)
    if sample is None:
        return INVALID
    if not gpu.spec.has_gpm:
        return NOT_SUPPORTED
    mig = next((m for m in gpu.mig if m.gpu_instance == gpu_instance), None)
    if mig is None:
        return NOT_FOUND
    return _fill(sample, gpu, gpu_instance, bool(mig.processes), mig.profile.slices / 7.0)


def _value(metric_id: int, a: Sample, b: Sample, dt: float) -> tuple[int, float]:
    """(nvmlReturn, value) of one metric between samples a and b."""
    if metric_id in _ACTIVITY or metric_id in _BYTES:
        key = _ACTIVITY.get(metric_id) or _BYTES[metric_id]
        if a.counters is None or b.counters is None:
            return OK, 0.0  # an idle instance
        delta = (b.counters[key] - a.counters[key]) / dt
        if metric_id in _BYTES:
            return OK, delta * a.share / MIB
        return OK, min(100.0, 100.0 * delta)
    if metric_id in _ZERO_TENSOR:
        return OK, 0.0
    if metric_id in (N.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC, N.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC):
        side = 0 if metric_id == N.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC else 1
        moved = sum(y[side] - x[side] for x, y in zip(a.links, b.links))
        return OK, moved * a.share / dt / MIB
    if _LINK_FIRST <= metric_id <= _LINK_LAST:
        link, side = divmod(metric_id - _LINK_FIRST, 2)
        if link >= len(a.links):
            return NOT_SUPPORTED, 0.0
        return OK, (b.links[link][side] - a.links[link][side]) * a.share / dt / MIB
    if not 0 < metric_id < N.NVML_GPM_METRIC_MAX:
        return INVALID, 0.0
    return NOT_SUPPORTED, 0.0


@system(c_void_p)
def nvmlGpmMetricsGet(sim: SimulatedNvml, out: int) -> int:
    if not out:
        return INVALID
    request = MetricsGet.from_address(out)
    if request.version != N.NVML_GPM_METRICS_GET_VERSION:
        return VERSION_MISMATCH
    a = sim._gpm_samples.get(request.sample1 or 0)
    b = sim._gpm_samples.get(request.sample2 or 0)
    if a is None or b is None or a.gpu is None or b.gpu is None:
        return INVALID
    if (a.gpu, a.gpu_instance) != (b.gpu, b.gpu_instance) or request.numMetrics > N.NVML_GPM_METRIC_MAX:
        return INVALID
    dt = b.t - a.t
    if dt <= 0:
        return INVALID  # the second sample must be taken after the first
    for metric in request.metrics[:request.numMetrics]:
        metric.nvmlReturn, metric.value = _value(metric.metricId, a, b, dt)
        unit = b"MiB/sec" if metric.metricId in _BYTES or metric.metricId >= 60 else b"%"
        metric.metricInfo.shortName = metric.metricInfo.longName = _text(f"metric {metric.metricId}".encode())
        metric.metricInfo.unit = _text(unit)
    return OK
