"""Detectors on literal windows: the planted entity is found with the right class; clean groups are quiet."""

from gpumond.rules.detectors.config import DetectorConfig
from gpumond.rules.detectors.engine import DetectorState, EvalInputs, evaluate
from gpumond.rules.detectors.stats import robust_z, threshold_for
from gpumond.rules.findings import FINDINGS_PERSISTENCE, Persistence, advance
from gpumond.rules.detectors.candidate import Candidate
from gpumond.rules.types import GpuSample, HostSample, RankInfo, RankWindow, StepRecord
from tests.unit.detector_inputs import NOW, build, job as share_job

CFG = DetectorConfig()


def kinds(cands):
    return sorted((c.kind, c.rank, c.node) for c in cands)


def run(inputs, state=None):
    return evaluate(inputs, state or DetectorState(), CFG)


def test_robust_z_floors_quantised_signals_and_threshold_rises_with_n():
    zs, med, scale = robust_z([1.0] * 7 + [1.001], floor=0.01)
    assert med == 1.0 and scale == 0.01 and abs(zs[-1] - 0.1) < 1e-9
    assert threshold_for(8) < threshold_for(512) < threshold_for(8192) < threshold_for(131072)
    assert threshold_for(1) == float("inf")


def test_clean_job_is_quiet():
    assert run(build())[1] == []


def test_thermally_throttled_gpu_is_a_straggler_with_evidence():
    _, c = run(build(gpu={5: {"sm_clock_hz": 1.3e9, "throttle_hw_thermal": 1.0, "temperature_c": 90.0}}))
    assert kinds(c) == [("straggler", 5, "node-0")]
    ev = c[0].evidence
    assert ev["signals"]["sm_clock_ratio"]["value"] < 0.7 and "hw_thermal" in ev["throttle_reasons"]
    assert c[0].gpu_uuid == "GPU-0005"


def test_silently_slow_gpu_stands_out_on_power():
    _, c = run(build(gpu={12: {"power_w": 680.0}}))
    assert kinds(c) == [("straggler", 12, "node-1")]
    assert "power_ratio" in c[0].evidence["signals"]


def test_a_node_whose_gpus_deviate_together_is_a_straggler_node():
    slow = {r: {"sm_clock_hz": 1.5e9} for r in range(16, 24)}
    _, c = run(build(gpu=slow))
    assert ("straggler_node", None, "node-2") in kinds(c)


def test_pipeline_stages_are_compared_only_within_their_group():
    # A small stage (4 of 48 ranks, one GPU on each of 4 nodes) draws more power by design. Few enough that,
    # compared with the whole job, its ranks would be outliers rather than a shift (≤ max_outlier_frac), and
    # spread over nodes so no node deviates as a whole: only the job's groups keep them from being stragglers.
    stage1 = {5, 13, 21, 29}
    heavy = {r: {"power_w": 690.0} for r in stage1}
    _, ungrouped = run(build(nodes=6, gpu=heavy))
    assert sorted(x.rank for x in ungrouped if x.kind == "straggler") == sorted(stage1)  # the case has teeth
    _, c = run(build(nodes=6, gpu=heavy, group=lambda r: "stage-1" if r in stage1 else "stage-0"))
    assert c == []
    # Within its group a stage is still compared: one of its GPUs drawing more again is a straggler.
    heavy[13] = {"power_w": 760.0}
    _, c = run(build(nodes=6, gpu=heavy, group=lambda r: "stage-1" if r in stage1 else "stage-0"))
    assert kinds(c) == [("straggler", 13, "node-1")]


def test_a_group_wide_shift_without_stage_labels_is_not_reported_as_many_stragglers():
    shifted = {r: {"power_w": 690.0} for r in range(0, 32, 2)}  # every other rank, all nodes
    _, c = run(build(gpu=shifted))
    assert [x for x in c if x.kind == "straggler"] == []


def test_lost_gpus_and_absent_nodes_are_never_stragglers():
    inputs = build(gpu={3: {"sm_clock_hz": 1.0e9}})
    gw = dict(inputs.gpu_windows)
    gw["GPU-0003"] = tuple(GpuSample(s.uuid, s.node, s.gpu, s.t, False, {}) for s in gw["GPU-0003"])
    assert run(EvalInputs(inputs.now, inputs.jobs, gw, inputs.host_windows))[1] == []
    inputs = build(gpu={3: {"sm_clock_hz": 1.0e9}})
    absent = EvalInputs(inputs.now, inputs.jobs, inputs.gpu_windows, inputs.host_windows, frozenset({"node-0"}))
    assert run(absent)[1] == []


