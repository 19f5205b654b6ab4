"""Sequential evidence (detectors/sequential.py) on literal step matrices: how much evidence, over how long, at
which magnitude, makes a straggler; what never does (one huge step, a burst that ended, a shift)."""

from dataclasses import replace

import numpy as np

from gpumond.rules.detectors.config import DetectorConfig
from gpumond.rules.detectors.sequential import judge, min_duration_s

CFG = DetectorConfig()
N = 16


def steps(k, step_s, slow=None, seed=1, noise=0.03):
    """k synchronous steps of `step_s`: absolute compute shares ~0.8 × (1 ± noise); slow(i) → {rank: factor}."""
    rng = np.random.default_rng(seed)
    x = 0.8 * np.exp(noise * rng.standard_normal((k, N)))
    for i in range(k):
        for rank, f in (slow(i) if slow else {}).items():
            x[i, rank] *= f
    ends = step_s * np.arange(1, k + 1, dtype=float)
    return x, ends - step_s, ends


def flagged(x, starts, ends, cfg=CFG):
    return judge(x, starts, ends, list(range(N)), cfg)


def test_a_clean_group_gives_nothing():
    assert flagged(*steps(60, 1.0)) == {}


def test_a_2x_rank_on_long_steps_is_flagged_after_two_slow_steps_and_the_short_minimum():
    # 8 s steps: past seq_transient_factor a run needs seq_short_s of span (end of its first step to end of its
    # newest) and no extra step, so two slow steps do (8 s of span); one step is never a run
    x, s, e = steps(11, 8.0, lambda i: {5: 2.0} if i >= 9 else {})
    assert set(flagged(x, s, e)) == {5}
    ev = flagged(x, s, e)[5]
    assert ev.magnitude > 1.9 and ev.span_s == 8.0 and ev.span_s >= min_duration_s(ev.magnitude, 8.0, CFG)
    x, s, e = steps(10, 8.0, lambda i: {5: 2.0} if i >= 9 else {})  # one slow step
    assert flagged(x, s, e) == {}


def test_inside_the_transient_range_a_run_outlasts_the_transient_by_one_step():
    # 1.5x on 8 s steps: 10 s (seq_transient_s) + one step = 18 s of span, three steps after the first
    assert min_duration_s(1.5, 8.0, CFG) == CFG.seq_transient_s + 8.0
    assert min_duration_s(2.0, 8.0, CFG) == CFG.seq_short_s
    x, s, e = steps(12, 8.0, lambda i: {5: 1.5} if i >= 9 else {})  # three slow steps: 16 s of span
    assert flagged(x, s, e) == {}
    x, s, e = steps(13, 8.0, lambda i: {5: 1.5} if i >= 9 else {})  # four: 24 s
    assert set(flagged(x, s, e)) == {5}


def test_a_1_25x_rank_needs_the_transient_minimum_duration():
    need = CFG.seq_transient_s + 1.0
    for slow_s, expect in ((need - 2, set()), (need + 2, {3})):
        k = int(slow_s) + 1  # steps of 1 s: the run spans its steps less one
        x, s, e = steps(40 + k, 1.0, lambda i, k=k: {3: 1.25} if i >= 40 else {})
        assert set(flagged(x, s, e)) == expect, slow_s


def test_one_huge_step_or_a_burst_that_ended_is_no_straggler():
    x, s, e = steps(40, 1.0, lambda i: {7: 10.0} if i == 30 else {})
    assert flagged(x, s, e) == {}
    # 15 s at 1.5× that ended 3 s ago: the newest steps are ordinary, so no run ending now is 90 % slow
    x, s, e = steps(60, 1.0, lambda i: {7: 1.5} if 42 <= i < 57 else {})
    assert flagged(x, s, e) == {}
    x, s, e = steps(60, 1.0, lambda i: {7: 1.5} if i >= 42 else {})  # the same, still going: flagged
    assert set(flagged(x, s, e)) == {7}


def test_a_marginal_slowdown_keeps_accumulating_until_it_has_lasted_long_enough_for_its_size():
    # 1.06× against 3 % noise: z ≈ 2 a step; its minimum duration is long (inverse in the excess)
    need = min_duration_s(1.06, 1.0, CFG)
    assert need > 3 * CFG.seq_transient_s
    x, s, e = steps(200, 1.0, lambda i: {9: 1.06} if i >= 200 - int(need) + 5 else {}, noise=0.01)
    assert flagged(x, s, e) == {}
    x, s, e = steps(200, 1.0, lambda i: {9: 1.06} if i >= 200 - int(need) - 10 else {}, noise=0.01)
    assert set(flagged(x, s, e)) == {9}


