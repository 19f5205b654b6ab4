"""The long compute-share look on healthy ranks with heavy-tailed steps (the benchmark's uneven-sequence control):
a batch of long sequences is trimmed out of its window however few steps the window holds, and the look, a
median over a few windows, must clear the group's threshold by one more, as the other medians of a few must."""

import random

import numpy as np
import pytest

from gpumond.rules.detectors.compute_share import Shares
from gpumond.rules.detectors.config import DetectorConfig
from gpumond.rules.detectors.engine import DetectorState, EvalInputs, evaluate
from gpumond.rules.detectors.features import (
    RankFeatures,
    rank_features,
    step_share_means,
    trim_count,
    trimmed_mean,
)
from gpumond.rules.detectors.ragged import trim_counts
from gpumond.rules.detectors.rank_batch import job_rank_features
from gpumond.rules.detectors.stats import robust_z, threshold_for
from gpumond.rules.detectors.straggler import detect_stragglers
from gpumond.rules.types import RankInfo, RankWindow, StepRecord

CFG = DetectorConfig()
T0 = 10_000.0


def test_a_trim_cuts_at_least_one_value_off_each_end_while_three_remain():
    assert [trim_count(n, 0.1) for n in (1, 2, 3, 7, 9, 10, 19, 20)] == [0, 0, 1, 1, 1, 1, 1, 2]
    assert trim_count(7, 0.0) == 0  # no trim asked: none
    assert trim_counts(np.arange(25), 0.1).tolist() == [trim_count(n, 0.1) for n in range(25)]
    assert trimmed_mean([1.0, 2.0, 30.0], 0.1) == pytest.approx(2.0)  # 10 % of 3 rounds to none: one is cut


def _job(now, long_every=8, step_s=6.0, ranks=32, seed=3):
    """A synchronous job whose steps are long (6 s of compute: about 7 in a 60 s window); rank 5 draws a batch
    of long sequences (1.6x the compute) every `long_every` steps, every window holding one; all ranks ±3 %."""
    rnd = random.Random(seed)
    windows, t, k = {}, T0, 0
    recs = {r: [] for r in range(ranks)}
    while True:
        busy = [step_s * (1.6 if r == 5 and k % long_every == 3 else 1.0) * (1 + rnd.uniform(-0.03, 0.03))
                for r in range(ranks)]
        dur = max(busy) + 0.6
        if t + dur > now:
            break
        t += dur
        for r in range(ranks):
            recs[r].append(StepRecord(k, t, dur, 0.002, None, dur - busy[r]))
        k += 1
    for r in range(ranks):
        windows[r] = RankWindow(RankInfo("job-a", r, ranks, f"node-{r // 8}", f"GPU-{r:04d}"), tuple(recs[r]), now)
    return EvalInputs(now, {"job-a": windows}, {})


def test_one_long_batch_does_not_move_a_window_of_few_long_steps():
    inputs = _job(T0 + 200.0)
    ws = inputs.jobs["job-a"]
    since = T0 + 140.0
    steps = [s for s in ws[5].steps if s.end >= since]
    assert len(steps) < 10  # floor(0.1 · n) would cut nothing
    fast, _ = job_rank_features(ws, since, inputs.now)
    peers = sorted(f.share_trimmed for f in fast if f.rank != 5)
    assert peers[0] - 0.01 <= fast[5].share_trimmed <= peers[-1] + 0.01  # the long batch was cut off
    ref = rank_features(ws[5], since, step_means=step_share_means(ws.values(), since))
    assert ref.share_trimmed == fast[5].share_trimmed  # the reference path cuts it as the vectorised one does


def test_a_healthy_rank_with_a_long_batch_in_every_window_is_no_straggler():
    # The uneven-sequence control at its default size: 8 s steps, and a healthy rank whose long batches sat one
    # in every window of five minutes was named on the long look (z 5.44 against 5.06).
    state, flagged = DetectorState(), []
    for i in range(90):  # every 5 s for 7.5 minutes: the long look speaks from about 3 minutes on
        state, cands = evaluate(_job(T0 + 30.0 + 5.0 * i), state, CFG)
        flagged += [(c.rank, c.evidence["signals"]) for c in cands if c.kind == "straggler"]
    assert state.shares["job-a"][5], "the long look was never built"
    assert flagged == []


def _members(long_of_suspect: float):
    peers = [0.02 * (i / 15.0 - 1.0) for i in range(31)]  # −0.02 … +0.02: spread well above the MAD floor
    ranks = [RankFeatures(r, f"node-{r // 8}", f"GPU-{r:04d}", None, 100, 1.0, 0.002, T0, T0) for r in range(32)]
    shares = {r: Shares(None, None, v, ()) for r, v in zip(range(32), [*peers, long_of_suspect])}
    return ranks, shares


def test_the_long_look_must_clear_the_threshold_by_one_more():
    thr = threshold_for(32, CFG.z_base, CFG.z_tail)
    ranks, shares = _members(1.0)
    _, med, scale = robust_z([sh.long for sh in shares.values()], CFG.floor_compute_share_long)
    for extra, named in ((0.5, False), (1.5, True)):
        ranks, shares = _members(med + (thr + extra) * scale)
        found = detect_stragglers("job-a", ranks, {}, CFG, shares)
        got = [(c.rank, c.evidence["signals"]["compute_share"]["look"]) for c in found.candidates]
        assert got == ([(31, "long")] if named else []), (extra, got)
