"""The detection benchmark's cluster simulator: barrier semantics, the signal shapes the detectors rely on,
missing telemetry, and the scorer's matching rules on literal episodes."""

import numpy as np

from benchmarks.detection.cluster import IDLE_CLOCK_HZ, Cluster, JobSpec
from benchmarks.detection.faults import Fault
from benchmarks.detection.noise import SM_CLOCK_MAX_HZ, Noise
from benchmarks.detection.scenarios import T0, Scenario
from benchmarks.detection.score import Episode, expand, label
from gpumond.rules.detectors.features import gpu_features, rank_features

QUIET = Noise(ckpt_every_s=0.0, sample_miss_p=0.0, node_miss_p=0.0)


def sim(faults=(), nodes=2, noise=QUIET, until=150.0, seed=3, **job):
    c = Cluster([JobSpec("job-0", nodes, **job)], faults, noise, seed=seed, t0=T0)
    c.advance_to(T0 + until)
    return c, c.inputs(T0 + until)


def gpu(inputs, rank, since=60.0):
    w = inputs.jobs["job-0"][rank]
    return gpu_features(w.info.gpu_uuid, [s for s in inputs.gpu_windows[w.info.gpu_uuid] if s.t >= inputs.now - since])


def test_barrier_every_rank_reports_the_slowest_ranks_step_time():
    slow = Fault("slow_gpu", "job-0", T0, 1e6, rank=5, slowdown=1.5)
    starved = Fault("starved_rank", "job-0", T0, 1e6, rank=9, wait_frac=0.3)
    _, inp = sim([slow, starved])
    by_step: dict[int, list[float]] = {}
    for w in inp.jobs["job-0"].values():
        for s in w.steps:
            by_step.setdefault(s.step, []).append(s.duration_s)
    full = [d for d in by_step.values() if len(d) == 16]
    assert len(full) > 30
    assert max(max(d) - min(d) for d in full) < 0.005  # equal up to the hosts' timer noise
    waits = {r: rank_features(w, inp.now - 60).wait_frac for r, w in inp.jobs["job-0"].items()}
    assert abs(waits[9] - 0.3) < 0.05 and max(v for r, v in waits.items() if r != 9) < 0.01


def test_step_time_is_set_by_the_slowest_rank():
    _, clean = sim()
    _, slow = sim([Fault("slow_gpu", "job-0", T0, 1e6, rank=3, slowdown=1.5)])
    t0 = rank_features(clean.jobs["job-0"][0], clean.now - 60).step_time_s
    t1 = rank_features(slow.jobs["job-0"][0], slow.now - 60).step_time_s
    assert 1.25 < t1 / t0 < 1.5  # the slow rank's compute sets the step, communication does not slow


def test_starved_rank_idles_while_peers_spin():
    _, inp = sim([Fault("starved_rank", "job-0", T0, 1e6, rank=2, wait_frac=0.4, cause="storage")], step_s=4.0)
    def mean(rank, key):
        uuid = inp.jobs["job-0"][rank].info.gpu_uuid
        return float(np.mean([s.values[key] for s in inp.gpu_windows[uuid]]))

    assert mean(2, "utilization") < 0.75 and mean(3, "utilization") > 0.97  # NCCL spinning reads as busy
    assert mean(2, "power_w") < mean(3, "power_w") - 50
    host = inp.host_windows["node-00000"][-1].values
    assert host["cpu_iowait"] >= 0.2 and inp.host_windows["node-00001"][-1].values["cpu_iowait"] < 0.1


def test_throttled_gpu_shows_low_clock_reason_and_heat_silent_one_does_not():
    thr = Fault("slow_gpu", "job-0", T0, 1e6, rank=1, slowdown=1.5, visible=True, reason="hw_thermal")
    sil = Fault("slow_gpu", "job-0", T0, 1e6, rank=10, slowdown=1.5)
    _, inp = sim([thr, sil])
    t, s, peer = gpu(inp, 1), gpu(inp, 10), gpu(inp, 11)
    assert abs(t.clock_ratio - 1 / 1.5) < 0.02 and t.throttle_frac >= 0.8 and "hw_thermal" in t.throttle_reasons
    assert t.temperature_c > peer.temperature_c + 5
    assert s.clock_ratio > 0.98 and s.throttle_frac == 0.0


def test_hung_rank_goes_idle_while_peers_spin_and_no_step_ends():
    hang = Fault("hung_rank", "job-0", T0 + 60, 1e6, rank=6)
    _, inp = sim([hang], until=120.0)
    last = max(s.end for w in inp.jobs["job-0"].values() for s in w.steps)
    assert last < T0 + 66
    me, peer = gpu(inp, 6, since=40), gpu(inp, 7, since=40)
    assert me.utilization == 0.0 and me.power_ratio < 0.2 and me.clock_ratio == IDLE_CLOCK_HZ / SM_CLOCK_MAX_HZ
    assert peer.utilization > 0.97 and 0.4 < peer.power_ratio < 0.6


def test_checkpoint_stall_stops_every_rank_together():
    c, inp = sim(noise=QUIET.with_(ckpt_every_s=100.0, ckpt_s=(40.0, 40.0)), until=300.0)
    ends = sorted({round(s.end, 1) for s in inp.jobs["job-0"][0].steps})
    assert max(np.diff(ends)) > 40.0


def test_missing_telemetry_fraction():
    c, inp = sim(noise=QUIET.with_(sample_miss_p=0.05), nodes=8, until=400.0)
    since = inp.now - 60.0
    got = sum(len(v) for v in inp.gpu_windows.values())
    expected = sum(1 for _ in range(64) for k in range(20) if c.next_scrape - 5.0 * (k + 1) >= since)
    assert 0.90 < got / expected < 0.99