# ----- groups larger than the one h was validated on (seq_h_ranks) -----------------------------------------------
from gpumond.rules.detectors.sequential import compute_test, corroborated_compute_test, evidence_needed  # noqa: E402

BIG = 64 * CFG.seq_h_ranks  # a 1,024-node job of 8 GPUs per node, one peer group


def grown(small, seed=7, noise=0.08):
    """`small` (steps × validated-size group) with the columns of BIG − its ranks more peers appended: its own
    ranks' values unchanged, the peers' ordinary."""
    x, s, e = small
    rng = np.random.default_rng(seed)
    more = 0.8 * np.exp(noise * rng.standard_normal((x.shape[0], BIG - x.shape[1])))
    return np.hstack([x, more]), s, e


def group(n, k, slow, step_s=2.0, noise=0.08):
    """k steps of `step_s` of n ranks, compute shares ~0.8 × (1 ± noise); slow(i) → {rank: factor}, exactly
    that factor over 0.8 (its evidence then depends on the group's noise alone)."""
    rng = np.random.default_rng(3)
    x = 0.8 * np.exp(noise * rng.standard_normal((k, n)))
    for i in range(k):
        for rank, f in slow(i).items():
            x[i, rank] = 0.8 * f
    ends = step_s * np.arange(1, k + 1, dtype=float)
    return x, ends - step_s, ends


def test_the_evidence_needed_is_h_up_to_the_validated_group_and_grows_as_ln_of_the_size_beyond():
    test = compute_test(CFG)
    for n in (4, 16, CFG.seq_h_ranks):  # the benchmark's 16-node jobs, DDP e2e, the demo: exactly as validated
        assert evidence_needed(test, n, CFG) == CFG.seq_h
    assert evidence_needed(test, BIG, CFG) == CFG.seq_h + np.log(64)
    # a test kept only for ranks another signal singled out is not a test of every rank
    assert evidence_needed(corroborated_compute_test(CFG), BIG, CFG) == CFG.seq_h


def test_a_marginal_lucky_run_named_in_the_validated_group_is_not_named_in_a_group_64_times_larger():
    # The fault-free 1,024-node benchmark's false finding (seed 1001, rank 6130): 7 steps of 2 s at 1.15× with
    # evidence 13.1, just past h = 12 and its minimum duration. Here 1.27× over 7 steps against 8 % noise: ~3
    # noise units a step, 2 of evidence, and 7 steps are what its minimum duration (10 s + one step) needs.
    small = group(CFG.seq_h_ranks, 60, lambda i: {5: 1.27} if i >= 53 else {})
    ev = judge(*small, list(range(CFG.seq_h_ranks)), CFG)
    assert set(ev) == {5}  # in a 16-node job: unchanged
    assert CFG.seq_h <= ev[5].evidence < CFG.seq_h + np.log(64), ev[5]  # marginal: between the two thresholds
    x, s, e = grown(small)
    assert judge(x, s, e, list(range(BIG)), CFG) == {}


def test_a_real_straggler_in_a_group_64_times_larger_is_named_as_soon_as_in_the_validated_group():
    def first(n):
        for k in range(1, 30):  # slow steps so far
            x, s, e = group(n, 40 + k, lambda i: {5: 1.5 if i >= 40 else 1.0})  # ordinary before: at the median
            if n == BIG:
                x, s, e = grown((x[:, :CFG.seq_h_ranks], s, e))
            found = judge(x, s, e, list(range(n)), CFG)
            if found:
                assert set(found) == {5}
                return k
        return None

    small = first(CFG.seq_h_ranks)
    assert small is not None and first(BIG) == small  # the minimum duration, not the evidence, sets when


# ----- the same test on data wait (io_starved_rank) -------------------------------------------------------------
from gpumond.rules.detectors.sequential import wait_min_duration_s, wait_test  # noqa: E402

WAIT = wait_test(CFG)


def waits(k, step_s, starved=None, seed=2):
    """k steps of `step_s`: healthy data-wait shares ~0.2 % (lognormal); starved(i) → {rank: share}."""
    rng = np.random.default_rng(seed)
    x = 0.002 * np.exp(0.5 * rng.standard_normal((k, N)))
    for i in range(k):
        for rank, w in (starved(i) if starved else {}).items():
            x[i, rank] = w
    ends = step_s * np.arange(1, k + 1, dtype=float)
    return x, ends - step_s, ends


def wait_flagged(x, starts, ends):
    return judge(x, starts, ends, list(range(N)), CFG, WAIT)


