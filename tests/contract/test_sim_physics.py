"""The GPU model seen through pynvml on a ManualClock: first-order thermal response,
degraded cooling, power capping, thermal slowdowns, setters and their constraints."""

from __future__ import annotations

import math

import pynvml
import pytest

from gpumond.nvml.sim import Fault, InletProfile, LoadPattern, ManualClock, Scenario
from gpumond.nvml.sim.models import H100_SXM

IDLE = Scenario(default_load=LoadPattern(pattern="idle"), inlet=InletProfile(base_c=30.0))
FULL = Scenario(default_load=LoadPattern(pattern="constant", utilization=1.0), inlet=InletProfile(base_c=30.0))

SW_POWER_CAP = pynvml.nvmlClocksEventReasonSwPowerCap
SW_THERMAL = pynvml.nvmlClocksEventReasonSwThermalSlowdown
HW_THERMAL = pynvml.nvmlClocksEventReasonHwThermalSlowdown
HW_SLOWDOWN = pynvml.nvmlClocksEventReasonHwSlowdown
GPU_IDLE = pynvml.nvmlClocksEventReasonGpuIdle


@pytest.fixture
def make(make_sim):
    def make(scenario, **kwargs):
        clock = ManualClock()
        sim = make_sim(gpus=2, scenario=scenario, clock=clock, **kwargs)
        return sim, clock, pynvml.nvmlDeviceGetHandleByIndex(0)

    return make


def temp(h):
    return pynvml.nvmlDeviceGetTemperatureV(h, pynvml.NVML_TEMPERATURE_GPU)


def steady(power_w, inlet_c=30.0, cooling=1.0):
    return inlet_c + power_w * H100_SXM.r_th_c_per_w * cooling


def test_temperature_rises_with_the_time_constant(make):
    sim, clock, h = make(IDLE)
    t_idle = steady(H100_SXM.idle_w)
    assert temp(h) == round(t_idle)
    assert pynvml.nvmlDeviceGetCurrentClocksEventReasons(h) == GPU_IDLE
    assert pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM) == H100_SXM.sm_idle_mhz

    sim.inject(Fault(gpu=0, kind="load", pattern="constant", utilization=1.0))
    t_busy = steady(H100_SXM.idle_w + H100_SXM.dyn_w)
    assert 73 < t_busy < 76  # 690 W on a 30 °C inlet settles near 75 °C
    clock.advance(H100_SXM.tau_s)
    expected = t_busy + (t_idle - t_busy) * math.exp(-1.0)  # 63 % of the way after one tau
    assert abs(temp(h) - expected) <= 1
    clock.advance(5 * H100_SXM.tau_s)
    assert abs(temp(h) - t_busy) <= 1
    # GPU 1 stayed idle; the fault was for GPU 0 only.
    assert temp(pynvml.nvmlDeviceGetHandleByIndex(1)) == round(t_idle)
    # Memory temperature sits above the die by a power-dependent offset.
    mem = pynvml.nvmlDeviceGetFieldValues(h, [pynvml.NVML_FI_DEV_MEMORY_TEMP])[0].value.uiVal
    assert temp(h) + 5 < mem < temp(h) + 10


def test_degraded_cooling_raises_temperature(make):
    sim, clock, h = make(Scenario(default_load=LoadPattern(pattern="constant", utilization=0.6)))
    h1 = pynvml.nvmlDeviceGetHandleByIndex(1)
    sim.inject({"gpu": 0, "kind": "cooling", "factor": 1.3})
    clock.advance(300)
    assert temp(h) - temp(h1) >= 8
    assert sim.gpus[0].temperature_c > sim.gpus[1].temperature_c
    sim.inject({"gpu": 0, "kind": "inlet", "delta_c": 5.0})
    clock.advance(300)
    assert temp(h) - temp(h1) >= 13


def test_power_cap_lowers_clock_and_sets_sw_power_cap(make):
    sim, clock, h = make(FULL)
    assert pynvml.nvmlDeviceGetCurrentClocksEventReasons(h) & SW_POWER_CAP == 0
    pynvml.nvmlDeviceSetPowerManagementLimit(h, 300_000)
    assert pynvml.nvmlDeviceGetPowerManagementLimit(h) == 300_000
    assert pynvml.nvmlDeviceGetEnforcedPowerLimit(h) == 300_000
    clock.advance(10)
    assert pynvml.nvmlDeviceGetCurrentClocksEventReasons(h) & SW_POWER_CAP
    assert abs(pynvml.nvmlDeviceGetPowerUsage(h) - 300_000) < 3_000
    sm = pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)
    assert 1200 < sm < 1450  # 225 W of dynamic headroom out of 615 W, at f^2.5
    # The violation counter accumulates while the cap is active (ns).
    counter = pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP
    assert pynvml.nvmlDeviceGetFieldValues(h, [counter])[0].value.ullVal == pytest.approx(10e9, rel=0.01)
    # Cooler too: steady state follows the capped power.
    clock.advance(300)
    assert abs(temp(h) - steady(300)) <= 1
    pynvml.nvmlDeviceSetPowerManagementLimit(h, 700_000)
    assert pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM) == 1980
    assert pynvml.nvmlDeviceGetCurrentClocksEventReasons(h) & SW_POWER_CAP == 0


