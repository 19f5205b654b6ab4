"""The stores' columnar windows always equal their objects: random pushes with duplicates, out-of-order and
stale steps, caps, expiry, ranks moving GPU; and a snapshot's arrays never change after it was taken."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpumond.rules.columns import step_columns, trailing_run
from gpumond.rules.store import CapExceeded, GpuStore, RankStore
from gpumond.rules.types import GPU_SIGNALS, GpuSample, RankInfo, RankWindow, StepRecord, TelemetryBatch
from gpumond.wire.identity import legacy_mig_uuid

NOW = 1_763_760_000.0


def expected_columns(w: RankWindow) -> tuple[list[int], np.ndarray]:
    values = np.array([(s.end, s.duration_s, s.data_wait_s, s.comm_wait_s) for s in w.steps], dtype=float)
    return [s.step for s in w.steps], values.reshape(-1, 4).T


def assert_columns_match(w: RankWindow) -> None:
    numbers, values = expected_columns(w)
    cols = w.columns
    assert cols.step.dtype == np.int64 and cols.values.dtype == np.float64
    assert cols.step.tolist() == numbers
    assert np.array_equal(cols.values, values, equal_nan=True)
    assert np.array_equal(cols.end, values[0]) and np.array_equal(cols.duration_s, values[1])
    assert not cols.step.flags.writeable and not cols.values.flags.writeable


class Reference:
    """The store's step rules written plainly, one record at a time (what the columnar store must equal):
    stale steps, duplicates within a push and against held steps, trimming, max_steps_per_rank, max_steps_held."""

    def __init__(self, window_s: float, per_rank: int, held: int) -> None:
        self.window_s, self.per_rank, self.cap = window_s, per_rank, held
        self.ranks: dict[int, list[StepRecord]] = {}
        self.last: dict[int, int] = {}
        self.pushed: dict[int, float] = {}
        self.accepted = self.duplicate = self.stale = self.refused = self.past = 0

    def total(self) -> int:
        return sum(map(len, self.ranks.values()))

    def trim(self, rank: int, cutoff: float) -> None:
        held = self.ranks[rank]
        while held and held[0].end < cutoff:
            held.pop(0)

    def add(self, rank: int, steps: list[StepRecord], now: float) -> bool:
        """False: refused whole (steps for a rank holding none while max_steps_held is full)."""
        cutoff = now - self.window_s
        if steps and not self.ranks.get(rank) and self.total() >= self.cap:
            return False
        held = self.ranks.setdefault(rank, [])
        fresh: list[StepRecord] = []
        for s in steps:
            if s.end < cutoff:
                self.stale += 1
            elif s.step in {f.step for f in fresh} or s.step in {h.step for h in held}:
                self.duplicate += 1
            else:
                fresh.append(s)
        self.trim(rank, cutoff)
        if len(fresh) > self.per_rank:
            self.past += len(fresh) - self.per_rank
            fresh = fresh[len(fresh) - self.per_rank:]
        allowed = min(self.per_rank, len(held) + max(0, self.cap - self.total()))
        excess = len(held) + len(fresh) - allowed
        if excess > 0:
            drop_old = min(excess, len(held))
            del held[:drop_old]
            drop_new = excess - drop_old
            self.refused += drop_new
            fresh = fresh[drop_new:]
        held.extend(fresh)
        self.accepted += len(fresh)
        self.last[rank] = max([self.last.get(rank, -1), *(s.step for s in fresh)])
        self.pushed[rank] = now
        return True

    def expire(self, now: float, after: float) -> None:
        for rank in [r for r, t in self.pushed.items() if t < now - after]:
            del self.ranks[rank], self.pushed[rank]
        for rank in self.ranks:
            self.trim(rank, now - self.window_s)


comm = st.one_of(st.none(), st.floats(0.0, 2.0, allow_nan=False))
# (rank, [(step, seconds before now, comm_wait_s)], seconds to advance, expire?)
push = st.tuples(st.integers(0, 3),
                 st.lists(st.tuples(st.integers(0, 30), st.sampled_from([0.0, 1.0, 5.0, 25.0, 40.0]), comm),
                          max_size=6),
                 st.sampled_from([0.0, 1.0, 7.0, 30.0]), st.booleans())


@settings(max_examples=300, deadline=None)
@given(st.lists(push, max_size=25), st.sampled_from([(4, 10), (8, 100), (100, 1000)]), st.booleans())
def test_the_columnar_store_keeps_what_the_record_rules_keep(pushes, caps, as_columns):
    per_rank, held = caps
    s = RankStore(window_s=30, expire_after_s=20, max_jobs=1, max_ranks=4, max_gpus=4,
                  max_steps_per_rank=per_rank, max_steps_held=held)
    ref = Reference(30, per_rank, held)
    now = NOW
    taken: list[tuple[RankWindow, list[int], np.ndarray]] = []
    for rank, batch, advance, expire in pushes:
        steps = [StepRecord(n, now - ago, 1.0 + ago, 0.25, None, c) for n, ago, c in batch]
        if steps or rank in ref.ranks:
            try:
                s.add(RankInfo("job", rank, 4, "node", f"GPU-{rank}"), step_columns(steps) if as_columns else steps,
                      now)
                stored = True
            except CapExceeded:
                stored = False
            assert ref.add(rank, steps, now) == stored
        now += advance
        if expire:
            s.expire(now)
            ref.expire(now, 20)
        snapshot = s.jobs(now).get("job", {})
        for rank, held_steps in ref.ranks.items():
            ref.trim(rank, now - 30)
            w = snapshot[rank]
            assert list(w.steps) == held_steps
            assert_columns_match(w)
            taken.append((w, *expected_columns(w)))
        assert set(snapshot) == set(ref.ranks)
        c = s.counts()
        assert (c.steps, c.steps_accepted, c.steps_duplicate, c.steps_stale, c.steps_refused,
                c.steps_per_rank_window) == (ref.total(), ref.accepted, ref.duplicate, ref.stale, ref.refused, ref.past)
    for w, numbers, values in taken:  # later pushes never wrote under an earlier snapshot
        assert w.columns.step.tolist() == numbers
        assert np.array_equal(w.columns.values, values, equal_nan=True)


def test_a_step_number_past_int64_is_refused_before_anything_is_stored():
    s = RankStore(window_s=30, expire_after_s=20, max_jobs=1, max_ranks=1, max_gpus=1, max_steps_per_rank=10,
                  max_steps_held=10)
    with pytest.raises(OverflowError):
        s.add(RankInfo("job", 0, 1, "n", "GPU-a"), [StepRecord(1, NOW, 1.0, 0.1), StepRecord(2**70, NOW, 1.0, 0.1)],
              NOW)
    assert s.counts().ranks == 0 and s.counts().steps == 0


def test_a_rank_moving_gpu_keeps_its_columns():
    s = RankStore(window_s=300, expire_after_s=900, max_jobs=1, max_ranks=1, max_gpus=1, max_steps_per_rank=50,
                  max_steps_held=50)
    s.add(RankInfo("job", 0, 1, "n", "GPU-a"), [StepRecord(i, NOW, 1.0, 0.1) for i in range(3)], NOW)
    s.add(RankInfo("job", 0, 1, "n", "GPU-b"), [StepRecord(i, NOW + 1, 1.0, 0.1, None, 0.2) for i in range(3, 5)],
          NOW + 1)
    w = s.jobs(NOW + 1)["job"][0]
    assert w.info.gpu_uuid == "GPU-b"
    assert_columns_match(w)
    assert w.columns.step.tolist() == [0, 1, 2, 3, 4]
    assert np.isnan(w.columns.comm_wait_s[:3]).all() and (w.columns.comm_wait_s[3:] == 0.2).all()


def test_columns_grow_past_their_first_buffer_without_touching_earlier_snapshots():
    s = RankStore(window_s=1000, expire_after_s=2000, max_jobs=1, max_ranks=1, max_gpus=1,
                  max_steps_per_rank=40, max_steps_held=40)
    info = RankInfo("job", 0, 1, "n", "GPU-a")
    snaps = []
    for i in range(100):
        s.add(info, [StepRecord(i, NOW + i, 1.0 + i, 0.1)], NOW + i)
        snaps.append(s.jobs(NOW + i)["job"][0])
    for i, w in enumerate(snaps):
        assert w.columns.step.tolist() == list(range(max(0, i - 39), i + 1))
        assert_columns_match(w)


# ----- GpuStore ----------------------------------------------------------------------------------
SIGNALS = ("sm_clock_hz", "power_w", "energy_j", "utilization")
sample = st.tuples(st.integers(0, 3), st.sampled_from([-3.0, 0.0, 1.0, 4.0]), st.booleans(),
                   st.dictionaries(st.sampled_from(SIGNALS), st.sampled_from([0.0, 1.5, float("nan")])))


def assert_gpu_columns_match(window) -> None:
    cols = window.columns
    assert cols is not None and len(cols) == len(window)
    assert not cols.data.flags.writeable
    assert cols.t.tolist() == [s.t for s in window] and cols.up.tolist() == [s.up for s in window]
    for j, name in enumerate(GPU_SIGNALS):
        assert [bool(p >> j & 1) for p in cols.present.tolist()] == [name in s.values for s in window]
        expected = np.array([s.values.get(name, np.nan) for s in window], dtype=float)
        assert np.array_equal(cols.signal(name), expected, equal_nan=True)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.lists(sample, max_size=5), st.sampled_from([0.0, 2.0, 9.0]), st.booleans()),
                max_size=20))
def test_gpu_columns_always_equal_the_samples(fetches):
    g = GpuStore(window_s=10, expire_after_s=15, max_gpus=3, max_samples=4)
    now = NOW
    taken = []
    for batch, advance, expire in fetches:
        gpus = tuple(GpuSample(f"G{u}", "n", str(u), now + dt, up, values) for u, dt, up, values in batch)
        g.add(TelemetryBatch(now, gpus))
        now += advance
        if expire:
            g.expire(now)
        for u in range(5):
            w = g.window(f"G{u}", now - 8.0)
            if w:
                assert_gpu_columns_match(w)
                taken.append((w, w.columns.data.copy()))
    for w, data in taken:  # later fetches never wrote under an earlier window
        assert np.array_equal(w.columns.data, data, equal_nan=True)


def test_a_windows_steps_read_as_records_by_index_slice_and_iteration():
    s = RankStore(window_s=300, expire_after_s=900, max_jobs=1, max_ranks=1, max_gpus=1, max_steps_per_rank=50,
                  max_steps_held=50)
    records = [StepRecord(i, NOW - 5 + i, 1.0 + i, 0.1, 32, None if i % 2 else 0.25) for i in range(5)]
    s.add(RankInfo("job", 0, 1, "n", "GPU-a"), records, NOW)
    steps = s.jobs(NOW)["job"][0].steps
    held = [StepRecord(r.step, r.end, r.duration_s, r.data_wait_s, None, r.comm_wait_s) for r in records]
    assert len(steps) == 5 and bool(steps) and list(steps) == held and steps == tuple(held)
    assert steps[0] == held[0] and steps[-1] == held[-1] and steps[1:3] == tuple(held[1:3])
    assert type(steps[0].step) is int and type(steps[0].end) is float
    with pytest.raises(IndexError):
        steps[5]
    empty = RankStore(window_s=300, expire_after_s=900, max_jobs=1, max_ranks=1, max_gpus=1, max_steps_per_rank=5,
                      max_steps_held=5)
    empty.add(RankInfo("job", 0, 1, "n", "GPU-a"), [], NOW)
    assert not empty.jobs(NOW)["job"][0].steps


def test_a_buffers_oldest_end_follows_appends_drops_growth_and_clear() -> None:
    from gpumond.rules.columns import StepBuffer

    buf = StepBuffer()
    assert buf.oldest_end == np.inf  # none held: never before a cutoff

    def push(first: int, k: int) -> None:
        ends = NOW + np.arange(first, first + k, dtype=float)
        buf.extend(np.arange(first, first + k), np.vstack([ends, np.ones(k), np.zeros(k), np.full(k, np.nan)]))

    push(0, 10)
    assert buf.oldest_end == NOW
    for first in range(10, 200, 10):  # past the first block: grown, so the live cells moved
        push(first, 10)
        assert buf.oldest_end == NOW
    buf.drop(15)
    assert buf.oldest_end == NOW + 15 == buf.ends()[0]
    buf.drop(len(buf))
    assert buf.oldest_end == np.inf
    push(500, 3)  # appended to an emptied buffer: its first step is the oldest
    assert buf.oldest_end == NOW + 500
    buf.clear()
    assert buf.oldest_end == np.inf


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0, 100), min_size=1, max_size=40), st.floats(0, 110), st.booleans())
def test_a_window_rolls_out_exactly_its_leading_steps_older_than_the_window(ends, cutoff, by_snapshot):
    """Trimming drops the leading run of steps (in arrival order) that ended before the window, however long
    that run is (a few as usual, or more than a trim reads one by one) and whatever ends follow it."""
    s = RankStore(window_s=1000, expire_after_s=10_000, max_jobs=1, max_ranks=1, max_gpus=1,
                  max_steps_per_rank=64, max_steps_held=64)
    info = RankInfo("j", 0, 1, "n", "G")
    s.record(info, [StepRecord(i, e, 1.0, 0.0) for i, e in enumerate(ends)], now=100.0)
    now = cutoff + 1000
    cutoff = now - 1000  # the window's start, as the store computes it (cutoff + 1000 − 1000 may round)
    if by_snapshot:
        held = s.jobs(now)["j"][0].columns.end.tolist()
    else:
        s.expire(now)
        held = s.jobs(now)["j"][0].columns.end.tolist()
    leading = next((i for i, e in enumerate(ends) if not e < cutoff), len(ends))
    assert held == ends[leading:]
    assert s.counts().steps == len(ends) - leading


def _run_from_newest(times: list[float], since: float) -> int:
    """How many of the newest times a reader going back from the newest keeps (stopping at the first not >= since)."""
    k = 0
    for t in reversed(times):
        if not t >= since:
            break
        k += 1
    return k


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.sampled_from([-2.0, 0.0, 1.0, 3.0, float("nan"), float("inf")]), max_size=6), max_size=6),
       st.sampled_from([-1.0, 0.0, 1.0, 2.5, float("-inf"), float("nan")]))
def test_trailing_runs_of_many_arrays_at_once_equal_reading_each_back_from_its_newest(arrays, since):
    got = trailing_run([np.array(a, dtype=float) for a in arrays], since)
    assert got.tolist() == [_run_from_newest(a, since) for a in arrays]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.lists(st.tuples(st.integers(0, 3), st.sampled_from([-3.0, 0.0, 1.0, 4.0, float("nan")]),
                                             st.booleans()), max_size=5),
                          st.sampled_from([0.0, 2.0, 9.0]), st.booleans()), max_size=20),
       st.sampled_from([-8.0, -3.0, 0.0, 1.0]))
def test_gpu_windows_read_at_once_equal_each_gpus_samples_read_back_from_its_newest(fetches, look):
    """GpuStore.windows (all GPUs together, counts from the columns) keeps exactly the samples a plain loop over
    each GPU's held samples keeps, unknown GPUs included, with the matching columns."""
    g = GpuStore(window_s=10, expire_after_s=15, max_gpus=3, max_samples=4)
    now = NOW
    for batch, advance, expire in fetches:
        gpus = tuple(GpuSample(f"G{u}", "n", str(u), now + dt, up, {"power_w": dt}) for u, dt, up in batch)
        g.add(TelemetryBatch(now, gpus))
        now += advance
        if expire:
            g.expire(now)
        asked = [f"G{u}" for u in (4, 0, 1, 2, 3)]
        got = g.windows(asked, now + look)
        assert list(got) == asked
        for u in asked:
            # The oracle reads the store's held samples directly (its deque), one object at a time.
            held = tuple(g._gpus.get(u, ()))
            k = _run_from_newest([s.t for s in held], now + look)
            expected = held[len(held) - k:]
            assert tuple(got[u]) == expected
            if u in g._gpus:
                assert_gpu_columns_match(got[u])
            else:
                assert got[u].columns is None


def test_gpu_windows_read_at_once_answer_a_mig_devices_legacy_name_under_the_name_asked():
    parent, mig = "GPU-11111111-2222-3333-4444-555555555555", "MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
    legacy = legacy_mig_uuid(parent, 1, 0)
    g = GpuStore(window_s=60, expire_after_s=90, max_gpus=4, max_samples=8)
    for i in range(3):
        g.add(TelemetryBatch(NOW + i, (GpuSample(mig, "n", "0", NOW + i, True, {"power_w": float(i)}, parent_uuid=parent,
                                                 gpu_instance=1, compute_instance=0),)))
    got = g.windows([legacy, mig, "GPU-unknown"], NOW + 1)
    assert list(got) == [legacy, mig, "GPU-unknown"]
    assert [s.t for s in got[legacy]] == [s.t for s in got[mig]] == [NOW + 1, NOW + 2]
    assert got[legacy].columns.t.tolist() == [NOW + 1, NOW + 2] and got["GPU-unknown"] == ()
