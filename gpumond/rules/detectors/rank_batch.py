"""Every rank's features and the job's step times in one pass over a job's steps, vectorised with numpy.

Same results as features.rank_features (per rank) and features.job_step_times, which stay the reference:
a job's recent steps × thousands of ranks are read once (step_matrix.read_steps: from the store's columns, else
the step objects) into padded matrices (ragged), and the medians are taken for all ranks at once. Numbers are
treated as floats, as ingest stores them (pydantic turns a JSON int into a float). A job with a NaN end, a NaN
recent duration or wait, a step number past 2**53, or a recent-steps matrix that would be mostly padding (one
rank with far more recent steps than the rest) is computed by the reference code instead: numpy orders and
compares NaN differently from `sorted` and `max`, and a mostly empty matrix would waste memory.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from gpumond.rules.detectors.features import (SHARE_QUANTUM, RankFeatures, job_step_times, rank_features,
                                               step_share_means)
from gpumond.rules.detectors.ragged import column_median, column_trimmed_mean_and_median, has_nan, too_ragged
from gpumond.rules.detectors.step_matrix import RecentSteps, read_steps
from gpumond.rules.types import RankWindow

_EXACT_INT = 2.0**53  # step numbers travel as floats: exact below this
# A step-number range up to this many times the step count is indexed directly instead of via np.unique.
_DENSE_STEPS = 4


def job_rank_features(ranks: Mapping[int, RankWindow], since: float, until: float, short_steps: int = 8,
                      min_steps: int = 5, trim: float = 0.1, short_s: float = 0.0,
                      steps: RecentSteps | None = None) -> tuple[list[RankFeatures], list[float]]:
    """([rank_features(w, since, short_steps, min_steps, trim, short_s, step_share_means(ranks.values(), since))
    for w in ranks.values()], job_step_times(ranks, since, until)): compute shares relative to their step's mean.
    `steps`: these windows already read (step_matrix.read_steps with this `since`), else they are read here."""
    windows = list(ranks.values())
    out = _vectorised(windows, steps if steps is not None else read_steps(windows, since), until, short_steps,
                      min_steps, trim, short_s)
    if out is None:
        means = step_share_means(windows, since)
        return ([rank_features(w, since, short_steps, min_steps, trim, short_s, means) for w in windows],
                job_step_times(ranks, since, until))
    return out


def _vectorised(windows: list[RankWindow], read: RecentSteps | None, until: float, short_steps: int,
                min_steps: int, trim: float, short_s: float) -> tuple[list[RankFeatures], list[float]] | None:
    if read is None:
        return None
    counts = read.counts
    n = len(counts)
    depth = len(read.ends)
    if too_ragged(np.minimum(counts, depth), depth):  # the cells of the matrices read that hold a step
        return None
    if read.ends_nan:
        return None
    last_end = read.last_end
    recent, k, ends = read.recent, read.k, read.ends
    durations, waits, numbers, comm = read.durations, read.waits, read.numbers, read.comm
    if has_nan(durations[recent], waits[recent]) or bool((np.abs(numbers[recent]) >= _EXACT_INT).any()):
        return None
    timed = recent & (durations > 0)
    with np.errstate(all="ignore"):  # untimed steps divide by zero; they are masked out
        fracs = np.minimum(waits / durations, 1.0)
        shares = np.maximum(1.0 - (waits + comm) / durations, 0.0)
    step_time, n_timed = column_median(durations, timed)
    wait_frac, _ = column_median(fracs, timed)
    # cumsum adds in row (step) order, as the reference's sum(); .sum() adds pairwise and can differ in the last bit.
    summed = np.cumsum(np.where(timed, fracs, 0.0), axis=0)[-1] if depth else np.zeros(n)
    wait_mean = summed / np.maximum(n_timed, 1)
    shared = timed & ~np.isnan(comm)
    compute_frac, _ = column_median(shares, shared)  # absolute, before the shares are made relative
    with np.errstate(all="ignore"):
        comm_frac, _ = column_median(comm / durations, shared)
    if shared.any():
        shares = _relative(shares, shared, numbers)
    share_trimmed, share_recent, n_shared = column_trimmed_mean_and_median(shares, shared, trim)
    with np.errstate(all="ignore"):  # cells that are not selected may hold anything; they are masked out
        share_spread, _ = column_median(np.abs(shares - share_recent), shared)
    # The last `short_steps` of them, and every one that ended within `short_s` of the newest of them.
    newest_end = np.where(shared, ends, -np.inf).max(axis=0) if depth else np.zeros(n)
    newest = shared & ((np.cumsum(shared[::-1], axis=0)[::-1] <= short_steps) | (ends >= newest_end - short_s))
    share_short, n_short = column_median(shares, newest)
    short_ok = n_shared >= min(short_steps, min_steps)
    recent_ok = n_shared >= min_steps

    feats = []
    for w, steps, timed_k, st, wf, le, total, wm, ss, sok, sr, rok, tm, sp, ns, nss, cf, mf in zip(
            windows, k.tolist(), n_timed.tolist(), step_time.tolist(), wait_frac.tolist(), last_end.tolist(),
            counts.tolist(), wait_mean.tolist(), share_short.tolist(), short_ok.tolist(), share_recent.tolist(),
            recent_ok.tolist(), share_trimmed.tolist(), share_spread.tolist(), n_shared.tolist(), n_short.tolist(),
            compute_frac.tolist(), comm_frac.tolist(), strict=True):
        i = w.info
        feats.append(RankFeatures(
            rank=i.rank, node=i.node, gpu_uuid=i.gpu_uuid, group=i.group, steps=steps,
            step_time_s=st if timed_k else None, wait_frac=wf if timed_k else None,
            last_end=le if total else None, last_push=w.last_push, wait_mean=wm if timed_k else None,
            share_short=ss if sok else None, share_recent=sr if rok else None,
            share_trimmed=tm if rok else None, share_spread=sp if rok else None, share_n=ns, share_short_n=nss,
            compute_frac=cf if rok else None, comm_frac=mf if rok else None))
    in_range = recent & (ends < until)
    return feats, _slowest_per_step(numbers[in_range].astype(np.int64), durations[in_range])


def _step_index(numbers: np.ndarray) -> tuple[np.ndarray, int]:
    """(index of each step number among the distinct ones, how many there are): dense when they are."""
    lo = int(numbers.min())
    span = int(numbers.max()) - lo + 1
    if span <= _DENSE_STEPS * len(numbers) + 64 and bool((numbers == np.floor(numbers)).all()):
        return (numbers - lo).astype(np.int64), span
    _, index = np.unique(numbers, return_inverse=True)  # exact on any float
    return index.reshape(-1), int(index.max()) + 1


def _relative(shares: np.ndarray, shared: np.ndarray, numbers: np.ndarray) -> np.ndarray:
    """Each selected share minus its step's mean over the ranks (features.step_share_means, bit for bit)."""
    index, slots = _step_index(numbers[shared])
    x = shares[shared]
    sums = np.bincount(index, weights=np.round(x * SHARE_QUANTUM) / SHARE_QUANTUM, minlength=slots)
    means = sums / np.maximum(np.bincount(index, minlength=slots), 1)  # (slots no step uses: never read)
    out = shares.copy()
    out[shared] = x - means[index]
    return out


def _slowest_per_step(numbers: np.ndarray, durations: np.ndarray) -> list[float]:
    """The largest duration (at least 0.0) for each step number, in step-number order."""
    if not len(numbers):
        return []
    lo = int(numbers.min())
    span = int(numbers.max()) - lo + 1
    if span <= _DENSE_STEPS * len(numbers) + 64:
        index, slots = numbers - lo, span
    else:
        _, index = np.unique(numbers, return_inverse=True)
        slots = int(index.max()) + 1
    slowest = np.zeros(slots)
    np.maximum.at(slowest, index, durations)
    seen = np.bincount(index, minlength=slots) > 0
    return slowest[seen].tolist()