def test_a_rank_waiting_40_percent_is_named_after_two_steps_past_the_short_minimum():
    # past seq_wait_miss_max no run of missed prefetches explains it: seq_min_steps steps spanning seq_wait_s
    x, s, e = waits(40, 1.5, lambda i: {4: 0.4} if i >= 38 else {})
    assert wait_flagged(x, s, e) == {}  # two steps: one step (1.5 s) of span, under seq_wait_s
    x, s, e = waits(40, 1.5, lambda i: {4: 0.4} if i >= 37 else {})
    (ev,) = wait_flagged(x, s, e).values()
    assert set(wait_flagged(x, s, e)) == {4} and ev.steps == 3 and abs(ev.magnitude - 0.4) < 0.01
    assert ev.span_s >= wait_min_duration_s(ev.magnitude, CFG) and abs(ev.mean - 0.4) < 0.01 and ev.peer < 0.01


def test_missed_prefetches_back_to_back_need_four_steps_below_the_miss_range():
    # a missed prefetch costs at most ~0.21 of its step: three in a row on one rank are not a starved rank…
    x, s, e = waits(40, 3.0, lambda i: {9: 0.2} if i >= 37 else {})
    assert wait_flagged(x, s, e) == {}
    # …four are (a rank waiting 20 % of every step: four steps)
    x, s, e = waits(40, 3.0, lambda i: {9: 0.2} if i >= 36 else {})
    assert set(wait_flagged(x, s, e)) == {9}


def test_one_long_wait_or_a_wait_that_ended_is_no_starved_rank():
    x, s, e = waits(40, 1.0, lambda i: {2: 0.9} if i == 30 else {})
    assert wait_flagged(x, s, e) == {}
    x, s, e = waits(40, 1.0, lambda i: {2: 0.3} if 20 <= i < 36 else {})  # ended four steps ago
    assert wait_flagged(x, s, e) == {}


def test_a_small_excess_needs_longer():
    # 5 % above its peers: seq_wait_s × seq_wait_large / 0.05 of span
    need = wait_min_duration_s(0.05, CFG)
    assert need == CFG.seq_wait_s * CFG.seq_wait_large / 0.05
    for slow_s, expect in ((need - 2, set()), (need + 2, {6})):
        k = int(slow_s) + 1
        x, s, e = waits(40 + k, 1.0, lambda i, k=k: {6: 0.052} if i >= 40 else {})
        assert set(wait_flagged(x, s, e)) == expect, slow_s


def test_a_group_whose_waits_scatter_step_by_step_names_no_rank():
    # the job's pipeline slowed 20 steps ago: every rank waits ~20 % × lognormal(0.25) each step. Against the
    # window's MAD (mostly the calm before) the scatter alone would be evidence; each step's own spread is the unit.
    rng = np.random.default_rng(5)
    x, s, e = waits(40, 1.0)
    x[20:] = 0.2 * np.exp(0.25 * rng.standard_normal((20, N)))
    assert wait_flagged(x, s, e) == {}


def test_in_a_waiting_job_a_rank_at_the_top_of_its_peers_spread_for_a_few_steps_is_luck_not_an_outlier():
    # The job's pipeline is slow (every rank ~17 % ± its loader's pace, as the benchmark's starved job at 40 %:
    # the step lasts as long as its slowest loader): rank 3 happens to wait ~0.5 three steps in a row, near the
    # top of that spread (it happened in the benchmark). Past seq_ref that is evidence, and ~3× the median
    # passes the told-apart ratio; in steps whose median rank waits as a rule a step counts only past
    # seq_wait_busy_ref noise units.
    rng = np.random.default_rng(9)
    x, s, e = waits(40, 1.0)
    x[:] = 0.17 * np.exp(0.3 * rng.standard_normal((40, N)))
    x[37:, 3] = 0.5
    assert wait_flagged(x, s, e) == {}
    assert set(judge(x, s, e, list(range(N)), CFG, replace(WAIT, busy_ref=None))) == {3}


def test_an_outlier_far_past_a_waiting_jobs_spread_is_named_in_three_steps():
    # The job waits ~8 % as a rule; rank 11's own loader makes it wait 45 % of each step: its deviation stands
    # many noise units past the step's spread, so each step still adds cap − seq_wait_busy_ref.
    rng = np.random.default_rng(3)
    x, s, e = waits(40, 1.0)
    x[:] = 0.08 * np.exp(0.25 * rng.standard_normal((40, N)))
    x[38:, 11] = 0.45
    assert wait_flagged(x, s, e) == {}  # two steps: 2 × (cap − busy_ref) < h
    x[37:, 11] = 0.45
    (ev,) = wait_flagged(x, s, e).values()
    assert set(wait_flagged(x, s, e)) == {11} and ev.steps == 3 and ev.peer > CFG.wait_min_frac
