"""The ctypes layer: NVML C symbols as CFUNCTYPE callbacks over a SimulatedNvml.

pynvml resolves every symbol with getattr(nvmlLib, name) and calls it with ctypes
arguments, so an object whose attributes are C function pointers is a complete stand-in
for libnvidia-ml: pynvml's real wrappers, structs and NVMLError classes all run.

Argument types follow pynvml's calls exactly: a scalar it passes by reference is declared
POINTER(that type) (ctypes checks it, and writing p[0] is cheapest); opaque handles, string
buffers, structs and arrays are declared c_void_p and accessed at that address through
plain mirrors of pynvml's struct layouts. Every callback catches its own exceptions: one escaping into ctypes would hand
pynvml a garbage return code.
"""

from __future__ import annotations

import ctypes
import logging
import time
from collections.abc import Callable
from ctypes import CFUNCTYPE, c_char_p, c_int32, c_uint, c_ulonglong, c_void_p
from typing import TYPE_CHECKING, Any

import pynvml as N

# gpm and nvlink implement their own symbols, registered on import (like this module's) in `symbols`' tables.
from . import gpm, nvlink, physics  # noqa: F401 - gpm is imported for its registrations
from .models import CUDA_DRIVER_VERSION, DRIVER_VERSION, NVML_VERSION
from .symbols import (
    DEVICE,
    INSUFFICIENT_SIZE,
    INT_P,
    INVALID,
    LOST,
    MIG,
    NO_PERMISSION,
    NOT_FOUND,
    NOT_SUPPORTED,
    OK,
    SYSTEM,
    UINT,
    UINT_P,
    ULL,
    ULL_P,
    UNKNOWN,
    VERSION_MISMATCH,
    device,
    on_mig,
    system,
    write_handle,
)

if TYPE_CHECKING:
    from .gpu import SimGpu, SimMigDevice
    from .simulator import SimulatedNvml

log = logging.getLogger("gpumond.nvml.sim")



def _mirror(struct: type[ctypes.Structure]) -> type[ctypes.Structure]:
    """A plain ctypes Structure with the layout of one of pynvml's structs.

    pynvml's structs override __setattr__/__getattribute__ for pretty printing, which makes
    each field write cost ~1 µs; the callbacks write through these mirrors instead.
    """
    mirror = type("Sim" + struct.__name__, (ctypes.Structure,), {"_fields_": list(struct._fields_)})
    assert ctypes.sizeof(mirror) == ctypes.sizeof(struct), struct.__name__
    return mirror


PciInfo = _mirror(N.nvmlPciInfo_t)
TemperatureV1 = _mirror(N.c_nvmlTemperature_v1_t)
PowerValueV2 = _mirror(N.c_nvmlPowerValue_v2_t)
Utilization = _mirror(N.c_nvmlUtilization_t)
Memory = _mirror(N.c_nvmlMemory_t)
MemoryV2 = _mirror(N.c_nvmlMemory_v2_t)
FieldValue = _mirror(N.c_nvmlFieldValue_t)
ProcessInfoV3 = _mirror(N.c_nvmlProcessInfo_v3_t)
EventData = _mirror(N.c_nvmlEventData_t)
DeviceAttributes = _mirror(N.c_nvmlDeviceAttributes)

def _put_string(address: int | None, length: int, text: str) -> int:
    data = text.encode() + b"\0"
    if not address:
        return INVALID
    if length < len(data):
        return INSUFFICIENT_SIZE
    ctypes.memmove(address, data, len(data))
    return OK


# ---- library, init and system -----------------------------------------------------------
@system(c_uint, needs_init=False, names=("nvmlInitWithFlags",))
def _init_with_flags(sim: SimulatedNvml, flags: int = 0) -> int:
    if sim.init_error_code:
        return sim.init_error_code
    code = sim._system_call("nvmlInitWithFlags", needs_init=False)
    if code:
        return code
    sim._init_count += 1
    return OK


@system(needs_init=False)
def nvmlInit_v2(sim: SimulatedNvml) -> int:
    return _init_with_flags(sim, 0)


@system(needs_init=False)
def nvmlShutdown(sim: SimulatedNvml) -> int:
    if not sim._init_count:
        return N.NVML_ERROR_UNINITIALIZED
    sim._init_count -= 1
    return OK


@system(c_void_p, c_uint)
def nvmlSystemGetDriverVersion(sim: SimulatedNvml, buf: int, length: int) -> int:
    return _put_string(buf, length, DRIVER_VERSION)


@system(c_void_p, c_uint)
def nvmlSystemGetNVMLVersion(sim: SimulatedNvml, buf: int, length: int) -> int:
    return _put_string(buf, length, NVML_VERSION)


@system(INT_P, names=("nvmlSystemGetCudaDriverVersion", "nvmlSystemGetCudaDriverVersion_v2"))
def _cuda_driver_version(sim: SimulatedNvml, out: Any) -> int:
    out[0] = CUDA_DRIVER_VERSION
    return OK


