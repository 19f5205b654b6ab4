"""Every rank's features and the job's step times in one pass over a job's steps, vectorised with numpy.

Same results as features.rank_features (per rank) and features.job_step_times, which stay the reference:
a job's ~100 steps × thousands of ranks are read once with C-level attribute getters, and the medians
are taken for all ranks at once (ragged.Groups). Numbers are treated as floats, as ingest stores them
(pydantic turns a JSON int into a float); a job with a NaN anywhere, or a step number past int64, is
computed by the reference code instead, because numpy orders and compares NaN differently from `sorted`
and `max`.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import chain, compress
from operator import attrgetter

import numpy as np

from gpumond.rules.detectors.features import RankFeatures, job_step_times, rank_features
from gpumond.rules.detectors.ragged import Groups, has_nan
from gpumond.rules.types import RankWindow

_END = attrgetter("end")
_DURATION = attrgetter("duration_s")
_WAIT = attrgetter("data_wait_s")
_STEP = attrgetter("step")
_STEPS = attrgetter("steps")
# A step-number range up to this many times the step count is indexed directly instead of via np.unique.
_DENSE_STEPS = 4


def job_rank_features(ranks: Mapping[int, RankWindow], since: float,
                      until: float) -> tuple[list[RankFeatures], list[float]]:
    """([rank_features(w, since) for w in ranks.values()], job_step_times(ranks, since, until))."""
    windows = list(ranks.values())
    try:
        out = _vectorised(windows, since, until)
    except OverflowError:  # a step number numpy cannot hold
        out = None
    if out is None:
        return [rank_features(w, since) for w in windows], job_step_times(ranks, since, until)
    return out


def _vectorised(windows: list[RankWindow], since: float,
                until: float) -> tuple[list[RankFeatures], list[float]] | None:
    step_lists = list(map(_STEPS, windows))
    counts = np.fromiter(map(len, step_lists), np.int64, len(step_lists))
    flat = list(chain.from_iterable(step_lists))
    ends = np.fromiter(map(_END, flat), float, len(flat))
    if has_nan(ends):
        return None
    everything = Groups(counts)
    recent_mask = ends >= since
    # Only recent steps are read further: with a 300 s window and 60 s of features that is a fifth of them.
    recent = list(compress(flat, recent_mask.tolist()))
    n = len(recent)
    durations = np.fromiter(map(_DURATION, recent), float, n)
    waits = np.fromiter(map(_WAIT, recent), float, n)
    numbers = np.fromiter(map(_STEP, recent), np.int64, n)
    if has_nan(durations, waits):
        return None
    groups = Groups(everything.count(recent_mask))
    timed = durations > 0
    with np.errstate(all="ignore"):  # untimed steps divide by zero; they are masked out
        fracs = np.minimum(waits / durations, 1.0)
    step_time, k = groups.median(durations, timed)
    wait_frac, _ = groups.median(fracs, timed)
    last_end = _group_max(ends, everything)

    feats = []
    for w, steps, timed_k, st, wf, le, total in zip(
            windows, groups.counts.tolist(), k.tolist(), step_time.tolist(), wait_frac.tolist(),
            last_end.tolist(), counts.tolist(), strict=True):
        i = w.info
        feats.append(RankFeatures(
            rank=i.rank, node=i.node, gpu_uuid=i.gpu_uuid, group=i.group, steps=steps,
            step_time_s=st if timed_k else None, wait_frac=wf if timed_k else None,
            last_end=le if total else None, last_push=w.last_push))
    in_range = ends[recent_mask] < until
    return feats, _slowest_per_step(numbers[in_range], durations[in_range])


def _group_max(values: np.ndarray, groups: Groups) -> np.ndarray:
    """Each group's maximum (0.0 for an empty group, which callers mask)."""
    out = np.zeros(groups.n)
    nonempty = groups.counts > 0
    if nonempty.any():
        # Empty groups add no elements, so consecutive non-empty starts bound exactly one group each.
        out[nonempty] = np.maximum.reduceat(values, groups.starts[nonempty])
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