def test_starved_rank_with_storage_evidence():
    _, c = run(build(wait={9: 0.25}, gpu={9: {"utilization": 0.6, "power_w": 400.0}},
                     host={"node-1": {"cpu_iowait": 0.4}}))
    starved = [x for x in c if x.kind == "io_starved_rank"]
    assert [(x.rank, x.node) for x in starved] == [(9, "node-1")]
    assert starved[0].evidence["likely_cause"].startswith("storage")
    assert abs(starved[0].evidence["data_wait_frac"] - 0.25) < 0.005
    assert [x for x in c if x.kind == "straggler"] == []  # its low power is explained by the starvation


def test_starved_rank_cpu_bound():
    _, c = run(build(wait={2: 0.1}, host={"node-0": {"cpu_utilization": 0.97}}))
    starved = [x for x in c if x.kind == "io_starved_rank"]
    assert len(starved) == 1 and starved[0].evidence["likely_cause"].startswith("cpu")


def test_small_data_wait_is_not_a_finding():
    assert [x for x in run(build(wait={4: 0.02}))[1] if x.kind.startswith("io_")] == []


def test_a_healthy_job_whose_ranks_wait_about_5_percent_on_data_is_not_starved():
    # The reported page: median_data_wait_frac=0.0498. Five per cent of the step is the cost of an ordinary
    # loader, not a pipeline to fix; the job finding needs its wait to cost at least job_min_cost_frac.
    waits = {r: 0.0498 + 0.004 * ((r % 5) - 2) for r in range(32)}
    assert [x for x in run(build(wait=waits))[1] if x.kind.startswith("io_")] == []
    waits = {r: 0.12 + 0.004 * ((r % 5) - 2) for r in range(32)}
    (job,) = [x for x in run(build(wait=waits))[1] if x.kind.startswith("io_")]
    assert job.kind == "io_starved_job" and job.evidence["min_cost_frac"] == CFG.job_min_cost_frac


def test_whole_job_starved_is_one_job_finding_not_many_rank_findings():
    _, c = run(build(wait={r: 0.2 + 0.01 * (r % 3) for r in range(32)}))
    assert [x.kind for x in c if x.kind.startswith("io_")] == ["io_starved_job"]


def io(cands):
    return sorted((c.kind, c.rank) for c in cands if c.kind.startswith("io_"))


def test_an_outlier_rank_inside_a_starved_job_is_named_with_the_job():
    # Every rank waits ~12 % on data (the job's pipeline) and rank 7's own loader makes it wait 60 %:
    # the operator needs both facts. Before, the job branch returned before any rank was judged.
    waits = {r: 0.12 + 0.004 * ((r % 5) - 2) for r in range(32)}
    waits[7] = 0.6
    c = run(build(wait=waits))[1]
    assert io(c) == [("io_starved_job", None), ("io_starved_rank", 7)]
    (job,) = [x for x in c if x.kind == "io_starved_job"]
    assert job.evidence["outlier_ranks"] == [7] and job.evidence["ranks"] == 31


def test_the_outlier_alone_when_the_other_ranks_wait_only_a_little():
    # The reported run: three ranks wait ~5.6 % (a busy machine), one most of its step.
    waits = {0: 0.055, 1: 0.7, 2: 0.056, 3: 0.058}
    assert io(run(build(nodes=1, gpus_per_node=4, wait=waits))[1]) == [("io_starved_rank", 1)]


def test_an_outlier_does_not_make_a_job_starved_that_is_not():
    # Counted with the others, rank 3 would make three of four ranks wait ≥ 5 % at a median of 8 %: the job's
    # other ranks, judged without it, wait less than the job finding's cost line.
    waits = {0: 0.03, 1: 0.07, 2: 0.09, 3: 0.6}
    assert io(run(build(nodes=1, gpus_per_node=4, wait=waits))[1]) == [("io_starved_rank", 3)]


