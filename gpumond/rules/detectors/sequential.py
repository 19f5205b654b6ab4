"""Pure: sequential evidence that a rank computes longer than its peers, step by step (issue 20).

The looks of compute_share.py are medians over fixed spans (the last 8 steps, the last minute), so a
straggler is seen once half of such a span holds slow steps: 30–50 s whatever its severity, and longer for
longer steps (a 2.0× straggler on 5 s steps took 52 s; 1.25× on 1 s steps 28 s, measured in
benchmarks/results/detection.md). Here every step is evidence on its own:

- per step, each rank's compute share over its group's median rank of that step is the rank's compute
  factor in that step (the slowest rank computes through the time its peers wait for it); its log, over the
  noise of such factors (the MAD of all of them in the window, floored), is the step's deviation z;
- read back from the newest step, each step adds min(z, cap) − ref: a deviation of a few noise units adds
  up in a few steps, a marginal one (z just above ref) keeps accumulating, and an ordinary step takes
  evidence away. One step adds at most cap − ref, so no single step (a GC pause, a batch of long
  sequences) makes a finding;
- a rank is flagged when some run of its newest steps holds `seq_h` of evidence, at least `seq_min_steps`
  steps, with `seq_frac` of them past ref (slow now, not a burst some seconds ago that ordinary steps
  since have not yet cancelled), and spans at least the minimum duration for its magnitude:
  `seq_transient_s` while its mean factor is within the transient range (below `seq_transient_factor`),
  `seq_short_s` beyond it. Both from measured transients, see docs/detection-benchmark.md.

Such a finding has waited for its evidence already: it fires at once (Candidate.sustained), where the
median looks wait for two of three evaluations over `findings.min_duration_s`.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from gpumond.rules.detectors.config import DetectorConfig
from gpumond.rules.detectors.ragged import held
from gpumond.rules.detectors.step_matrix import step_matrices
from gpumond.rules.types import RankWindow

_MAD_TO_SIGMA = 1.4826
_MAX_LOG_FACTOR = math.log(10.0)


@dataclass(frozen=True, slots=True)
class StepShares:
    """A job's absolute compute shares of its recent steps, one row per step number (oldest first), one column
    per rank; NaN where a rank has no timed step with a comm wait of that number."""

    ranks: tuple[int, ...]
    shares: np.ndarray  # (steps, ranks)
    starts: np.ndarray  # (steps,) when each step began (its median rank's end − duration)
    ends: np.ndarray  # (steps,) when each step ended (its median rank)

    def columns(self, ranks: Sequence[int]) -> np.ndarray:
        """The shares of these ranks (columns in this order)."""
        index = {r: i for i, r in enumerate(self.ranks)}
        return self.shares[:, [index[r] for r in ranks]]


def step_shares(windows: Mapping[int, RankWindow], since: float) -> StepShares | None:
    """The shares of the steps that ended since `since`, or None when the job pushes no comm waits."""
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
    durations, waits, numbers, comm = m.tail(read, depth)
    ok = recent & (durations > 0) & ~np.isnan(comm) & ~np.isnan(waits) & np.isfinite(numbers)
    if not ok.any():
        return None
    with np.errstate(all="ignore"):
        share = np.maximum(1.0 - (waits + comm) / durations, 0.0)
    nums = numbers[ok]
    lo, hi = nums.min(), nums.max()
    if hi - lo > 8 * depth + 64 or not bool((nums == np.floor(nums)).all()):
        return None  # sparse or odd step numbers: no step-aligned view (the median looks still judge)
    rows = int(hi - lo) + 1
    col = np.broadcast_to(np.arange(len(ws))[None, :], ok.shape)[ok]
    row = (nums - lo).astype(np.int64)
    out = np.full((rows, len(ws)), np.nan)
    out[row, col] = share[ok]
    end = np.full((rows, len(ws)), np.nan)
    end[row, col] = ends[ok]
    start = np.full((rows, len(ws)), np.nan)
    start[row, col] = (ends - durations)[ok]
    kept = ~np.isnan(out).all(axis=1)
    with warnings.catch_warnings():  # all-NaN columns of a row cannot occur (kept); numpy warns on any NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        row_end = np.nanmedian(end[kept], axis=1)
        row_start = np.nanmedian(start[kept], axis=1)
    return StepShares(tuple(w.info.rank for w in ws), out[kept], row_start, row_end)


@dataclass(frozen=True, slots=True)
class Evidence:
    """The strongest run of a rank's newest steps that passes the test."""

    evidence: float  # Σ (min(z, cap) − ref) over the run
    steps: int
    span_s: float
    factor: float  # its mean compute factor over the run (exp of the mean log factor)
    z: float  # the run's mean deviation in noise units (each step's capped at seq_cap)