@system(UINT_P)
def nvmlDeviceGetCount_v2(sim: SimulatedNvml, out: Any) -> int:
    out[0] = len(sim._gpus)
    return OK


def _handle_of(gpu: SimGpu | None, out: int | None) -> int:
    if gpu is None:
        return NOT_FOUND
    if gpu.lost:
        return LOST  # as nvidia-smi: "Unable to determine the device handle ...: GPU is lost"
    return write_handle(out, gpu.handle)


@system(c_uint, c_void_p)
def nvmlDeviceGetHandleByIndex_v2(sim: SimulatedNvml, index: int, out: int) -> int:
    if index >= len(sim._gpus):
        return INVALID
    return _handle_of(sim._gpus[index], out)


@system(c_char_p, c_void_p)
def nvmlDeviceGetHandleByUUID(sim: SimulatedNvml, uuid: bytes | None, out: int) -> int:
    wanted = (uuid or b"").decode(errors="replace")
    return _handle_of(next((g for g in sim._gpus if g.uuid == wanted), None), out)


def _bus_id_key(text: str) -> tuple[int, ...] | None:
    """(domain, bus, device, function) of "00000000:18:00.0" or the legacy "0000:18:00.0"."""
    try:
        return tuple(int(part, 16) for part in text.replace(".", ":").split(":"))
    except ValueError:
        return None


@system(c_char_p, c_void_p)
def nvmlDeviceGetHandleByPciBusId_v2(sim: SimulatedNvml, bus_id: bytes | None, out: int) -> int:
    wanted = _bus_id_key((bus_id or b"").decode(errors="replace"))
    return _handle_of(next((g for g in sim._gpus if _bus_id_key(g.pci_bus_id) == wanted), None), out)


@system(c_char_p, c_void_p)
def nvmlDeviceGetHandleBySerial(sim: SimulatedNvml, serial: bytes | None, out: int) -> int:
    wanted = (serial or b"").decode(errors="replace")
    return _handle_of(next((g for g in sim._gpus if g.serial == wanted), None), out)


@system(c_void_p)
def nvmlEventSetCreate(sim: SimulatedNvml, out: int) -> int:
    return write_handle(out, sim._hub.create().handle)


@system(c_void_p)
def nvmlEventSetFree(sim: SimulatedNvml, set_handle: int | None) -> int:
    return OK if sim._hub.free(set_handle) else INVALID


# ---- identity ---------------------------------------------------------------------------
@on_mig("nvmlDeviceGetName")
@device(c_void_p, c_uint)
def nvmlDeviceGetName(sim: SimulatedNvml, gpu: SimGpu | SimMigDevice, buf: int, length: int) -> int:
    return _put_string(buf, length, gpu.name)


@on_mig("nvmlDeviceGetUUID")
@device(c_void_p, c_uint)
def nvmlDeviceGetUUID(sim: SimulatedNvml, gpu: SimGpu | SimMigDevice, buf: int, length: int) -> int:
    return _put_string(buf, length, gpu.uuid)


@device(c_void_p, c_uint)
def nvmlDeviceGetSerial(sim: SimulatedNvml, gpu: SimGpu, buf: int, length: int) -> int:
    return _put_string(buf, length, gpu.serial)


@device(c_void_p)
def nvmlDeviceGetPciInfo_v3(sim: SimulatedNvml, gpu: SimGpu, out: int) -> int:
    info = PciInfo.from_address(out)
    info.busIdLegacy = f"0000:{gpu.pci_bus:02X}:00.0".encode()
    info.domain = 0
    info.bus = gpu.pci_bus
    info.device = 0
    info.pciDeviceId = gpu.spec.pci_device_id
    info.pciSubSystemId = gpu.spec.pci_subsystem_id
    info.busId = gpu.pci_bus_id.encode()
    return OK


@device(UINT_P, names=("nvmlDeviceGetIndex", "nvmlDeviceGetMinorNumber"))
def _index(sim: SimulatedNvml, gpu: SimGpu, out: Any) -> int:
    out[0] = gpu.index
    return OK


@device(UINT_P)
def nvmlDeviceGetArchitecture(sim: SimulatedNvml, gpu: SimGpu, out: Any) -> int:
    out[0] = gpu.spec.architecture
    return OK


@device(INT_P, INT_P)
def nvmlDeviceGetCudaComputeCapability(sim: SimulatedNvml, gpu: SimGpu, major: Any, minor: Any) -> int:
    major[0], minor[0] = gpu.spec.compute_capability
    return OK


@device(UINT_P)
def nvmlDeviceGetBrand(sim: SimulatedNvml, gpu: SimGpu, out: Any) -> int:
    out[0] = gpu.spec.brand
    return OK


@device(UINT_P)
def nvmlDeviceGetPersistenceMode(sim: SimulatedNvml, gpu: SimGpu, out: Any) -> int:
    out[0] = N.NVML_FEATURE_ENABLED  # what a training node runs with
    return OK


