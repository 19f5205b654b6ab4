"""The simulated NVML through the real pynvml API: every implemented call returns sane,
typed values, identities are unique and stable, and installing is reversible."""

from __future__ import annotations

import re

import pynvml
import pytest

from gpumond.nvml.sim import LoadPattern, ManualClock, Scenario, SimulatedNvml

TRAINING = Scenario(default_load=LoadPattern(pattern="constant", utilization=0.9))


@pytest.fixture
def sim():
    sim = SimulatedNvml(gpu_count=4, node="gpu-node-01", scenario=TRAINING, clock=ManualClock()).install()
    pynvml.nvmlInit()
    yield sim
    sim.uninstall()


def handles(n):
    return [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(n)]


def test_system_calls(sim):
    assert re.fullmatch(r"\d+\.\d+\.\d+", pynvml.nvmlSystemGetDriverVersion())
    assert pynvml.nvmlSystemGetNVMLVersion().endswith(pynvml.nvmlSystemGetDriverVersion())
    assert pynvml.nvmlSystemGetCudaDriverVersion() == pynvml.nvmlSystemGetCudaDriverVersion_v2() == 12080
    assert pynvml.nvmlDeviceGetCount() == 4
    assert pynvml.nvmlErrorString(pynvml.NVML_ERROR_GPU_IS_LOST) == "GPU is lost"
    assert pynvml.nvmlErrorString(4242) == "Unknown Error"


def test_identity(sim):
    for i, h in enumerate(handles(4)):
        assert pynvml.nvmlDeviceGetIndex(h) == i
        assert pynvml.nvmlDeviceGetName(h) == "NVIDIA H100 80GB HBM3"
        uuid = pynvml.nvmlDeviceGetUUID(h)
        assert re.fullmatch(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", uuid)
        pci = pynvml.nvmlDeviceGetPciInfo(h)
        assert re.fullmatch(r"00000000:[0-9A-F]{2}:00\.0", pci.busId)
        assert pci.pciDeviceId == 0x233010DE
        assert pynvml.nvmlDeviceGetCudaComputeCapability(h) == (9, 0)
        assert pynvml.nvmlDeviceGetArchitecture(h) == pynvml.NVML_DEVICE_ARCH_HOPPER
        assert pynvml.nvmlDeviceGetMigMode(h) == [0, 0]
        # Handles found by UUID / bus id / serial are the same device.
        for other in (pynvml.nvmlDeviceGetHandleByUUID(uuid),
                      pynvml.nvmlDeviceGetHandleByPciBusId(pci.busId),
                      pynvml.nvmlDeviceGetHandleBySerial(pynvml.nvmlDeviceGetSerial(h))):
            assert pynvml.nvmlDeviceGetIndex(other) == i
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetHandleByUUID("GPU-00000000-0000-0000-0000-000000000000")
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetHandleByIndex(4)


def test_uuids_unique_across_nodes_and_stable():
    def uuids(node):
        return [g.uuid for g in SimulatedNvml(gpu_count=8, node=node, clock=ManualClock()).gpus]

    a, b = uuids("gpu-node-01"), uuids("gpu-node-02")
    assert len(set(a) | set(b)) == 16
    assert uuids("gpu-node-01") == a


def test_telemetry_values_are_sane(sim):
    for h in handles(4):
        temp = pynvml.nvmlDeviceGetTemperatureV(h, pynvml.NVML_TEMPERATURE_GPU)
        assert isinstance(temp, int) and 30 < temp < 90
        assert pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU) == temp
        thresholds = [pynvml.nvmlDeviceGetTemperatureThreshold(h, t) for t in (
            pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX, pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN,
            pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN)]
        assert thresholds == sorted(thresholds) == [87, 89, 92]
        assert pynvml.nvmlDeviceGetTemperatureThreshold(h, pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX) == 95

        power_mw = pynvml.nvmlDeviceGetPowerUsage(h)
        assert 75_000 < power_mw <= 700_000
        assert pynvml.nvmlDeviceGetPowerManagementLimit(h) == 700_000
        assert pynvml.nvmlDeviceGetEnforcedPowerLimit(h) == 700_000
        assert pynvml.nvmlDeviceGetPowerManagementDefaultLimit(h) == 700_000
        assert pynvml.nvmlDeviceGetPowerManagementLimitConstraints(h) == [200_000, 700_000]
        assert pynvml.nvmlDeviceGetTotalEnergyConsumption(h) >= 0

        assert pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM) == 1980
        assert pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_GRAPHICS) == 1980
        assert pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM) == 2619
        assert pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM) == 1980
        assert pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM) == 2619

        util = pynvml.nvmlDeviceGetUtilizationRates(h)
        assert util.gpu == 90 and 0 < util.memory < 100

        mem = pynvml.nvmlDeviceGetMemoryInfo(h)
        assert mem.total == 81559 * 2**20 and mem.used + mem.free == mem.total
        mem2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
        assert mem2.total == mem.total and mem2.reserved > 0
        assert mem2.used + mem2.free + mem2.reserved == mem2.total

        assert pynvml.nvmlDeviceGetCurrentClocksEventReasons(h) == 0
        assert pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h) == 0
        for etype in (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED):
            for counter in (pynvml.NVML_VOLATILE_ECC, pynvml.NVML_AGGREGATE_ECC):
                assert pynvml.nvmlDeviceGetTotalEccErrors(h, etype, counter) == 0
        assert pynvml.nvmlDeviceGetRemappedRows(h) == (0, 0, 0, 0)
        assert pynvml.nvmlDeviceGetPcieReplayCounter(h) == 0
        assert pynvml.nvmlDeviceGetSupportedEventTypes(h) & pynvml.nvmlEventTypeXidCriticalError
        assert pynvml.nvmlDeviceGetPersistenceMode(h) == pynvml.NVML_FEATURE_ENABLED
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetFanSpeed(h)  # SXM modules have no fan


