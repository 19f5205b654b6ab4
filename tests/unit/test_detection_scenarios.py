"""Small seeded versions of the detection benchmark's scenarios, through the rules service's own detectors
(`evaluate` + `advance` with the default persistence): the planted entity is found with the right class,
and nothing fires in the clean and negative-control runs.

Tests marked xfail(strict=True) document a gap the benchmark measured in today's detectors (see
benchmarks/results/detection.md and docs/detection-benchmark.md, "What to change"); strict, so the day a
detector change fixes one, the test fails until its mark is removed.
"""

import pytest

from benchmarks.detection.cluster import JobSpec
from benchmarks.detection.faults import Fault
from benchmarks.detection.noise import Noise
from benchmarks.detection.scenarios import CONTROLS, T0, Scenario
from benchmarks.detection.score import run

ONSET = T0 + 125.0
NODES = 4


def scenario(fault=None, seed=1, duration=300.0, noise=Noise(), **job):
    spec = JobSpec("job-0", NODES, step_s=job.pop("step_s", 1.0), **job)
    return Scenario("test", "fault" if fault else "control", (spec,), (fault,) if fault else (), noise, seed,
                    duration, eval_phase=3.0)


def found(fault, seed=1, **kw):
    """The scored run of one planted fault."""
    res = run(scenario(fault, seed, duration=kw.pop("duration", 270.0), **kw))
    return res, res.truths


def firing(res):
    return sorted((e.kind, e.rank, e.node) for e in res.episodes)


def test_slow_gpu_throttled_1_5_is_a_straggler_on_that_rank():
    f = Fault("slow_gpu", "job-0", ONSET, 3600, rank=13, slowdown=1.5, visible=True, reason="hw_thermal")
    res, (tr,) = found(f)
    assert tr.detected and tr.predicted == "straggler" and tr.latency_s <= 60
    ep = next(e for e in res.episodes if e.label == "tp")
    assert ep.rank == 13 and "hw_thermal" in ep.evidence["throttle_reasons"]


def test_slow_gpu_silent_1_25_is_a_straggler_on_that_rank():
    f = Fault("slow_gpu", "job-0", ONSET, 3600, rank=21, slowdown=1.25)
    _, (tr,) = found(f)
    assert tr.detected and tr.predicted == "straggler"


def test_slow_gpu_silent_1_10_is_found_from_its_compute_share():
    f = Fault("slow_gpu", "job-0", ONSET, 3600, rank=9, slowdown=1.10)
    res, (tr,) = found(f, duration=330.0)
    assert tr.detected and tr.predicted == "straggler"
    ep = next(e for e in res.episodes if e.label == "tp")
    assert "compute_share" in ep.evidence["signals"]


def test_without_comm_waits_a_silent_1_10_straggler_is_missed_but_a_throttled_one_is_found():
    # An SDK that times no collective: only GPU telemetry can localise, and a silent 1.10x hides in it.
    silent = Fault("slow_gpu", "job-0", ONSET, 3600, rank=9, slowdown=1.10)
    res = run(scenario(silent, 1, duration=330.0), comm_wait=False)
    assert not res.truths[0].detected and [e for e in res.episodes if e.label == "fp"] == []
    throttled = Fault("slow_gpu", "job-0", ONSET, 3600, rank=13, slowdown=1.5, visible=True, reason="hw_thermal")
    res = run(scenario(throttled, 1, duration=270.0), comm_wait=False)
    assert res.truths[0].detected and res.truths[0].predicted == "straggler"


def test_slow_node_is_a_straggler_node():
    f = Fault("slow_node", "job-0", ONSET, 3600, node="node-00002", slowdown=1.25, visible=True,
              reason="hw_power_brake")
    res, (tr,) = found(f)
    assert tr.detected and tr.predicted == "straggler_node"
    assert all(e.node == "node-00002" for e in res.episodes if e.label in ("tp", "neutral"))