@device(UINT_P)
def nvmlDeviceGetPerformanceState(sim: SimulatedNvml, gpu: SimGpu, out: Any) -> int:
    out[0] = 0  # P0: persistence mode keeps datacenter GPUs in P0
    return OK


@device(UINT_P, UINT_P)
def nvmlDeviceGetEccMode(sim: SimulatedNvml, gpu: SimGpu, current: Any, pending: Any) -> int:
    current[0] = pending[0] = N.NVML_FEATURE_ENABLED
    return OK


@device(UINT_P, UINT_P)
def nvmlDeviceGetMigMode(sim: SimulatedNvml, gpu: SimGpu, current: Any, pending: Any) -> int:
    if not gpu.spec.has_mig:
        return NOT_SUPPORTED
    current[0] = pending[0] = N.NVML_DEVICE_MIG_ENABLE if gpu.mig_enabled else N.NVML_DEVICE_MIG_DISABLE
    return OK


# ---- MIG ----------------------------------------------------------------------------------
@device(UINT_P)
def nvmlDeviceGetMaxMigDeviceCount(sim: SimulatedNvml, gpu: SimGpu, out: Any) -> int:
    if not gpu.spec.has_mig:
        return NOT_SUPPORTED
    out[0] = 7 if gpu.mig_enabled else 0  # one MIG device per compute slice at most
    return OK


@device(c_uint, c_void_p)
def nvmlDeviceGetMigDeviceHandleByIndex(sim: SimulatedNvml, gpu: SimGpu, index: int, out: int) -> int:
    if not gpu.spec.has_mig:
        return NOT_SUPPORTED
    if index >= 7:
        return INVALID
    if index >= len(gpu.mig):
        return NOT_FOUND  # a free slot: callers walk 0..max-1 and skip these
    return write_handle(out, gpu.mig[index].handle)


@device(UINT_P)
def nvmlDeviceIsMigDeviceHandle(sim: SimulatedNvml, gpu: SimGpu, out: Any) -> int:
    out[0] = 0
    return OK


@on_mig("nvmlDeviceIsMigDeviceHandle")
def _mig_is_mig(sim: SimulatedNvml, mig: SimMigDevice, out: Any) -> int:
    out[0] = 1
    return OK


@device(UINT_P, names=("nvmlDeviceGetGpuInstanceId", "nvmlDeviceGetComputeInstanceId"))
def _instance_id_of_gpu(sim: SimulatedNvml, gpu: SimGpu, out: Any) -> int:
    return INVALID  # only a MIG device handle has instance ids


@on_mig("nvmlDeviceGetGpuInstanceId")
def _mig_gpu_instance(sim: SimulatedNvml, mig: SimMigDevice, out: Any) -> int:
    out[0] = mig.gpu_instance
    return OK


@on_mig("nvmlDeviceGetComputeInstanceId")
def _mig_compute_instance(sim: SimulatedNvml, mig: SimMigDevice, out: Any) -> int:
    out[0] = mig.compute_instance
    return OK


@device(c_void_p)
def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(sim: SimulatedNvml, gpu: SimGpu, out: int) -> int:
    return INVALID  # given a parent handle


@on_mig("nvmlDeviceGetDeviceHandleFromMigDeviceHandle")
def _mig_parent(sim: SimulatedNvml, mig: SimMigDevice, out: int) -> int:
    return write_handle(out, mig.parent.handle)


def _attributes(out: int, sms: int, gi_slices: int, memory_mib: int) -> int:
    attrs = DeviceAttributes.from_address(out)
    attrs.multiprocessorCount = sms
    attrs.sharedCopyEngineCount = max(1, gi_slices)
    attrs.sharedDecoderCount = attrs.sharedEncoderCount = attrs.sharedJpegCount = attrs.sharedOfaCount = 0
    attrs.gpuInstanceSliceCount = gi_slices
    attrs.computeInstanceSliceCount = gi_slices
    attrs.memorySizeMB = memory_mib
    return OK


@device(c_void_p)
def nvmlDeviceGetAttributes_v2(sim: SimulatedNvml, gpu: SimGpu, out: int) -> int:
    full = gpu.spec.mig_profiles.get("7g.80gb")
    return _attributes(out, full.sm_count if full else 0, 7 if full else 0, gpu.spec.memory_total_mib)


@on_mig("nvmlDeviceGetAttributes_v2")
def _mig_attributes(sim: SimulatedNvml, mig: SimMigDevice, out: int) -> int:
    p = mig.profile
    return _attributes(out, p.sm_count, p.slices, p.memory_mib)


@device(UINT_P)
def nvmlDeviceGetFanSpeed(sim: SimulatedNvml, gpu: SimGpu, out: Any) -> int:
    return NOT_SUPPORTED  # SXM modules have no fan of their own; the chassis cools them


# ---- thermal ----------------------------------------------------------------------------
@device(c_uint, UINT_P)
def nvmlDeviceGetTemperature(sim: SimulatedNvml, gpu: SimGpu, sensor: int, out: Any) -> int:
    if sensor != N.NVML_TEMPERATURE_GPU:
        return INVALID
    out[0] = round(gpu.temperature_c)
    return OK