def test_field_values(sim):
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    fields = [pynvml.NVML_FI_DEV_MEMORY_TEMP, pynvml.NVML_FI_DEV_POWER_AVERAGE,
              pynvml.NVML_FI_DEV_POWER_INSTANT,
              pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP,
              pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN,
              pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN,
              pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN,
              pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST]
    values = pynvml.nvmlDeviceGetFieldValues(h, fields)
    assert [v.nvmlReturn for v in values] == [pynvml.NVML_SUCCESS] * len(fields)
    assert [v.fieldId for v in values] == fields
    gpu_temp = pynvml.nvmlDeviceGetTemperatureV(h, pynvml.NVML_TEMPERATURE_GPU)
    assert values[0].valueType == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
    assert gpu_temp < values[0].value.uiVal < gpu_temp + 10  # HBM runs a few degrees hotter
    assert abs(values[1].value.uiVal - pynvml.nvmlDeviceGetPowerUsage(h)) < 1000
    for v in values[3:]:
        assert v.valueType == pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG and v.value.ullVal == 0
    assert values[0].timestamp > 0
    # A field the simulator does not know fails on its own entry; the call succeeds.
    mixed = pynvml.nvmlDeviceGetFieldValues(h, [pynvml.NVML_FI_DEV_NVLINK_BANDWIDTH_C0_TOTAL,
                                                pynvml.NVML_FI_DEV_MEMORY_TEMP])
    assert mixed[0].nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert mixed[1].nvmlReturn == pynvml.NVML_SUCCESS


def test_processes_two_call_protocol(sim):
    h0, h1 = handles(2)
    sim.set_processes(0, [4242, 4343, 4444])
    procs = pynvml.nvmlDeviceGetComputeRunningProcesses_v3(h0)
    assert [p.pid for p in procs] == [4242, 4343, 4444]
    assert all(p.usedGpuMemory > 0 for p in procs)
    assert pynvml.nvmlDeviceGetComputeRunningProcesses(h1) == []


def test_calls_before_init_and_after_shutdown():
    sim = SimulatedNvml(gpu_count=1, clock=ManualClock()).install()
    try:
        with pytest.raises(pynvml.NVMLError_Uninitialized):
            pynvml.nvmlDeviceGetCount()
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        pynvml.nvmlShutdown()
        with pytest.raises(pynvml.NVMLError_Uninitialized):
            pynvml.nvmlDeviceGetPowerUsage(h)
        with pytest.raises(pynvml.NVMLError_InvalidArgument):  # a handle that is not ours
            pynvml.nvmlInit()
            pynvml.nvmlDeviceGetPowerUsage(pynvml.c_nvmlDevice_t())
    finally:
        sim.uninstall()


def test_install_and_uninstall_restore_pynvml():
    before = pynvml.nvmlLib
    sim = SimulatedNvml(gpu_count=1, clock=ManualClock())
    with sim:
        assert pynvml.nvmlLib is sim.library
        pynvml.nvmlInit()
        assert pynvml._nvmlLib_refcount == 1
    assert pynvml.nvmlLib is before
    assert pynvml._nvmlLib_refcount == 0
    assert pynvml._nvmlGetFunctionPointer_cache == {}
