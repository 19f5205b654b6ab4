"""Compute share (from the comm_wait_s jobs push) localises silent stragglers; a job's node-aligned structure
learnt at its start is not reported as slow nodes; a rank waiting on data is not judged on power."""

import random

import pytest

from gpumond.rules.detectors.compute_share import job_shares, rank_shares
from gpumond.rules.detectors.features import rank_features, trimmed_mean
from gpumond.rules.detectors.rank_batch import job_rank_features
from gpumond.rules.detectors.config import DetectorConfig
from gpumond.rules.detectors.engine import DetectorState, EvalInputs, evaluate
from gpumond.rules.detectors.structure import Structure, learn
from gpumond.rules.types import RankInfo, RankWindow, StepRecord
from tests.unit.detector_inputs import NOW as T, job

CFG = DetectorConfig()


def kinds(cands):
    return sorted((c.kind, c.rank, c.node) for c in cands)


def test_compute_share_takes_both_waits_out_and_needs_enough_steps():
    info = RankInfo("j", 0, 2, "n", "GPU-0")
    steps = tuple(StepRecord(k, 100.0 + k, 1.0, 0.1, None, 0.2 + 0.01 * k) for k in range(10))
    f = rank_features(RankWindow(info, steps, 110.0), since=0.0, short_steps=4, min_steps=5)
    assert f.share_short == pytest.approx(0.625) and f.share_recent == pytest.approx(0.655)
    few = rank_features(RankWindow(info, steps[:4], 110.0), 0.0, 8, 5)
    assert (few.share_short, few.share_recent) == (None, None)
    # the vectorised path says the same, relative to each step's mean over the job's ranks (here: itself)
    (fast,), _ = job_rank_features({0: RankWindow(info, steps, 110.0)}, 0.0, 200.0, 4, 5)
    assert (fast.share_short, fast.share_recent) == pytest.approx((0.0, 0.0), abs=1e-9)


def test_long_look_is_the_median_of_the_last_evaluations_and_forgets_older_ones():
    info = RankInfo("j", 0, 2, "n", "GPU-0")
    steps = tuple(StepRecord(k, 100.0 + k, 1.0, 0.0, None, 0.5) for k in range(10))
    f = rank_features(RankWindow(info, steps, 110.0), 0.0)
    sh = rank_shares(f, (0.1, 0.9, 0.9, 0.9, 0.9), min_evals=5, long_evals=5)
    assert sh.history == (0.9, 0.9, 0.9, 0.9, 0.5) and sh.long == pytest.approx(0.9)  # 0.1 fell out
    first = rank_shares(f, (), min_evals=5, long_evals=5)
    assert first.long is None and first.history == (0.5,)  # one evaluation is not a long look


def test_a_few_evaluations_apart_do_not_move_the_long_look():
    # a healthy rank whose node had transients back to back: a minute of windows (12 evaluations at 5 s) holds
    # them, the other 48 of five minutes do not; a mean carried them into the long look, the median does not
    info = RankInfo("j", 0, 2, "n", "GPU-0")
    steps = tuple(StepRecord(k, 100.0 + k, 1.0, 0.0, None, 0.5) for k in range(10))
    f = rank_features(RankWindow(info, steps, 110.0), 0.0)
    history = (0.5,) * 36 + (0.6,) * 12 + (0.5,) * 11
    sh = rank_shares(f, history, min_evals=5, long_evals=60)
    assert sh.long == pytest.approx(0.5)
    # a straggler is apart in every window: its median is as far out as its mean
    slow = rank_shares(f, (0.52,) * 59, min_evals=5, long_evals=60)
    assert slow.long == pytest.approx(0.52)


def test_jobs_that_push_no_comm_wait_have_no_shares():
    inputs = job(T, comm=False)
    feats = [rank_features(w, T - 60) for w in inputs.jobs["job-a"].values()]
    assert job_shares(feats, {}, 5, 30) == {}


