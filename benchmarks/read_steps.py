"""Reading one job's steps for an evaluation (step_matrix.read_steps, the columns path) at 32,768 ranks, by steps held.

Every evaluation reads each job's held steps once: the ends of all of them, the other fields of the recent ones.
What that costs grows with the steps each rank holds (a 300 s window at 2 steps/s is 600 of them), so it is
measured at a short and a long window; then the job's rank features from that read (the medians and trimmed means
over each rank's recent steps, which grow with the recent ones). With `--before DIR` the same reads run from DIR's
gpumond too (e.g. `git archive REV gpumond | tar -x -C DIR`), alternating with this tree's in separate processes: a
before/after in one run.

    python benchmarks/read_steps.py --before /tmp/before     # ~3 min
    python benchmarks/read_steps.py --quick                  # seconds (smoke test)
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench  # noqa: E402

NOW = 1000.0
SINCE = NOW - 60.0  # the detectors' recent window


def measure(ranks: int, per: int, repeats: int) -> dict:
    """Least and median CPU of `repeats` reads of one job of `ranks` ranks holding `per` steps over 300 s each."""
    import numpy as np

    from gpumond.rules.detectors.rank_batch import job_rank_features
    from gpumond.rules.detectors.step_matrix import read_steps
    from gpumond.rules.types import RankInfo, RankWindow, StepColumns

    rng = np.random.default_rng(1)
    ends = NOW - (per - 1 - np.arange(per)) * (300.0 / per)  # oldest first, the newest at NOW
    windows = []
    for r in range(ranks):
        values = np.vstack([ends, rng.uniform(0.4, 0.6, per), rng.uniform(0, 0.05, per), rng.uniform(0, 0.1, per)])
        values.flags.writeable = False
        windows.append(RankWindow(RankInfo("j", r, ranks, f"n{r // 8}", f"G{r}"), (), NOW,
                                  columns=StepColumns(np.arange(per), values)))
    cpu, features = [], []
    by_rank = dict(enumerate(windows))
    for _ in range(repeats):
        t = time.process_time()
        read = read_steps(windows, SINCE)
        cpu.append(time.process_time() - t)
        t = time.process_time()
        job_rank_features(by_rank, SINCE, NOW, steps=read)  # the detectors' first reader of it: medians, shares
        features.append(time.process_time() - t)
    cpu.sort()
    return {"min": cpu[0], "median": cpu[len(cpu) // 2], "features_min": min(features)}


def _run(tree: Path | None, ranks: int, per: int, repeats: int) -> dict:
    """One measurement in a fresh process, importing gpumond from `tree` (None: this checkout)."""
    return _bench.one_in_fresh_process(__file__, tree, ranks, per, repeats)


def main() -> None:
    ap = _bench.parser(__doc__, "256 ranks")
    _bench.before_after_args(ap, "read")
    args = ap.parse_args()
    if args.one:
        print(json.dumps(measure(*args.one)))
        return
    ranks, sizes, repeats = (256, (8, 64), 2) if args.quick else (32_768, (90, 430), 5)
    rounds = 1 if args.quick else args.rounds
    rows = []
    for per in sizes:
        got: dict[str, list[dict]] = {"this tree": [], "before": []}
        for label, tree in _bench.alternating(args, rounds):
            got[label].append(_run(tree, ranks, per, repeats))
            print(f"[{per} steps a rank] {label}: read {got[label][-1]['min']:.3f} s, features "
                  f"{got[label][-1]['features_min']:.3f} s", file=sys.stderr, flush=True)
        row = [f"{ranks:,}", f"{per:,}", f"{ranks * per:,}"]
        for key in ("min", "features_min"):
            now = min(g[key] for g in got["this tree"])
            row.append(f"{now:.3f} s")
            if args.before:
                before = min(g[key] for g in got["before"])
                row += [f"{before:.3f} s", f"{now / before:.2f}"]
        rows.append(row)
    headers = ["ranks", "steps a rank", "steps held",
               *_bench.before_after_headers(args, "CPU per read, this tree (least)"),
               *_bench.before_after_headers(args, "rank features from the read, this tree (least)")]
    text = "\n".join([
        "# Reading a job's steps for one evaluation (step_matrix.read_steps, columns), and its rank features", "",
        _bench.machine_block({"rounds": f"{rounds} alternating, {repeats} reads each (least CPU kept)"}), "",
        _bench.md_table(headers, rows), "",
        "One job's windows as the rank store hands them over (columns), a 300 s window ending now, the recent "
        "window 60 s: the ends of every held step are read, the other fields of the newest fifth. Then the rank "
        "features of the job from that read (rank_batch.job_rank_features: step time, wait and compute-share "
        "medians, the trimmed mean), on step durations and waits that vary from step to step. Each figure is the "
        "least process CPU in a fresh process; the machine is shared, so compare within a row."])
    _bench.write_result("read_steps", text, quick=args.quick)


if __name__ == "__main__":
    main()
