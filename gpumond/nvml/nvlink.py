"""NVLink reads: per-link state, data throughput counters and error counters, keyed `<what>@<link>`, with
their sums over links as `<what>_total`.

A key `x@N` is exported by the catalogue row with key `x@link`, labelled `link="N"` (see gpu_series). The link
state is always exported per link; the counters as per-GPU totals (fields.csv), and per link only with
`exposition.nvlink_per_link` (nvlink_links.csv, under their own metric names): per-link counters more than double
an 8-GPU node's exposition (benchmarks/results/agent_sample_cycle.md). The agent's NVLink alerts read them per
link whatever is exported. The links are counted once per read with the field NVML_FI_DEV_NVLINK_LINK_COUNT; a
GPU without NVLink answers NOT_SUPPORTED there, and its NVLink readers are left out like any unsupported reader.
"""

from __future__ import annotations

from typing import Any

import pynvml

from gpumond.nvml.reader import Values, field_value

ERROR_COUNTERS = (
    ("replay", pynvml.NVML_NVLINK_ERROR_DL_REPLAY),
    ("recovery", pynvml.NVML_NVLINK_ERROR_DL_RECOVERY),
    ("crc_flit", pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT),
    ("crc_data", pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA),
)


def link_count(h: Any) -> int:
    (entry,) = pynvml.nvmlDeviceGetFieldValues(h, [pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT])
    if entry.nvmlReturn != pynvml.NVML_SUCCESS:
        raise pynvml.NVMLError(entry.nvmlReturn)
    return int(field_value(entry))


def read_state(h: Any) -> Values:
    """up@N: 1 while link N is active."""
    return {f"up@{link}": float(pynvml.nvmlDeviceGetNvLinkState(h, link)) for link in range(link_count(h))}


def read_throughput(h: Any) -> Values:
    """tx@N, rx@N: data KiB sent / received on link N since the driver loaded (one batched call), and
    tx_total, rx_total over the links."""
    links = link_count(h)
    ids = [(f, link) for link in range(links)
           for f in (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX)]
    out: dict[str, float] = {}
    for entry in pynvml.nvmlDeviceGetFieldValues(h, ids):
        ret = entry.nvmlReturn
        if ret == pynvml.NVML_SUCCESS:
            side = "tx" if entry.fieldId == pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX else "rx"
            value = field_value(entry)
            out[f"{side}@{entry.scopeId}"] = value
            out[f"{side}_total"] = out.get(f"{side}_total", 0.0) + value
        elif ret == pynvml.NVML_ERROR_GPU_IS_LOST:
            raise pynvml.NVMLError(ret)
    if not out:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
    return out


def read_errors(h: Any) -> Values:
    """replay@N, recovery@N, crc_flit@N, crc_data@N per link, and their sums over links as <name>_total."""
    out: dict[str, float] = {}
    for link in range(link_count(h)):
        for name, counter in ERROR_COUNTERS:
            try:
                value = float(pynvml.nvmlDeviceGetNvLinkErrorCounter(h, link, counter))
            except pynvml.NVMLError_NotSupported:
                continue  # a counter this link lacks is left out, the others still count
            out[f"{name}@{link}"] = value
            out[f"{name}_total"] = out.get(f"{name}_total", 0.0) + value
    if not out:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
    return out
