"""The I/O-starvation defaults on the detection benchmark's own simulated cluster: the job finding's threshold
and minimum throughput cost, before and after (before, a healthy job whose ranks wait ~5 % on data paged).

    python -m benchmarks.detection.io_threshold [--seeds K] [--procs P]

Every rank of a job waiting a fraction f of its step on data (`starved_job f`, what a healthy loader's 5 %
looks like at f = 0.05), one starved rank and one starved node at the same levels, through
`gpumond.rules.detectors.engine.evaluate` and the findings lifecycle, with the previous defaults (a job
finding at a median wait of 4 %) and the current `DetectorConfig`. Writes
benchmarks/results/detection_io_threshold.md.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace

from gpumond.rules.detectors.config import DetectorConfig

from benchmarks import _bench
from benchmarks.detection.scenarios import Scenario, fault_scenarios
from benchmarks.detection.score import run

LEVELS = (0.03, 0.05, 0.07, 0.10, 0.20)
NEW = DetectorConfig()
OLD = replace(NEW, job_wait_min_frac=0.04, job_min_cost_frac=0.04)  # before the cost line: wait_min_frac for both


def _one(job: tuple[str, Scenario]) -> tuple[str, str, float, list[tuple[bool, bool, bool, float | None]]]:
    which, sc = job
    res = run(sc, cfg=OLD if which == "previous" else NEW)
    kind, level = sc.name.rsplit(" ", 1)
    return which, kind, float(level.rstrip("%")) / 100, [
        (t.detected, t.job_finding, t.rank_finding, t.latency_s) for t in res.truths]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--nodes", type=int, default=16)
    args = ap.parse_args(argv)
    start = time.perf_counter()
    scs = [sc for s in range(args.seeds) for sc in fault_scenarios(
        s, args.nodes, slowdowns=(), node_slowdowns=(), waits=LEVELS, sub_waits=(), hangs=0)]
    jobs = [(which, sc) for sc in scs for which in ("previous", "current")]
    rows: dict[tuple[str, float, str], list] = defaultdict(list)
    with mp.get_context("fork").Pool(args.procs) as pool:
        for i, (which, kind, level, truths) in enumerate(pool.imap_unordered(_one, jobs), 1):
            rows[(kind, level, which)] += truths
            print(f"[{i}/{len(jobs)}] {which} {kind} {level:.0%}", flush=True)
    table = []
    for kind in ("starved_job", "starved_rank", "starved_node"):
        for level in LEVELS:
            cells = [f"{kind.replace('_', ' ')} {level:.0%}"]
            for which in ("previous", "current"):
                ts = rows[(kind, level, which)]
                if kind == "starved_job":
                    fired = sum(job for _, job, _, _ in ts)
                    ranks = sum(rank for _, _, rank, _ in ts)
                    cells.append(f"{fired}/{len(ts)} `io_starved_job`, {ranks}/{len(ts)} with an `io_starved_rank`")
                else:
                    found = sum(d for d, _, _, _ in ts)
                    wrong = sum(job for _, job, _, _ in ts)
                    cells.append(f"{found}/{len(ts)} found" + (f", {wrong} as a starved job" if wrong else ""))
            table.append(cells)
    text = "\n".join([
        "# I/O-starvation defaults on the detection benchmark", "",
        _bench.machine_block({"scenarios": f"{len(scs)} fault runs × 2 configurations, {args.seeds} seed(s), "
                                           f"{args.nodes} nodes × 8 GPUs per job",
                              "wall time": f"{time.perf_counter() - start:.0f} s on {args.procs} process(es)"}), "",
        "Each run: one job on the benchmark's simulated cluster (`benchmarks/detection/`), evaluated every 10 s by "
        "`gpumond.rules.detectors.engine.evaluate` and the findings lifecycle (2 of 3 evaluations, 10 s), the "
        "fault planted after a 120 s warm-up. `starved job f`: every rank waits f of its step on data, which "
        "at 5 % is what an ordinary, healthy data loader shows (the page a healthy job raised: "
        "`median_data_wait_frac=0.0498`). "
        "A starved rank or node counts as found when `io_starved_rank` names it (a node's 8 ranks each count). "
        "The benchmark counts `starved job` runs as planted faults; at 3–7 % they are the case the new defaults "
        "leave quiet on purpose.", "",
        "- **previous**: `io_starved_job` when half the ranks wait ≥ 4 % and the median wait ≥ 4 % "
        "(`wait_min_frac` for both).",
        f"- **current** (`DetectorConfig` defaults): half the ranks wait ≥ {NEW.job_wait_min_frac:.0%} "
        f"(`job_wait_min_frac`) and the job's median wait, the share of its step time the data pipeline costs, "
        f"is ≥ {NEW.job_min_cost_frac:.0%} (`job_min_cost_frac`); `io_starved_rank` unchanged "
        f"(≥ {NEW.wait_min_frac:.0%} and an outlier among its peers).", "",
        _bench.md_table(("fault", "previous defaults", "current defaults"), table), "",
    ])
    _bench.write_result("detection_io_threshold", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
