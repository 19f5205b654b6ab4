"""False findings per job-day at fleet scale: fault-free jobs of 1,024 nodes through the service's detectors.

    python -m benchmarks.detection.fault_free [--quick] [--hours H] [--procs P] [--nodes N] [--segment-s S]
                                              [--no-early-push]

The simulated hours are cut into independent segments (a fresh job and seed each: the jobs are independent,
so their exposures add), run P at a time, each evaluated at the service's interval with the default
persistence, as in run.py. Exposure counts only a segment's time after its warm-up (the job's first two
minutes, while its baseline is learnt and some checks are not yet armed); false findings count whenever they
fire. With k false findings in E job-days the one-sided 95 % upper bound on the rate is the Poisson bound
(3 / E for k = 0). Writes benchmarks/results/detection_fault_free.md (…_no_early_push.md with
--no-early-push; …_quick.md for --quick).
"""

from __future__ import annotations

import math
import multiprocessing as mp
import time
from collections import Counter

from benchmarks import _bench
from benchmarks.detection.scenarios import EVAL_S, WARMUP_S, big_control
from benchmarks.detection.score import ON_STEPS_S, RunResult, run


def poisson_upper(k: int, confidence: float = 0.95) -> float:
    """The one-sided upper confidence bound on a Poisson mean after observing k events (−ln 0.05 ≈ 3 for 0)."""
    def cdf(mu: float) -> float:
        term = total = math.exp(-mu)
        for i in range(1, k + 1):
            term *= mu / i
            total += term
        return total

    lo, hi = 0.0, 10.0 + 10.0 * k
    for _ in range(100):  # cdf falls in mu: bisect for cdf(mu) = 1 − confidence
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) > 1 - confidence else (lo, mid)
    return hi


def _one(args: tuple[int, int, float, bool]) -> RunResult:
    seed, nodes, seconds, early = args
    return run(big_control(seed, nodes, seconds), early_push=early)


def main() -> int:
    ap = _bench.parser(__doc__, "16-node jobs, 2 segments of 4 minutes")
    ap.add_argument("--hours", type=float, default=1.0, help="simulated hours of fault-free jobs (default 1)")
    ap.add_argument("--procs", type=int, default=2, help="segments run at a time (default 2)")
    ap.add_argument("--nodes", type=int, default=1024, help="nodes per job (default 1,024)")
    ap.add_argument("--segment-s", type=float, default=1800.0, help="simulated seconds per segment (default 1800)")
    ap.add_argument("--no-early-push", action="store_true",
                    help="ranks push only every 5 s (an SDK with push_early=False), not also after a step that "
                         "stands out")
    a = ap.parse_args()
    if a.quick:
        a.hours, a.nodes, a.segment_s = 480.0 / 3600.0, 16, 240.0
    segments = max(1, math.ceil(a.hours * 3600.0 / a.segment_s))
    # Seeds apart from run.py's controls; the same with and without early pushes, so the two runs compare.
    plan = [(1000 + i, a.nodes, a.segment_s, not a.no_early_push) for i in range(segments)]
    start = time.perf_counter()
    results: list[RunResult] = []
    with mp.get_context("fork").Pool(a.procs) as pool:
        for i, r in enumerate(pool.imap_unordered(_one, plan), 1):
            results.append(r)
            print(f"[{i}/{segments}] seed {r.scenario.seed}: {len(r.episodes)} false", flush=True)
    wall = time.perf_counter() - start
    exposed_h = sum(max(r.scenario.duration_s - WARMUP_S, 0.0) for r in results) / 3600.0
    job_days = exposed_h / 24.0
    kinds = Counter(e.kind for r in results for e in r.episodes)
    k = sum(kinds.values())
    bound = poisson_upper(k) / job_days if job_days else math.nan
    sim_s = sum(r.scenario.duration_s for r in results)
    rows = [(f"{a.nodes:,}", segments, f"{a.segment_s:g} s", f"{exposed_h:.2f}", f"{job_days:.3f}", k,
             ", ".join(f"{kd} {v}" for kd, v in sorted(kinds.items())) or "none",
             f"{k / job_days:.1f}" if job_days else "–", f"{bound:.1f}")]
    speed = sim_s / wall / max(1, min(a.procs, segments))
    need_h = poisson_upper(0) * 24.0  # job-hours for a bound of one per job-day with no event
    run_h = math.ceil(need_h * a.segment_s / max(a.segment_s - WARMUP_S, 1.0))  # …with the segments' warm-ups
    _bench.report(
        "detection_fault_free" + ("_no_early_push" if a.no_early_push else ""),
        "# False findings per job-day, fault-free jobs at fleet scale"
        + (", without early pushes" if a.no_early_push else ""),
        {"scenario": f"`big_control`: one {a.nodes:,}-node job per segment (2 s steps, everyday noise, transient "
                     f"slowdowns at the fleet rate), evaluated every {EVAL_S:g} s"
                     + (f" and as its steps land (at most every {ON_STEPS_S:g} s, judge_on_steps)" if ON_STEPS_S else "")
                     + " with the default persistence",
         "pushes": "every 5 s only (`--no-early-push`: an SDK with push_early=False)" if a.no_early_push
                   else "every 5 s, and at once after a step that stands out (the SDK's default)",
         "wall time": f"{wall:.0f} s on {a.procs} process(es): {speed:.1f} simulated s per second per process"},
        _bench.md_table(("nodes", "segments", "each", "job-hours exposed", "job-days", "false findings", "by kind",
                         "per job-day", "95 % upper bound per job-day"), rows),
        f"Exposure excludes each segment's first {WARMUP_S:g} s (warm-up); a false finding there still counts. "
        f"A bound of one false finding per job-day with none seen needs {need_h:.0f} job-hours of exposure: at "
        f"this speed {run_h / speed:.0f} process-hours "
        f"(e.g. `--hours {run_h:.0f} --procs 16` on 16 cores, warm-ups included: "
        f"{run_h / speed / 16:.1f} h).",
        quick=a.quick)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