@device(c_void_p)
def nvmlDeviceGetTemperatureV(sim: SimulatedNvml, gpu: SimGpu, out: int) -> int:
    if not gpu.spec.has_temperature_v:
        return NOT_SUPPORTED
    request = TemperatureV1.from_address(out)
    if request.version != N.nvmlTemperature_v1:
        return VERSION_MISMATCH
    if request.sensorType != N.NVML_TEMPERATURE_GPU:
        return INVALID
    request.temperature = round(gpu.temperature_c)
    return OK


@device(c_uint, UINT_P)
def nvmlDeviceGetTemperatureThreshold(sim: SimulatedNvml, gpu: SimGpu, which: int, out: Any) -> int:
    spec = gpu.spec
    value = {N.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: spec.shutdown_c,
             N.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: spec.slowdown_c,
             N.NVML_TEMPERATURE_THRESHOLD_GPU_MAX: spec.gpu_max_c,
             N.NVML_TEMPERATURE_THRESHOLD_MEM_MAX: spec.mem_max_c}.get(which)
    if which >= N.NVML_TEMPERATURE_THRESHOLD_COUNT:
        return INVALID
    if value is None:
        return NOT_SUPPORTED  # acoustic thresholds, or MEM_MAX without an HBM sensor
    out[0] = value
    return OK


# ---- power ------------------------------------------------------------------------------
@device(UINT_P)
def nvmlDeviceGetPowerUsage(sim: SimulatedNvml, gpu: SimGpu, out: Any) -> int:
    out[0] = int(gpu.power_avg_w * 1000.0)
    return OK


@device(ULL_P)
def nvmlDeviceGetTotalEnergyConsumption(sim: SimulatedNvml, gpu: SimGpu, out: Any) -> int:
    out[0] = int(gpu.energy_j * 1000.0)
    return OK


@device(UINT_P, names=("nvmlDeviceGetPowerManagementLimit", "nvmlDeviceGetEnforcedPowerLimit"))
def _power_limit(sim: SimulatedNvml, gpu: SimGpu, out: Any) -> int:
    out[0] = int(round(gpu.power_limit_w * 1000.0))
    return OK


@device(UINT_P)
def nvmlDeviceGetPowerManagementDefaultLimit(sim: SimulatedNvml, gpu: SimGpu, out: Any) -> int:
    out[0] = int(gpu.spec.power_default_w * 1000.0)
    return OK


@device(UINT_P, UINT_P)
def nvmlDeviceGetPowerManagementLimitConstraints(sim: SimulatedNvml, gpu: SimGpu, lo: Any, hi: Any) -> int:
    lo[0] = int(gpu.spec.power_min_w * 1000.0)
    hi[0] = int(gpu.spec.power_max_w * 1000.0)
    return OK


def _set_limit(sim: SimulatedNvml, gpu: SimGpu, milliwatts: int) -> int:
    if not sim.allow_set or gpu.no_permission_on_set:
        return NO_PERMISSION  # the real driver: caller lacks CAP_SYS_ADMIN
    if not gpu.spec.power_min_w * 1000.0 <= milliwatts <= gpu.spec.power_max_w * 1000.0:
        return INVALID
    gpu.set_power_limit(milliwatts / 1000.0)
    return OK


@device(c_uint)
def nvmlDeviceSetPowerManagementLimit(sim: SimulatedNvml, gpu: SimGpu, milliwatts: int) -> int:
    return _set_limit(sim, gpu, milliwatts)


@device(c_void_p)
def nvmlDeviceSetPowerManagementLimit_v2(sim: SimulatedNvml, gpu: SimGpu, value: int) -> int:
    request = PowerValueV2.from_address(value)
    if request.version != N.nvmlPowerValue_v2:
        return VERSION_MISMATCH
    if request.powerScope != N.NVML_POWER_SCOPE_GPU:
        return NOT_SUPPORTED  # module / memory scopes exist on Grace Hopper boards only
    return _set_limit(sim, gpu, request.powerValueMw)


# ---- clocks and utilization ---------------------------------------------------------------
@device(c_uint, UINT_P)
def nvmlDeviceGetClockInfo(sim: SimulatedNvml, gpu: SimGpu, clock_type: int, out: Any) -> int:
    spec = gpu.spec
    if clock_type in (N.NVML_CLOCK_SM, N.NVML_CLOCK_GRAPHICS):
        out[0] = round(gpu.sm_clock_mhz)
    elif clock_type == N.NVML_CLOCK_MEM:
        out[0] = spec.mem_clock_mhz  # HBM does not scale with load
    elif clock_type == N.NVML_CLOCK_VIDEO:
        out[0] = round(spec.video_max_mhz * gpu.sm_clock_mhz / spec.sm_max_mhz)
    else:
        return INVALID
    return OK


