"""The engine reads a job's steps once per evaluation (step_matrix.read_steps) for the rank features, the per-step
shares and the span of its window, and fingerprints every job with a pass per field (less CPU at fleet scale): each
gives what reading the windows one by one gives."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from gpumond.rules.columns import step_columns
from gpumond.rules.detectors.engine import _oldest_end, inputs_key
from gpumond.rules.detectors.rank_batch import job_rank_features
from gpumond.rules.detectors.sequential import step_shares
from gpumond.rules.detectors.step_matrix import read_steps
from tests.unit.detector_inputs import NOW, build, job
from tests.unit.sequential_reference import step_shares as reference_shares


def _key_by_rank(ranks, gpu_windows, absent_nodes):
    """The fingerprint's definition, one rank at a time."""
    push = beat = -1.0
    steps = absent = 0
    newest = ends = -1.0
    for w in ranks.values():
        push = max(push, w.last_push)
        if w.last_beat is not None:
            beat = max(beat, w.last_beat)
        if w.steps:
            steps += len(w.steps)
            ends += w.steps[-1].end
        if absent_nodes and w.info.node in absent_nodes:
            absent += 1
        g = gpu_windows.get(w.info.gpu_uuid)
        if g:
            newest = max(newest, g[-1].t)
    return (push, beat, float(steps), ends, newest, float(absent))


def _with_columns(ranks):
    return {r: replace(w, columns=step_columns(tuple(w.steps))) for r, w in ranks.items()}


def _ragged(ranks):
    """Some ranks without steps, some with fewer, one with a heartbeat, one without a GPU window."""
    out = dict(ranks)
    out[0] = replace(out[0], steps=())
    out[1] = replace(out[1], steps=out[1].steps[7:], last_beat=NOW - 3.0)
    out[2] = replace(out[2], steps=out[2].steps[:40], last_push=NOW + 1.5)
    return out


@pytest.mark.parametrize("columns", [False, True])
def test_the_fingerprint_is_the_per_rank_definitions(columns):
    inputs = build(beat=NOW - 9.0)
    base = inputs.jobs["job-a"]
    gpus = {u: g for u, g in inputs.gpu_windows.items() if u != base[5].info.gpu_uuid}
    for ranks in (base, _ragged(base)):
        ranks = _with_columns(ranks) if columns else ranks
        for absent in (frozenset(), frozenset({"node-1", "node-9"})):
            assert inputs_key(ranks, gpus, absent) == _key_by_rank(ranks, gpus, absent)
    assert inputs_key({}, gpus, frozenset()) == _key_by_rank({}, gpus, frozenset())


@pytest.mark.parametrize("columns", [False, True])
def test_the_oldest_end_is_the_min_over_the_windows_first_steps(columns):
    ranks = _ragged(build().jobs["job-a"])
    ranks = _with_columns(ranks) if columns else ranks
    want = min(w.steps[0].end for w in ranks.values() if w.steps)
    assert _oldest_end(read_steps(list(ranks.values()), NOW - 60.0), -1.0) == want
    assert _oldest_end(read_steps([replace(w, steps=(), columns=None) for w in ranks.values()], 0.0), 7.0) == 7.0
    # A NaN end (rank_batch hands such a job to its reference code): Python's min in rank order, as before.
    odd = dict(ranks)
    odd[3] = replace(odd[3], steps=(replace(odd[3].steps[0], end=math.nan),) + tuple(odd[3].steps[1:]))
    odd = _with_columns(odd) if columns else odd
    firsts = [w.steps[0].end for w in odd.values() if w.steps]
    got = _oldest_end(read_steps(list(odd.values()), NOW - 60.0), -1.0)
    assert got == min(firsts) or (math.isnan(got) and math.isnan(min(firsts)))


@pytest.mark.parametrize("columns", [False, True])
def test_features_and_shares_from_one_read_equal_those_read_separately_and_the_old_shares(columns):
    starved_and_slow = job(NOW, wait=lambda r: 0.3 if r == 3 else 0.002, compute=lambda r, k: 1.04 if r == 5 else 0.8)
    jobs = [starved_and_slow.jobs["job-a"], _ragged(build().jobs["job-a"])]
    for ranks in jobs:
        ranks = _with_columns(ranks) if columns else ranks
        since = NOW - 60.0
        read = read_steps(list(ranks.values()), since)
        assert job_rank_features(ranks, since, NOW, steps=read) == job_rank_features(ranks, since, NOW)
        a, b = step_shares(ranks, since, read), reference_shares(ranks, since)
        assert a is not None and b is not None and a.ranks == b.ranks
        for x, y in ((a.shares, b.shares), (a.starts, b.starts), (a.ends, b.ends), (a.waits, b.waits)):
            assert np.array_equal(x, y, equal_nan=True)
        assert not read.durations.flags.writeable  # shared by the detectors: none writes into it
