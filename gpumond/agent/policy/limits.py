"""Persistent power limits: which configured setting applies to a GPU, and is it allowed there."""

from __future__ import annotations

from dataclasses import dataclass

from gpumond.agent.policy.view import GpuView
from gpumond.config import PowerLimitConfig, PowerSetting

_WHERE = "policy.power_limit"


@dataclass(frozen=True, slots=True)
class LimitResolution:
    """The persistent limit for one GPU: watts to enforce, None to leave the board alone, or an error."""

    watts: float | None
    error: str | None = None
    source: str | None = None  # the config key that chose it, e.g. 'policy.power_limit.per_gpu["0"]'


def select_setting(view: GpuView, cfg: PowerLimitConfig) -> tuple[str, PowerSetting] | None:
    """The most specific setting for this GPU (uuid > index > model > default) and its config key."""
    for selector in (view.uuid, str(view.index), view.name):
        setting = cfg.per_gpu.get(selector) if selector else None
        if setting is not None:
            return f'{_WHERE}.per_gpu["{selector}"]', setting
    if cfg.default_w is not None:
        return f"{_WHERE}.default_w", cfg.default_w
    return None


def resolve_persistent_limit(view: GpuView, cfg: PowerLimitConfig) -> LimitResolution:
    """Watts for this GPU within its NVML constraints; outside them is an error, never a silent clamp."""
    chosen = select_setting(view, cfg)
    if chosen is None:
        return LimitResolution(None)
    source, setting = chosen
    if setting.percent is not None:
        if view.limit_default_w is None:
            return _error(source, f"{setting} needs the GPU's default power limit, which it does not report; "
                                  "give watts instead")
        watts = round(view.limit_default_w * setting.percent / 100.0, 3)
        asked = f"{setting} of the {view.limit_default_w:g} W default is {watts:g} W, which"
    else:
        watts = float(setting.watts or 0.0)
        asked = f"{watts:g} W"
    low, high = view.limit_min_w, view.limit_max_w
    if low is None or high is None:
        # A limit we cannot bound is never set: bounds come from NVML's constraints (docs/policy.md).
        return _error(source, f"{asked} cannot be checked: the GPU does not report its power-limit "
                              "constraints; not applied")
    bounds = f"(NVML constraints {low:g}–{high:g} W)"
    if watts > high:
        return _error(source, f"{asked} is above this GPU's maximum of {high:g} W {bounds}")
    if watts < low:
        return _error(source, f"{asked} is below this GPU's minimum of {low:g} W {bounds}")
    return LimitResolution(watts, source=source)


def _error(source: str, problem: str) -> LimitResolution:
    return LimitResolution(None, f"{source}: {problem}", source)
