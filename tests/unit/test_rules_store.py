"""RankStore and GpuStore: windows in time and count, idempotent pushes, caps, expiry, snapshots, threads."""

from __future__ import annotations

import threading
from types import MappingProxyType

import pytest

from gpumond.rules.store import CapExceeded, GpuStore, RankStore
from gpumond.rules.types import GpuSample, HostSample, RankInfo, StepRecord, TelemetryBatch

NOW = 1_763_760_000.0


def uuid(n: int) -> str:
    return f"GPU-00000000-0000-0000-0000-{n:012x}"


def info(job: str = "job", rank: int = 0, gpu: int | None = None, world: int = 1024) -> RankInfo:
    return RankInfo(job, rank, world, f"node-{rank // 8}", uuid(rank if gpu is None else gpu))


def steps(first: int, count: int, end: float = NOW, gap: float = 1.0) -> list[StepRecord]:
    """`count` steps numbered from `first`, the last one ending at `end`."""
    return [StepRecord(first + i, end - (count - 1 - i) * gap, 0.8, 0.1, 32) for i in range(count)]


def store(**over: int | float) -> RankStore:
    kw: dict = dict(window_s=300, expire_after_s=900, max_jobs=100, max_ranks=1000, max_gpus=1000,
                    max_steps_per_rank=100, max_steps_held=100_000)
    kw.update(over)
    return RankStore(**kw)


def held(s: RankStore, job: str = "job", rank: int = 0, now: float = NOW) -> list[int]:
    return [r.step for r in s.jobs(now)[job][rank].steps]


# ----- RankStore: windows ------------------------------------------------------------------------
def test_steps_are_kept_oldest_first_with_the_latest_info_and_push_time() -> None:
    s = store()
    assert s.add(info(), steps(0, 5), NOW) == 5
    newer = RankInfo("job", 0, 1024, "node-9", uuid(9), "pp-1")
    assert s.add(newer, steps(5, 2), NOW + 2) == 2
    window = s.jobs(NOW + 2)["job"][0]
    assert [r.step for r in window.steps] == [0, 1, 2, 3, 4, 5, 6]
    assert window.info == newer and window.last_push == NOW + 2


def test_a_repeated_push_is_idempotent() -> None:
    s = store()
    batch = steps(10, 8)
    assert s.add(info(), batch, NOW) == 8
    assert s.add(info(), batch, NOW + 1) == 0
    assert s.add(info(), steps(14, 8), NOW + 2) == 4  # overlaps: only 18..21 are new
    assert held(s) == list(range(10, 22))
    c = s.counts()
    assert (c.steps, c.steps_accepted, c.steps_duplicate) == (12, 12, 12)


def test_duplicates_within_one_push_and_out_of_order_steps() -> None:
    s = store()
    s.add(info(), steps(10, 3), NOW)
    late = [StepRecord(5, NOW - 20, 0.8, 0.1), StepRecord(7, NOW - 19, 0.8, 0.1), StepRecord(7, NOW - 19, 0.8, 0.1),
            StepRecord(11, NOW, 0.8, 0.1)]
    assert s.add(info(), late, NOW) == 2  # 5 and 7 are new; the second 7 and 11 are not
    assert held(s) == [10, 11, 12, 5, 7]  # arrival order


def test_steps_older_than_the_window_are_not_stored() -> None:
    s = store(window_s=60)
    assert s.add(info(), steps(0, 100, end=NOW, gap=1.0), NOW) == 61  # ends NOW-99 … NOW; 61 within 60 s
    assert s.counts().steps_stale == 39
    assert held(s, now=NOW + 30) == list(range(69, 100))  # the window moves on at read time
    assert s.counts().steps == 31


def test_each_rank_keeps_at_most_max_steps_per_rank() -> None:
    s = store(max_steps_per_rank=10)
    for k in range(5):
        s.add(info(), steps(k * 8, 8, end=NOW + k), NOW + k)
    assert held(s, now=NOW + 4) == list(range(30, 40))
    assert s.counts().steps == 10


def test_the_global_step_cap_makes_full_ranks_roll_their_own_window() -> None:
    s = store(max_steps_held=20, max_steps_per_rank=100)
    assert s.add(info(rank=0), steps(0, 15), NOW) == 15
    assert s.add(info(rank=1), steps(0, 15), NOW) == 5  # only 5 fit; the 10 oldest new ones are refused
    assert held(s, rank=1) == [10, 11, 12, 13, 14]
    assert s.add(info(rank=0), steps(15, 4, end=NOW + 1), NOW + 1) == 4  # rank 0 rolls: drops its 4 oldest
    assert held(s, rank=0, now=NOW + 1) == list(range(4, 19))
    with pytest.raises(CapExceeded) as err:
        s.add(info(rank=2), steps(0, 1), NOW + 1)  # a new rank with steps while full
    assert err.value.cap == "steps"
    assert str(err.value).startswith("steps cap reached: 20 steps held (limits.max_steps_held); new rank 2 of job")
    c = s.counts()
    assert c.steps == 20 and c.steps_refused == 10 and c.refused["steps"] == 1


