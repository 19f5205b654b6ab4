"""Synthetic jobs' windows for the detectors: `build` (every rank, GPU and node, tweakable per rank, GPU and node)
and `job` (per-step compute and data waits, for the compute-share tests)."""

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


def job(now, nodes=4, compute=None, wait=None, comm=True, power=None, seed=1, steps=120):
    """A synchronous job with 1 s steps ending at `now`: rank r computes `compute(r, k)` seconds of step k
    (default 0.8 ± 3 %), waits `wait(r)` on data first, then waits for the slowest in the collective."""
    rnd = random.Random(seed)
    n = nodes * 8
    compute = compute or (lambda r, k: 0.8)
    wait = wait or (lambda r: 0.002)
    busy = {}
    for k in range(steps):
        busy[k] = [wait(r) + compute(r, k) * (1 + rnd.uniform(-0.03, 0.03)) for r in range(n)]
    ranks, gwin = {}, {}
    for r in range(n):
        node, uuid = f"node-{r // 8}", f"GPU-{r:04d}"
        recs = []
        for k in range(steps):
            dur = max(busy[k]) + 0.1
            end = now - (steps - 1 - k) * 1.0
            recs.append(StepRecord(k, end, dur, wait(r), None, dur - busy[k][r] if comm else None))
        ranks[r] = RankWindow(RankInfo("job-a", r, n, node, uuid), tuple(recs), now)
        vals = {"sm_clock_hz": 1.98e9, "sm_clock_max_hz": 1.98e9, "power_limit_w": 700.0, "utilization": 0.99,
                "temperature_c": 70 + rnd.uniform(-1, 1), "throttle_hw_thermal": 0.0, "throttle_sw_thermal": 0.0,
                "throttle_hw_slowdown": 0.0, "throttle_hw_power_brake": 0.0}
        gwin[uuid] = tuple(GpuSample(uuid, node, str(r % 8), now - 55 + 5 * i, True,
                                     {**vals, "power_w": (power or (lambda r: 600.0))(r) + rnd.uniform(-5, 5)})
                           for i in range(12))
    return EvalInputs(now, {"job-a": ranks}, gwin)
