"""How long the detection benchmark's transient slowness lasts on one rank, chained: what the sequential test's
minimum duration (`seq_transient_s`) must outlast, and how often shorter minimums would be passed.

    python -m benchmarks.detection.transient_runs [--quick]

The controls plant transient episodes (benchmarks/detection/noise.py `transient_episodes`, as cluster.py
draws them): on each rank at `transient_rate_h` (lognormal, median 0.5 s), on each node's 8 ranks at
`transient_node_rate_h` (median 2 s), each capped at 6 s, at 1.15–1.6×; a new episode replaces the one a rank is
in. Episodes whose gap is under one step leave no ordinary step between them, so to the sequential test they
are one run. Here the episodes of one rank (its own and its node's) are drawn for many rank-hours at the
stress rate (the transient controls) and at the fleet rate (the 1,024-node control), merged into runs with
a gap of one step, and counted by wall length, for runs whose mean factor is 1.25× or more (below it the
minimum duration is longer: docs/detectors.md). The count at length L is how often a run of at least L
would be there for a minimum duration of L to pass: an upper bound on the false findings it allows (a run
must still gather its evidence, 90 % of its steps past the reference, and the one extra step).
Writes benchmarks/results/detection_transient_runs.md.
"""

from __future__ import annotations

import time

import numpy as np

from benchmarks import _bench
from benchmarks.detection.noise import Noise
from benchmarks.detection.scenarios import FLEET_TRANSIENTS, TRANSIENTS

LENGTHS_S = (5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0)
GAPS_S = (1.3, 2.6)  # one synchronous step at 1 s and 2 s of base compute
MARGINAL = 1.25  # seq_marginal_factor: the band [1.25, 1.8) waits seq_transient_s
# The exposures the counts are scaled to: the benchmark's two transient controls (16 nodes, 15 min, 3 seeds)…
CONTROL_RANK_H = 2 * 3 * 128 * 0.25
# …and one job-day of a 1,024-node job.
JOB_DAY_RANK_H = 1024 * 8 * 24.0


def runs(rng: np.random.Generator, noise: Noise, hours: float, gap_s: float) -> tuple[np.ndarray, np.ndarray]:
    """Wall lengths and mean factors of one rank's merged transient runs over `hours`."""
    t = hours * 3600.0
    k_rank = rng.poisson(noise.transient_rate_h * hours)
    k_node = rng.poisson(noise.transient_node_rate_h * hours)
    start = np.concatenate([rng.uniform(0.0, t, k_rank), rng.uniform(0.0, t, k_node)])
    dur = np.minimum(np.concatenate([noise.transient_median_s * rng.lognormal(0.0, noise.transient_sigma, k_rank),
                                     noise.transient_node_median_s * rng.lognormal(0.0, noise.transient_sigma,
                                                                                   k_node)]),
                     noise.transient_max_s)
    factor = rng.uniform(*noise.transient_factor, k_rank + k_node)
    order = np.argsort(start)
    start, dur, factor = start[order], dur[order], factor[order]
    end = start + dur
    # An episode replaces the one before it, so a run lasts to its last episode's end, and each episode slows
    # the rank until the next one begins.
    held = np.minimum(dur, np.append(np.diff(start), np.inf))
    new_run = np.ones(len(start), dtype=bool)
    new_run[1:] = start[1:] > end[:-1] + gap_s
    first = np.flatnonzero(new_run)
    last = np.append(first[1:] - 1, len(start) - 1)
    length = end[last] - start[first]
    weight = np.add.reduceat(held, first)
    mean = np.add.reduceat(held * factor, first) / np.maximum(weight, 1e-9)
    return length, mean


def main() -> None:
    ap = _bench.parser(__doc__, "a tenth of the rank-hours")
    args = ap.parse_args()
    rng = np.random.default_rng(20)
    scale = 0.1 if args.quick else 1.0
    started = time.perf_counter()
    sections = []
    for name, knobs, hours, exposure, per in (
            ("stress rate (the transient controls)", TRANSIENTS, 200_000.0, CONTROL_RANK_H,
             f"in the transient controls ({CONTROL_RANK_H:.0f} rank-hours)"),
            ("fleet rate (the 1,024-node control)", FLEET_TRANSIENTS, 2_000_000.0, JOB_DAY_RANK_H,
             "per job-day at 1,024 nodes")):
        noise = Noise().with_(**knobs)
        rows = []
        per_gap = {}
        for gap in GAPS_S:
            length, mean = runs(rng, noise, hours * scale, gap)
            per_gap[gap] = [float(((length >= x) & (mean >= MARGINAL)).sum()) / (hours * scale) for x in LENGTHS_S]
        for i, x in enumerate(LENGTHS_S):
            rows.append((f"{x:g} s", *(f"{per_gap[g][i]:.1e} ({per_gap[g][i] * exposure:.2g})" for g in GAPS_S)))
        sections.append(f"## {name}\n\n{knobs}: runs of at least L at a mean factor ≥ {MARGINAL}×, per rank-hour "
                        f"(and {per}), over {hours * scale:,.0f} simulated rank-hours.\n\n"
                        + _bench.md_table(("L", *(f"gap {g:g} s (steps of {g:g} s)" for g in GAPS_S)), rows))
    _bench.report("detection_transient_runs", "# Transient runs on one rank: what the minimum duration must outlast",
                  {"wall time": f"{time.perf_counter() - started:.1f} s",
                   "command": "python -m benchmarks.detection.transient_runs" + (" --quick" if args.quick else "")},
                  *sections, quick=args.quick)


if __name__ == "__main__":
    main()