@device(c_uint, UINT_P)
def nvmlDeviceGetMaxClockInfo(sim: SimulatedNvml, gpu: SimGpu, clock_type: int, out: Any) -> int:
    spec = gpu.spec
    value = {N.NVML_CLOCK_SM: spec.sm_max_mhz, N.NVML_CLOCK_GRAPHICS: spec.sm_max_mhz,
             N.NVML_CLOCK_MEM: spec.mem_clock_mhz, N.NVML_CLOCK_VIDEO: spec.video_max_mhz}.get(clock_type)
    if value is None:
        return INVALID
    out[0] = value
    return OK


@device(c_void_p)
def nvmlDeviceGetUtilizationRates(sim: SimulatedNvml, gpu: SimGpu, out: int) -> int:
    if gpu.mig_enabled:
        return NOT_SUPPORTED  # nvidia-smi shows N/A: utilization is not counted in MIG mode
    rates = Utilization.from_address(out)
    rates.gpu = round(gpu.utilization * 100.0)
    rates.memory = round(gpu.memory_utilization * 100.0)
    return OK


# The sampling period the driver reports beside a video engine's utilization, in microseconds.
VIDEO_SAMPLING_PERIOD_US = 1_000_000


def _video_utilization(gpu: SimGpu, engine: int, out: Any, period_us: Any) -> int:
    if gpu.mig_enabled:
        return NOT_SUPPORTED  # as for the utilization rates: not counted for the board in MIG mode
    out[0] = round(gpu.video_utilization[engine] * 100.0)
    period_us[0] = VIDEO_SAMPLING_PERIOD_US
    return OK


@device(UINT_P, UINT_P)
def nvmlDeviceGetEncoderUtilization(sim: SimulatedNvml, gpu: SimGpu, out: Any, period_us: Any) -> int:
    return _video_utilization(gpu, 0, out, period_us)


@device(UINT_P, UINT_P)
def nvmlDeviceGetDecoderUtilization(sim: SimulatedNvml, gpu: SimGpu, out: Any, period_us: Any) -> int:
    return _video_utilization(gpu, 1, out, period_us)


@device(ULL_P, names=("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"))
def _clock_event_reasons(sim: SimulatedNvml, gpu: SimGpu, out: Any) -> int:
    out[0] = gpu.clock_event_reasons
    return OK


# ---- memory -----------------------------------------------------------------------------
@on_mig("nvmlDeviceGetMemoryInfo", "nvmlDeviceGetMemoryInfo_v2")
def _mig_memory(sim: SimulatedNvml, mig: SimMigDevice, out: int) -> int:
    if MemoryV2.from_address(out).version == N.nvmlMemory_v2:
        memory = MemoryV2.from_address(out)
        memory.reserved = 0
    else:
        memory = Memory.from_address(out)
    memory.total = mig.memory_total_bytes
    memory.used = mig.memory_used_bytes
    memory.free = memory.total - memory.used
    return OK


@device(c_void_p)
def nvmlDeviceGetMemoryInfo(sim: SimulatedNvml, gpu: SimGpu, out: int) -> int:
    memory = Memory.from_address(out)
    memory.total = gpu.memory_total_bytes
    memory.used = gpu.memory_reserved_bytes + gpu.memory_used_bytes  # v1 counts reserved as used
    memory.free = memory.total - memory.used
    return OK


@device(c_void_p)
def nvmlDeviceGetMemoryInfo_v2(sim: SimulatedNvml, gpu: SimGpu, out: int) -> int:
    memory = MemoryV2.from_address(out)
    if memory.version != N.nvmlMemory_v2:
        return VERSION_MISMATCH
    memory.total = gpu.memory_total_bytes
    memory.reserved = gpu.memory_reserved_bytes
    memory.used = gpu.memory_used_bytes
    memory.free = memory.total - memory.reserved - memory.used
    return OK


# ---- health counters --------------------------------------------------------------------
@device(c_uint, c_uint, ULL_P)
def nvmlDeviceGetTotalEccErrors(sim: SimulatedNvml, gpu: SimGpu, error_type: int, counter: int, out: Any) -> int:
    kind = {N.NVML_MEMORY_ERROR_TYPE_CORRECTED: "corrected",
            N.NVML_MEMORY_ERROR_TYPE_UNCORRECTED: "uncorrected"}.get(error_type)
    scope = {N.NVML_VOLATILE_ECC: "volatile", N.NVML_AGGREGATE_ECC: "aggregate"}.get(counter)
    if kind is None or scope is None:
        return INVALID
    out[0] = gpu.ecc[(kind, scope)]
    return OK


@device(UINT_P, UINT_P, UINT_P, UINT_P)
def nvmlDeviceGetRemappedRows(sim: SimulatedNvml, gpu: SimGpu, corr: Any, unc: Any, pending: Any, failure: Any) -> int:
    if not gpu.spec.has_remapped_rows:
        return NOT_SUPPORTED
    corr[0] = gpu.remapped_correctable
    unc[0] = gpu.remapped_uncorrectable
    pending[0] = int(gpu.remap_pending)
    failure[0] = int(gpu.remap_failure)
    return OK