def test_a_push_longer_than_a_rank_window_names_the_steps_it_cannot_keep() -> None:
    s = store(max_steps_per_rank=10)
    stored = s.record(info(), steps(0, 25), NOW)
    assert (stored.accepted, stored.dropped()) == (10, {"per_rank_window": 15})
    assert held(s) == list(range(15, 25))
    c = s.counts()
    assert c.steps_per_rank_window == 15 and c.steps_refused == 0  # not "no room under max_steps_held"
    assert s.record(info(), steps(25, 3, end=NOW + 1), NOW + 1).dropped() == {}  # an ordinary push rolls


def test_the_global_cap_names_the_new_steps_it_had_no_room_for() -> None:
    s = store(max_steps_held=20, max_steps_per_rank=100)
    s.add(info(rank=0), steps(0, 15), NOW)
    stored = s.record(info(rank=1), steps(0, 15), NOW)
    assert (stored.accepted, stored.dropped()) == (5, {"steps_held": 10})


def test_a_rank_made_by_a_heartbeat_is_refused_steps_while_the_total_is_full() -> None:
    s = store(max_steps_held=10, max_steps_per_rank=100)
    assert s.add(info(rank=1), [], NOW) == 0  # a heartbeat: room is not needed to say "alive"
    s.add(info(rank=0), steps(0, 10), NOW)
    with pytest.raises(CapExceeded) as err:
        s.add(info(rank=1), steps(0, 3), NOW)  # it holds nothing it could roll out to make room
    assert err.value.cap == "steps"
    assert "new steps for rank 1 of job" in str(err.value) and "(it holds none it could roll out)" in str(err.value)
    assert s.add(info(rank=1), [], NOW) == 0  # heartbeats still fine
    assert s.add(info(rank=0), steps(10, 2, end=NOW + 1), NOW + 1) == 2  # a rank holding steps rolls


# ----- RankStore: cardinality caps ---------------------------------------------------------------
@pytest.mark.parametrize(
    ("cap", "limits", "new", "message"),
    [
        ("jobs", {"max_jobs": 2}, info("job-new", 0, gpu=50), "jobs cap reached: 2 jobs held (limits.max_jobs); "
                                                                "new job 'job-new' refused"),
        ("ranks", {"max_ranks": 2}, info("job-0", 5, gpu=50), "ranks cap reached: 2 ranks held (limits.max_ranks); "
                                                                "new rank 5 of job 'job-0' refused"),
        ("gpus", {"max_gpus": 2}, info("job-0", 5, gpu=50), f"gpus cap reached: 2 gpus held (limits.max_gpus); "
                                                              f"new GPU {uuid(50)} refused"),
    ],
)
def test_a_cap_refuses_new_entries_while_held_ones_keep_working(cap: str, limits: dict, new: RankInfo,
                                                                message: str) -> None:
    s = store(**limits)
    s.add(info("job-0", 0, gpu=0), steps(0, 2), NOW)
    s.add(info("job-1", 0, gpu=1), steps(0, 2), NOW)
    with pytest.raises(CapExceeded) as err:
        s.add(new, steps(0, 2), NOW)
    assert err.value.cap == cap
    assert str(err.value).startswith(message)
    assert str(err.value).endswith("data of those already held is still accepted")
    assert s.add(info("job-0", 0, gpu=0), steps(2, 2), NOW + 1) == 2  # held series still accepted
    c = s.counts()
    assert c.refused[cap] == 1 and (c.jobs, c.ranks, c.gpus) == (2, 2, 2)
    assert "job-new" not in s.jobs(NOW)


def test_ranks_sharing_a_gpu_count_it_once_and_a_move_frees_it() -> None:
    s = store(max_gpus=2)
    s.add(info("a", 0, gpu=0), [], NOW)
    s.add(info("b", 0, gpu=0), [], NOW)  # same GPU, another job (time-sliced)
    s.add(info("a", 1, gpu=1), [], NOW)
    assert s.counts().gpus == 2
    with pytest.raises(CapExceeded):
        s.add(info("a", 0, gpu=7), [], NOW)  # GPU 0 is still used by job b: 7 would be a third
    s.add(info("a", 1, gpu=7), [], NOW)  # rank a/1 was alone on GPU 1: moving frees it
    assert s.counts().gpus == 2


