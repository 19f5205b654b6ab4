"""Error paths through the real pynvml error classes: NotSupported on older models,
FunctionNotFound, GpuIsLost, counted NVML errors, init failures, model exceptions, and the
ECC / remap / retired-page / PCIe counters."""

from __future__ import annotations

import logging

import pynvml
import pytest

from gpumond.nvml.sim import Fault, LoadPattern, Scenario, SimulatedNvml
from gpumond.nvml.sim.scenario import GpuEntry

MIXED = Scenario(gpus=[GpuEntry(index=1, model="v100-sxm2")],
                 default_load=LoadPattern(pattern="constant", utilization=0.8))


@pytest.fixture
def make(make_sim):
    return lambda scenario=MIXED, **kwargs: make_sim(scenario=scenario, **kwargs)


def handle(i):
    return pynvml.nvmlDeviceGetHandleByIndex(i)


def test_v100_lacks_newer_functions(make):
    make()
    v100 = handle(1)
    assert pynvml.nvmlDeviceGetName(v100) == "Tesla V100-SXM2-32GB"
    assert pynvml.nvmlDeviceGetPowerManagementLimitConstraints(v100) == [100_000, 300_000]
    assert pynvml.nvmlDeviceGetMaxClockInfo(v100, pynvml.NVML_CLOCK_SM) == 1530
    assert pynvml.nvmlDeviceGetMemoryInfo(v100).total == 32 * 2**30
    for call in (lambda: pynvml.nvmlDeviceGetRemappedRows(v100),
                 lambda: pynvml.nvmlDeviceGetTemperatureV(v100, pynvml.NVML_TEMPERATURE_GPU),
                 lambda: pynvml.nvmlDeviceGetTemperatureThreshold(v100, pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX),
                 lambda: pynvml.nvmlDeviceGetMigMode(v100)):
        with pytest.raises(pynvml.NVMLError_NotSupported):
            call()
    # The deprecated call still works there: the fallback the agent uses.
    assert 30 < pynvml.nvmlDeviceGetTemperature(v100, pynvml.NVML_TEMPERATURE_GPU) < 85
    assert pynvml.nvmlDeviceGetRetiredPages(v100, pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR) == []


def test_field_values_fail_per_entry(make):
    make()
    fields = [pynvml.NVML_FI_DEV_MEMORY_TEMP, pynvml.NVML_FI_DEV_POWER_AVERAGE,
              pynvml.NVML_FI_DEV_POWER_INSTANT, pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN]
    v100 = pynvml.nvmlDeviceGetFieldValues(handle(1), fields)  # the call itself succeeds
    assert [v.nvmlReturn for v in v100] == [pynvml.NVML_ERROR_NOT_SUPPORTED] * 3 + [pynvml.NVML_SUCCESS]
    h100 = pynvml.nvmlDeviceGetFieldValues(handle(0), fields)
    assert [v.nvmlReturn for v in h100] == [pynvml.NVML_SUCCESS] * 4


def test_missing_function_and_fallback(make):
    make(missing_functions=frozenset({"nvmlDeviceGetTemperatureV"}))
    h = handle(0)
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        pynvml.nvmlDeviceGetTemperatureV(h, pynvml.NVML_TEMPERATURE_GPU)
    assert pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU) > 0
    with pytest.raises(ValueError, match="nvmlDeviceGetTemperatureVV"):
        SimulatedNvml(gpu_count=1, missing_functions={"nvmlDeviceGetTemperatureVV"})


def test_lost_gpu_only_that_gpu_then_reset(make):
    sim = make(scenario=Scenario(default_load=LoadPattern(pattern="constant", utilization=0.8)))
    h0, h2 = handle(0), handle(2)
    sim.inject(Fault(gpu=2, kind="ecc_uncorrected", count=2))
    sim.inject(Fault(gpu=2, kind="lost", duration_s=60))
    for call in (pynvml.nvmlDeviceGetPowerUsage, pynvml.nvmlDeviceGetUUID,
                 lambda h: pynvml.nvmlDeviceGetTemperatureV(h, pynvml.NVML_TEMPERATURE_GPU)):
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            call(h2)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetHandleByIndex(2)
    assert pynvml.nvmlDeviceGetPowerUsage(h0) > 0  # the others keep working
    assert pynvml.nvmlDeviceGetCount() == 3
    assert sim.gpus[2].lost and sim.gpus[2].xid_counts == {79: 1}
    sim.clock.advance(61)  # back, as after a reset: volatile counters cleared, remap applied
    assert pynvml.nvmlDeviceGetPowerUsage(h2) >= 0
    unc = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    assert pynvml.nvmlDeviceGetTotalEccErrors(h2, unc, pynvml.NVML_VOLATILE_ECC) == 0
    assert pynvml.nvmlDeviceGetTotalEccErrors(h2, unc, pynvml.NVML_AGGREGATE_ECC) == 2
    assert pynvml.nvmlDeviceGetRemappedRows(h2) == (0, 2, 0, 0)


