"""Pure: the closed loop around a job's power-slack offers. The job's step time before any offer is its
baseline; while offers stand, a step time above the baseline by more than the margin withdraws every offer
for the job at once (the agents drop those leases at their next answer) and holds new ones off for a while."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True, slots=True)
class JobLoop:
    """One job's loop: its baseline step time, whether offers stand, until when they are held off."""

    baseline_s: float | None = None
    offering: bool = False
    held_until: float = 0.0
    backoffs: int = 0
    learnt: int = 0  # evaluations in the baseline so far


def advance_loop(loop: JobLoop, step_s: float, now: float, *, margin: float, hold_s: float,
                 learn: int = 5, alpha: float = 0.2) -> JobLoop:
    """The loop after one evaluation of the job's recent median step time; `loop.offering` says whether its
    GPUs may be offered lower limits now (after `learn` evaluations of the unshifted step time)."""
    if step_s <= 0:
        return loop
    if loop.offering:
        assert loop.baseline_s is not None
        if step_s > loop.baseline_s * (1.0 + margin):
            # Back off at once: the measured step time is the judge, whatever the power model predicted.
            return JobLoop(None, False, now + hold_s, loop.backoffs + 1, 0)
        return loop
    if now < loop.held_until:
        return loop
    # Not offering: learn the baseline (a slow moving mean of the unshifted step time), then offer.
    n = loop.learnt + 1
    base = step_s if loop.baseline_s is None else loop.baseline_s + (step_s - loop.baseline_s) * max(alpha, 1 / n)
    return replace(loop, baseline_s=base, learnt=n, offering=n >= learn)
