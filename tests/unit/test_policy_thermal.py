"""thermal_step on literal reading sequences: bounds, rate limit, hysteresis, targets, holds."""

from __future__ import annotations

from dataclasses import replace
from itertools import pairwise

import pytest

from gpumond.agent.policy.thermal import (
    ThermalDecision,
    ThermalState,
    thermal_bounds,
    thermal_step,
    thermal_target,
)
from gpumond.agent.policy.view import GPU_IDLE, SW_POWER_CAP, GpuView
from gpumond.config import ThermalConfig

CFG = ThermalConfig()  # target = slowdown 89 − margin 5 = 84 °C, step 10 W, every 5 s


def gpu(temp: float | None = 80.0, power: float | None = 600.0, limit: float = 700.0, **kw) -> GpuView:
    """An H100 drawing `power` under an enforced `limit`; capped when it draws the limit."""
    mask = SW_POWER_CAP if power is not None and power >= limit * 0.99 else 0
    values = dict(index=0, uuid="GPU-0", name="NVIDIA H100 80GB HBM3", up=True, temperature_c=temp,
                  power_w=power, enforced_limit_w=limit, limit_min_w=200.0, limit_max_w=700.0,
                  limit_default_w=700.0, slowdown_c=89.0, shutdown_c=92.0, gpu_max_c=87.0,
                  clocks_event_mask=mask)
    values.update(kw)
    return GpuView(**values)


class Driver:
    """Feeds readings one per second; the GPU follows the wanted limit (as the actuator would)."""

    def __init__(self, cfg: ThermalConfig = CFG, ceiling: float = 700.0, state: ThermalState | None = None):
        self.cfg, self.ceiling = cfg, ceiling
        self.state = state or ThermalState()
        self.t = 1000.0
        self.limit = 700.0
        self.decisions: list[ThermalDecision] = []

    def step(self, temp: float | None, demand: float = 690.0, **kw) -> ThermalDecision:
        power = min(demand, self.limit)
        view = gpu(temp, power, self.limit, **kw)
        self.state, decision = thermal_step(self.state, view, self.cfg, self.ceiling, self.t)
        self.decisions.append(decision)
        self.limit = decision.limit_w
        self.t += 1.0
        return decision

    def run(self, temps: list[float], **kw) -> list[ThermalDecision]:
        return [self.step(t, **kw) for t in temps]


def test_target_comes_from_the_slowdown_threshold() -> None:
    assert thermal_target(gpu(), CFG) == 84.0
    assert thermal_target(gpu(), ThermalConfig(margin_c=3)) == 86.0
    assert thermal_target(gpu(slowdown_c=None), CFG) == 83.0  # driver reports none
    assert thermal_target(gpu(), ThermalConfig(target_c=80)) == 80.0


def test_bounds_use_the_nvml_minimum_or_the_configured_floor() -> None:
    assert thermal_bounds(gpu(), CFG, 700.0) == (200.0, 700.0)
    assert thermal_bounds(gpu(), ThermalConfig(floor_w=300), 650.0) == (300.0, 650.0)
    assert thermal_bounds(gpu(), ThermalConfig(floor_w=300), 250.0) == (250.0, 250.0)  # the cap wins
    assert thermal_bounds(gpu(), CFG, 900.0) == (200.0, 700.0)  # never above NVML's maximum


def test_steady_below_target_holds() -> None:
    decisions = Driver().run([78.0] * 30)
    assert all(d.limit_w == 700.0 for d in decisions)
    assert decisions[0].target_c == 84.0 and "holding 700 W" in decisions[-1].reason


def test_hot_and_rising_lowers_at_once_and_fast() -> None:
    d = Driver().step(temp=85.5)
    assert d.changed and d.limit_w < 700.0 - CFG.step_w  # cutting is not limited to step_w
    assert "lowering 700 W →" in d.reason and "> target 84 °C" in d.reason


def test_acts_at_most_every_interval() -> None:
    driver = Driver()
    decisions = driver.run([85.0] * 11)
    changes = [i for i, d in enumerate(decisions) if d.changed]
    assert changes and all(b - a >= CFG.interval_s for a, b in pairwise(changes))
    assert "between control steps" in decisions[1].reason


def test_emergency_does_not_wait_for_the_step() -> None:
    driver = Driver()
    driver.run([83.0] * 2)  # a step at t=0, the next one due at t=5
    d = driver.step(temp=87.0)  # t=2: target + 3 °C
    assert d.changed and "emergency cut" in d.reason


def test_never_below_the_floor() -> None:
    for floor, cfg in ((200.0, CFG), (350.0, ThermalConfig(floor_w=350))):
        driver = Driver(cfg)
        decisions = driver.run([95.0] * 60)
        assert min(d.limit_w for d in decisions) == floor
        assert driver.state.at_floor and "floor" in decisions[-1].reason


