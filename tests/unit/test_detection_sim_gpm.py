"""The detection benchmark's GPM telemetry: SM activity follows compute vs spin, only on nodes with GPM, and
leaves every other draw of the simulation as it was (the with/without comparison is paired)."""

import numpy as np

from benchmarks.detection.cluster import Cluster, JobSpec
from benchmarks.detection.faults import Fault
from benchmarks.detection.noise import Noise
from benchmarks.detection.scenarios import T0

QUIET = Noise(ckpt_every_s=0.0, sample_miss_p=0.0, node_miss_p=0.0)
SLOW = Fault("slow_gpu", "job-0", T0, 1e6, rank=5, slowdown=1.5)  # silent: clock and reasons unchanged


def _run(gpm, faults=(SLOW,), nodes=2, until=150.0):
    c = Cluster([JobSpec("job-0", nodes, step_s=1.0)], faults, QUIET, seed=3, t0=T0, comm_wait=False, gpm=gpm)
    c.advance_to(T0 + until)
    return c.inputs(T0 + until)


def _mean(inputs, rank, key):
    uuid = inputs.jobs["job-0"][rank].info.gpu_uuid
    return float(np.mean([s.values[key] for s in inputs.gpu_windows[uuid] if s.t >= inputs.now - 60]))


def test_the_gpu_that_computes_while_its_peers_spin_reads_higher_sm_activity_at_equal_utilization():
    inp = _run(1.0)
    peers = [r for r in range(8) if r != 5]
    assert abs(_mean(inp, 5, "utilization") - np.mean([_mean(inp, r, "utilization") for r in peers])) < 0.02
    sm_peers = [_mean(inp, r, "sm_active") for r in peers]
    assert _mean(inp, 5, "sm_active") > max(sm_peers) + 0.1
    # Tensor activity moves with compute (no tensor work in a spinning collective).
    assert _mean(inp, 5, "tensor_active") > max(_mean(inp, r, "tensor_active") for r in peers)


def test_gpm_only_on_its_share_of_nodes_and_the_rest_of_the_run_unchanged():
    without, half, full = _run(0.0, nodes=8), _run(0.5, nodes=8), _run(1.0, nodes=8)
    has = lambda inp: {u for u, w in inp.gpu_windows.items() if w and "sm_active" in w[-1].values}  # noqa: E731
    assert has(without) == set() and len(has(full)) == 64
    assert 0 < len(has(half)) < 64 and len(has(half)) % 8 == 0  # whole nodes: a node is one model
    gpm_keys = ("sm_active", "tensor_active")
    strip = lambda inp: {u: [{k: v for k, v in s.values.items() if k not in gpm_keys}  # noqa: E731
                             for s in w] for u, w in inp.gpu_windows.items()}
    assert strip(without) == strip(full)
    assert [w.steps for w in without.jobs["job-0"].values()] == [w.steps for w in full.jobs["job-0"].values()]