def test_a_hostile_client_pushing_ten_times_the_caps_cannot_grow_the_store_past_them() -> None:
    caps = dict(max_jobs=20, max_ranks=50, max_gpus=40, max_steps_per_rank=30, max_steps_held=1000)
    s = store(**caps)
    refused = 0
    for i in range(10 * caps["max_ranks"]):
        hostile = RankInfo(f"job-{i % (10 * caps['max_jobs'])}", i, 10_000, f"n{i}", uuid(i))
        for k in range(10):  # each rank pushes 10 × its cap of steps
            try:
                s.add(hostile, steps(k * 30, 30, end=NOW + k), NOW + k)
            except CapExceeded:
                refused += 1
        c = s.counts()
        assert c.jobs <= caps["max_jobs"] and c.ranks <= caps["max_ranks"] and c.gpus <= caps["max_gpus"]
        assert c.steps <= caps["max_steps_held"]
    snapshot = s.jobs(NOW + 9)
    entries = sum(len(r.steps) for ranks in snapshot.values() for r in ranks.values())
    assert entries == s.counts().steps <= caps["max_steps_held"]
    assert all(len(r.steps) <= caps["max_steps_per_rank"] for ranks in snapshot.values() for r in ranks.values())
    assert refused > 0 and sum(s.counts().refused.values()) == refused


# ----- RankStore: expiry and snapshots -----------------------------------------------------------
def test_silent_ranks_then_empty_jobs_and_unused_gpus_expire() -> None:
    s = store(expire_after_s=900)
    s.add(info("a", 0, gpu=0), steps(0, 3), NOW)
    s.add(info("a", 1, gpu=1), steps(0, 3), NOW + 600)
    s.add(info("b", 0, gpu=1), steps(0, 3), NOW + 600)
    c = s.expire(NOW + 901)
    assert (c.jobs, c.ranks, c.gpus, c.steps) == (2, 2, 1, 0)  # steps of the live ranks left the window
    assert c.expired == {"jobs": 0, "ranks": 1, "gpus": 1}
    c = s.expire(NOW + 1501)
    assert (c.jobs, c.ranks, c.gpus) == (0, 0, 0)
    assert c.expired == {"jobs": 2, "ranks": 3, "gpus": 2}
    assert s.jobs(NOW + 1501) == {}


def test_snapshots_are_immutable_and_reused_until_a_rank_changes() -> None:
    s = store()
    s.add(info(rank=0), steps(0, 3), NOW)
    s.add(info(rank=1), steps(0, 3), NOW)
    first = s.jobs(NOW)
    assert isinstance(first, MappingProxyType) and isinstance(first["job"], MappingProxyType)
    with pytest.raises(TypeError):
        first["job"][0] = None  # type: ignore[index]
    s.add(info(rank=1), steps(3, 1), NOW + 1)
    second = s.jobs(NOW + 1)
    assert second["job"][0] is first["job"][0]  # unchanged rank: the same object, no copy
    assert len(second["job"][1].steps) == 4 and len(first["job"][1].steps) == 3