def test_silicon_variation_spreads_power_a_few_percent():
    c, _ = sim(nodes=64, until=10.0)
    assert 0.008 < float(np.std(c.pf)) < 0.015 and float(np.abs(c.pf - 1).max()) <= 0.03 + 1e-9


def _sc(*faults, first_node=0):
    return Scenario("t", "fault", (JobSpec("job-0", 4, first_node=first_node),), faults, QUIET, 0, 600.0)


def test_matching_rules():
    node = Fault("slow_node", "job-0", T0 + 100, 300, node="node-00002", slowdown=1.3)
    sc = _sc(node)
    truths = expand(sc)
    eps = [Episode("straggler", "job-0", "node-00002", 17, "GPU-00002-1", T0 + 150, T0 + 130),
           Episode("straggler_node", "job-0", "node-00002", None, None, T0 + 150, T0 + 130),
           Episode("straggler", "job-0", "node-00001", 9, "GPU-00001-1", T0 + 150, T0 + 130),
           Episode("straggler_node", "job-0", "node-00002", None, None, T0 + 50, T0 + 40)]  # before onset
    label(sc, truths, eps)
    assert [e.label for e in eps] == ["neutral", "tp", "fp", "fp"]
    assert truths[0].detected and truths[0].latency_s == 50.0


def test_starved_node_is_eight_truths_and_unlocalised_hang_is_reported_apart():
    sc = _sc(Fault("starved_node", "job-0", T0 + 100, 300, node="node-00001", wait_frac=0.2))
    truths = expand(sc)
    assert [t.rank for t in truths] == list(range(8, 16)) and {t.cls for t in truths} == {"starved_rank"}
    hang = _sc(Fault("hung_rank", "job-0", T0 + 100, 600, rank=3))
    truths = expand(hang)
    eps = [Episode("hung_rank", "job-0", None, None, None, T0 + 130, T0 + 120)]
    label(hang, truths, eps)
    assert eps[0].label == "unlocalised" and truths[0].unlocalised and not truths[0].detected


def test_ranks_push_every_5_s_and_at_once_after_a_step_that_stands_out():
    # A 2.0× rank from T0 + 100 s on 1 s steps: every rank's step lengthens, so every rank pushes at that step's end
    # (the SDK's rule, gpumond.job.early), and its steps reach the service within a second; without early pushes
    # they wait for each rank's next regular push (up to 5 s).
    slow = Fault("slow_gpu", "job-0", T0 + 100.0, 1e6, rank=3, slowdown=2.0)
    for early in (True, False):
        c = Cluster([JobSpec("job-0", 2, step_s=1.0)], [slow], QUIET, seed=4, t0=T0, early_push=early)
        c.advance_to(T0 + 90.0)
        job = c.jobs[0]
        assert job.early_pushes == 0  # healthy steps never stand out
        regular = job.regular_pushes
        assert 16 * 17 <= regular <= 16 * 19  # 90 s / 5 s per rank
        c.advance_to(T0 + 104.0)
        lag = [T0 + 104.0 - w.steps[-1].end for w in c.inputs(T0 + 104.0).jobs["job-0"].values()]
        if early:
            assert job.early_pushes >= 16 and max(lag) < 2.0
        else:
            assert job.early_pushes == 0 and max(lag) > 2.0


def test_an_early_push_leaves_each_ranks_regular_cadence_at_its_phase():
    # As the SDK (early.regular_after_early): the whole job pushes early after the same long step; restarting the
    # cadence there would line every rank up into one burst each 5 s. Each rank's regular beats stay on its phase.
    slow = Fault("slow_gpu", "job-0", T0 + 100.0, 1e6, rank=3, slowdown=2.0)
    c = Cluster([JobSpec("job-0", 2, step_s=1.0)], [slow], QUIET, seed=4, t0=T0, early_push=True)
    c.advance_to(T0 + 130.0)
    job = c.jobs[0]
    assert job.early_pushes >= 16
    beats = (job.regular - (T0 + job.push_phase)) / c.push_s
    assert np.allclose(beats, np.round(beats))
    assert np.ptp(job.regular % c.push_s) > 0.5 * c.push_s  # still spread over the interval


def test_a_hung_jobs_ranks_keep_their_heartbeats():
    hang = Fault("hung_rank", "job-0", T0 + 60.0, 1e6, rank=2)
    c = Cluster([JobSpec("job-0", 2, step_s=1.0)], [hang], QUIET, seed=4, t0=T0)
    c.advance_to(T0 + 200.0)
    beats = [w.last_beat for w in c.inputs(T0 + 200.0).jobs["job-0"].values()]
    assert min(beats) > T0 + 195.0  # every 5 s, long after the last step ended


def test_ranks_keep_pushing_through_a_long_step():
    # A 40 s checkpoint: no step ends inside it, but each rank's push thread still pushes (heartbeats) every 5 s.
    # An evaluation inside it sees every rank's beat of the last 5 s, not the last one before the checkpoint.
    c = Cluster([JobSpec("job-0", 2, step_s=1.0)], [], QUIET.with_(ckpt_every_s=100.0, ckpt_s=(40.0, 40.0)),
                seed=4, t0=T0)
    c.advance_to(T0 + 300.0)
    job = c.jobs[0]
    gaps = np.diff(job.ends)
    k = int(np.argmax(gaps))
    assert gaps[k] > 35.0
    mid = job.ends[k] + 0.5 * gaps[k]
    beats = [w.last_beat for w in c.inputs(mid).jobs["job-0"].values()]
    assert min(beats) > mid - c.push_s and max(beats) <= mid