def min_duration_s(factor: float, step_s: float, cfg: DetectorConfig) -> float:
    """How long (from the end of its first step to the end of its newest) a deviation of this mean compute
    factor must last before it is a finding, with steps of `step_s`."""
    return float(_min_duration(np.array(factor), cfg)) + step_s


def _min_duration(factor: np.ndarray, cfg: DetectorConfig) -> np.ndarray:
    """seq_short_s past the transient range; inside it seq_transient_s, and longer for smaller factors in
    inverse proportion to the excess below seq_marginal_factor: slowness of a few per cent is where two
    transients back to back (each within the range) are likeliest to pass for one long one, and where the
    median looks (a minute of steps) lose little against the sequential test."""
    excess = np.maximum(factor - 1.0, 1e-6)
    inside = cfg.seq_transient_s * np.maximum(1.0, (cfg.seq_marginal_factor - 1.0) / excess)
    return np.where(factor < cfg.seq_transient_factor, inside, cfg.seq_short_s)


def judge(x: np.ndarray, starts: np.ndarray, ends: np.ndarray, ranks: Sequence[int],
          cfg: DetectorConfig) -> dict[int, Evidence]:
    """The ranks (columns of `x`, a StepShares slice of one peer group) with enough sequential evidence."""
    rows, n = x.shape
    if rows == 0 or n < cfg.min_peers:
        return {}
    with np.errstate(all="ignore"), warnings.catch_warnings():  # steps no rank of the group pushed: NaN rows
        warnings.simplefilter("ignore", RuntimeWarning)
        counted = (~np.isnan(x)).sum(axis=1) >= cfg.min_peers  # a step few peers pushed is not compared
        med = np.nanmedian(np.where(counted[:, None], x, np.nan), axis=1)
        y = np.log(np.maximum(x, 1e-3) / np.maximum(med, 1e-3)[:, None])
        y[~counted] = np.nan
        valid = ~np.isnan(y)
        if not valid.any():
            return {}
        sigma = max(_MAD_TO_SIGMA * float(np.median(np.abs(y[valid]))), cfg.seq_floor)
    z = np.where(valid, np.clip(y / sigma, -cfg.seq_cap, cfg.seq_cap), 0.0)
    # Suffix sums, read from the newest step back: row j holds the run from step j to the newest.
    rev = slice(None, None, -1)
    gain = np.cumsum(np.where(valid, z - cfg.seq_ref, 0.0)[rev], axis=0)[rev]
    steps = np.cumsum(valid[rev], axis=0)[rev]
    above = np.cumsum((valid & (z > cfg.seq_ref))[rev], axis=0)[rev]
    # The magnitude is the factor itself (a 3× rank is 3×, however many noise units that is), bounded so that
    # one absurd step (a share near 0 from a clock jump) cannot carry a run's mean.
    logf = np.cumsum(np.where(valid, np.clip(y, -_MAX_LOG_FACTOR, _MAX_LOG_FACTOR), 0.0)[rev], axis=0)[rev]
    # From the end of the run's first step to the end of the rank's newest (ranks push at their own moments, so
    # the job's newest steps may not be this rank's yet). Slowness of wall length L slows, at least in part,
    # steps whose ends lie within L + one step of each other: the minimum duration is the transient's plus a
    # step, so that long steps cannot stretch a transient into a finding.
    last = np.where(valid, np.arange(rows)[:, None], -1).max(axis=0)
    span = ends[np.maximum(last, 0)][None, :] - ends[:, None]
    step_s = float(np.median(ends - starts))
    with np.errstate(all="ignore"):
        factor = np.exp(logf / np.maximum(steps, 1))
    need = _min_duration(factor, cfg) + step_s  # min_duration_s, for every run at once
    ok = (gain >= cfg.seq_h) & (steps >= cfg.seq_min_steps) & (above >= cfg.seq_frac * steps) & (span >= need)
    out: dict[int, Evidence] = {}
    for c in np.flatnonzero(ok.any(axis=0)).tolist():
        j = int(np.argmax(np.where(ok[:, c], gain[:, c], -math.inf)))
        k = int(steps[j, c])
        out[ranks[c]] = Evidence(round(float(gain[j, c]), 2), k, round(float(span[j, c]), 2),
                                 round(float(factor[j, c]), 4), round(float(gain[j, c] / k + cfg.seq_ref), 2))
    return out
