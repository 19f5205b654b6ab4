"""detect_stragglers while learning a job's structure judges the job once when nothing is split off (the second pass
would see the same groups), and compares z-scores in one numpy pass (less CPU at fleet scale): the same result as
the two passes and the per-rank comparisons it replaced."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gpumond.rules.detectors import straggler
from gpumond.rules.detectors.compute_share import job_shares
from gpumond.rules.detectors.config import DetectorConfig
from gpumond.rules.detectors.engine import DetectorState, evaluate
from gpumond.rules.detectors.gpu_batch import gpu_features_many
from gpumond.rules.detectors.sequential import step_shares
from tests.unit.detector_inputs import NOW, build, job

CFG = DetectorConfig()


def _two_passes(job_id, ranks, gpus, cfg, shares, structural, steps):
    """detect_stragglers(learning=True) as it was: the job as a whole, then again split by what was found."""
    members = []
    for r in ranks:
        g = gpus.get(r.gpu_uuid)
        if g is None or not g.up or g.samples < cfg.min_samples:
            g = None
        if g is not None or shares.get(r.rank) is not None:
            members.append((r, g, shares.get(r.rank)))
    def judge(split):
        return straggler._judge(job_id, straggler._looks_of(members, cfg, frozenset(split), None), cfg, steps)  # noqa: SLF001

    _, blocks, current, _ = judge(frozenset())
    out, _, _, judged = judge(structural | blocks)
    return straggler.StragglerResult(out, frozenset(blocks), judged, frozenset(current))


CASES = {
    "clean": build(),
    "slow rank": job(NOW, compute=lambda r, k: 1.2 if r == 5 else 0.8),
    "slow node": job(NOW, compute=lambda r, k: 1.1 if r // 8 == 2 else 0.8),
    "throttled": build(gpu={5: {"sm_clock_hz": 1.3e9, "throttle_hw_thermal": 1.0, "temperature_c": 90.0}}),
}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("structural", [frozenset(), frozenset({"node-1"})])
def test_learning_judges_once_when_nothing_is_split_off_with_the_same_result(name, structural):
    inputs = CASES[name]
    state, _ = evaluate(inputs, DetectorState(), CFG)
    feats = list(state.rank_features["job-a"])
    since = inputs.now - CFG.recent_s
    gpus = gpu_features_many([r.gpu_uuid for r in feats], inputs.gpu_windows, since)
    shares = job_shares(feats, {}, CFG.min_steps, 0, False, False)
    steps = step_shares(inputs.jobs["job-a"], since)
    got = straggler.detect_stragglers("job-a", feats, gpus, CFG, shares, structural, learning=True,
                                      steps=steps if shares else None)
    # Not vacuous: a node deviating together is split off (two passes), a slow rank is a candidate.
    assert bool(got.blocks) == (name == "slow node") and bool(got.candidates) == (name in ("slow rank", "throttled"))
    assert got == _two_passes("job-a", feats, gpus, CFG, shares, structural, steps if shares else None)


def test_z_scores_past_the_threshold_are_python_s_comparisons():
    rng = np.random.default_rng(7)
    zs = rng.standard_normal(500).tolist() + [math.nan, math.inf, -math.inf, -0.0, 0.0, 3.5, -3.5]
    rng.shuffle(zs)
    for thr in (0.0, 1.0, 3.5, math.inf):
        for sign in (-1, 0, 1):
            want = [i for i, z in enumerate(zs) if (abs(z) if sign == 0 else sign * z) > thr]
            assert straggler._past_index(zs, thr, sign) == want  # noqa: SLF001
    assert straggler._past_index([], 1.0, 1) == []  # noqa: SLF001
