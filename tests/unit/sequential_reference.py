"""The sequential test's judge and step_shares as they were before their CPU at fleet scale was cut (the judge's
columns pruned, the steps read once per evaluation): the references the new ones must equal value for value
(test_sequential_pruning.py, test_engine_reads_once.py). Not used by the product."""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence

import numpy as np

from gpumond.rules.detectors.config import DetectorConfig
from gpumond.rules.detectors.ragged import held
from gpumond.rules.detectors.stats import MAD_TO_SIGMA
from gpumond.rules.detectors.sequential import (Evidence, StepShares, Test, compute_test,
                                                evidence_needed)
from gpumond.rules.detectors.step_matrix import step_matrices
from gpumond.rules.types import RankWindow


def judge(x: np.ndarray, starts: np.ndarray, ends: np.ndarray, ranks: Sequence[int],
          cfg: DetectorConfig, test: Test | None = None) -> dict[int, Evidence]:
    """The ranks (columns of `x`, a StepShares slice of one peer group) with enough sequential evidence: on
    compute shares by default, or under another `test` (wait_test on data-wait shares)."""
    test = test if test is not None else compute_test(cfg)
    rows, n = x.shape
    if rows == 0 or n < cfg.min_peers:
        return {}
    with np.errstate(all="ignore"), warnings.catch_warnings():  # steps no rank of the group pushed: NaN rows
        warnings.simplefilter("ignore", RuntimeWarning)
        counted = (~np.isnan(x)).sum(axis=1) >= cfg.min_peers  # a step few peers pushed is not compared
        med = np.nanmedian(np.where(counted[:, None], x, np.nan), axis=1)
        y = test.deviation(x, med[:, None])
        y[~counted] = np.nan
        valid = ~np.isnan(y)
        if not valid.any():
            return {}
        sigma = max(MAD_TO_SIGMA * float(np.median(np.abs(y[valid]))), test.floor)
        if test.row_noise:
            sigma = np.maximum(sigma, np.nan_to_num(MAD_TO_SIGMA * np.nanmedian(np.abs(y), axis=1)))[:, None]
    z = np.where(valid, np.clip(y / sigma, -test.cap, test.cap), 0.0)
    ref = np.full((rows, 1), test.ref)
    if test.busy_ref is not None:
        ref[np.nan_to_num(med) >= test.busy_level] = test.busy_ref
    # Suffix sums, read from the newest step back: row j holds the run from step j to the newest.
    rev = slice(None, None, -1)
    gain = np.cumsum(np.where(valid, z - ref, 0.0)[rev], axis=0)[rev]
    steps = np.cumsum(valid[rev], axis=0)[rev]
    above = np.cumsum((valid & (z > ref))[rev], axis=0)[rev]
    refs = np.cumsum(np.where(valid, ref, 0.0)[rev], axis=0)[rev]
    # The magnitude is the deviation itself (a 3× rank is 3×, however many noise units that is), bounded so
    # that one absurd step (a share near 0 from a clock jump) cannot carry a run's mean.
    total = np.cumsum(np.where(valid, np.clip(y, -test.bound, test.bound), 0.0)[rev], axis=0)[rev]
    own = np.cumsum(np.where(valid, x, 0.0)[rev], axis=0)[rev]
    peer = np.cumsum(np.where(valid, med[:, None], 0.0)[rev], axis=0)[rev]
    # From the end of the run's first step to the end of the rank's newest (ranks push at their own moments, so
    # the job's newest steps may not be this rank's yet).
    last = np.where(valid, np.arange(rows)[:, None], -1).max(axis=0)
    span = ends[np.maximum(last, 0)][None, :] - ends[:, None]
    step_s = float(np.median(ends - starts))
    with np.errstate(all="ignore"):
        magnitude = test.magnitude(total / np.maximum(steps, 1))
    need = test.need(magnitude, step_s)
    ok = (gain >= evidence_needed(test, n, cfg)) & (steps >= test.min_steps(magnitude)) \
        & (above >= test.frac * steps) & (span >= need)
    out: dict[int, Evidence] = {}
    for c in np.flatnonzero(ok.any(axis=0)).tolist():
        j = int(np.argmax(np.where(ok[:, c], gain[:, c], -math.inf)))
        k = int(steps[j, c])
        out[ranks[c]] = Evidence(round(float(gain[j, c]), 2), k, round(float(span[j, c]), 2),
                                 round(float(magnitude[j, c]), 4), round(float((gain[j, c] + refs[j, c]) / k), 2),
                                 float(own[j, c] / k), float(peer[j, c] / k), float(starts[j]))
    return out


def step_shares(windows: Mapping[int, RankWindow], since: float) -> StepShares | None:
    """The shares of the steps that ended since `since`, or None when the job has no timed steps there."""
    ws = list(windows.values())
    if not ws:
        return None
    m = step_matrices(ws)
    counts = m.counts
    depth = int(counts.max())
    if depth == 0:
        return None
    ends = m.ends(depth)
    recent = held(counts, depth) & (ends >= since)
    k = recent.sum(axis=0)
    width = int(k.max())
    if np.array_equal(recent[depth - width:], held(k, width)) and not recent[:depth - width].any():
        # As usual, the recent steps are each rank's newest: read only those (as rank_batch does).
        ends, recent, read, depth = ends[depth - width:], recent[depth - width:], k, width
    else:
        read = counts
    _, durations, waits, numbers, comm = m.tail(read, depth)
    timed = recent & (durations > 0) & ~np.isnan(waits) & np.isfinite(numbers)
    if not timed.any():
        return None
    with np.errstate(all="ignore"):
        share = np.maximum(1.0 - (waits + comm) / durations, 0.0)
        wait = np.clip(waits / durations, 0.0, 1.0)
    nums = numbers[timed]
    lo, hi = nums.min(), nums.max()
    if hi - lo > 8 * depth + 64 or not bool((nums == np.floor(nums)).all()):
        return None  # sparse or odd step numbers: no step-aligned view (the median looks still judge)
    rows = int(hi - lo) + 1
    col = np.broadcast_to(np.arange(len(ws))[None, :], timed.shape)[timed]
    row = (nums - lo).astype(np.int64)

    def place(v: np.ndarray) -> np.ndarray:
        out = np.full((rows, len(ws)), np.nan)
        out[row, col] = v[timed]
        return out

    shares = place(np.where(np.isnan(comm), np.nan, share))
    kept = ~np.isnan(place(wait)).all(axis=1)
    with warnings.catch_warnings():  # all-NaN columns of a row cannot occur (kept); numpy warns on any NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        row_end = np.nanmedian(place(ends)[kept], axis=1)
        row_start = np.nanmedian(place(ends - durations)[kept], axis=1)
    return StepShares(tuple(w.info.rank for w in ws), shares[kept], row_start, row_end, place(wait)[kept])
