"""The stores' columnar windows always equal their objects: random pushes with duplicates, out-of-order and
stale steps, caps, expiry, ranks moving GPU; and a snapshot's arrays never change after it was taken."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gpumond.rules.store import CapExceeded, GpuStore, RankStore
from gpumond.rules.types import GPU_SIGNALS, GpuSample, RankInfo, RankWindow, StepRecord, TelemetryBatch

NOW = 1_763_760_000.0


def expected_columns(w: RankWindow) -> tuple[list[int], np.ndarray]:
    values = np.array([(s.end, s.duration_s, s.data_wait_s, s.comm_wait_s) for s in w.steps], dtype=float)
    return [s.step for s in w.steps], values.reshape(-1, 4).T


def assert_columns_match(w: RankWindow) -> None:
    numbers, values = expected_columns(w)
    cols = w.columns
    if cols is None:  # only while a step number past int64 is held
        assert any(not -2**63 <= n < 2**63 for n in numbers)
        return
    assert cols.step.dtype == np.int64 and cols.values.dtype == np.float64
    assert cols.step.tolist() == numbers
    assert np.array_equal(cols.values, values, equal_nan=True)
    assert np.array_equal(cols.end, values[0]) and np.array_equal(cols.duration_s, values[1])
    assert not cols.step.flags.writeable and not cols.values.flags.writeable


step_number = st.one_of(st.integers(0, 30), st.just(2**70))
comm = st.one_of(st.none(), st.floats(0.0, 2.0, allow_nan=False))
# (rank, gpu, [(step, seconds before now, comm_wait_s)], seconds to advance, expire?)
push = st.tuples(st.integers(0, 3), st.integers(0, 4),
                 st.lists(st.tuples(step_number, st.sampled_from([0.0, 1.0, 5.0, 25.0, 40.0]), comm), max_size=6),
                 st.sampled_from([0.0, 1.0, 7.0, 30.0]), st.booleans())


@settings(max_examples=300, deadline=None)
@given(st.lists(push, max_size=25), st.sampled_from([(4, 10), (8, 100), (100, 1000)]))
def test_columns_always_equal_the_steps(pushes, caps):
    per_rank, held = caps
    s = RankStore(window_s=30, expire_after_s=20, max_jobs=2, max_ranks=3, max_gpus=3,
                  max_steps_per_rank=per_rank, max_steps_held=held)
    now = NOW
    taken: list[tuple[RankWindow, list[int], np.ndarray]] = []
    for rank, gpu, batch, advance, expire in pushes:
        steps = [StepRecord(n, now - ago, 1.0 + ago, 0.25, None, c) for n, ago, c in batch]
        try:
            s.add(RankInfo("job", rank, 4, "node", f"GPU-{gpu}"), steps, now)
        except CapExceeded:
            pass
        now += advance
        if expire:
            s.expire(now)
        for ranks in s.jobs(now).values():
            for w in ranks.values():
                assert_columns_match(w)
                if w.columns is not None:
                    taken.append((w, *expected_columns(w)))
    for w, numbers, values in taken:  # later pushes never wrote under an earlier snapshot
        assert w.columns.step.tolist() == numbers
        assert np.array_equal(w.columns.values, values, equal_nan=True)


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
