"""Closed-loop thermal power capping for one GPU: a pure controller on forecast temperature.

Every control step (`interval_s`) the controller forecasts the temperature one horizon H
ahead (thermal_model: an observer of T' = (A + R·P − T)/τ, and the mean power the recent
load would draw under a given limit), and finds the limit L* whose forecast is exactly the
target. It then moves the limit toward L*:

- down at once by `cut_gain`·(L − L*) when the forecast is above target (fast to cut);
- up by `raise_gain`·(L* − L), at most `step_w` a step, only once the forecast has been
  more than `hysteresis_c` below target at every step of the last `raise_window_s`, and on
  until it comes within `settle_c` of target (slow to give back; the band keeps a cut from
  being undone by the next reading, the window keeps a training step's light phase from
  passing for cooler weather);
- at once and in full, without waiting for the step, when the temperature is already
  `emergency_c` above target.

As increments on the limit this is a velocity-form PI: integral action because the limit
keeps moving while the forecast is off target, a proportional part through the forecast's
slope term. The limit is the integrator and is clamped to [floor, ceiling], so nothing
winds up at either bound; and it is not raised while the GPU draws less than it (raising a
limit nobody reaches would only store up an overshoot for the next load step).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gpumond.agent.policy.thermal_model import (
    PowerSample,
    ThermalObserver,
    limit_for_mean_power,
    mean_power_under,
)
from gpumond.agent.policy.view import GPU_IDLE, SW_POWER_CAP, GpuView
from gpumond.config import ThermalConfig

FALLBACK_TARGET_C = 83.0  # when the driver reports no slowdown threshold


@dataclass(frozen=True, slots=True)
class ThermalGains:
    """Controller constants; tuned on the simulator benchmark, deliberately not operator settings."""

    rise_at_max_c: float = 60.0  # assumed die-over-inlet rise at the board's max power → R
    tau_s: float = 30.0  # assumed thermal time constant (datacenter coolers: 20–40 s)
    horizon_s: float = 15.0  # how far ahead the forecast looks; ≈ closed-loop time constant
    observer_s: float = 6.0  # observer time constant: filters 1 °C sensor steps, follows A
    cut_gain: float = 0.8  # fraction of the model's cut applied per step (<1: R is a guess)
    raise_gain: float = 0.5  # fraction of the model's headroom given back per step (≤ step_w)
    settle_c: float = 0.5  # a rise continues until the forecast is this close to target
    emergency_c: float = 2.0  # this far above target: cut at once and in full
    power_window_s: float = 10.0  # recent power that stands for "the load now" (cuts)
    raise_window_s: float = 60.0  # a give-back must fit every step of this long (periodic loads)
    power_slack: float = 0.03  # drawing ≥ (1 − slack)·limit counts as held back by the cap
    min_change_w: float = 3.0  # smaller changes are not worth an NVML set and an audit line
    round_w: float = 1.0  # limits are whole watts: NVML takes mW, audit lines stay readable

    def resistance(self, view: GpuView, ceiling_w: float) -> float:
        """Assumed thermal resistance R in °C/W: full power lifts the die `rise_at_max_c`."""
        full = view.limit_max_w or view.limit_default_w or ceiling_w
        return self.rise_at_max_c / max(full, 1.0)


DEFAULT_GAINS = ThermalGains()


@dataclass(frozen=True, slots=True)
class ThermalState:
    """Everything the controller remembers about one GPU between calls."""

    limit_w: float | None = None  # the limit it wants; None before the first call
    last_step_at: float | None = None
    die: ThermalObserver | None = None
    memory: ThermalObserver | None = None
    power: tuple[PowerSample, ...] = ()
    raising: bool = False  # inside a give-back that started below target − hysteresis
    history: tuple[tuple[float, float, float], ...] = ()  # (t, room °C, fitting limit W) per step
    at_floor: bool = False  # pinned at the floor while the forecast is still above target


@dataclass(frozen=True, slots=True)
class ThermalDecision:
    """What the controller wants now and why; `changed` = differs from its previous wish."""

    limit_w: float
    reason: str
    changed: bool
    target_c: float | None = None


def thermal_target(view: GpuView, cfg: ThermalConfig) -> float:
    """The GPU temperature to hold: configured, else slowdown threshold − margin, else 83 °C."""
    if cfg.target_c is not None:
        return cfg.target_c
    if view.slowdown_c is not None:
        return view.slowdown_c - cfg.margin_c
    return FALLBACK_TARGET_C


def thermal_bounds(view: GpuView, cfg: ThermalConfig, ceiling_w: float) -> tuple[float, float]:
    """(floor, ceiling) for this GPU; a ceiling below the floor wins (never exceed the operator's cap)."""
    ceiling = ceiling_w if view.limit_max_w is None else min(ceiling_w, view.limit_max_w)
    floor = max(cfg.floor_w or 0.0, view.limit_min_w or 0.0)
    return min(floor, ceiling), ceiling


def thermal_step(
    state: ThermalState, view: GpuView, cfg: ThermalConfig, ceiling_w: float, now: float,
    gains: ThermalGains = DEFAULT_GAINS,
) -> tuple[ThermalState, ThermalDecision]:
    """Call once per sample: the next state and the limit the policy wants for this GPU now."""
    floor, ceiling = thermal_bounds(view, cfg, ceiling_w)
    previous = state.limit_w if state.limit_w is not None else view.enforced_limit_w
    start = previous if previous is not None else ceiling
    limit = _clamp(start, floor, ceiling)
    notes = [_bound_note(start, limit, floor, ceiling)]

    def decide(new: float, reason: str, nxt: ThermalState, target: float | None = None):
        changed = previous is None or abs(new - previous) >= 0.5
        text = "; ".join(n for n in (*notes, reason) if n)
        return replace(nxt, limit_w=new), ThermalDecision(new, text, changed, target)

    if not cfg.enabled:
        return decide(ceiling, "thermal control disabled: persistent limit only", ThermalState())
    if not view.up or view.temperature_c is None:
        # Forget the model: after a gap its estimates would be stale, not merely old.
        why = "GPU not readable" if not view.up else "no temperature reading"
        forgotten = ThermalState(limit_w=state.limit_w, last_step_at=state.last_step_at)
        return decide(limit, f"{why}: holding {_w(limit)}", forgotten)

    r = gains.resistance(view, ceiling)
    state = _observe(state, view, limit, now, r, gains)
    target = thermal_target(view, cfg)
    nodes = _nodes(state, view, cfg, target)
    near = _assess(nodes, state.power, limit, ceiling, r, gains)
    emergency = near.room < 0 and any(m - g >= gains.emergency_c for _, g, _, m in nodes)
    due = state.last_step_at is None or now - state.last_step_at >= cfg.interval_s
    if not (due or emergency):
        return decide(limit, f"between control steps: holding {_w(limit)}", state, target)

    history = (*_since_steps(state.history, now - gains.raise_window_s), (now, near.room, near.wanted_w))
    state = replace(state, last_step_at=now, history=history)
    if near.room < 0 and view.clocks_event_mask is not None and view.clocks_event_mask & GPU_IDLE:
        return decide(limit, f"GPU idle, {near}: no tightening needed",
                      replace(state, raising=False, at_floor=False), target)
    if near.room < 0:
        gain = 1.0 if emergency else gains.cut_gain
        new = _clamp(_round(limit - gain * (limit - near.wanted_w), gains), floor, limit)
        if limit - new < gains.min_change_w and new > floor:
            new = limit
        pinned = new <= floor
        if new < limit:
            verb = "emergency cut" if emergency else "lowering"
            text = f"{near}: {verb} {_w(limit)} → {_w(new)}" + (f" (floor {_w(floor)})" if pinned else "")
        elif pinned:
            text = f"{near}: pinned at the floor {_w(floor)}"
        else:
            text = f"{near}: cut under {gains.min_change_w:g} W, holding {_w(limit)}"
        return decide(new, text, replace(state, raising=False, at_floor=pinned), target)

    # Giving back is judged on the worst step of the last raise_window_s: a training step's
    # light phase must not look like cooler weather.
    worst_room = min(h[1] for h in history)
    worst_wanted = min(h[2] for h in history)
    raising = state.raising or (worst_room > cfg.hysteresis_c and near.measured_c < near.goal_c - cfg.hysteresis_c)
    if worst_room <= gains.settle_c:
        raising = False
    state = replace(state, raising=raising, at_floor=False)
    if not raising or limit >= ceiling:
        return decide(limit, f"{near}: holding {_w(limit)}", state, target)
    if ceiling - limit <= cfg.step_w and worst_room > cfg.hysteresis_c + gains.settle_c:
        # The last few watts: halving steps under min_change_w (or a load just under the cap) would stall
        # short of the ceiling forever, leaving the GPU capped for no thermal reason. The whole raise
        # window had room to spare, and the remainder is at most one ordinary step.
        return decide(ceiling, f"{near}: raising {_w(limit)} → {_w(ceiling)} (back to the ceiling)", state, target)
    if not any(s.capped for s in state.power):
        return decide(limit, f"{near}: not held back by the cap, holding {_w(limit)}", state, target)
    gap = max(worst_wanted - limit, 0.0)
    step = min(cfg.step_w, gap, max(gains.raise_gain * gap, gains.min_change_w))
    new = _clamp(_round(limit + step, gains), limit, ceiling)
    if new - limit < gains.min_change_w and new < ceiling:
        return decide(limit, f"{near}: holding {_w(limit)}", state, target)
    return decide(new, f"{near}: raising {_w(limit)} → {_w(new)}", state, target)


@dataclass(frozen=True, slots=True)
class _Assessment:
    """The sensor with least room at the horizon under the current limit, and the limit that fits."""

    name: str
    measured_c: float
    forecast_c: float
    goal_c: float
    wanted_w: float  # the limit whose forecast for this load is exactly on target

    @property
    def room(self) -> float:
        """°C left below target at the horizon; negative = heading above it."""
        return self.goal_c - self.forecast_c

    def __str__(self) -> str:
        side = ">" if self.forecast_c > self.goal_c else "≤"
        return (f"{self.name} {self.measured_c:.1f} °C, forecast {self.forecast_c:.1f} °C "
                f"{side} target {self.goal_c:g} °C")


def _assess(nodes: list[tuple[ThermalObserver, float, str, float]], samples: tuple[PowerSample, ...],
            limit: float, ceiling: float, r: float, gains: ThermalGains) -> _Assessment:
    # Forecast on the power the recent load actually drew (clipped to the current limit). NVML's power
    # reading is a 1 s average: the sample just after a light phase has SwPowerCap set but an average
    # far below the limit, so mean_power_under() overstates the mean (~20–30 W on 10 s steps, ~1 °C of
    # forecast). The limit model is used only for how the mean changes with the limit: `shift`.
    modelled = mean_power_under(samples, limit)
    power = sum(min(s.power_w, limit) for s in samples) / len(samples) if samples else limit
    shift = modelled - power
    found = []
    for node, goal, name, measured in nodes:
        forecast = node.forecast_c(power, r, gains.tau_s, gains.horizon_s)
        wanted = node.power_for(goal, r, gains.tau_s, gains.horizon_s) + shift
        fit = limit_for_mean_power(samples, wanted, 0.0, ceiling)
        found.append(_Assessment(name, measured, forecast, goal, fit))
    return min(found, key=lambda a: a.room)


def _since_steps(history: tuple[tuple[float, float, float], ...], t: float) -> tuple[tuple[float, float, float], ...]:
    return tuple(h for h in history if h[0] > t)


def _observe(state: ThermalState, view: GpuView, limit: float, now: float, r: float,
             gains: ThermalGains) -> ThermalState:
    """Fold one reading into the observers and the recent-power window."""
    assert view.temperature_c is not None
    power = view.power_w
    watts = power if power is not None else 0.0  # without power, A absorbs it all
    die = _track(state.die, now, view.temperature_c, watts, r, gains)
    memory = None
    if view.memory_temperature_c is not None:
        memory = _track(state.memory, now, view.memory_temperature_c, watts, r, gains)
    samples = [s for s in state.power if now - s.t < gains.power_window_s and s.t < now]
    if power is not None:
        cap = view.enforced_limit_w if view.enforced_limit_w is not None else limit
        capped = bool((view.clocks_event_mask or 0) & SW_POWER_CAP) or power >= cap * (1.0 - gains.power_slack)
        samples.append(PowerSample(now, power, capped))
    return replace(state, die=die, memory=memory, power=tuple(samples))


def _track(node: ThermalObserver | None, now: float, temp_c: float, power_w: float, r: float,
           gains: ThermalGains) -> ThermalObserver:
    if node is None or now - node.t > 4 * gains.power_window_s:
        return ThermalObserver.start(now, temp_c, power_w, r)
    return node.update(now, temp_c, power_w, r, gains.tau_s, gains.observer_s)


def _nodes(state: ThermalState, view: GpuView, cfg: ThermalConfig,
           target: float) -> list[tuple[ThermalObserver, float, str, float]]:
    """(observer, goal °C, name, measured °C) for every controlled sensor."""
    assert state.die is not None and view.temperature_c is not None
    nodes = [(state.die, target, "temp", view.temperature_c)]
    if cfg.memory_target_c is not None and state.memory is not None and view.memory_temperature_c is not None:
        nodes.append((state.memory, cfg.memory_target_c, "memory temp", view.memory_temperature_c))
    return nodes


def _bound_note(start: float, limit: float, floor: float, ceiling: float) -> str:
    if start > limit:
        return f"ceiling {_w(ceiling)} is below {_w(start)}: lowering to it"
    if start < limit:
        return f"floor {_w(floor)} is above {_w(start)}: raising to it"
    return ""


def _clamp(value: float, low: float, high: float) -> float:
    return max(low, min(high, value))


def _round(watts: float, gains: ThermalGains) -> float:
    return round(watts / gains.round_w) * gains.round_w


def _w(watts: float) -> str:
    return f"{watts:.0f} W"

