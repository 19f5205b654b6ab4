"""Offline experiment: would a per-rank "time waiting in the step's collectives" signal localise silent
stragglers that GPU telemetry cannot? (Not a gpumond detector: the job SDK does not push this today.)

    python -m benchmarks.detection.collective_wait

For each slowdown, 6 seeds of a 32-node job with one silent slow GPU from t = 60 s; every 10 s from
t = 120 s to 400 s the median over the last 60 s of each rank's spin share of the step (from the
simulator's own timelines) is compared across ranks with the detectors' robust z (floor 0.004) and
group-size threshold. Prints how often the slow rank, and any healthy rank, passes the threshold.
"""

from __future__ import annotations

import numpy as np

from gpumond.rules.detectors.stats import robust_z, threshold_for

from benchmarks.detection.cluster import Cluster, JobSpec
from benchmarks.detection.faults import Fault
from benchmarks.detection.noise import Noise
from benchmarks.detection.scenarios import T0

RANK = 37


def run(slowdown: float, seeds: int = 6, nodes: int = 32) -> tuple[float, float, float]:
    """(share of evaluations the slow rank is flagged, share with any healthy rank flagged, healthy max |z|)."""
    thr = threshold_for(nodes * 8)
    hit, false, worst = [], [], 0.0
    for seed in range(seeds):
        faults = [Fault("slow_gpu", "job-0", T0 + 60, 1e6, rank=RANK, slowdown=slowdown)] if slowdown > 1 else []
        c = Cluster([JobSpec("job-0", nodes, step_s=(1.0, 2.0, 4.0)[seed % 3])], faults, Noise(), seed=seed)
        spin: dict[float, tuple[float, np.ndarray]] = {}
        for t in np.arange(T0 + 1, T0 + 400, 1.0):
            c.advance_to(float(t))
            for st in c.jobs[0].recent:
                spin[st.start] = (st.end, (st.bounds[2] - st.bounds[1]) / (st.end - st.start))
            if (t - T0) % 10 == 0 and t >= T0 + 120:
                med = np.median(np.array([v for end, v in spin.values() if t - 60 <= end <= t]), axis=0)
                z = np.array(robust_z(list(med), 0.004)[0])
                healthy = np.abs(np.delete(z, RANK))
                hit.append(-z[RANK] > thr)
                false.append(bool((healthy > thr).any()))
                worst = max(worst, float(healthy.max()))
    return float(np.mean(hit)), float(np.mean(false)), worst


def main() -> None:
    print(f"threshold at 256 GPUs: {threshold_for(256):.2f}")
    for s in (1.0, 1.03, 1.05, 1.10, 1.25):
        h, f, w = run(s)
        print(f"slowdown {s:.2f}: slow rank flagged in {h:.0%} of evaluations; a healthy rank in {f:.0%} "
              f"(healthy max |z| {w:.2f})")


if __name__ == "__main__":
    main()