def test_inside_a_starved_job_a_rank_waiting_less_than_twice_the_median_is_the_pipelines_spread():
    # A z-score alone would name it (the others sit within ±0.8 %); the ratio keeps the shared pipeline's
    # spread (each loader draining at its own pace) from naming ranks.
    waits = {r: 0.2 + 0.004 * ((r % 5) - 2) for r in range(32)}
    waits[11] = 0.35
    assert io(run(build(wait=waits))[1]) == [("io_starved_job", None)]
    waits[11] = 0.45
    assert io(run(build(wait=waits))[1]) == [("io_starved_job", None), ("io_starved_rank", 11)]


def test_in_a_two_rank_job_the_rank_whose_wait_dwarfs_the_others_is_named_not_the_pipeline():
    # Of two ranks, one is half the job: set against the job's median (which it makes), a rank waiting 97 % never
    # waited twice it, and the job was called starved. Against the other rank's wait it is the rank's loader.
    two = dict(nodes=1, gpus_per_node=2)
    assert io(run(build(**two, wait={0: 0.97, 1: 0.01}))[1]) == [("io_starved_rank", 0)]
    assert io(run(build(**two, wait={0: 0.01, 1: 0.6}))[1]) == [("io_starved_rank", 1)]
    # Both wait as a rule, within the pipeline's spread of each other: the job's pipeline.
    assert io(run(build(**two, wait={0: 0.3, 1: 0.45}))[1]) == [("io_starved_job", None)]
    # Three ranks: the same rule, the starved one against the median of the other two; the job is then judged on
    # those two, one of which waits 30 %: both facts.
    assert io(run(build(nodes=1, gpus_per_node=3, wait={0: 0.02, 1: 0.9, 2: 0.3}))[1]) == [
        ("io_starved_job", None), ("io_starved_rank", 1)]


def test_a_one_rank_job_has_no_peers_to_tell_its_loader_from_its_pipeline():
    assert io(run(build(nodes=1, gpus_per_node=1, wait={0: 0.97}))[1]) == []


def test_job_slowdown_against_its_own_baseline():
    state, c = run(build(step_s=1.0))
    assert c == [] and state.baselines["job-a"].step_time_s > 0.9
    state, c = run(build(step_s=1.3, seed=2), state)
    assert [x.kind for x in c] == ["job_slowdown"] and c[0].score > 1.2


def test_a_job_whose_first_seconds_ran_faster_than_its_steady_pace_is_not_a_slowdown():
    # A fault-free DDP job on a loaded host once went pending as job_slowdown (1.106). The baseline was
    # learnt at the first evaluation that held 10 steps, a few seconds of the job's start, which ran faster
    # than what followed. It is now learnt from a full minute of the job's steps.
    def job(t_end, start=NOW - 200):
        ranks = {}
        for rank in range(8):
            t, k, recs = start, 0, []
            while True:
                d = 0.1 if t - start < 8 else 0.115  # 8 s of fast start, then the steady pace
                if t + d > t_end:
                    break
                t += d
                recs.append(StepRecord(k, t, d * (1 + 0.002 * (rank % 3)), 0.001))
                k += 1
            ranks[rank] = RankWindow(RankInfo("job-a", rank, 8, f"node-{rank // 4}", f"GPU-{rank:04d}"),
                                     tuple(r for r in recs if r.end >= t_end - 300), t_end)
        return EvalInputs(t_end, {"job-a": ranks})
    state, seen = DetectorState(), []
    for t in range(10, 150, 10):
        state, c = evaluate(job(NOW - 200 + t), state, CFG)
        seen += [x.kind for x in c]
    assert seen == [] and abs(state.baselines["job-a"].step_time_s - 0.115) < 0.002


def test_hang_localised_to_the_idle_rank_and_silent_when_the_job_ended():
    state, _ = run(build())
    # Hung: no step for 60 s, but the processes live (the SDK's heartbeats keep coming).
    hung = build(stop_at=NOW - 60, gpu={7: {"utilization": 0.0, "power_w": 90.0}}, beat=NOW - 3)
    _, c = run(hung, state)
    assert [(x.kind, x.rank) for x in c] == [("hung_rank", 7)] and c[0].evidence["alive"] == "heartbeat"
    ended = build(stop_at=NOW - 60, gpu={r: {"utilization": 0.0} for r in range(32)}, beat=NOW - 3)
    assert run(ended, state)[1] == []


