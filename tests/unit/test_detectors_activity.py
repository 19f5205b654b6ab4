"""GPM activity and NVLink replays as evidence on findings, and NVLink as the named cause of a straggler node."""

from dataclasses import replace

from gpumond.rules.detectors.activity import NVLINK_CAUSE, replay_rate, with_activity
from gpumond.rules.detectors.candidate import Candidate
from gpumond.rules.detectors.config import DetectorConfig
from gpumond.rules.detectors.engine import DetectorState, evaluate
from gpumond.rules.types import GpuSample
from tests.unit.detector_inputs import build

SLOW_NODE = {r: {"sm_clock_hz": 1.5e9} for r in range(16, 24)}  # node-2's eight GPUs


def _replaying(inputs, ranks, per_s=2000.0):
    """`inputs` with the GPUs of `ranks` replaying on NVLink at `per_s` (a counter rising over the window)."""
    windows = dict(inputs.gpu_windows)
    for rank in ranks:
        uuid = f"GPU-{rank:04d}"
        windows[uuid] = tuple(replace(s, values={**s.values, "nvlink_replays_total": per_s * (s.t - windows[uuid][0].t)})
                              for s in windows[uuid])
    return replace(inputs, gpu_windows=windows)


def _node_finding(inputs):
    _, found = evaluate(inputs, DetectorState(), DetectorConfig())
    (node,) = [c for c in found if c.kind == "straggler_node"]
    return node


def test_a_straggler_node_whose_gpus_replay_on_nvlink_names_nvlink_as_its_likely_cause():
    node = _node_finding(_replaying(build(gpu=SLOW_NODE), [17, 18]))
    assert node.node == "node-2" and node.evidence["likely_cause"] == NVLINK_CAUSE
    assert node.evidence["nvlink_replays_per_s"] == {"GPU-0017": 2000.0, "GPU-0018": 2000.0}


def test_without_replays_or_with_replays_elsewhere_no_cause_is_named():
    assert "likely_cause" not in _node_finding(build(gpu=SLOW_NODE)).evidence
    assert "likely_cause" not in _node_finding(_replaying(build(gpu=SLOW_NODE), [3])).evidence  # node-0
    # A healthy link's rare replays are not a cause.
    assert "likely_cause" not in _node_finding(_replaying(build(gpu=SLOW_NODE), [17], per_s=0.01)).evidence


def test_a_straggler_rank_carries_its_sm_and_tensor_activity_next_to_its_peers():
    gpu = {r: {"sm_active": 0.8, "tensor_active": 0.5} for r in range(32)}
    gpu[5] = {"sm_clock_hz": 1.3e9, "throttle_hw_thermal": 1.0, "temperature_c": 90.0, "sm_active": 0.45,
              "tensor_active": 0.2}
    _, found = evaluate(build(gpu=gpu), DetectorState(), DetectorConfig())
    (c,) = found
    assert (c.kind, c.rank) == ("straggler", 5)
    assert {k: c.evidence[k] for k in ("sm_active", "peer_median_sm_active", "tensor_active",
                                       "peer_median_tensor_active")} == {
        "sm_active": 0.45, "peer_median_sm_active": 0.8, "tensor_active": 0.2, "peer_median_tensor_active": 0.5}


def test_evidence_is_left_alone_without_gpm_or_nvlink_telemetry_and_a_reset_counter_gives_no_rate():
    c = Candidate("straggler", "j", "n", 1, "GPU-1", 3.0, {"signals": {}})
    window = {"GPU-1": (GpuSample("GPU-1", "n", "0", 0.0, True, {"utilization": 0.9}),)}
    assert with_activity(c, window, {"GPU-1": "n"}, since=-1.0) is c
    reset = [GpuSample("GPU-1", "n", "0", t, True, {"nvlink_replays_total": v}) for t, v in ((0.0, 9e6), (5.0, 10.0))]
    assert replay_rate(reset) is None and replay_rate(reset[:1]) is None
