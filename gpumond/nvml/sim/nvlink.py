"""The NVLink symbols: per-link state, version and error counters, and the NVLink field values.

Throughput is NVML's field values NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_/RAW_ TX/RX with the link as scopeId
(KiB since the driver loaded); the error totals (fields 38, 45, 52, 59) sum every link. A link index past
the model's links is INVALID_ARGUMENT.
"""

from __future__ import annotations

from ctypes import c_uint
from typing import TYPE_CHECKING, Any

import pynvml as N

from .symbols import INVALID, NOT_SUPPORTED, OK, UINT, UINT_P, ULL, ULL_P, device

if TYPE_CHECKING:
    from .gpu import SimGpu
    from .simulator import SimulatedNvml

_COUNTERS = {N.NVML_NVLINK_ERROR_DL_REPLAY: "replay", N.NVML_NVLINK_ERROR_DL_RECOVERY: "recovery",
             N.NVML_NVLINK_ERROR_DL_CRC_FLIT: "crc_flit", N.NVML_NVLINK_ERROR_DL_CRC_DATA: "crc_data"}
_TOTALS = {N.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL: "replay",
           N.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL: "recovery",
           N.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL: "crc_flit",
           N.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL: "crc_data"}
RAW_OVERHEAD = 1.06  # protocol headers on top of the payload


def _link(gpu: SimGpu, link: int) -> int:
    if not gpu.spec.nvlink_links:
        return NOT_SUPPORTED
    return OK if 0 <= link < gpu.spec.nvlink_links else INVALID


@device(c_uint, UINT_P)
def nvmlDeviceGetNvLinkState(sim: SimulatedNvml, gpu: SimGpu, link: int, out: Any) -> int:
    code = _link(gpu, link)
    if not code:
        out[0] = int(gpu.nvlink_up[link])  # NVML_FEATURE_ENABLED while the link is active
    return code


@device(c_uint, UINT_P)
def nvmlDeviceGetNvLinkVersion(sim: SimulatedNvml, gpu: SimGpu, link: int, out: Any) -> int:
    code = _link(gpu, link)
    if not code:
        out[0] = gpu.spec.nvlink_version
    return code


@device(c_uint, c_uint, ULL_P)
def nvmlDeviceGetNvLinkErrorCounter(sim: SimulatedNvml, gpu: SimGpu, link: int, counter: int, out: Any) -> int:
    code = _link(gpu, link)
    if code:
        return code
    if counter == N.NVML_NVLINK_ERROR_DL_ECC_DATA:
        return NOT_SUPPORTED  # Hopper reports no NVLink data ECC counter here
    if counter not in _COUNTERS:
        return INVALID
    out[0] = int(gpu.nvlink_errors[link][_COUNTERS[counter]])
    return OK


def nvlink_field(gpu: SimGpu, field_id: int, scope: int) -> tuple[int, int, int] | None:
    """(nvmlReturn, valueType, value) of an NVLink field; None for any other field."""
    links = gpu.spec.nvlink_links
    if field_id == N.NVML_FI_DEV_NVLINK_LINK_COUNT:
        return (OK, UINT, links) if links else (NOT_SUPPORTED, UINT, 0)
    if field_id in _TOTALS:
        if not links:
            return NOT_SUPPORTED, ULL, 0
        return OK, ULL, int(sum(e[_TOTALS[field_id]] for e in gpu.nvlink_errors))
    if N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX <= field_id <= N.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX:
        if not links:
            return NOT_SUPPORTED, ULL, 0
        if scope >= links:
            return INVALID, ULL, 0
        offset = field_id - N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX  # DATA_TX, DATA_RX, RAW_TX, RAW_RX
        moved = (gpu.nvlink_tx_bytes if offset % 2 == 0 else gpu.nvlink_rx_bytes)[scope]
        if offset >= 2:
            moved *= RAW_OVERHEAD
        return OK, ULL, int(moved / 1024)
    return None

