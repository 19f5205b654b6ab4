"""A synthetic job's windows for the detectors (every rank, GPU and node), tweakable per rank, GPU and node."""

import random

from gpumond.rules.detectors.engine import EvalInputs
from gpumond.rules.types import GpuSample, HostSample, RankInfo, RankWindow, StepRecord

NOW = 10_000.0


def build(nodes=4, gpus_per_node=8, step_s=1.0, wait=None, gpu=None, host=None, stop_at=None, seed=1,
          group=None, beat=None, ended=(), gpu_jobs=()):
    """A synchronous job: every rank ends step k at the same time; per-rank waits and per-GPU values tweakable."""
    rnd = random.Random(seed)
    wait = wait or {}
    gpu = gpu or {}
    host = host or {}
    jobs, gwin, hwin = {}, {}, {}
    ranks = {}
    n = nodes * gpus_per_node
    end_last = stop_at if stop_at is not None else NOW
    steps = [(k, end_last - (60 - k) * step_s) for k in range(60)]
    for rank in range(n):
        node = f"node-{rank // gpus_per_node}"
        uuid = f"GPU-{rank:04d}"
        info = RankInfo("job-a", rank, n, node, uuid, group(rank) if group else None)
        w = wait.get(rank, 0.002)
        recs = tuple(StepRecord(k, t, step_s * (1 + rnd.uniform(-0.01, 0.01)), w * step_s) for k, t in steps)
        ranks[rank] = RankWindow(info, recs, end_last, last_beat=beat, ended=rank in ended)
        base = {"sm_clock_hz": 1.98e9 * (1 - rnd.uniform(0, 0.004)), "sm_clock_max_hz": 1.98e9,
                "power_w": 620 + rnd.uniform(-6, 6), "power_limit_w": 700.0, "utilization": 0.99,
                "temperature_c": 70 + rnd.uniform(-2, 2), "throttle_hw_thermal": 0.0, "throttle_sw_thermal": 0.0,
                "throttle_hw_slowdown": 0.0, "throttle_hw_power_brake": 0.0}
        base.update(gpu.get(rank, {}))
        gwin[uuid] = tuple(GpuSample(uuid, node, str(rank % gpus_per_node), NOW - 55 + 5 * i, True, dict(base),
                                     jobs=tuple(gpu_jobs)) for i in range(12))
    for i in range(nodes):
        vals = {"cpu_utilization": 0.3, "cpu_iowait": 0.01, "disk_read_bytes_total": 1e9}
        vals.update(host.get(f"node-{i}", {}))
        hwin[f"node-{i}"] = tuple(HostSample(f"node-{i}", NOW - 55 + 5 * k, vals) for k in range(12))
    jobs["job-a"] = ranks
    return EvalInputs(NOW, jobs, gwin, hwin)