def test_starved_rank_20_percent_with_storage_cause():
    f = Fault("starved_rank", "job-0", ONSET, 3600, rank=6, node="node-00000", wait_frac=0.2, cause="storage")
    res, (tr,) = found(f)
    assert tr.detected and tr.predicted == "starved_rank" and tr.cause == "storage"
    assert not tr.job_finding
    assert [e for e in res.episodes if e.kind.startswith("io_") and e.label != "tp"] == []


def test_starved_job_is_one_job_finding():
    f = Fault("starved_job", "job-0", ONSET, 3600, wait_frac=0.2, cause="remote")
    res, (tr,) = found(f)
    assert tr.detected and tr.predicted == "starved_job" and not tr.rank_finding
    assert [e.kind for e in res.episodes if e.kind.startswith("io_")] == ["io_starved_job"]


def test_a_starved_rank_inside_a_job_whose_loaders_all_wait_is_named():
    # Every loader waits ~20 %, rank 9's 50 % (the others still ~13 % of the step it lengthens, a
    # starved job). Before, the job's branch returned first: the rank
    # was named only until the job's other ranks crossed into waiting.
    f = Fault("starved_outlier", "job-0", ONSET, 3600, rank=9, node="node-00001", wait_frac=0.5, base_wait=0.2,
              cause="storage")
    res, (tr,) = found(f)
    assert tr.detected and tr.predicted == "starved_rank" and tr.cause == "storage"
    assert [e for e in res.episodes if e.kind.startswith("io_") and e.label not in ("tp", "neutral")] == []
    assert tr.job_finding  # both facts: the rest of the job waits too…
    # …and the rank stays named once the job is starved (before, its finding resolved then)
    (rank,) = [e for e in res.episodes if e.kind == "io_starved_rank"]
    assert rank.ended is None


def test_hung_rank_is_localised():
    f = Fault("hung_rank", "job-0", ONSET, 3600, rank=26)
    res, (tr,) = found(f, duration=240.0)
    assert tr.detected and tr.predicted == "hung"
    assert [e.rank for e in res.episodes if e.kind == "hung_rank"] == [26]


def test_rank_waiting_2_percent_is_not_reported():
    f = Fault("starved_sub", "job-0", ONSET, 3600, rank=3, wait_frac=0.02, cause="storage")
    res, _ = found(f)
    assert [e for e in res.episodes if e.kind.startswith("io_")] == []


# Fault-free runs: 8 simulated minutes each. Today's detectors fire on some (see the module docstring).
KNOWN_FALSE: dict[str, str] = {}


def _control(name: str) -> Scenario:
    spec = dict(CONTROLS[name])
    noise = Noise().with_(**spec.pop("noise", {}))
    if name == "checkpoint stalls":
        noise = noise.with_(ckpt_every_s=200.0)
    return scenario(None, seed=2, duration=360.0, noise=noise, **spec)


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=KNOWN_FALSE[n])) if n in KNOWN_FALSE else n
    for n in CONTROLS])
def test_nothing_fires_without_a_fault(name):
    res = run(_control(name))
    assert firing(res) == []


def test_nothing_fires_on_a_clean_16_node_job_with_2_s_steps():
    # Was a known gap (median power aliasing with the 5 s scrape); power now comes from the energy counter.
    spec = JobSpec("job-0", 16, step_s=2.0)
    res = run(Scenario("clean-16", "control", (spec,), (), Noise(), 7, 300.0, eval_phase=3.0))
    assert firing(res) == []


def test_the_fault_free_bound_is_the_poisson_upper_bound():
    # one-sided 95 %: −ln 0.05 for no event (the "3 / exposure" rule), then the tabulated 4.74 and 6.30
    from benchmarks.detection.fault_free import poisson_upper

    assert [round(poisson_upper(k), 2) for k in (0, 1, 2)] == [3.0, 4.74, 6.3]
