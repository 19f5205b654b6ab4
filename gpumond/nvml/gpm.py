"""GPU Performance Monitoring (Hopper and later): SM, tensor and DRAM activity and PCIe/NVLink bytes per second.

GPM reports rates between two samples of a GPU's counters. Each GPU keeps two sample buffers: every read
fills the newer one and asks nvmlGpmMetricsGet for the metrics since the previous read, so the two
samples of one fast cycle span exactly one fast interval and cost one nvmlGpmSampleGet. The first read
of a GPU only takes its first sample (no values yet). `release` frees a GPU's buffers: the session calls
it when the GPU is lost, its handle is replaced, or NVML closes. One `GpmSampler` per session.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping
from typing import Any

import pynvml

from gpumond.nvml.reader import Values

# Metric id → the key it is read into (the catalogue's `key` for reader "gpm").
METRICS: Mapping[int, str] = {
    pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: "graphics",
    pynvml.NVML_GPM_METRIC_SM_UTIL: "sm",
    pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: "occupancy",
    pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: "tensor_any",
    pynvml.NVML_GPM_METRIC_HMMA_TENSOR_UTIL: "tensor_hmma",
    pynvml.NVML_GPM_METRIC_IMMA_TENSOR_UTIL: "tensor_imma",
    pynvml.NVML_GPM_METRIC_DMMA_TENSOR_UTIL: "tensor_dmma",
    pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: "dram",
    pynvml.NVML_GPM_METRIC_FP64_UTIL: "fp64",
    pynvml.NVML_GPM_METRIC_FP32_UTIL: "fp32",
    pynvml.NVML_GPM_METRIC_FP16_UTIL: "fp16",
    pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC: "pcie_tx",
    pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC: "pcie_rx",
    pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC: "nvlink_tx",
    pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC: "nvlink_rx",
}
_IDS = tuple(METRICS)


def _key(handle: Any, gpu_instance: int | None = None) -> tuple[int | None, int | None]:
    return ctypes.cast(handle, ctypes.c_void_p).value, gpu_instance


class GpmSampler:
    """Per-GPU (and per GPU instance) pairs of GPM samples, read as rates since the previous read."""

    def __init__(self) -> None:
        self._pairs: dict[tuple[int | None, int | None], list[Any]] = {}  # (handle, gi) → [previous, spare]
        # One request struct, reused: it holds NVML_GPM_METRIC_MAX entries (~30 KB) and only the ids change.
        self._request = pynvml.c_nvmlGpmMetricsGet_t()
        self._request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        self._request.numMetrics = len(_IDS)
        for i, metric_id in enumerate(_IDS):
            self._request.metrics[i].metricId = metric_id

    def read(self, handle: Any) -> Values:
        """The whole GPU's metrics since the last read; NOT_SUPPORTED on a GPU without GPM."""
        return self._read(handle, None)

    def read_mig(self, handle: Any, gpu_instance: int) -> Values:
        """One GPU instance's metrics (nvmlGpmMigSampleGet on the parent's handle)."""
        return self._read(handle, gpu_instance)

    def _read(self, handle: Any, gpu_instance: int | None) -> Values:
        key = _key(handle, gpu_instance)
        pair = self._pairs.get(key)
        if pair is None:
            if not any(k[0] == key[0] for k in self._pairs):  # ask once per GPU, not per instance
                if not pynvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice:
                    raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
            pair = [pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()]
            try:
                self._sample(handle, gpu_instance, pair[0])
            except pynvml.NVMLError:
                _free(pair)
                raise
            self._pairs[key] = pair
            return {}  # one sample so far: the rates start with the next read
        previous, current = pair
        self._sample(handle, gpu_instance, current)
        request = self._request
        request.sample1, request.sample2 = previous, current
        pair[0], pair[1] = current, previous  # this sample is the next read's start
        pynvml.nvmlGpmMetricsGet(request)
        out: dict[str, float] = {}
        for i in range(len(_IDS)):
            metric = request.metrics[i]
            if metric.nvmlReturn == pynvml.NVML_SUCCESS:  # a metric this GPU lacks is left out
                out[METRICS[metric.metricId]] = metric.value
        return out

    @staticmethod
    def _sample(handle: Any, gpu_instance: int | None, sample: Any) -> None:
        if gpu_instance is None:
            pynvml.nvmlGpmSampleGet(handle, sample)
        else:
            pynvml.nvmlGpmMigSampleGet(handle, gpu_instance, sample)

    def release(self, handle: Any) -> None:
        """Free the samples of a GPU (and its instances) whose handle is no longer used."""
        address = _key(handle)[0]
        for key in [k for k in self._pairs if k[0] == address]:
            _free(self._pairs.pop(key))

    def release_all(self) -> None:
        for pair in self._pairs.values():
            _free(pair)
        self._pairs.clear()


def _free(pair: list[Any]) -> None:
    for sample in pair:
        try:
            pynvml.nvmlGpmSampleFree(sample)
        except pynvml.NVMLError:
            pass  # the driver is gone or reset: nothing left to free
