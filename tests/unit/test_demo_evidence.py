"""The demo's evidence wording: the fields that matter per kind, whole, in words; a cause never reads as a miss."""

import pytest

from gpumond.demo.evidence import describe

STRAGGLER = {"group": None, "peers": 32, "threshold_z": 4.5, "throttle_reasons": ["sw_thermal"],
             "signals": {"compute_share": {"value": 0.7604, "peer_median": 0.65, "z": 22.06, "look": "short"},
                         "sm_clock_ratio": {"value": 0.81, "peer_median": 1.0, "z": -19.2},
                         "power_ratio": {"value": 3.68, "peer_median": 3.84, "z": -11.0}}}

IO_RANK = {"group": None, "data_wait_frac": 0.3498, "peer_median_data_wait_frac": 0.0, "gpu_utilization": 0.63,
           "gpu_power_ratio": 0.76, "host_cpu_utilization": 0.23, "host_cpu_iowait": 0.001,
           "likely_cause": "unknown (host CPU and iowait normal: check the loader, network storage, or sharding)"}


def test_straggler_says_each_signal_against_its_peers_in_words():
    lines = describe("straggler", STRAGGLER, "demo-node-01")
    assert "computes 76 % of each step vs 65 % for its peers, who wait for it (over its last few steps; z 22.1)" \
        in lines
    assert "SM clock at 81 % of its maximum vs 100 % for its peers (z -19.2)" in lines
    assert "throttle reasons: sw_thermal" in lines
    assert any(line.startswith("power at 368 %") for line in lines)


def test_power_ratios_are_left_out_when_asked():
    assert not any("power" in line for line in describe("straggler", STRAGGLER, power=False))
    assert describe("io_starved_rank", IO_RANK, "n2", power=False)[1] == "its GPU: utilization 63 %"


def test_io_starved_rank_with_normal_host_reads_as_what_was_ruled_out_not_as_unknown():
    lines = describe("io_starved_rank", IO_RANK, "demo-node-02")
    assert lines[0] == "waits on its data loader 35 % of each step vs 0 % for its peers"
    assert lines[1] == "its GPU: utilization 63 %, power 76 % of its limit"
    assert lines[2] == ("likely cause: not CPU or disk contention on the host (demo-node-02: CPU 23 % busy, "
                        "iowait 0 %); look at the loader itself, network storage or sharding")
    assert not any("unknown" in line for line in lines)


@pytest.mark.parametrize(("cause", "expected"), [
    ("storage (host iowait high)", "likely cause: storage — the host waits on disk (n2: CPU 23 % busy, iowait 0 %)"
                                   " — in this demo every node reports this machine's real CPU and iowait"),
    ("cpu (host CPU saturated)", "likely cause: CPU — the host is saturated (n2: CPU 23 % busy, iowait 0 %)"
                                 " — in this demo every node reports this machine's real CPU and iowait"),
])
def test_a_host_cause_says_the_host_numbers_and_that_they_are_this_machines(cause, expected):
    assert describe("io_starved_rank", {**IO_RANK, "likely_cause": cause}, "n2")[-1] == expected


def test_no_host_evidence_says_so():
    ev = {k: v for k, v in IO_RANK.items() if not k.startswith("host_")}
    ev["likely_cause"] = "unknown (no host evidence)"
    assert describe("io_starved_rank", ev, "n2")[-1] == \
        "likely cause: not known — the agent on n2 reports no host CPU or iowait"


def test_job_level_kinds():
    assert describe("job_slowdown", {"step_time_s": 0.3858, "baseline_step_time_s": 0.2528, "slowdown": 1.526}) == (
        "step time 0.386 s vs its own baseline 0.253 s (1.53×)",)
    assert describe("io_starved_job", {"median_data_wait_frac": 0.3, "ranks_starved": 30, "ranks": 32,
                                       "nodes": ["a", "b"]}) == (
        "30 of 32 ranks wait on data (median 30 % of each step): the data pipeline cannot keep up", "nodes: a, b")
    assert describe("hung_rank", {"stalled_for_s": 31.2, "limit_s": 10, "localised": False}) == (
        "no step for 31 s (limit 10 s)", "no single rank stands out")
    assert describe("straggler_node", {"gpus_flagged": 5, "gpus_on_node": 8, "ranks": [8, 9]}) == (
        "5 of its 8 GPUs are slower than their peers (ranks 8, 9)",)


def test_an_unknown_kind_shows_every_field_whole():
    long = "x" * 300
    assert describe("new_kind", {"a": 1, "b": long}) == ("a: 1", f"b: {long}")


def test_nvlink_as_the_cause_of_a_straggler_node_and_sm_activity_of_a_straggler_in_words():
    node = describe("straggler_node", {"gpus_flagged": 8, "gpus_on_node": 8, "likely_cause": "nvlink_errors",
                                       "nvlink_replays_per_s": {"GPU-1": 2000.0, "GPU-2": 1900.0}})
    assert node[-1] == "likely cause: NVLink — replays slow every collective through it (2 GPU(s) replaying)"
    rank = describe("straggler", {"signals": {}, "sm_active": 0.05, "peer_median_sm_active": 0.8})
    assert rank == ("SM activity 5 % vs 80 % for its peers",)


def test_a_share_rounding_to_zero_from_below_reads_as_0_not_minus_0():
    ev = {"signals": {"compute_share": {"value": 0.15, "peer_median": -0.0004, "z": 30.8, "look": "short"}}}
    assert describe("straggler", ev)[0].startswith("computes 15 % of each step vs 0 % for its peers")