def test_a_job_that_stopped_pushing_is_not_hung_unless_its_processes_still_hold_the_gpus():
    # The reported false page: the job ended (or crashed: no close()), its GPUs still read busy (another
    # tenant, or a slow utilization counter), and no step came for 60 s. Nothing says a process lives: no page.
    state, _ = run(build())
    busy = {7: {"utilization": 0.0, "power_w": 90.0}}
    assert run(build(stop_at=NOW - 60, gpu=busy), state)[1] == []
    # A heartbeat from before the last step, or one too old, is no evidence of life now.
    assert run(build(stop_at=NOW - 60, gpu=busy, beat=NOW - 70), state)[1] == []
    assert run(build(stop_at=NOW - 60, gpu=busy, beat=NOW - CFG.hang_alive_s - 1), state)[1] == []
    # The agents' gpumond_gpu_job_info says the job's processes still hold its GPUs: an old SDK without
    # heartbeats, hung, still pages.
    _, c = run(build(stop_at=NOW - 60, gpu=busy, gpu_jobs=("job-a",)), state)
    assert [(x.kind, x.rank) for x in c] == [("hung_rank", 7)] and c[0].evidence["alive"] == "gpu_processes"
    assert run(build(stop_at=NOW - 60, gpu=busy, gpu_jobs=("another-job",)), state)[1] == []


def test_a_job_a_rank_said_is_ending_is_never_hung():
    state, _ = run(build())
    ending = build(stop_at=NOW - 60, gpu={7: {"utilization": 0.0, "power_w": 90.0}}, beat=NOW - 3, ended={3})
    assert run(ending, state)[1] == []


def test_persistence_k_of_n_then_resolve_after_quiet():
    c = Candidate("straggler", "j", "n", 1, "GPU-1", 5.0)
    tracks, f, _ = advance(None, [c], 0.0)
    assert [x.state for x in f] == ["pending"]
    tracks, f, _ = advance(tracks, [], 10.0)
    tracks, f, _ = advance(tracks, [c], 20.0)
    assert [x.state for x in f] == ["firing"] and f[0].since == 0.0
    for t in (30.0, 40.0):
        tracks, f, resolved = advance(tracks, [], t)
        assert resolved == []
    tracks, f, resolved = advance(tracks, [], 50.0)
    assert f == [] and [x.kind for x in resolved] == ["straggler"]


def test_persistence_is_wall_time_whatever_the_evaluation_interval():
    # Evaluating every second, a candidate seen for 5 s (a transient) stays pending and goes away when its look
    # (half of findings.min_duration_s: 10 s) ends; one that holds for findings.min_duration_s (20 s by
    # default) fires then, not at the second evaluation.
    c = Candidate("straggler", "j", "n", 1, "GPU-1", 5.0)
    tracks = None
    for t in range(6):
        tracks, f, _ = advance(tracks, [c], float(t))
        assert [x.state for x in f] == ["pending"]
    for t in range(6, 10):
        tracks, f, _ = advance(tracks, [], float(t))
        assert [x.state for x in f] == ["pending"]  # still inside the look that saw it
    tracks, f, _ = advance(tracks, [], FINDINGS_PERSISTENCE.look_s)
    assert f == []
    tracks, states = None, []
    for t in range(22):
        tracks, f, _ = advance(tracks, [c], 100.0 + t)
        states.append(f[0].state)
    assert states.index("firing") == FINDINGS_PERSISTENCE.min_s == 20


def test_a_single_blip_never_fires():
    c = Candidate("straggler", "j", "n", 1, "GPU-1", 5.0)
    tracks, _, _ = advance(None, [c], 0.0, Persistence(k=2, n=3))
    for t in (10.0, 20.0, 30.0):
        tracks, f, resolved = advance(tracks, [], t)
        assert all(x.state == "pending" for x in f) and resolved == []
    assert not tracks.alerts


def test_a_corroborated_candidate_fires_at_once_and_a_pending_one_fires_when_corroborated():
    strong = Candidate("straggler", "j", "n", 1, "GPU-1", 9.0, corroborated=True)
    _, f, _ = advance(None, [strong], 0.0)
    assert [x.state for x in f] == ["firing"]
    weak = Candidate("straggler", "j", "n", 2, "GPU-2", 5.0)
    tracks, f, _ = advance(None, [weak], 0.0)
    assert [x.state for x in f] == ["pending"]
    _, f, _ = advance(tracks, [Candidate("straggler", "j", "n", 2, "GPU-2", 9.0, corroborated=True)], 10.0)
    assert [x.state for x in f] == ["firing"] and f[0].since == 0.0


