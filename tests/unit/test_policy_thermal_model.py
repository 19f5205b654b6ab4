"""Thermal model pieces: the observer converges, forecast and its inverse agree, water-filling."""

from __future__ import annotations

import math

import pytest

from gpumond.agent.policy.thermal_model import (
    PowerSample,
    ThermalObserver,
    limit_for_mean_power,
    mean_power_under,
)


def test_observer_starts_in_equilibrium() -> None:
    node = ThermalObserver.start(0.0, 80.0, 500.0, 0.1)
    assert node.offset_c == pytest.approx(30.0)
    assert node.forecast_c(500.0, 0.1, 30.0, 15.0) == pytest.approx(80.0)


def test_observer_sees_a_power_step_at_once_and_learns_the_true_offset() -> None:
    # Plant: inlet 40, R = 0.1, τ = 30; the observer assumes R = 0.08.
    node = ThermalObserver.start(0.0, 90.0, 500.0, 0.08)
    temp = 90.0
    for t in range(1, 300):
        power = 500.0 if t < 50 else 600.0
        steady = 40.0 + 0.1 * power
        temp = steady + (temp - steady) * math.exp(-1 / 30)
        node = node.update(float(t), float(round(temp)), power, 0.08, 30.0, 6.0)
        if t == 50:
            # One second after the step the model already expects most of the 10 °C rise.
            assert node.offset_c + 0.08 * power > 97.0
    assert node.offset_c + 0.08 * 600.0 == pytest.approx(100.0, abs=0.6)


def test_power_for_inverts_forecast() -> None:
    node = ThermalObserver(0.0, 70.0, 35.0)
    power = node.power_for(84.0, 0.09, 30.0, 15.0)
    assert node.forecast_c(power, 0.09, 30.0, 15.0) == pytest.approx(84.0)


def test_update_ignores_time_going_backwards() -> None:
    node = ThermalObserver(10.0, 70.0, 35.0)
    assert node.update(10.0, 99.0, 500.0, 0.1, 30.0, 6.0) is node


def test_capped_samples_draw_the_whole_new_limit() -> None:
    samples = [PowerSample(0, 500.0, True), PowerSample(1, 500.0, True), PowerSample(2, 300.0, False),
               PowerSample(3, 300.0, False)]
    assert mean_power_under(samples, 500.0) == 400.0
    assert mean_power_under(samples, 600.0) == 450.0  # capped ones would take more
    assert mean_power_under(samples, 250.0) == 250.0
    assert mean_power_under([], 420.0) == 420.0


def test_lowering_only_trims_the_busy_part() -> None:
    samples = [PowerSample(t, 690.0, True) for t in range(8)] + [PowerSample(8, 300.0, False),
                                                                   PowerSample(9, 300.0, False)]
    limit = limit_for_mean_power(samples, 500.0, 200.0, 700.0)
    assert mean_power_under(samples, limit) == pytest.approx(500.0, abs=0.01)
    assert limit == pytest.approx(550.0, abs=0.01)  # (500·10 − 2·300) / 8


def test_limit_for_mean_power_stays_in_bounds() -> None:
    samples = [PowerSample(0, 400.0, True)]
    assert limit_for_mean_power(samples, 900.0, 200.0, 700.0) == 700.0
    assert limit_for_mean_power(samples, 100.0, 200.0, 700.0) == 200.0
