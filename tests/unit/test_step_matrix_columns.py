"""The job's steps read from the windows' columns equal those read from the step objects, field by field.

The columns path reads the other fields than the ends only for each rank's newest steps (sliced before they are
concatenated); the objects path reads them one StepRecord at a time: two independent readings of one window."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gpumond.rules.columns import step_columns
from gpumond.rules.detectors.step_matrix import RecentSteps, read_steps
from gpumond.rules.types import RankInfo, RankWindow, StepRecord

NOW = 1000.0
SINCE = NOW - 60.0
# Read whole: what is derived from every held end. The tail's fields are read only where `recent` (every
# detector masks them by it; outside it each path leaves what is cheapest: padding, or an older step).
WHOLE = ("counts", "first_end", "last_end", "ends_nan", "recent", "k")
TAIL = ("ends", "durations", "waits", "numbers", "comm")
assert set(WHOLE + TAIL) == {f.name for f in dataclasses.fields(RecentSteps)}


def _window(rank: int, ends: list[float], seed: int) -> RankWindow:
    rng = np.random.default_rng(seed)
    steps = tuple(StepRecord(k, e, float(rng.uniform(0.1, 2.0)), float(rng.uniform(0.0, 0.1)), None,
                             None if rng.random() < 0.1 else float(rng.uniform(0.0, 0.3)))
                  for k, e in enumerate(ends))
    return RankWindow(RankInfo("j", rank, 8, f"n{rank // 4}", f"G{rank}"), steps, NOW)


# Ends oldest first, as the store holds them; some windows long (hundreds of steps, only the newest recent),
# some with no recent step, some with every step recent.
ends_of = st.one_of(
    st.builds(lambda n, m: [SINCE - 100.0 + 100.0 * i / max(n, 1) for i in range(n)]
              + [SINCE + 59.0 * i / max(m, 1) for i in range(m)], st.integers(0, 400), st.integers(0, 60)),
    st.lists(st.sampled_from([SINCE - 5.0, SINCE, SINCE + 1.0, NOW]), max_size=8).map(sorted),
)


def _same(a: np.ndarray | bool, b: np.ndarray | bool) -> bool:
    if isinstance(a, bool):
        return a is b
    return a.shape == b.shape and a.dtype == b.dtype and bool(np.array_equal(a, b, equal_nan=a.dtype.kind == "f"))


@settings(max_examples=150, deadline=None)
@given(st.lists(ends_of, min_size=1, max_size=12), st.integers(0, 2**31))
def test_the_columns_read_what_the_objects_read(all_ends, seed):
    windows = [_window(r, ends, seed + r) for r, ends in enumerate(all_ends)]
    with_columns = [dataclasses.replace(w, columns=step_columns(w.steps)) for w in windows]
    a, b = read_steps(with_columns, SINCE), read_steps(windows, SINCE)
    assert (a is None) == (b is None)
    if a is not None:
        for name in WHOLE:
            assert _same(getattr(a, name), getattr(b, name)), name
        for name in TAIL:
            assert _same(getattr(a, name)[a.recent], getattr(b, name)[b.recent]), name


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(ends_of, st.lists(st.sampled_from([SINCE - 5.0, SINCE, NOW, math.nan]), max_size=6)),
                min_size=1, max_size=12), st.integers(0, 2**31), st.booleans())
def test_what_the_whole_window_says_is_what_each_windows_steps_say(all_ends, seed, columns):
    """Per rank, read flat from every held end (not a matrix of them): checked against the steps one by one, in
    any order of ends (a NaN end, a recent step before an older one)."""
    windows = [_window(r, ends, seed + r) for r, ends in enumerate(all_ends)]
    if columns:
        windows = [dataclasses.replace(w, columns=step_columns(w.steps)) for w in windows]
    got = read_steps(windows, SINCE)
    if not any(w.steps for w in windows):
        assert got is None
        return
    assert got is not None
    for j, w in enumerate(windows):
        ends = [s.end for s in w.steps]
        assert got.counts[j] == len(ends)
        assert got.k[j] == sum(e >= SINCE for e in ends)
        assert got.recent[:, j].sum() == got.k[j]
        assert sorted(got.ends[:, j][got.recent[:, j]].tolist()) == sorted(e for e in ends if e >= SINCE)
        if not ends:
            assert math.isnan(got.first_end[j]) and got.last_end[j] == -math.inf
        else:
            assert _same(got.first_end[j:j + 1], np.array(ends[:1]))
            want_last = math.nan if any(math.isnan(e) for e in ends) else max(ends)
            assert _same(got.last_end[j:j + 1], np.array([want_last]))
    assert got.ends_nan == any(math.isnan(s.end) for w in windows for s in w.steps)


def test_sorted_windows_never_build_the_whole_windows_matrix(monkeypatch):
    """The fast path (every rank's recent steps are its newest): the (width, n) matrix of every held end, what
    read_steps exists to avoid, is never built; only the recent rows are read."""
    from gpumond.rules.detectors import step_matrix

    def whole(self, width):
        raise AssertionError(f"the whole window's ends were read ({width} rows)")

    monkeypatch.setattr(step_matrix._FromColumns, "ends", whole)
    windows = [dataclasses.replace(w, columns=step_columns(w.steps))
               for w in (_window(r, [SINCE - 200.0 + i for i in range(150)] + [SINCE + i for i in range(40 + r)], r)
                         for r in range(6))]
    got = read_steps(windows, SINCE)
    assert got is not None and got.k.tolist() == [40 + r for r in range(6)] and len(got.ends) == 45


def test_newest_of_each_looks_within_each_segment_only():
    from gpumond.rules.detectors.step_matrix import _newest_of_each

    # rank A: all recent; rank B: an old step first, then recent ones (still its newest): True.
    assert _newest_of_each(np.array([True, True, False, True]), np.array([2, 4]))
    # rank B: a recent step before an old one: False.
    assert not _newest_of_each(np.array([True, True, True, False]), np.array([2, 4]))
    # rank A's recent steps are followed by rank B's old first step: not a fall within a segment.
    assert _newest_of_each(np.array([False, True, False, False]), np.array([2, 4]))
    assert _newest_of_each(np.array([True]), np.array([1]))
