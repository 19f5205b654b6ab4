"""Evaluation time against cluster size: one `evaluate` over a full window, on one core."""

from __future__ import annotations

import cProfile
import gc
import io
import pstats
import statistics
import time

from gpumond.rules.detectors.config import DetectorConfig
from gpumond.rules.detectors.engine import DetectorState, evaluate

from benchmarks.detection.cluster import Cluster, JobSpec
from benchmarks.detection.noise import Noise

JOB_NODES = 1024  # clusters larger than one 8,192-GPU job run several such jobs


def build(gpus: int, seed: int = 0) -> tuple[Cluster, float]:
    """A cluster of `gpus` GPUs run for 310 s, so every rank window holds the service's full 300 s."""
    nodes = gpus // 8
    jobs, first, i = [], 0, 0
    while first < nodes:
        k = min(JOB_NODES, nodes - first)
        jobs.append(JobSpec(f"job-{i}", k, first_node=first, step_s=2.0))
        first, i = first + k, i + 1
    c = Cluster(jobs, (), Noise(), seed=seed)
    now = c.t0 + 310.0
    c.advance_to(now - WARM_S, telemetry_from=now - WARM_S - 70.0)
    return c, now


# Untimed evaluations every 10 s before the timed one, so the detector state is a running job's: the
# baseline learnt and the job's structure too (for `structure_learn_s` after a job is first judged the
# straggler detector compares twice — the whole job, then with its structure split off).
WARM_S = 80.0


def measure(gpus: int, repeats: int = 3, profile: bool = False) -> dict:
    """Median wall time of one evaluation at `gpus` GPUs, in the steady state of a running job."""
    t_build = time.perf_counter()
    c, now = build(gpus)
    state, cfg = DetectorState(), DetectorConfig()
    for t in range(int(WARM_S), 0, -10):
        c.advance_to(now - t)
        state, _ = evaluate(c.inputs(now - t), state, cfg)
    assert all(s.done for s in state.structure.values()), "warm-up shorter than structure learning"
    c.advance_to(now)
    inputs = c.inputs(now)
    t_build = time.perf_counter() - t_build
    steps = sum(len(w.steps) for ranks in inputs.jobs.values() for w in ranks.values())
    samples = sum(len(s) for s in inputs.gpu_windows.values())
    times = []
    gc.collect()
    gc.disable()  # a collection pass over millions of live objects would be timed as the detectors' cost
    try:
        for _ in range(repeats):
            t = time.perf_counter()
            evaluate(inputs, state, DetectorConfig())
            times.append(time.perf_counter() - t)
    finally:
        gc.enable()
    out = {"gpus": gpus, "jobs": len(inputs.jobs), "steps_held": steps, "gpu_samples": samples,
           "eval_s": statistics.median(times), "runs": repeats, "build_s": t_build}
    if profile:
        pr = cProfile.Profile()
        pr.enable()
        evaluate(inputs, state, DetectorConfig())
        pr.disable()
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(12)
        out["profile"] = s.getvalue()
        out["profile_rows"] = _rows(pr)
    return out


def _rows(pr: cProfile.Profile) -> list[tuple[str, int, float, float]]:
    """(function, calls, own s, cumulative s), most own time first."""
    st = pstats.Stats(pr)
    rows = []
    for (file, line, fn), (_cc, nc, tt, ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
        where = file.split("gpumond/")[-1] if "gpumond/" in file else file.rsplit("/", 1)[-1]
        rows.append((f"{where}:{line} {fn}", nc, tt, ct))
    rows.sort(key=lambda r: -r[2])
    return rows[:14]
