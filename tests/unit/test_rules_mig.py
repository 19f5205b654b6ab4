"""The rules service and MIG: MIG devices become samples with their parent's telemetry (scrape and PromQL),
and ranks are compared only with peers on the same MIG profile."""

from __future__ import annotations

from dataclasses import replace

from prometheus_client.parser import text_string_to_metric_families

from gpumond.rules.detectors.config import DetectorConfig
from gpumond.rules.detectors.engine import DetectorState, EvalInputs, evaluate
from gpumond.rules.telemetry import Row, join, read_agent, signals
from gpumond.rules.telemetry.mig import mig_row
from gpumond.rules.telemetry.promql_join import IDENTITY
from gpumond.rules.types import GpuSample
from gpumond.wire.identity import legacy_mig_uuid
from tests.unit.detector_inputs import build

P0 = "GPU-a8c57d47-7419-54ce-a816-ce1029736ad6"
M0 = "MIG-373a625b-4063-5299-8c5c-731cb05a0928"
M1 = "MIG-70b05682-ec6d-5733-aae5-f24d5fefae48"

EXPOSITION = f"""\
gpumond_gpu_info{{gpu="1",hostname="node-m",name="NVIDIA H100 80GB HBM3",pci_bus_id="00000000:2A:00.0",uuid="{P0}"}} 1
gpumond_gpu_up{{gpu="1",uuid="{P0}"}} 1
gpumond_gpu_temperature_celsius{{gpu="1",uuid="{P0}"}} 71
gpumond_gpu_power_watts{{gpu="1",uuid="{P0}"}} 420.5
gpumond_gpu_job_info{{gpu="1",job="whole-board-job",uuid="{P0}"}} 1
gpumond_gpu_mig_info{{compute_instance="0",gpu="1",gpu_instance="1",mig_uuid="{M0.upper().replace("MIG-", "MIG-")}",profile="3g.40gb",uuid="{P0}"}} 1
gpumond_gpu_mig_info{{compute_instance="0",gpu="1",gpu_instance="2",mig_uuid="{M1}",profile="2g.20gb",uuid="{P0}"}} 1
gpumond_gpu_mig_info{{compute_instance="x",gpu="1",gpu_instance="3",mig_uuid="MIG-bad",profile="1g.10gb",uuid="{P0}"}} 1
gpumond_gpu_job_info{{compute_instance="0",gpu="1",gpu_instance="1",job="k8s-pod/ml/a",mig_uuid="{M0}",namespace="ml",pod="a",container="c",profile="3g.40gb",uuid="{P0}"}} 1
gpumond_gpu_mig_memory_used_bytes{{compute_instance="0",gpu="1",gpu_instance="1",mig_uuid="{M0}",profile="3g.40gb",uuid="{P0}"}} 1e9
"""


def test_scraped_mig_devices_carry_their_parents_telemetry() -> None:
    reading = read_agent(text_string_to_metric_families(EXPOSITION), t=5.0, fallback_node="x")
    by_uuid = {g.uuid: g for g in reading.gpus}
    assert list(by_uuid) == [P0, M0, M1]  # the malformed mig_info row is dropped
    parent, m0, m1 = by_uuid[P0], by_uuid[M0], by_uuid[M1]
    assert parent.jobs == ("whole-board-job",) and parent.parent_uuid is None  # a slice's job stays its own
    assert (m0.parent_uuid, m0.mig_profile, m0.gpu_instance, m0.compute_instance) == (P0, "3g.40gb", 1, 0)
    assert (m0.node, m0.gpu, m0.t, m0.up) == ("node-m", "1", 5.0, True)
    assert dict(m0.values) == dict(parent.values) == {"temperature_c": 71.0, "power_w": 420.5}
    assert m0.jobs == ("k8s-pod/ml/a",) and m1.jobs == () and m1.mig_profile == "2g.20gb"


