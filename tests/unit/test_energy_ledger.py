"""Energy per job from GPU energy counters: counter resets, lost GPUs, agent restarts and jobs coming and going
neither lose nor double-count energy (pure accumulator, gpumond/rules/energy/ledger.py)."""

from __future__ import annotations

import math

import pytest

from gpumond.rules.energy.ledger import Ledger, Progress, Reading, advance, counter_increase, forget

A, B, C = "GPU-a", "GPU-b", "GPU-c"


def run(fetches: list[tuple[list[Reading], dict]], progress: list[dict] | None = None) -> Ledger:
    ledger = Ledger()
    for i, (rs, holders) in enumerate(fetches):
        ledger = advance(ledger, rs, holders, (progress or [{}] * len(fetches))[i])
    return ledger


def test_counter_increase_is_the_difference_or_the_new_value_after_a_reset() -> None:
    assert counter_increase(100.0, 150.0) == 50.0
    assert counter_increase(100.0, 30.0) == 30.0  # reset: counts from 0 again


def test_two_gpus_of_one_job_add_up() -> None:
    held = {A: (("j", 1.0),), B: (("j", 1.0),)}
    ledger = run([([Reading(A, 0, 1000), Reading(B, 0, 5000)], held),
                  ([Reading(A, 10, 4000), Reading(B, 10, 7000)], held)])
    e = ledger.jobs["j"]
    assert e.joules == 5000.0 and e.seconds == 10.0 and e.mean_power_w == 500.0


def test_energy_before_the_job_was_on_the_gpu_is_not_its() -> None:
    ledger = run([([Reading(A, 0, 0)], {}),
                  ([Reading(A, 10, 3000)], {A: (("j", 1.0),)}),
                  ([Reading(A, 20, 5000)], {A: (("j", 1.0),)})])
    assert ledger.jobs["j"].joules == 2000.0


def test_a_lost_gpu_is_credited_once_for_the_gap_when_it_returns() -> None:
    held = {A: (("j", 1.0),), B: (("j", 1.0),)}
    ledger = run([([Reading(A, 0, 0), Reading(B, 0, 0)], held),
                  ([Reading(A, 10, 100)], held),  # B missing (lost, or its agent restarting)
                  ([Reading(A, 20, 200)], held),
                  ([Reading(A, 30, 300), Reading(B, 30, 450)], held)])
    assert ledger.jobs["j"].joules == 750.0


def test_a_counter_reset_counts_from_zero() -> None:
    held = {A: (("j", 1.0),)}
    ledger = run([([Reading(A, 0, 10_000)], held), ([Reading(A, 10, 11_000)], held),
                  ([Reading(A, 20, 400)], held), ([Reading(A, 30, 1400)], held)])
    assert ledger.jobs["j"].joules == 1000 + 400 + 1000


def test_unusable_values_and_old_readings_are_no_reading() -> None:
    held = {A: (("j", 1.0),)}
    ledger = run([([Reading(A, 0, 0)], held), ([Reading(A, 10, math.nan)], held), ([Reading(A, 10, -5)], held),
                  ([Reading(A, 10, 100)], held), ([Reading(A, 5, 9e9)], held), ([Reading(A, 10, 9e9)], held),
                  ([Reading(A, 20, 200)], held)])
    assert ledger.jobs["j"].joules == 200.0


def test_shares_split_a_board_and_a_job_leaving_stops_its_credit() -> None:
    both = {A: (("j", 3 / 7), ("k", 4 / 7))}
    ledger = run([([Reading(A, 0, 0)], both), ([Reading(A, 10, 700)], both),
                  ([Reading(A, 20, 1400)], {A: (("k", 4 / 7),)})])
    assert ledger.jobs["j"].joules == pytest.approx(300.0)
    assert ledger.jobs["k"].joules == pytest.approx(800.0)


def test_steps_and_samples_since_first_seen_and_a_restart_from_a_checkpoint() -> None:
    held = {A: (("j", 1.0),)}
    fetches = [([Reading(A, t, 100.0 * t)], held) for t in (0, 10, 20, 30)]
    progress = [{"j": Progress(50, 0)}, {"j": Progress(60, 640)}, {"j": Progress(55, 640)},  # restarted at 55
                {"j": Progress(65, 1280)}]
    e = run(fetches, progress).jobs["j"]
    assert (e.steps, e.samples) == (20, 1280)
    assert e.joules_per_step == pytest.approx(3000 / 20) and e.joules_per_sample == pytest.approx(3000 / 1280)


def test_forget_drops_the_job_and_the_marks_only_it_held() -> None:
    ledger = run([([Reading(A, 0, 0), Reading(B, 0, 0)], {A: (("j", 1.0),), B: (("k", 1.0),)})])
    left = forget(ledger, ["j"])
    assert set(left.jobs) == {"k"} and set(left.marks) == {B}


def simulated_fleet(seconds: int, fetch_s: int, lost: tuple[int, int], restart: tuple[int, int]) -> tuple[
        Ledger, float]:
    """8 GPUs whose power varies, read every fetch_s. GPU 3 falls off the bus during `lost` (its counter reads
    from 0 when it is back: a reset); the node's agent restarts during `restart` (no readings of any GPU, the
    driver's counters go on). Returns the ledger and the truth: the GPUs' energy over the job's life."""
    gpus = [f"GPU-{i}" for i in range(8)]
    held = {u: (("job", 1.0),) for u in gpus}
    counters = [1e6 * (i + 1) for i in range(8)]  # since the driver loaded, long before the job
    ledger, truth = Ledger(), 0.0
    for t in range(0, seconds + 1):
        if t:
            for i in range(8):
                power = 0.0 if i == 3 and lost[0] <= t < lost[1] else 300 + 200 * math.sin(t / 37 + i)
                counters[i] += power
                truth += power
                if i == 3 and t == lost[1]:
                    counters[i] = power  # back after a GPU reset: the counter starts again
        if t % fetch_s:
            continue
        visible = [] if restart[0] <= t < restart[1] else [
            Reading(u, float(t), counters[i]) for i, u in enumerate(gpus) if not (i == 3 and lost[0] <= t < lost[1])]
        ledger = advance(ledger, visible, held)
    return ledger, truth


def test_a_job_total_agrees_with_the_counters_within_one_percent_across_restart_and_lost_gpu() -> None:
    ledger, truth = simulated_fleet(3600, 15, lost=(900, 1500), restart=(2000, 2090))
    assert ledger.jobs["job"].joules == pytest.approx(truth, rel=0.01)