def test_stragglers_are_corroborated_only_by_pushes_and_telemetry_together():
    # compute share alone (pushes) or clock alone (telemetry): not corroborated; both: corroborated
    share_only = share_job(NOW, compute=lambda r, k: 0.8 * (1.3 if r == 5 else 1.0))
    (c,) = run(share_only)[1]
    assert c.rank == 5 and not c.corroborated
    clock_only = build(gpu={5: {"sm_clock_hz": 1.3e9}})
    (c,) = run(clock_only)[1]
    assert c.rank == 5 and not c.corroborated
    both = EvalInputs(share_only.now, share_only.jobs, {
        u: tuple(GpuSample(s.uuid, s.node, s.gpu, s.t, s.up, {**s.values, "sm_clock_hz": 1.3e9} if u == "GPU-0005"
                           else s.values) for s in w)
        for u, w in share_only.gpu_windows.items()})
    (c,) = run(both)[1]
    assert c.rank == 5 and c.corroborated and {"compute_share", "sm_clock_ratio"} <= set(c.evidence["signals"])
    # power agrees with compute share on workload too (heavier batches): not corroboration
    busy = EvalInputs(share_only.now, share_only.jobs, {
        u: tuple(GpuSample(s.uuid, s.node, s.gpu, s.t, s.up, {**s.values, "power_w": 690.0} if u == "GPU-0005"
                           else s.values) for s in w)
        for u, w in share_only.gpu_windows.items()})
    (c,) = run(busy)[1]
    assert c.rank == 5 and not c.corroborated and {"compute_share", "power_ratio"} <= set(c.evidence["signals"])


def _with_gpu(inputs, uuids, **values):
    """`inputs` with these GPUs' samples changed to `values`."""
    return EvalInputs(inputs.now, inputs.jobs, {
        u: tuple(GpuSample(s.uuid, s.node, s.gpu, s.t, s.up, {**s.values, **values} if u in uuids else s.values)
                 for s in w) for u, w in inputs.gpu_windows.items()})


def test_a_throttled_gpu_fires_on_a_few_slow_steps_where_a_silent_one_waits_out_the_transient_minimum():
    # Rank 5 has computed 1.3× for its last four 1 s steps (3 s from the end of the first to the newest), well
    # under the 10 s minimum that keeps a healthy rank's transient from firing; a throttle reason on its own GPU
    # says it is no workload transient, so its sequential evidence needs only seq_short_s.
    slow = share_job(NOW, compute=lambda r, k: 0.8 * (1.3 if r == 5 and k >= 116 else 1.0))
    assert [c for c in run(slow)[1] if c.rank == 5] == []  # silent: not yet
    (c,) = run(_with_gpu(slow, {"GPU-0005"}, throttle_hw_thermal=1.0))[1]
    assert c.rank == 5 and c.sustained and c.evidence["signals"]["sequential"]["steps"] >= CFG.seq_min_steps
    assert "throttled" in c.evidence["signals"]


def _with_newest(inputs, uuids, k, **values):
    """`inputs` with the newest `k` samples of these GPUs changed to `values`."""
    return EvalInputs(inputs.now, inputs.jobs, {
        u: tuple(GpuSample(s.uuid, s.node, s.gpu, s.t, s.up, {**s.values, **values} if u in uuids and i >= len(w) - k
                           else s.values) for i, s in enumerate(w)) for u, w in inputs.gpu_windows.items()})


def test_a_gpu_throttled_in_its_newest_two_samples_fires_on_a_few_slow_steps():
    # The same four 1.3× steps; the GPU shows a throttle reason only in its two newest samples, far from the 30 % of
    # the window the `throttled` signal needs: a cause on the GPU now, seen while the run lasts.
    slow = share_job(NOW, compute=lambda r, k: 0.8 * (1.3 if r == 5 and k >= 116 else 1.0))
    (c,) = run(_with_newest(slow, {"GPU-0005"}, 2, throttle_hw_slowdown=1.0))[1]
    assert c.rank == 5 and c.sustained and "throttled" not in c.evidence["signals"]
    assert c.evidence["signals"]["sequential"]["gpu_cause"] == ["hw_slowdown"]
    # One sample is not enough: a brief bit in one sample beside a transient is no cause.
    assert [c for c in run(_with_newest(slow, {"GPU-0005"}, 1, throttle_hw_slowdown=1.0))[1] if c.rank == 5] == []
    # Half the group throttled at once is the room, not the GPU.
    half = {f"GPU-{r:04d}" for r in range(0, 32, 2)} | {"GPU-0005"}
    assert [c for c in run(_with_newest(slow, half, 2, throttle_hw_slowdown=1.0))[1] if c.rank == 5] == []


