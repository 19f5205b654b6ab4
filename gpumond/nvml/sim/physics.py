"""Pure functions of the GPU model: load, clocks, power and temperature.

No state lives here; `gpu.SimGpu` owns state and calls these once per integration step.
Everything is closed form (no solvers) because a simulated NVML call should cost
microseconds.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .models import (
    HW_SLOWDOWN_HYSTERESIS_C,
    HW_THERMAL_CLOCK_FACTOR,
    IDLE_UTILIZATION,
    SW_THERMAL_CLOCK_FACTOR,
    SW_THERMAL_HYSTERESIS_C,
    GpuModelSpec,
)

if TYPE_CHECKING:  # annotations only: the scenario module reaches the library, which uses these functions
    from .scenario import InletProfile, LoadPattern

# nvmlClocksEventReason* bits.
REASON_GPU_IDLE = 0x1
REASON_SW_POWER_CAP = 0x4
REASON_HW_SLOWDOWN = 0x8
REASON_SYNC_BOOST = 0x10
REASON_SW_THERMAL = 0x20
REASON_HW_THERMAL = 0x40
REASON_HW_POWER_BRAKE = 0x80

_MASK64 = 0xFFFFFFFFFFFFFFFF
NOISE_BUCKET_S = 1.0  # noise is re-drawn once per simulated second


def _unit_hash(key: int, bucket: int) -> float:
    """A uniform number in [0, 1) from (key, bucket): splitmix64, so noise depends only on
    simulated time and seed, never on how often anybody polled."""
    z = (key * 0x9E3779B97F4A7C15 + bucket * 0xBF58476D1CE4E5B9 + 0x94D049BB133111EB) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return ((z ^ (z >> 31)) >> 11) / float(1 << 53)


def utilization_at(load: LoadPattern, t: float, noise_key: int) -> float:
    if load.pattern == "idle":
        return 0.0
    u = load.utilization
    if load.pattern == "training":
        pos = (t + load.phase_s) % load.period_s
        if pos >= load.busy_fraction * load.period_s:
            u = load.low_utilization
    if load.noise and u > 0.0:
        r = _unit_hash(noise_key, int(math.floor(t / NOISE_BUCKET_S)))
        u = min(1.0, max(0.0, u + load.noise * (2.0 * r - 1.0)))
    return u


def next_load_change(load: LoadPattern, t: float) -> float:
    """The next time after t at which utilization_at() may change value."""
    nxt = math.inf
    if load.pattern == "idle":
        return nxt
    if load.pattern == "training":
        period = load.period_s
        pos = (t + load.phase_s) % period
        busy_end = load.busy_fraction * period
        nxt = t + (busy_end - pos if pos < busy_end else period - pos)
    if load.noise:
        nxt = min(nxt, (math.floor(t / NOISE_BUCKET_S) + 1.0) * NOISE_BUCKET_S)
    return nxt


def memory_used_fraction(load: LoadPattern) -> float:
    if load.memory_used_fraction is not None:
        return load.memory_used_fraction
    # A training process allocates most of HBM up front (caching allocator) and keeps it.
    return 0.005 if load.pattern == "idle" else 0.85


def sm_activity_factor(load: LoadPattern, busy_idle: float | None) -> float:
    """SM activity (share of SMs busy) per unit of utilization: a busy-but-idle fault overrides the load."""
    if busy_idle is not None:
        return busy_idle
    if load.sm_activity is not None:
        return load.sm_activity
    return min(1.0, 0.85 * load.intensity)


def inlet_at(inlet: InletProfile, t: float) -> float:
    if not inlet.swing_c:
        return inlet.base_c
    return inlet.base_c + inlet.swing_c * math.sin(2.0 * math.pi * t / inlet.period_s)


def relax(value: float, target: float, dt: float, tau: float) -> float:
    """Exact solution of dv/dt = (target − v)/tau over dt with target held constant."""
    return target + (value - target) * math.exp(-dt / tau)


def thermal_flags(spec: GpuModelSpec, temp_c: float, hw_prev: bool, sw_prev: bool) -> tuple[bool, bool]:
    """(hardware slowdown, software slowdown) with hysteresis: once on, each stays on until
    the die has cooled a few degrees below its threshold."""
    hw = temp_c >= (spec.slowdown_c - HW_SLOWDOWN_HYSTERESIS_C if hw_prev else spec.slowdown_c)
    sw = temp_c >= (spec.gpu_max_c - SW_THERMAL_HYSTERESIS_C if sw_prev else spec.gpu_max_c)
    return hw, sw


def operating_point(spec: GpuModelSpec, util: float, intensity: float, hw_slow: bool,
                    sw_slow: bool, slow_factor: float, limit_w: float) -> tuple[float, float, int]:
    """(SM clock MHz, power W, clocks-event reason bits) for one instant.

    Clock candidates are applied in the order the driver does: idle parking, thermal
    slowdown, then the power controller lowers the clock until the power fits the limit.
    `slow_factor` (a degraded part) cuts the clock without any reason bit.
    """
    fmax = float(spec.sm_max_mhz)
    reasons = 0
    if util < IDLE_UTILIZATION:
        f = float(spec.sm_idle_mhz)
        reasons |= REASON_GPU_IDLE
    else:
        f = fmax
    if hw_slow:
        f = min(f, fmax * HW_THERMAL_CLOCK_FACTOR)
        reasons |= REASON_HW_THERMAL | REASON_HW_SLOWDOWN
    elif sw_slow:
        f = min(f, fmax * SW_THERMAL_CLOCK_FACTOR)
        reasons |= REASON_SW_THERMAL
    f = max(f * slow_factor, float(spec.sm_min_mhz))
    dyn = spec.dyn_w * util * intensity
    power = spec.idle_w + dyn * (f / fmax) ** spec.alpha
    if power > limit_w and dyn > 0.0:
        # Solve idle + dyn·(f/fmax)^α = limit for f; the floor is the lowest DVFS clock.
        headroom = max(limit_w - spec.idle_w, 0.0)
        f = max(min(f, fmax * (headroom / dyn) ** (1.0 / spec.alpha)), float(spec.sm_min_mhz))
        power = spec.idle_w + dyn * (f / fmax) ** spec.alpha
        reasons |= REASON_SW_POWER_CAP
    return f, power, reasons


def steady_temperature(spec: GpuModelSpec, inlet_c: float, power_w: float, cooling_factor: float) -> float:
    return inlet_c + power_w * spec.r_th_c_per_w * cooling_factor


def memory_temperature(spec: GpuModelSpec, temp_c: float, power_w: float) -> float | None:
    if spec.mem_temp_offset_c_per_w is None:
        return None
    return temp_c + spec.mem_temp_offset_c_per_w * power_w