def test_crossing_slowdown_sets_hw_thermal_slowdown_and_halves_clocks(make):
    sim, clock, h = make(FULL)
    sim.inject({"gpu": 0, "kind": "cooling", "factor": 3.0})
    seen_sw = False
    for _ in range(400):
        clock.advance(0.5)
        reasons = pynvml.nvmlDeviceGetCurrentClocksEventReasons(h)
        if reasons & SW_THERMAL:
            seen_sw = True
            assert temp(h) >= 85  # software slowdown from GPU_MAX (87) with 2 °C hysteresis
            assert pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM) == round(1980 * 0.8)
        if reasons & HW_THERMAL:
            break
    else:
        pytest.fail("never reached hardware slowdown")
    assert seen_sw  # the software controller acts first, at GPU_MAX
    assert reasons & HW_SLOWDOWN
    assert temp(h) >= 89
    assert pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM) == 990
    # Hysteresis: one second later the die is cooling but the slowdown still holds.
    clock.advance(1.0)
    assert pynvml.nvmlDeviceGetCurrentClocksEventReasons(h) & HW_THERMAL
    hw_ns = pynvml.nvmlDeviceGetFieldValues(h, [pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN])
    assert hw_ns[0].value.ullVal > 0
    # It releases only once the die has cooled 5 °C below SLOWDOWN (89 − 5 = 84).
    for _ in range(400):
        clock.advance(0.25)
        if not pynvml.nvmlDeviceGetCurrentClocksEventReasons(h) & HW_THERMAL:
            break
    else:
        pytest.fail("hardware slowdown never released")
    assert temp(h) <= 84


def test_slow_fault_cuts_clock_silently(make):
    sim, clock, h = make(FULL)
    sim.inject(Fault(gpu=0, kind="slow", factor=0.7, duration_s=30))
    clock.advance(1)
    assert pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM) == round(1980 * 0.7)
    assert pynvml.nvmlDeviceGetCurrentClocksEventReasons(h) == 0
    clock.advance(30)
    assert pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM) == 1980


def test_energy_is_the_integral_of_power(make):
    sim, clock, h = make(FULL)
    e0 = pynvml.nvmlDeviceGetTotalEnergyConsumption(h)
    clock.advance(100)
    e1 = pynvml.nvmlDeviceGetTotalEnergyConsumption(h)
    assert e1 - e0 == pytest.approx(690 * 100 * 1000, rel=0.001)  # mJ


def test_setters_enforce_constraints(make):
    sim, clock, h = make(FULL)
    for bad in (199_999, 700_001, 0):
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            pynvml.nvmlDeviceSetPowerManagementLimit(h, bad)
    assert pynvml.nvmlDeviceGetPowerManagementLimit(h) == 700_000
    pynvml.nvmlDeviceSetPowerManagementLimit(h, 200_000)
    assert pynvml.nvmlDeviceGetPowerManagementLimit(h) == 200_000
    # _v2 works, but pynvml never checks its return code: only a read-back tells.
    pynvml.nvmlDeviceSetPowerManagementLimit_v2(h, pynvml.NVML_POWER_SCOPE_GPU, 450_000)
    assert pynvml.nvmlDeviceGetPowerManagementLimit(h) == 450_000
    pynvml.nvmlDeviceSetPowerManagementLimit_v2(h, pynvml.NVML_POWER_SCOPE_GPU, 900_000)  # "succeeds"
    assert pynvml.nvmlDeviceGetPowerManagementLimit(h) == 450_000


def test_setters_without_permission(make):
    sim, clock, h = make(FULL, allow_set=False)
    with pytest.raises(pynvml.NVMLError_NoPermission):
        pynvml.nvmlDeviceSetPowerManagementLimit(h, 300_000)
    assert pynvml.nvmlDeviceGetPowerManagementLimit(h) == 700_000


def test_no_permission_fault_then_recovery(make):
    sim, clock, h = make(FULL)
    sim.inject(Fault(gpu=0, kind="no_permission_on_set", duration_s=10))
    with pytest.raises(pynvml.NVMLError_NoPermission):
        pynvml.nvmlDeviceSetPowerManagementLimit(h, 300_000)
    pynvml.nvmlDeviceSetPowerManagementLimit(pynvml.nvmlDeviceGetHandleByIndex(1), 300_000)
    clock.advance(11)
    pynvml.nvmlDeviceSetPowerManagementLimit(h, 300_000)
    assert pynvml.nvmlDeviceGetPowerManagementLimit(h) == 300_000


def test_training_load_is_a_square_wave_independent_of_polling(make):
    scenario = Scenario(default_load=LoadPattern(pattern="training", utilization=0.95, period_s=10,
                                                 busy_fraction=0.8, low_utilization=0.2))
    sim, clock, h = make(scenario)
    samples = []
    for _ in range(20):
        clock.advance(1.0)
        samples.append(pynvml.nvmlDeviceGetUtilizationRates(h).gpu)
    assert samples[:10] == [95] * 7 + [20, 20, 95]  # t = 1..10: busy until 8 s of each 10
    # A second GPU that nobody polled integrated the same history.
    polled, unpolled = sim.gpus[0], sim.gpus[1]
    assert unpolled.temperature_c == pytest.approx(polled.temperature_c, abs=1e-6)
    assert unpolled.energy_j == pytest.approx(polled.energy_j, rel=1e-9)
