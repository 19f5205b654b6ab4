"""The first-order thermal model the controller reasons with: an observer and a power forecast.

Physics: T' = (A + R·P − T)/τ, where A is everything that is not this GPU's own power
(inlet air, neighbours, fan curve) and R the thermal resistance in °C/W. R and τ are
assumed (see ThermalGains); A is estimated online by a two-state Luenberger observer from
the measured temperature and power, so a wrong R is absorbed into A at the operating point
instead of biasing the forecast. Unlike a slope fitted to past temperatures, the model sees
a change of power (a load step, or the controller's own cut) the moment it happens.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ThermalObserver:
    """Estimated temperature and offset A of one thermal node (the die, or the HBM)."""

    t: float
    temp_c: float
    offset_c: float

    @classmethod
    def start(cls, t: float, temp_c: float, power_w: float, r: float) -> ThermalObserver:
        """Assume equilibrium at the first reading: A = T − R·P."""
        return cls(t, temp_c, temp_c - r * power_w)

    def update(self, t: float, measured_c: float, power_w: float, r: float, tau_s: float,
               bandwidth_s: float) -> ThermalObserver:
        """Predict to `t` with `power_w` held since the last update, then correct toward the reading.

        Gains put both observer poles at p = e^(−dt/bandwidth): for x = (T, A),
        F = [[a, 1−a], [0, 1]] with a = e^(−dt/τ), the error dynamics (I − L·[1, 0])·F have
        the characteristic polynomial (z − p)² when l1 = 1 − p²/a and l2 = (1 − p)²/(1 − a).
        """
        dt = t - self.t
        if dt <= 0.0:
            return self
        a = math.exp(-dt / tau_s)
        p = math.exp(-dt / bandwidth_s)
        predicted = self.offset_c + r * power_w + (self.temp_c - self.offset_c - r * power_w) * a
        innovation = measured_c - predicted
        l1 = 1.0 - p * p / a
        l2 = (1.0 - p) ** 2 / (1.0 - a)
        return ThermalObserver(t, predicted + l1 * innovation, self.offset_c + l2 * innovation)

    def forecast_c(self, power_w: float, r: float, tau_s: float, horizon_s: float) -> float:
        """Temperature `horizon_s` from now if the mean power stays `power_w`."""
        reach = 1.0 - math.exp(-horizon_s / tau_s)
        return self.temp_c + reach * (self.offset_c + r * power_w - self.temp_c)

    def power_for(self, temp_c: float, r: float, tau_s: float, horizon_s: float) -> float:
        """The mean power whose forecast is exactly `temp_c` (inverse of forecast_c)."""
        reach = 1.0 - math.exp(-horizon_s / tau_s)
        return ((temp_c - self.temp_c) / reach + self.temp_c - self.offset_c) / r


@dataclass(frozen=True, slots=True)
class PowerSample:
    """One power reading and whether the power cap was holding the GPU back at the time."""

    t: float
    power_w: float
    capped: bool


def mean_power_under(samples: Sequence[PowerSample], limit_w: float) -> float:
    """Mean power the recent load would draw under `limit_w`.

    A capped sample wanted at least its cap, so it is taken to draw the whole new limit (an
    upper bound when raising, exact when cutting); an uncapped one draws what it drew, clipped.
    """
    if not samples:
        return limit_w
    return sum(limit_w if s.capped else min(s.power_w, limit_w) for s in samples) / len(samples)


def limit_for_mean_power(samples: Sequence[PowerSample], power_w: float, low: float, high: float) -> float:
    """The limit in [low, high] under which the recent load would draw `power_w` on average.

    Lowering a limit only trims the samples above it (a training step's light phase is not
    touched), so the answer can sit well below a naive `power_w`. Bisection: the mean is
    continuous and non-decreasing in the limit.
    """
    if mean_power_under(samples, high) <= power_w:
        return high
    if mean_power_under(samples, low) >= power_w:
        return low
    for _ in range(50):
        mid = 0.5 * (low + high)
        if mean_power_under(samples, mid) < power_w:
            low = mid
        else:
            high = mid
    return 0.5 * (low + high)
