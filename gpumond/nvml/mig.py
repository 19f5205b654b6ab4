"""MIG devices of a MIG-enabled GPU: who they are (identity) and what NVML reports per instance.

NVML answers on a MIG device handle only what belongs to the instance: UUID, name (with the profile),
GPU / compute instance ids, memory, attributes and its processes. Temperature, power, clocks,
utilization, ECC and limits belong to the whole board; they are read on the parent GPU (and
utilization is not reported at all while MIG mode is on).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pynvml

from gpumond.nvml.errors import Disposition, classify

# NVML names a MIG device "<board name> MIG <profile>", e.g. "NVIDIA H100 80GB HBM3 MIG 1g.10gb".
_PROFILE_IN_NAME = re.compile(r"\bMIG (\d+g\.\d+gb(?:\+me)?|\d+c\.\d+g\.\d+gb)\s*$")


@dataclass(frozen=True, slots=True)
class MigIdentity:
    """What names a MIG device in every exported series, with its parent GPU."""

    parent_index: int
    parent_uuid: str
    uuid: str
    gpu_instance: int
    compute_instance: int
    profile: str


def profile_of(name: str, slices: int | None = None, memory_mib: int | None = None) -> str:
    """The MIG profile (`1g.10gb`) from the device name, else from its attributes, else ""."""
    match = _PROFILE_IN_NAME.search(name)
    if match:
        return match.group(1)
    if slices and memory_mib:
        return f"{slices}g.{round(memory_mib / 1000)}gb"  # NVIDIA rounds MiB / 1000: 9856 MiB is "10gb"
    return ""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def discover(handle: Any, parent_index: int, parent_uuid: str,
             nvml: Any = pynvml) -> list[tuple[MigIdentity, Any]]:
    """(identity, handle) of each MIG device on a GPU; [] when MIG mode is off or unsupported.

    Raises pynvml.NVMLError only when the parent is lost or the driver is gone (the caller's policy).
    """
    def fatal(e: pynvml.NVMLError) -> bool:
        return classify(e) in (Disposition.GPU_LOST, Disposition.DRIVER_MISMATCH, Disposition.NOT_INITIALISED)

    try:
        current, _pending = nvml.nvmlDeviceGetMigMode(handle)
        if current != pynvml.NVML_DEVICE_MIG_ENABLE:
            return []
        slots = nvml.nvmlDeviceGetMaxMigDeviceCount(handle)
    except pynvml.NVMLError as e:
        if fatal(e):
            raise
        return []
    out = []
    for slot in range(slots):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            uuid = _text(nvml.nvmlDeviceGetUUID(mig))
            gi = int(nvml.nvmlDeviceGetGpuInstanceId(mig))
            ci = int(nvml.nvmlDeviceGetComputeInstanceId(mig))
        except pynvml.NVMLError as e:
            if fatal(e):
                raise
            continue  # NOT_FOUND: a free slot; anything else: this instance is unreadable now
        out.append((MigIdentity(parent_index, parent_uuid, uuid, gi, ci, _profile(nvml, mig)), mig))
    return out


def _profile(nvml: Any, mig: Any) -> str:
    name = ""
    try:
        name = _text(nvml.nvmlDeviceGetName(mig))
    except pynvml.NVMLError:
        pass
    found = profile_of(name)
    if found:
        return found
    try:
        attrs = nvml.nvmlDeviceGetAttributes(mig)
        return profile_of(name, attrs.gpuInstanceSliceCount, attrs.memorySizeMB)
    except pynvml.NVMLError:
        return ""


def read_memory(mig: Any, nvml: Any = pynvml) -> tuple[float, float] | None:
    """(used, total) bytes of one MIG device, or None if it cannot be read now."""
    getter: Callable[..., Any] = nvml.nvmlDeviceGetMemoryInfo
    try:
        memory = getter(mig, version=pynvml.nvmlMemory_v2)
    except pynvml.NVMLError as e:
        if classify(e) is not Disposition.MISSING_SYMBOL:
            raise
        memory = getter(mig)  # drivers before the v2 struct
    return float(memory.used), float(memory.total)