def _retired_pages(gpu: SimGpu, cause: int, count: Any, addresses: Any, times: Any) -> int:
    if not gpu.spec.has_retired_pages:
        return NOT_SUPPORTED
    pages = [p for p in gpu.retired_pages if p[1] == cause]
    if count[0] < len(pages):  # the two-call protocol: report the size first
        count[0] = len(pages)
        return INSUFFICIENT_SIZE
    if pages and not addresses:
        return INVALID
    for i, (address, _, stamp) in enumerate(pages):
        addresses[i] = address
        if times is not None:
            times[i] = stamp
    count[0] = len(pages)
    return OK


@device(c_uint, UINT_P, ULL_P)
def nvmlDeviceGetRetiredPages(sim: SimulatedNvml, gpu: SimGpu, cause: int, count: Any, addresses: Any) -> int:
    return _retired_pages(gpu, cause, count, addresses, None)


# pynvml's size query passes only four arguments to this five-argument function (C does
# not check); the fifth, the timestamps array, is only touched when pages are written.
@device(c_uint, UINT_P, ULL_P, ULL_P, required=3)
def nvmlDeviceGetRetiredPages_v2(sim: SimulatedNvml, gpu: SimGpu, cause: int, count: Any,
                                 addresses: Any, times: Any) -> int:
    return _retired_pages(gpu, cause, count, addresses, times if times else None)


@device(UINT_P)
def nvmlDeviceGetPcieReplayCounter(sim: SimulatedNvml, gpu: SimGpu, out: Any) -> int:
    out[0] = gpu.pcie_replay
    return OK


# ---- field values -------------------------------------------------------------------------
_VIOLATION_FIELDS = {
    N.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP: physics.REASON_SW_POWER_CAP,
    N.NVML_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST: physics.REASON_SYNC_BOOST,
    N.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN: physics.REASON_SW_THERMAL,
    N.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN: physics.REASON_HW_THERMAL,
    N.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN: physics.REASON_HW_POWER_BRAKE,
}
_ECC_FIELDS = {
    N.NVML_FI_DEV_ECC_SBE_VOL_TOTAL: ("corrected", "volatile"),
    N.NVML_FI_DEV_ECC_DBE_VOL_TOTAL: ("uncorrected", "volatile"),
    N.NVML_FI_DEV_ECC_SBE_AGG_TOTAL: ("corrected", "aggregate"),
    N.NVML_FI_DEV_ECC_DBE_AGG_TOTAL: ("uncorrected", "aggregate"),
}



def _field(gpu: SimGpu, field_id: int, scope: int) -> tuple[int, int, int]:
    """(nvmlReturn, valueType, value) of one field."""
    spec = gpu.spec
    answer = nvlink.nvlink_field(gpu, field_id, scope)  # the NVLink fields are nvlink.py's
    if answer is not None:
        return answer
    if field_id in _VIOLATION_FIELDS:
        return OK, ULL, int(gpu.violation_ns[_VIOLATION_FIELDS[field_id]])
    if field_id in (N.NVML_FI_DEV_POWER_AVERAGE, N.NVML_FI_DEV_POWER_INSTANT):
        if not spec.has_power_fields or scope != N.NVML_POWER_SCOPE_GPU:
            return NOT_SUPPORTED, UINT, 0
        watts = gpu.power_avg_w if field_id == N.NVML_FI_DEV_POWER_AVERAGE else gpu.power_w
        return OK, UINT, int(watts * 1000.0)
    if field_id == N.NVML_FI_DEV_MEMORY_TEMP:
        memory_c = gpu.memory_temperature_c
        return (NOT_SUPPORTED, UINT, 0) if memory_c is None else (OK, UINT, round(memory_c))
    if field_id == N.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION:
        return OK, ULL, int(gpu.energy_j * 1000.0)
    if field_id == N.NVML_FI_DEV_PCIE_REPLAY_COUNTER:
        return OK, ULL, gpu.pcie_replay
    if field_id in _ECC_FIELDS:
        return OK, ULL, gpu.ecc[_ECC_FIELDS[field_id]]
    if N.NVML_FI_DEV_REMAPPED_COR <= field_id <= N.NVML_FI_DEV_REMAPPED_FAILURE:
        if not spec.has_remapped_rows:
            return NOT_SUPPORTED, UINT, 0
        value = (gpu.remapped_correctable, gpu.remapped_uncorrectable,
                 int(gpu.remap_pending), int(gpu.remap_failure))[field_id - N.NVML_FI_DEV_REMAPPED_COR]
        return OK, UINT, value
    if not 0 < field_id < N.NVML_FI_MAX:
        return INVALID, UINT, 0
    return NOT_SUPPORTED, UINT, 0


