"""The closed loop around power-slack offers (gpumond/rules/energy/loop.py): offers start after a baseline,
stop at once when the step time rises by more than the margin, and are held off for a while."""

from __future__ import annotations

from gpumond.rules.energy.loop import JobLoop, advance_loop


def run(steps: list[float], t0: float = 0.0) -> list[JobLoop]:
    loop, out = JobLoop(), []
    for i, s in enumerate(steps):
        loop = advance_loop(loop, s, t0 + 10 * i, margin=0.02, hold_s=300, learn=2)
        out.append(loop)
    return out


def test_offers_start_after_a_baseline_and_stand_while_the_step_time_holds() -> None:
    loops = run([1.0, 1.0, 1.01, 1.015, 0.99])
    assert [l.offering for l in loops] == [False, True, True, True, True]
    assert loops[-1].baseline_s == 1.0 and loops[-1].backoffs == 0


def test_a_step_time_above_the_margin_withdraws_at_once_and_holds_off() -> None:
    loops = run([1.0, 1.0, 1.03] + [1.0] * 32)
    assert loops[2].offering is False and loops[2].backoffs == 1 and loops[2].held_until == 320
    assert not any(l.offering for l in loops[3:33])  # held off until t = 320, then a new baseline
    assert loops[33].offering and loops[33].backoffs == 1