def test_never_above_the_ceiling_and_raises_by_at_most_step_w() -> None:
    driver = Driver(ceiling=600.0, state=ThermalState(limit_w=450.0))
    driver.limit = 450.0
    decisions = driver.run([60.0] * 120)
    limits = [450.0] + [d.limit_w for d in decisions]
    assert max(limits) == 600.0
    assert all(b - a <= CFG.step_w for a, b in pairwise(limits))
    assert "raising" in next(d.reason for d in decisions if d.changed)


def test_hysteresis_band_holds_then_gives_back_below_it() -> None:
    start = ThermalState(limit_w=500.0)
    inside = Driver(state=start)
    inside.limit = 500.0
    assert all(not d.changed for d in inside.run([82.0] * 40))  # 2 °C under target: hold
    below = Driver(state=start)
    below.limit = 500.0
    assert any(d.changed and d.limit_w > 500.0 for d in below.run([80.0] * 40))  # 4 °C under: raise


def test_no_give_back_while_the_cap_is_not_reached() -> None:
    driver = Driver(state=ThermalState(limit_w=500.0))
    driver.limit = 500.0
    decisions = driver.run([60.0] * 40, demand=300.0)
    assert all(d.limit_w == 500.0 for d in decisions)
    assert "not held back by the cap" in decisions[-5].reason


def test_memory_target_controls_when_set() -> None:
    hot_hbm = dict(memory_temperature_c=96.0)
    ignored = Driver().run([75.0] * 6, **hot_hbm)
    assert all(d.limit_w == 700.0 for d in ignored)
    controlled = Driver(ThermalConfig(memory_target_c=90)).run([75.0] * 6, **hot_hbm)
    assert controlled[0].changed and "memory temp 96.0 °C" in controlled[0].reason


def test_idle_gpu_is_not_tightened() -> None:
    driver = Driver()
    decisions = driver.run([90.0] * 10, demand=80.0, clocks_event_mask=GPU_IDLE)
    assert all(d.limit_w == 700.0 for d in decisions)
    assert "idle" in decisions[0].reason


@pytest.mark.parametrize(("kw", "why"), [({"up": False, "temperature_c": None}, "GPU not readable"),
                                         ({"temperature_c": None}, "no temperature reading")])
def test_lost_or_unreadable_holds(kw: dict, why: str) -> None:
    state = ThermalState(limit_w=450.0)
    state, d = thermal_step(state, gpu(limit=450.0, **kw), CFG, 700.0, 0.0)
    assert (d.limit_w, d.changed) == (450.0, False) and why in d.reason
    assert state.die is None and state.power == ()


def test_first_call_starts_from_the_enforced_limit() -> None:
    _, d = thermal_step(ThermalState(), gpu(temp=70.0, limit=550.0, power=400.0), CFG, 700.0, 0.0)
    assert (d.limit_w, d.changed) == (550.0, False)
    _, d = thermal_step(ThermalState(), gpu(temp=70.0, limit=720.0, power=400.0, limit_max_w=750.0), CFG, 700.0, 0.0)
    assert (d.limit_w, d.changed) == (700.0, True) and "ceiling 700 W is below 720 W" in d.reason


def test_a_lowered_ceiling_applies_between_steps() -> None:
    driver = Driver()
    driver.run([80.0] * 2)
    driver.ceiling = 400.0
    d = driver.step(80.0)
    assert (d.limit_w, d.changed) == (400.0, True)


def test_disabled_wants_the_ceiling() -> None:
    _, d = thermal_step(ThermalState(limit_w=400.0), gpu(temp=95.0), ThermalConfig(enabled=False), 650.0, 0.0)
    assert (d.limit_w, d.changed) == (650.0, True) and "disabled" in d.reason


def test_no_windup_at_the_floor() -> None:
    def recovery_delay(hot_seconds: int) -> int:
        driver = Driver()
        driver.run([96.0] * hot_seconds)
        assert driver.limit == 200.0 and driver.state.at_floor
        decisions = driver.run([70.0] * 120)  # cooling recovered
        assert not driver.state.at_floor
        return next(i for i, d in enumerate(decisions) if d.limit_w > 200.0)

    # Ten minutes pinned at the floor give back exactly as soon as one: nothing to unwind.
    # The delay itself is the deliberate give-back evidence window (raise_window_s).
    assert recovery_delay(600) == recovery_delay(60) <= 60 + CFG.interval_s


def test_no_windup_at_the_ceiling() -> None:
    driver = Driver()
    driver.run([60.0] * 600)  # ten cold minutes at the ceiling
    d = next(d for d in driver.run([88.0] * 6) if d.changed)
    assert d.limit_w < 700.0  # the first step cuts: nothing stored above the ceiling


def test_state_and_decision_are_immutable_values() -> None:
    state, d = thermal_step(ThermalState(), gpu(), CFG, 700.0, 0.0)
    with pytest.raises(AttributeError):
        d.limit_w = 1.0  # type: ignore[misc]
    assert replace(state) == state
