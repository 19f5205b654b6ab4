"""Controller variants for experiments: patch gpumond's thermal controller inside this process only.

`benchmarks/thermal_policy.py --variant NAME` runs run (c) with one of these in place of the shipped
logic, so that a proposed change can be measured on the same scenario before anyone edits gpumond/.
A variant replaces a private function of `gpumond.agent.policy.thermal` (thermal_step looks it up at
call time) and is undone on exit. Results of a variant run are printed, never written over the
committed results.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from gpumond.agent.policy import thermal
from gpumond.agent.policy.thermal_model import limit_for_mean_power, mean_power_under


def _assess_unbiased_power(nodes, samples, limit, ceiling, r, gains):  # type: ignore[no-untyped-def]
    """`thermal._assess`, with the forecast made on the power the recent load actually drew.

    Shipped: the forecast uses mean_power_under(samples, limit), which counts every sample with the
    SwPowerCap bit as drawing the whole limit. NVML's power reading is a 1 s average, so the sample
    taken just after a training step's light phase has the bit set (the busy phase has started) but
    an average far below the limit: the mean is overestimated (by ~20–30 W on a 10 s step) and the
    forecast sits ~1 °C high, so the GPU is held ~1 °C under target. Here the forecast uses the
    measured mean (each sample clipped to the current limit) and the limit model only for how the
    mean would change with the limit (the same shift is added to the power wanted).
    """
    modelled = mean_power_under(samples, limit)
    power = sum(min(s.power_w, limit) for s in samples) / len(samples) if samples else limit
    shift = modelled - power
    found = []
    for node, goal, name, measured in nodes:
        forecast = node.forecast_c(power, r, gains.tau_s, gains.horizon_s)
        wanted = node.power_for(goal, r, gains.tau_s, gains.horizon_s) + shift
        fit = limit_for_mean_power(samples, wanted, 0.0, ceiling)
        found.append(thermal._Assessment(name, measured, forecast, goal, fit))
    return min(found, key=lambda a: a.room)


VARIANTS: dict[str, tuple[str, Callable[..., object]]] = {
    "unbiased-power": ("_assess", _assess_unbiased_power),
}


@contextlib.contextmanager
def applied(name: str | None) -> Iterator[None]:
    """Patch the named variant in for the duration of the block (None: the shipped controller)."""
    if name is None:
        yield
        return
    attr, fn = VARIANTS[name]
    original = getattr(thermal, attr)
    setattr(thermal, attr, fn)
    try:
        yield
    finally:
        setattr(thermal, attr, original)