def test_a_silent_straggler_invisible_to_telemetry_is_found_by_its_compute_share():
    slow = job(T, compute=lambda r, k: 0.8 * (1.08 if r == 13 else 1.0))
    _, c = evaluate(slow, DetectorState(), CFG)
    assert kinds(c) == [("straggler", 13, "node-1")]
    ev = c[0].evidence["signals"]["compute_share"]
    assert ev["value"] > ev["peer_median"] and ev["z"] > c[0].evidence["threshold_z"]
    assert ev["look"] in ("short", "recent", "long")
    # the same job without comm waits: GPU telemetry alone cannot see it
    _, c = evaluate(job(T, compute=lambda r, k: 0.8 * (1.08 if r == 13 else 1.0), comm=False), DetectorState(), CFG)
    assert c == []


def test_a_clean_job_with_comm_waits_is_quiet_over_many_evaluations():
    state = DetectorState()
    for i in range(12):
        state, c = evaluate(job(T + 10 * i, seed=i), state, CFG)
        assert c == []


def test_a_rank_starved_on_data_is_starved_not_a_straggler():
    # it waits 30 % of each step on its loader: its peers wait for it in the collective, its GPU idles
    starved = job(T, wait=lambda r: 0.3 if r == 6 else 0.002, power=lambda r: 420.0 if r == 6 else 600.0)
    _, c = evaluate(starved, DetectorState(), CFG)
    assert kinds(c) == [("io_starved_rank", 6, "node-0")]


def test_a_low_power_rank_that_waits_on_data_is_not_judged_on_power():
    # mean data wait 10 %, just started (median still low): its low power is explained by the wait
    waits = {r: (lambda k: 0.1 if k >= 80 else 0.002) for r in (6,)}
    inputs = job(T, comm=False, power=lambda r: 450.0 if r == 6 else 600.0)
    ranks = dict(inputs.jobs["job-a"])
    w = ranks[6]
    ranks[6] = RankWindow(w.info, tuple(StepRecord(s.step, s.end, s.duration_s, waits[6](s.step) * s.duration_s)
                                        for s in w.steps), w.last_push)
    _, c = evaluate(EvalInputs(T, {"job-a": ranks}, inputs.gpu_windows), DetectorState(), CFG)
    assert [x for x in c if x.kind == "straggler"] == []


