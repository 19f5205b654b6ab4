"""Pure: power slack. A GPU of a synchronous job that finishes its compute early and waits for its peers every
step runs faster than the job needs; the lowest power limit under which it still finishes a stated margin
before the slowest peer is what it can give up.

The power a GPU needs for a clock is read from its own measured operating points (mean SM clock and mean
power under each limit it has run at), never from a constant: between two measured points the chord is used,
which for a convex power curve (dynamic power ∝ f·V², the voltage rising with the clock) lies above the curve,
so the limit is never lower than the clock needs. Below the lowest measured point nothing is known: the
recommendation is then one step below it (a probe, no larger than the clock's remaining cut in proportion:
under load power falls at least as fast as the clock), and the points measured there extend what is known.
Compute time is taken to scale with 1/clock (`clock_bound` = 1), the most a clock cut can cost: a kernel
bound by memory slows less.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class OperatingPoint:
    """A GPU's mean SM clock and power over a while under one limit."""

    clock_hz: float
    power_w: float


@dataclass(frozen=True, slots=True)
class RankTime:
    """One rank's step as the detectors measured it: its median step time and the share of it spent computing
    (neither waiting on its data loader nor on its peers)."""

    rank: int
    gpu_uuid: str
    step_s: float
    compute_share: float

    @property
    def compute_s(self) -> float:
        return self.step_s * self.compute_share


@dataclass(frozen=True, slots=True)
class Recommendation:
    """A power limit for one GPU and why: `interpolated` from measured points, a `probe` step below them, or
    `hold` (at the margin already: keep the limit it has)."""

    gpu_uuid: str
    limit_w: float
    clock_hz: float  # the lowest clock that keeps the margin
    basis: str  # "interpolated" | "probe" | "hold"
    compute_s: float
    slowest_compute_s: float


def target_clock(compute_s: float, slowest_compute_s: float, clock_hz: float, margin: float,
                 clock_bound: float = 1.0) -> float | None:
    """The lowest clock at which `compute_s` (measured at `clock_hz`) still ends `margin` (a share of the slowest
    peer's compute) before the slowest peer's; None when it has no such slack. A share `clock_bound` of the
    compute scales with 1/clock, the rest not at all."""
    budget = slowest_compute_s * (1.0 - margin)
    if compute_s <= 0.0 or clock_hz <= 0.0 or budget <= compute_s or not 0.0 < clock_bound <= 1.0:
        return None
    # compute_s · (clock_bound · f0/f + 1 − clock_bound) ≤ budget
    return clock_hz * clock_bound / (budget / compute_s - 1.0 + clock_bound)


def operating_points(samples: Iterable[tuple[float, float]], resolution_hz: float = 15e6) -> list[OperatingPoint]:
    """(clock Hz, power W) samples as one point per clock bin (the mean of each), lowest clock first."""
    bins: dict[int, list[tuple[float, float]]] = {}
    for f, p in samples:
        if f > 0 and p > 0:
            bins.setdefault(round(f / resolution_hz), []).append((f, p))
    return [OperatingPoint(sum(f for f, _ in b) / len(b), sum(p for _, p in b) / len(b))
            for _, b in sorted(bins.items())]


def power_for_clock(points: Sequence[OperatingPoint], clock_hz: float) -> float | None:
    """The power for `clock_hz` on the chord between the measured points around it (points lowest clock first);
    None below the lowest measured clock (unknown). Above the highest, its power."""
    if not points or clock_hz < points[0].clock_hz:
        return None
    for lo, hi in zip(points, points[1:]):
        if lo.clock_hz <= clock_hz <= hi.clock_hz:
            if hi.clock_hz == lo.clock_hz:
                return max(lo.power_w, hi.power_w)
            w = (clock_hz - lo.clock_hz) / (hi.clock_hz - lo.clock_hz)
            # A measured curve may be noisy: never less than the lower point's power.
            return max(lo.power_w, lo.power_w + w * (hi.power_w - lo.power_w))
    return points[-1].power_w


def recommend(gpu_uuid: str, points: Sequence[OperatingPoint], clock_hz: float, compute_s: float,
              slowest_compute_s: float, *, margin: float, floor_w: float, ceiling_w: float, probe_w: float,
              clock_bound: float = 1.0, limit_w: float | None = None) -> Recommendation | None:
    """The limit to lease this GPU, or None (no slack, or nothing to gain within [floor_w, ceiling_w]).
    `limit_w`: its limit now. A GPU already below its ceiling that has reached the margin (its compute now
    ends just before the slowest's) keeps that limit (`hold`): withdrawing it would only start the walk down
    again; one that became the slowest gets nothing, and its lease is withdrawn."""
    f = target_clock(compute_s, slowest_compute_s, clock_hz, margin, clock_bound)
    if f is None:
        if limit_w is not None and limit_w < ceiling_w and compute_s < slowest_compute_s:
            return Recommendation(gpu_uuid, round(max(limit_w, floor_w), 1), clock_hz, "hold", compute_s,
                                  slowest_compute_s)
        return None
    power = power_for_clock(points, f)
    basis = "interpolated"
    if power is None:  # below what was measured: one step down from its lowest point, then measure again
        low = points[0]
        # Power falls at least in proportion to the clock under load (dynamic power ∝ f·V², V not falling as f
        # rises), so a cut of that proportion never takes the clock below the target: the probe cannot overshoot.
        power, basis = low.power_w - min(probe_w, low.power_w * (1.0 - f / low.clock_hz)), "probe"
    limit = min(max(power, floor_w), ceiling_w)
    if limit >= ceiling_w:
        return None
    return Recommendation(gpu_uuid, round(limit, 1), f, basis, compute_s, slowest_compute_s)


def job_recommendations(ranks: Sequence[RankTime], points: Mapping[str, Sequence[OperatingPoint]],
                        clocks: Mapping[str, float], *, margin: float, floor_w: Mapping[str, float],
                        ceiling_w: Mapping[str, float], probe_w: float,
                        limits: Mapping[str, float] | None = None) -> list[Recommendation]:
    """For each GPU of one synchronous job (every rank waits for the slowest at each step): its recommendation,
    for those with slack (or holding a limit at the margin) and a measured clock and points; `limits` each
    GPU's limit now. A job with one rank has no peers to wait for."""
    if len(ranks) < 2:
        return []
    slowest = max(r.compute_s for r in ranks)
    out = []
    for r in ranks:
        u = r.gpu_uuid
        if u not in clocks or not points.get(u) or u not in floor_w or u not in ceiling_w:
            continue
        rec = recommend(u, points[u], clocks[u], r.compute_s, slowest, margin=margin, floor_w=floor_w[u],
                        ceiling_w=ceiling_w[u], probe_w=probe_w, limit_w=(limits or {}).get(u))
        if rec is not None:
            out.append(rec)
    return out