def test_a_gpu_throttled_only_before_its_slow_run_gives_it_no_cause():
    # Throttled in two samples that ended before the slow steps began: no cause seen during the run.
    slow = share_job(NOW, compute=lambda r, k: 0.8 * (1.3 if r == 5 and k >= 116 else 1.0))
    window = slow.gpu_windows["GPU-0005"]
    newest = window[-1].t
    before = EvalInputs(slow.now, slow.jobs, {**slow.gpu_windows, "GPU-0005": tuple(
        GpuSample(s.uuid, s.node, s.gpu, s.t - (newest - (NOW - 30.0)), s.up,
                  {**s.values, "throttle_hw_slowdown": float(i >= len(window) - 2)}) for i, s in enumerate(window))})
    assert [c for c in run(before)[1] if c.rank == 5] == []


def test_a_node_fires_at_once_when_its_gpus_with_sequential_evidence_alone_make_it():
    # Six of node 1's GPUs compute 2× for the last six steps; a seventh shows a low clock on telemetry but no
    # slow step yet: six of eight GPUs with sequential evidence are the node already, and the seventh, flagged
    # on a windowed check, does not hold it back to the windowed checks' persistence.
    slow = share_job(NOW, compute=lambda r, k: 0.8 * (2.0 if 8 <= r < 14 and k >= 114 else 1.0))
    cands = run(_with_gpu(slow, {"GPU-0014"}, sm_clock_hz=1.3e9))[1]
    assert "sequential" not in [c for c in cands if c.rank == 14][0].evidence["signals"]
    (node,) = [c for c in cands if c.kind == "straggler_node"]
    assert node.node == "node-1" and node.sustained
    flagged = {c.rank: c for c in cands if c.kind == "straggler"}
    assert set(range(8, 14)) <= set(flagged) and all(flagged[r].sustained for r in range(8, 14))


def test_a_starved_rank_in_a_calm_job_is_named_on_sequential_evidence_and_fires_at_once():
    (c,) = [x for x in run(build(wait={5: 0.5}))[1] if x.kind.startswith("io_")]
    assert (c.kind, c.rank, c.sustained) == ("io_starved_rank", 5, True)
    assert c.evidence["sequential"]["steps"] >= CFG.seq_min_steps and abs(c.evidence["data_wait_frac"] - 0.5) < 0.01


def test_inside_a_job_that_waits_as_a_rule_the_outlier_is_named_on_sequential_evidence_and_fires_at_once():
    # Each step is judged against its peers' wait in units of that step's spread, whatever the job's
    # own level (in steps whose median rank waits, past seq_wait_busy_ref units), so the outlier no longer waits
    # for a minute of window medians; the job finding is still reported beside it.
    waits = {r: 0.12 + 0.004 * ((r % 5) - 2) for r in range(32)}
    waits[7] = 0.6
    cands = run(build(wait=waits))[1]
    (c,) = [x for x in cands if x.kind == "io_starved_rank"]
    assert c.rank == 7 and c.sustained and c.evidence["sequential"]["steps"] >= CFG.seq_min_steps
    assert c.evidence["peer_median_data_wait_frac"] > CFG.wait_min_frac
    assert [x.kind for x in cands if x.kind == "io_starved_job"] == ["io_starved_job"]


def test_median_without_one_value_is_the_median_of_the_rest() -> None:
    from hypothesis import given
    from hypothesis import strategies as st

    from gpumond.rules.detectors.stats import median, median_without

    @given(st.lists(st.floats(0, 1), min_size=1, max_size=40), st.data())
    def check(values: list[float], data: st.DataObject) -> None:
        drop = data.draw(st.sampled_from(values))
        rest = list(values)
        rest.remove(drop)
        assert median_without(sorted(values), drop) == (median(rest) if rest else None)

    check()