def test_counted_nvml_error_then_recovery(make):
    sim = make()
    h0, h2 = handle(0), handle(2)
    sim.inject({"gpu": 0, "kind": "nvml_error", "function": "nvmlDeviceGetPowerUsage",
                "error": "unknown", "count": 2})
    for _ in range(2):
        with pytest.raises(pynvml.NVMLError_Unknown):
            pynvml.nvmlDeviceGetPowerUsage(h0)
        assert pynvml.nvmlDeviceGetPowerUsage(h2) > 0  # other GPUs unaffected
    assert pynvml.nvmlDeviceGetPowerUsage(h0) > 0
    # Without `gpu` it hits system calls too, here for a duration instead of a count.
    sim.inject({"kind": "nvml_error", "function": "nvmlDeviceGetCount_v2", "error": "insufficient_power",
                "duration_s": 5})
    with pytest.raises(pynvml.NVMLError_InsufficientPower):
        pynvml.nvmlDeviceGetCount()
    sim.clock.advance(5)
    assert pynvml.nvmlDeviceGetCount() == 3


def test_init_error_lib_rm_version_mismatch(make):
    make(init=False, init_error="lib_rm_version_mismatch")
    with pytest.raises(pynvml.NVMLError_LibRmVersionMismatch):
        pynvml.nvmlInit()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()


def test_exception_inside_the_model_becomes_unknown(make, monkeypatch, caplog):
    sim = make()
    h = handle(0)

    def broken(*args, **kwargs):
        raise ZeroDivisionError("model bug")

    monkeypatch.setattr("gpumond.nvml.sim.physics.operating_point", broken)
    sim.clock.advance(2)  # force an integration step on the next call
    with caplog.at_level(logging.ERROR, logger="gpumond.nvml.sim"):
        with pytest.raises(pynvml.NVMLError_Unknown):
            pynvml.nvmlDeviceGetPowerUsage(h)
    assert "nvmlDeviceGetPowerUsage" in caplog.text and "model bug" in caplog.text
    monkeypatch.undo()
    assert pynvml.nvmlDeviceGetPowerUsage(h) > 0  # the simulator lives on


def test_health_counters(make):
    sim = make()
    h100, v100 = handle(0), handle(1)
    sim.inject(Fault(gpu=0, kind="ecc_corrected", count=5))
    sim.inject(Fault(gpu=0, kind="ecc_uncorrected"))
    sim.inject(Fault(gpu=0, kind="pcie_replay", count=7))
    sim.inject(Fault(gpu=0, kind="remap_failure", duration_s=10))
    cor, unc = pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    assert pynvml.nvmlDeviceGetTotalEccErrors(h100, cor, pynvml.NVML_VOLATILE_ECC) == 5
    assert pynvml.nvmlDeviceGetTotalEccErrors(h100, unc, pynvml.NVML_AGGREGATE_ECC) == 1
    assert pynvml.nvmlDeviceGetRemappedRows(h100) == (0, 1, 1, 1)
    assert pynvml.nvmlDeviceGetPcieReplayCounter(h100) == 7
    remap = pynvml.nvmlDeviceGetFieldValues(h100, [pynvml.NVML_FI_DEV_REMAPPED_PENDING])[0]
    assert remap.nvmlReturn == pynvml.NVML_SUCCESS and remap.value.uiVal == 1
    sim.clock.advance(10)
    assert pynvml.nvmlDeviceGetRemappedRows(h100)[3] == 0  # the failure flag ended with the fault
    # Pre-Ampere: an uncorrectable error retires a page instead of remapping a row.
    sim.inject(Fault(gpu=1, kind="ecc_uncorrected", count=2))
    cause = pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
    pages = pynvml.nvmlDeviceGetRetiredPages(v100, cause)
    assert len(pages) == 2 and len(set(pages)) == 2
    detailed = pynvml.nvmlDeviceGetRetiredPages_v2(v100, cause)
    assert [p["address"] for p in detailed] == pages and all(p["timestamp"] > 0 for p in detailed)
    assert pynvml.nvmlDeviceGetRetiredPages(
        v100, pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS) == []
    assert sim.gpus[0].xid_counts == {}  # ECC faults do not invent XIDs; scenarios add them