def test_a_node_heavier_from_the_start_is_structure_but_a_node_slowing_later_is_a_straggler_node():
    def heavy(extra_from):  # node-1 computes 25 % more from the start; node-2 from step `extra_from`
        return lambda r, k: 0.8 * (1.25 if r // 8 == 1 else 1.0) * (1.25 if r // 8 == 2 and k >= extra_from else 1.0)

    state, seen = DetectorState(), []
    for i in range(12):
        now = T + 10 * i
        # node-2 slows 60 s after the job started being judged (step index relative to this window)
        slow_from = 120 - (10 * i - 60) if i >= 6 else 10**6
        state, c = evaluate(job(now, compute=heavy(slow_from), seed=i), state, CFG)
        seen.append(kinds(c))
    assert state.structure["job-a"].nodes == {"node-1"}
    assert all(("straggler_node", None, "node-1") not in k for k in seen)
    assert all(not any(n == "node-1" for _, _, n in k) for k in seen)
    assert ("straggler_node", None, "node-2") in seen[-1]


def test_structure_is_what_deviated_in_at_least_half_the_learning_evaluations():
    s = learn(None, frozenset({"a", "b"}), 0.0, 60.0)
    assert s.nodes == {"a", "b"}  # provisional from the first evaluation on
    s = learn(s, frozenset({"a"}), 10.0, 60.0)
    s = learn(s, frozenset({"a"}), 20.0, 60.0)
    assert s.nodes == {"a"} and s.evals == 3
    s = learn(s, frozenset(), 70.0, 60.0)  # learning over: frozen
    assert s.done and learn(s, frozenset({"c"}), 80.0, 60.0) is s
    assert Structure(0.0, 2, {"x": 1}).nodes == {"x"}


def test_trimmed_mean_cuts_the_tails_before_averaging():
    assert trimmed_mean([1.0, 2.0, 3.0, 4.0, 100.0], 0.2) == pytest.approx(3.0)  # one cut off each end
    assert trimmed_mean([1.0, 2.0, 30.0], 0.1) == pytest.approx(2.0)  # floor(0.3) = 0, yet one is cut off each end
    info = RankInfo("j", 0, 2, "n", "GPU-0")
    # ten steps with a 0.7 share and one GC pause (share 0.95): the long look's input ignores the pause
    steps = tuple(StepRecord(k, 100.0 + k, 1.0, 0.0, None, 0.05 if k == 3 else 0.3) for k in range(10))
    f = rank_features(RankWindow(info, steps, 110.0), 0.0)
    assert f.share_trimmed == pytest.approx(0.7)


def test_power_alone_does_not_flag_a_rank_whose_compute_share_is_normal():
    # rank 4 draws 12 % more power (long sequences in its batches, silicon) but computes as long as its peers
    hot = job(T, power=lambda r: 690.0 if r == 4 else 600.0)
    _, c = evaluate(hot, DetectorState(), CFG)
    assert c == []
    # without comm waits power is all there is, and it is reported
    _, c = evaluate(job(T, comm=False, power=lambda r: 690.0 if r == 4 else 600.0), DetectorState(), CFG)
    assert kinds(c) == [("straggler", 4, "node-0")]


def test_a_rank_with_a_handful_of_steps_is_not_judged_on_data_wait():
    # a job that just started: rank 2 missed one prefetch in its first three steps
    young = job(T, wait=lambda r: 0.4 if r == 2 else 0.002, steps=3)
    _, c = evaluate(young, DetectorState(), CFG)
    assert [x for x in c if x.kind.startswith("io_")] == []
    _, c = evaluate(job(T, wait=lambda r: 0.4 if r == 2 else 0.002, steps=8), DetectorState(), CFG)
    assert ("io_starved_rank", 2, "node-0") in kinds(c)


def _fast_job(burst_rank=None, slow_rank=None, ranks=4, steps=400, step_s=0.05):
    """A 4-rank job of 50 ms steps (real DDP on small models): everyone computes 30 ms ± 3 %; `burst_rank` is
    late by 15 ms in its last 8 steps only (a descheduled thread), `slow_rank` computes 1.25× throughout."""
    rnd = random.Random(3)
    windows = {r: [] for r in range(ranks)}
    for k in range(steps):
        busy = []
        for r in range(ranks):
            c = 0.030 * (1 + rnd.uniform(-0.03, 0.03)) * (1.25 if r == slow_rank else 1.0)
            busy.append(c + (0.015 if r == burst_rank and k >= steps - 8 else 0.0))
        dur = max(busy) + 0.01
        for r in range(ranks):
            windows[r].append(StepRecord(k, T - (steps - 1 - k) * step_s, dur, 0.0005, None, dur - busy[r]))
    return EvalInputs(T, {"job-a": {r: RankWindow(RankInfo("job-a", r, ranks, "node-0", f"GPU-{r:04d}"),
                                                  tuple(w), T) for r, w in windows.items()}}, {})


def test_with_fast_steps_the_short_look_spans_seconds_so_a_burst_of_a_few_steps_is_not_a_straggler():
    burst = _fast_job(burst_rank=3)
    w = burst.jobs["job-a"][3]
    eight = rank_features(w, T - 60, short_steps=8, min_steps=5)
    seconds = rank_features(w, T - 60, short_steps=8, min_steps=5, short_s=CFG.share_short_s)
    assert eight.share_short > 0.8 > seconds.share_short  # the burst owns 8 steps, not 5 s of them
    assert [c for c in evaluate(burst, DetectorState(), CFG)[1] if c.kind == "straggler"] == []
    # A rank slow throughout still is one.
    _, c = evaluate(_fast_job(slow_rank=1), DetectorState(), CFG)
    assert [(x.kind, x.rank) for x in c] == [("straggler", 1)]


def _noisy_small_job(seed, steps, slow=None, factor=1.0):
    """An 8-rank job with `steps` 1 s steps whose compute varies ±15 % step to step (a job's first seconds:
    few steps a rank, each noisy); rank `slow` computes `factor` × as long."""
    rnd = random.Random(seed * 7919)
    busy = {}

    def compute(r, k):
        if (r, k) not in busy:
            busy[r, k] = 0.8 * (1 + rnd.uniform(-0.15, 0.15)) * (factor if r == slow else 1.0)
        return busy[r, k]

    return job(T, nodes=1, compute=compute, seed=seed, steps=steps)


def _on_share(inputs):
    return sorted(c.rank for c in evaluate(inputs, DetectorState(), CFG)[1]
                  if c.kind == "straggler" and "compute_share" in c.evidence["signals"])


def test_a_small_jobs_few_noisy_steps_flag_no_rank_on_compute_share():
    # The eight ranks' medians of 20 noisy steps: their own MAD is σ's estimate from eight values, often a fraction
    # of it. Without the noise floor (straggler.noise_floors) 14 of these 300 healthy jobs had a rank flagged.
    flagged = [seed for seed in range(300) if _on_share(_noisy_small_job(seed, 20))]
    assert flagged == []


def test_a_1_25x_straggler_in_the_same_small_noisy_job_is_still_found():
    found = sum(_on_share(_noisy_small_job(seed, 20, slow=3, factor=1.25)) == [3] for seed in range(50))
    assert found >= 45  # 49 of 50 with the floor; 46 without it, healthy ranks flagged beside it


def test_the_noise_floor_is_the_spread_of_a_median_of_as_many_steps_as_each_look_holds():
    from gpumond.rules.detectors.features import RankFeatures
    from gpumond.rules.detectors.straggler import noise_floors

    def rank(r, spread, recent=40, short=10):
        return RankFeatures(r, "n", f"GPU-{r}", None, recent, 2.0, 0.0, T, T, share_spread=spread,
                            share_n=recent, share_short_n=short)

    ranks = [rank(0, 0.01), rank(1, 0.02, 30, 9), rank(2, 0.02), rank(3, 0.03, 50, 12), rank(4, None, 4, 4)]
    sigma = 1.4826 * 0.02  # the median spread of the ranks that have one, as a σ
    floors = noise_floors(ranks)
    assert floors["recent"] == pytest.approx(1.2533 * sigma / 40**0.5, rel=1e-4)
    assert floors["short"] == pytest.approx(1.2533 * sigma / 10**0.5, rel=1e-4)
    assert "long" not in floors  # a median over evaluations: its fixed floor only
    assert noise_floors([rank(0, None), rank(1, None)]) == {"short": 0.0, "recent": 0.0}


def test_a_ranks_step_counts_are_those_its_looks_are_medians_of():
    info = RankInfo("j", 0, 2, "n", "GPU-0")
    # 30 steps of 2 s, 3 of them without a comm wait (not in any look): the short look is the last 8 of the
    # other 27, or those that ended in the 20 s before the newest when that is more (steps 19–29, of which 27
    # and 28 have no comm wait: 9).
    steps = tuple(StepRecord(k, 100.0 + 2 * k, 1.0, 0.1, None, None if k in (5, 27, 28) else 0.2)
                  for k in range(30))
    f = rank_features(RankWindow(info, steps, 160.0), since=0.0, short_steps=8, min_steps=5, short_s=20.0)
    assert (f.share_n, f.share_short_n) == (27, 9)