def test_promql_join_makes_the_same_mig_samples() -> None:
    target = {"job": "gpumond", "instance": "node-m:9480", "hostname": "node-m"}
    gpu = {**target, "gpu": "1", "uuid": P0}
    mig = {**gpu, "gpu_instance": "1", "compute_instance": "0", "mig_uuid": M0, "profile": "3g.40gb"}
    j = join({IDENTITY: [Row(gpu, 1.0)], signals.GPU_UP: [Row(gpu, 1.0)],
              "gpumond_gpu_power_watts": [Row(gpu, 420.5)],
              signals.MIG_INFO: [Row(mig, 1.0), Row({**mig, "instance": "dup:9480"}, 1.0)],
              signals.JOB_INFO: [Row({**mig, "job": "k8s-pod/ml/a"}, 1.0), Row({**gpu, "job": "whole"}, 1.0)]},
             t=9.0)
    assert [(g.uuid, g.parent_uuid, g.mig_profile, dict(g.values), g.jobs) for g in j.gpus] == [
        (P0, None, None, {"power_w": 420.5}, ("whole",)),
        (M0, P0, "3g.40gb", {"power_w": 420.5}, ("k8s-pod/ml/a",)),
    ]


def test_legacy_names_and_bad_rows() -> None:
    assert legacy_mig_uuid(P0.upper().replace("GPU-", "GPU-"), 3, 0) == f"MIG-{P0}/3/0"
    assert mig_row({"uuid": P0, "mig_uuid": M0, "gpu_instance": "1", "compute_instance": "0"}).profile == ""
    assert mig_row({"uuid": P0, "mig_uuid": M0, "gpu_instance": "", "compute_instance": "0"}) is None
    assert mig_row({"uuid": "0", "mig_uuid": M0, "gpu_instance": "1", "compute_instance": "0"}) is None


def on_mig(inputs: EvalInputs, profile_of: dict[int, str]) -> EvalInputs:
    """The same job with each rank on a MIG slice of the given profile (its samples say so, as the agent does)."""
    ranks = inputs.jobs["job-a"]
    jobs, windows = {}, {}
    for rank, w in ranks.items():
        uuid = f"MIG-{rank:08x}-0000-4000-8000-000000000000"
        jobs[rank] = replace(w, info=replace(w.info, gpu_uuid=uuid))
        windows[uuid] = tuple(replace(s, uuid=uuid, parent_uuid=w.info.gpu_uuid, mig_profile=profile_of[rank],
                                      gpu_instance=1, compute_instance=0)
                              for s in inputs.gpu_windows[w.info.gpu_uuid])
    return replace(inputs, jobs={"job-a": jobs}, gpu_windows=windows)


def test_ranks_are_compared_only_with_peers_on_the_same_profile() -> None:
    # 30 ranks on 3g.40gb slices and 2 on 1g.10gb slices, whose boards draw far less power: not stragglers.
    small = {7: {"power_w": 300.0}, 23: {"power_w": 305.0}}
    profile = {r: "1g.10gb" if r in small else "3g.40gb" for r in range(32)}
    inputs = on_mig(build(gpu=small), profile)
    assert evaluate(inputs, DetectorState(), DetectorConfig())[1] == []
    # The same values with every rank on one profile: those two are what a straggler looks like.
    same = on_mig(build(gpu=small), {r: "3g.40gb" for r in range(32)})
    assert sorted(c.rank for c in evaluate(same, DetectorState(), DetectorConfig())[1] if c.kind == "straggler") \
        == [7, 23]


def test_a_straggler_among_its_profile_peers_is_still_found_and_says_its_profile() -> None:
    hot = {5: {"sm_clock_hz": 1.3e9, "throttle_hw_thermal": 1.0, "temperature_c": 90.0}}
    profile = {r: "1g.10gb" if r >= 28 else "3g.40gb" for r in range(32)}
    _, found = evaluate(on_mig(build(gpu=hot), profile), DetectorState(), DetectorConfig())
    assert [(c.kind, c.rank) for c in found] == [("straggler", 5)]
    assert found[0].evidence["mig_profile"] == "3g.40gb" and found[0].evidence["peers"] == 28


def test_a_mig_rank_without_telemetry_yet_is_not_a_peer_of_whole_gpus() -> None:
    inputs = build(gpu={3: {"power_w": 300.0}})
    w = inputs.jobs["job-a"][3]
    mig = "MIG-00000003-0000-4000-8000-000000000000"
    jobs = {**inputs.jobs["job-a"], 3: replace(w, info=replace(w.info, gpu_uuid=mig))}
    windows = {**inputs.gpu_windows, mig: inputs.gpu_windows[w.info.gpu_uuid]}  # no profile in its samples
    _, found = evaluate(replace(inputs, jobs={"job-a": jobs}, gpu_windows=windows), DetectorState(),
                        DetectorConfig())
    assert found == []
    assert isinstance(windows[mig][0], GpuSample) and windows[mig][0].mig_profile is None