@device(c_int32, c_void_p)
def nvmlDeviceGetFieldValues(sim: SimulatedNvml, gpu: SimGpu, count: int, values: int) -> int:
    if count < 0 or (count and not values):
        return INVALID
    entries = (FieldValue * count).from_address(values) if count else ()
    stamp = int(time.time() * 1e6)
    for entry in entries:
        ret, value_type, value = _field(gpu, entry.fieldId, entry.scopeId)
        entry.timestamp = stamp
        entry.latencyUsec = 0
        entry.nvmlReturn = ret  # each field succeeds or fails on its own
        entry.valueType = value_type
        if value_type == ULL:
            entry.value.ullVal = value
        else:
            entry.value.uiVal = value
    return OK


# ---- processes and events -----------------------------------------------------------------
@device(UINT_P, c_void_p)
def nvmlDeviceGetComputeRunningProcesses_v3(sim: SimulatedNvml, gpu: SimGpu, count: Any, infos: int | None) -> int:
    # On a MIG-enabled GPU the parent lists every instance's processes, each with its instance ids.
    rows = [(pid, 0xFFFFFFFF, 0xFFFFFFFF, gpu.memory_used_bytes // max(1, len(gpu.processes)))
            for pid in gpu.processes]
    for mig in gpu.mig:
        rows += [(pid, mig.gpu_instance, mig.compute_instance, mig.memory_used_bytes // len(mig.processes))
                 for pid in mig.processes]
    return _processes(rows, count, infos)


@on_mig("nvmlDeviceGetComputeRunningProcesses_v3")
def _mig_processes(sim: SimulatedNvml, mig: SimMigDevice, count: Any, infos: int | None) -> int:
    return _processes([(pid, mig.gpu_instance, mig.compute_instance,
                        mig.memory_used_bytes // len(mig.processes)) for pid in mig.processes], count, infos)


def _processes(rows: list[tuple[int, int, int, int]], count: Any, infos: int | None) -> int:
    if not rows:
        count[0] = 0
        return OK
    if not infos or count[0] < len(rows):
        count[0] = len(rows)  # first call: tell the caller how big an array to bring
        return INSUFFICIENT_SIZE
    for info, (pid, gi, ci, used) in zip((ProcessInfoV3 * len(rows)).from_address(infos), rows):
        info.pid = pid
        info.usedGpuMemory = used
        info.gpuInstanceId = gi  # 0xFFFFFFFF: not a MIG instance
        info.computeInstanceId = ci
    count[0] = len(rows)
    return OK


@device(ULL_P)
def nvmlDeviceGetSupportedEventTypes(sim: SimulatedNvml, gpu: SimGpu, out: Any) -> int:
    out[0] = gpu.spec.supported_events
    return OK


@device(c_ulonglong, c_void_p)
def nvmlDeviceRegisterEvents(sim: SimulatedNvml, gpu: SimGpu, event_types: int, set_handle: int | None) -> int:
    event_set = sim._hub.get(set_handle)
    if event_set is None:
        return INVALID
    mask = event_types & gpu.spec.supported_events
    if not mask:
        return NOT_SUPPORTED
    # Lenient like tools expect: unsupported bits in the request are dropped, not refused.
    event_set.registrations[gpu.index] = event_set.registrations.get(gpu.index, 0) | mask
    return OK


# ---- assembling the library ----------------------------------------------------------------
_ERROR_TEXT = {
    0: "Success", 1: "Uninitialized", 2: "Invalid Argument", 3: "Not Supported",
    4: "Insufficient Permissions", 5: "Already Initialized", 6: "Not Found",
    7: "Insufficient Size", 8: "Insufficient External Power", 9: "Driver Not Loaded",
    10: "Timeout", 11: "Interrupt Request Issue", 12: "NVML Shared Library Not Found",
    13: "Function Not Found", 14: "Corrupted infoROM", 15: "GPU is lost",
    16: "GPU requires restart", 17: "The operating system has blocked the request.",
    18: "RM has detected an NVML/RM version mismatch.", 19: "In use by another client",
    20: "Insufficient Memory", 21: "No data", 25: "Argument version mismatch",
    26: "Deprecated", 27: "Not ready", 28: "GPU not found", 29: "Invalid state",
}
# nvmlErrorString returns a const char*: the buffers must outlive every caller, so they
# are created once per code and never freed (shared by all simulated libraries).
_ERROR_BUFFERS: dict[int, ctypes.Array] = {}


def _error_string_address(code: int) -> int:
    buf = _ERROR_BUFFERS.get(code)
    if buf is None:
        buf = _ERROR_BUFFERS.setdefault(code, ctypes.create_string_buffer(
            _ERROR_TEXT.get(code, "Unknown Error").encode()))
    return ctypes.addressof(buf)


_PROTOTYPES: dict[tuple[Any, ...], Any] = {}


def _prototype(restype: Any, argtypes: tuple[Any, ...]) -> Any:
    key = (restype, *argtypes)
    if key not in _PROTOTYPES:
        _PROTOTYPES[key] = CFUNCTYPE(restype, *argtypes)
    return _PROTOTYPES[key]


def _guard(name: str, fn: Callable[..., int]) -> Callable[..., int]:
    def call(*args: Any) -> int:
        try:
            return fn(*args) or OK
        except Exception:  # never let an exception cross into ctypes
            log.exception("simulated %s failed; returning NVML_ERROR_UNKNOWN", name)
            return UNKNOWN
    return call


def _device_callback(sim: SimulatedNvml, name: str, impl: Callable[..., int]) -> Callable[..., int]:
    lock, enter, enter_mig, on_mig = sim._lock, sim._device_call, sim._mig_call, MIG.get(name)

    def call(handle: int | None, *args: Any) -> int:
        with lock:
            code, mig = enter_mig(name, handle)
            if mig is not None:
                return code or (on_mig(sim, mig, *args) if on_mig is not None else NOT_SUPPORTED)
            code, gpu = enter(name, handle)
            return code or impl(sim, gpu, *args)
    return _guard(name, call)


def _system_callback(sim: SimulatedNvml, name: str, impl: Callable[..., int], needs_init: bool) -> Callable[..., int]:
    lock, enter = sim._lock, sim._system_call

    def call(*args: Any) -> int:
        with lock:
            if needs_init:
                code = enter(name)
                if code:
                    return code
            return impl(sim, *args)
    return _guard(name, call)


def _event_wait_callback(sim: SimulatedNvml) -> Callable[..., int]:
    def call(set_handle: int | None, out: int | None, timeout_ms: int) -> int:
        if not out:
            return INVALID
        code, event = sim._wait_event(set_handle, timeout_ms)  # takes the lock itself
        if code or event is None:
            return code
        data = EventData.from_address(out)
        data.device = ctypes.cast(sim._gpus[event.gpu_index].handle, N.c_nvmlDevice_t)
        data.eventType = event.event_type
        data.eventData = event.data
        data.gpuInstanceId = 0xFFFFFFFF
        data.computeInstanceId = 0xFFFFFFFF
        return OK
    return _guard("nvmlEventSetWait_v2", call)


def _error_string_callback() -> Callable[[int], int]:
    def call(code: int) -> int:
        try:
            return _error_string_address(code)
        except Exception:
            log.exception("simulated nvmlErrorString failed")
            return _error_string_address(UNKNOWN)
    return call


_SPECIAL = ("nvmlEventSetWait_v2", "nvmlErrorString")
SYMBOLS = frozenset(DEVICE) | frozenset(SYSTEM) | frozenset(_SPECIAL)


class SimulatedLibrary:
    """Stands in for CDLL("libnvidia-ml.so.1"): one C function pointer per NVML symbol.

    A symbol that is absent (see `missing_functions`) raises AttributeError on lookup,
    which pynvml turns into NVMLError_FunctionNotFound, as with an older driver.
    """

    def __init__(self, node: str) -> None:
        self._name = f"simulated libnvidia-ml ({node})"
        # C code holds no reference to a callback object: if it were collected, the next
        # call through the pointer would crash. Keep every one alive with the library.
        self._callbacks: dict[str, Any] = {}

    def _add(self, name: str, restype: Any, argtypes: tuple[Any, ...], fn: Callable[..., Any],
             required: int | None = None) -> None:
        callback = _prototype(restype, argtypes)(fn)
        pointer = callback
        if required is not None:
            # Callers may pass the trailing arguments or not: declare only the required ones
            # (ctypes passes extras through, as C varargs) over the full-signature thunk.
            pointer = ctypes.cast(callback, _prototype(restype, argtypes[:required]))
        self._callbacks[name] = (pointer, callback, fn)
        setattr(self, name, pointer)

    def __repr__(self) -> str:
        return f"<{self._name}: {len(self._callbacks)} symbols>"


def build_library(sim: SimulatedNvml, missing: frozenset[str]) -> SimulatedLibrary:
    unknown = missing - SYMBOLS
    if unknown:
        raise ValueError(f"missing_functions names symbols the simulator does not have: {sorted(unknown)}")
    lib = SimulatedLibrary(sim.node)
    for name, (argtypes, impl, required) in DEVICE.items():
        if name not in missing:
            lib._add(name, c_uint, (c_void_p, *argtypes), _device_callback(sim, name, impl),
                     None if required is None else required + 1)
    for name, (argtypes, impl, needs_init) in SYSTEM.items():
        if name not in missing:
            lib._add(name, c_uint, argtypes, _system_callback(sim, name, impl, needs_init))
    if "nvmlEventSetWait_v2" not in missing:
        lib._add("nvmlEventSetWait_v2", c_uint, (c_void_p, c_void_p, c_uint),
                 _event_wait_callback(sim))
    if "nvmlErrorString" not in missing:
        # Declared as returning c_void_p: pynvml sets restype = c_char_p on the pointer and
        # reads the string at the address we return.
        lib._add("nvmlErrorString", c_void_p, (c_uint,), _error_string_callback())
    return lib