def test_concurrent_pushes_and_snapshots_stay_consistent() -> None:
    s = store(max_steps_per_rank=50, max_steps_held=10_000)
    errors: list[BaseException] = []

    def pusher(rank: int) -> None:
        try:
            for k in range(200):
                s.add(info(rank=rank), steps(k * 5, 5, end=NOW), NOW)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    def reader() -> None:
        try:
            for _ in range(200):
                for ranks in s.jobs(NOW).values():
                    for window in ranks.values():
                        numbers = [r.step for r in window.steps]
                        assert numbers == sorted(numbers) and len(numbers) <= 50
                s.expire(NOW)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=pusher, args=(r,)) for r in range(4)] + [threading.Thread(target=reader)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    c = s.counts()
    assert c.ranks == 4 and c.steps == 200 and c.steps_accepted == 4 * 1000


def test_from_config_takes_the_limits() -> None:
    from gpumond.config.rules import RulesConfig

    config = RulesConfig.model_validate({"window_s": 60, "limits": {"max_jobs": 3, "max_steps_held": 99}})
    s = RankStore.from_config(config)
    assert s.window_s == 60 and s.limits == {"jobs": 3, "ranks": 65536, "gpus": 65536, "steps": 99}
    g = GpuStore.from_config(config)
    assert g.window_s == 60 and g.max_gpus == 65536


# ----- GpuStore ----------------------------------------------------------------------------------
def sample(n: int, t: float, node: str = "node-0") -> GpuSample:
    return GpuSample(uuid(n), node, str(n), t, True, {"power_w": 300.0 + n})


def gpus(**over: float) -> GpuStore:
    kw: dict = dict(window_s=60, expire_after_s=120, max_gpus=4, max_samples=10)
    kw.update(over)
    return GpuStore(**kw)


def test_gpu_windows_in_time_order_and_since() -> None:
    g = gpus()
    for k in range(5):
        g.add(TelemetryBatch(NOW + k * 5, gpus=(sample(0, NOW + k * 5), sample(1, NOW + k * 5)),
                             hosts=(HostSample("node-0", NOW + k * 5, {"cpu_iowait": 0.1}),)))
    assert [s.t for s in g.window(uuid(0), NOW + 10)] == [NOW + 10, NOW + 15, NOW + 20]
    assert len(g.window(uuid(1), 0)) == 5
    assert g.window(uuid(3), 0) == ()
    assert [h.t for h in g.hosts("node-0", NOW + 15)] == [NOW + 15, NOW + 20]
    assert g.uuids() == {uuid(0), uuid(1)}


def test_gpu_windows_are_bounded_in_time_and_count() -> None:
    g = gpus(window_s=30, max_samples=4)
    for k in range(20):
        g.add(TelemetryBatch(NOW + k, gpus=(sample(0, NOW + k),)))
    assert [s.t for s in g.window(uuid(0), 0)] == [NOW + 16, NOW + 17, NOW + 18, NOW + 19]
    g2 = gpus(window_s=30, max_samples=100)
    for k in range(0, 100, 10):
        g2.add(TelemetryBatch(NOW + k, gpus=(sample(0, NOW + k),)))
    assert [s.t - NOW for s in g2.window(uuid(0), 0)] == [60, 70, 80, 90]


def test_a_late_sample_does_not_break_time_order() -> None:
    g = gpus()
    g.add(TelemetryBatch(NOW, gpus=(sample(0, NOW),)))
    g.add(TelemetryBatch(NOW, gpus=(sample(0, NOW - 3),)))
    assert [s.t for s in g.window(uuid(0), 0)] == [NOW]


def test_absent_nodes_come_from_the_latest_fetch() -> None:
    g = gpus()
    g.add(TelemetryBatch(NOW, absent_nodes=frozenset({"node-3"})))
    assert g.absent_nodes() == {"node-3"}
    g.add(TelemetryBatch(NOW + 5))
    assert g.absent_nodes() == frozenset()


def test_new_gpus_past_the_cap_are_refused_and_counted() -> None:
    g = gpus(max_gpus=2)
    for k in range(10):
        g.add(TelemetryBatch(NOW + k, gpus=tuple(sample(n, NOW + k) for n in range(20)),
                             hosts=tuple(HostSample(f"node-{n}", NOW + k) for n in range(5))))
    c = g.counts()
    assert (c.gpus, c.nodes) == (2, 2) and c.samples <= 2 * 10
    assert c.refused_gpus == 10 * 18 and c.refused_nodes == 10 * 3


def test_silent_gpus_and_nodes_expire() -> None:
    g = gpus(window_s=60, expire_after_s=120)
    g.add(TelemetryBatch(NOW, gpus=(sample(0, NOW), sample(1, NOW)), hosts=(HostSample("node-0", NOW),)))
    g.add(TelemetryBatch(NOW + 100, gpus=(sample(1, NOW + 100),)))
    c = g.expire(NOW + 121)
    assert (c.gpus, c.nodes, c.expired_gpus, c.expired_nodes) == (1, 0, 1, 1)
    # Past the window but not yet expired: the newest sample stays, invisible to `since` queries.
    c = g.expire(NOW + 200)
    assert c.gpus == 1 and g.window(uuid(1), NOW + 200 - 60) == ()
    assert g.expire(NOW + 221).gpus == 0


def test_jobs_with_new_steps_are_taken_once_with_when_their_first_new_steps_landed() -> None:
    s = store()
    assert not s.wait_fresh(0.0) and s.take_fresh() == {}
    s.add(info("a"), steps(0, 3, NOW - 2), NOW - 2)
    s.add(info("a", 1, gpu=1), steps(0, 3, NOW - 1), NOW - 1)
    s.add(info("b"), [], NOW)  # a heartbeat: nothing to judge
    s.add(info("a"), steps(0, 3, NOW - 2), NOW)  # duplicates: nothing new
    assert s.wait_fresh(0.0) and s.take_fresh() == {"a": NOW - 2}
    assert not s.wait_fresh(0.0) and s.take_fresh() == {}
    assert s.job_names() == {"a", "b"} and list(s.jobs(NOW, ["b", "gone"])) == ["b"]


def test_a_waiting_judge_wakes_when_steps_land() -> None:
    s = store()
    woke = []
    t = threading.Thread(target=lambda: woke.append(s.wait_fresh(10.0)))
    t.start()
    s.add(info("a"), steps(0, 1), NOW)
    t.join(10.0)
    assert woke == [True]
