"""What GPM's SM activity changes for telemetry-only jobs: the same runs with and without it, paired.

    python -m benchmarks.detection.gpm [--quick] [--seeds K] [--nodes N] [--procs P]

Every straggler scenario of the detection benchmark (slow GPU throttled and silent at every level, slow
node), starvation at 20 % (rank, node, job: must not change) and every negative control (15 minutes each), on jobs whose
ranks push no comm_wait_s. Each runs once per arm on the same seed: without GPM (a model without it, or an
agent before it), with `sm_active` / `tensor_active` on every node (Hopper and later), and with --arms
0,0.5,1 also on half of the nodes (a mixed fleet: the detectors fall back to the other signals
elsewhere). The simulator draws GPM
from a stream of its own, so both runs see the same steps and the same other telemetry: a difference is
the signal's doing. Writes benchmarks/results/detection_gpm.md.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Sequence

from benchmarks import _bench
from benchmarks.detection import metrics as M
from benchmarks.detection.scenarios import NODE_SLOWDOWNS, SLOWDOWNS, Scenario, control_scenarios, fault_scenarios
from benchmarks.detection.score import RunResult, run


def plan(quick: bool, seeds: int, nodes: int) -> list[Scenario]:
    """The scenarios of one arm (longest first)."""
    out: list[Scenario] = []
    for s in range(seeds):
        if quick:
            out += fault_scenarios(s, nodes, slowdowns=(1.25,), node_slowdowns=(), waits=(), sub_waits=(), hangs=0,
                                   outliers=())
            out += control_scenarios(s, nodes, 300.0, names=("clean",))
        else:
            out += fault_scenarios(s, nodes, waits=(0.2,), sub_waits=(), hangs=0, outliers=())
            out += control_scenarios(s, nodes, 900.0)
    return sorted(out, key=lambda sc: -sc.nodes * sc.duration_s)


def _one(job: tuple[Scenario, float]) -> tuple[float, RunResult]:
    sc, gpm = job
    return gpm, run(sc, comm_wait=False, gpm=gpm)


def _f(x: float) -> str:
    return "–" if x != x else f"{x:.2f}"


def _s(x: float) -> str:
    return "–" if x != x else f"{x:.0f} s"


def tables(arms: dict[float, list[RunResult]]) -> list[str]:
    """The per-level table (recall, precision, latency per arm) and the false findings per control."""
    names = {0.0: "without GPM", 1.0: "with GPM"}
    names.update({g: f"GPM on {g:.0%} of nodes" for g in arms if g not in names})
    picks: list[tuple[str, object]] = []
    for s in SLOWDOWNS:
        for vis in (True, False):
            picks.append((f"straggler GPU {s:.2f} {'throttled' if vis else 'silent'}",
                          lambda tr, s=s, vis=vis: tr.fault.kind == "slow_gpu" and tr.fault.slowdown == s
                          and tr.fault.visible == vis))
    for s in NODE_SLOWDOWNS:
        for vis in (True, False):
            picks.append((f"straggler node {s:.2f} {'throttled' if vis else 'silent'}",
                          lambda tr, s=s, vis=vis: tr.fault.kind == "slow_node" and tr.fault.slowdown == s
                          and tr.fault.visible == vis))
    for kind in ("starved_rank", "starved_node", "starved_job"):
        picks.append((kind.replace("_", " ") + " 20 %", lambda tr, kind=kind: tr.fault.kind == kind))
    picks += [("slowdown ≥ 1.10 (GPU and node)", lambda tr: tr.fault.kind in ("slow_gpu", "slow_node")
               and tr.fault.slowdown >= 1.10),
              ("slowdown ≥ 1.25 (GPU and node)", lambda tr: tr.fault.kind in ("slow_gpu", "slow_node")
               and tr.fault.slowdown >= 1.25)]
    rows = []
    for label, pick in picks:
        faults = {g: [r for r in res if r.scenario.kind == "fault"] for g, res in arms.items()}
        rs = {g: M.row(label, fs, pick) for g, fs in faults.items()}
        if not any(r.n for r in rs.values()):
            continue
        cells = []
        for g in sorted(arms):
            r = rs[g]
            cells += [f"{r.detected}/{r.n}", _f(r.precision), f"{_s(r.p(50))} / {_s(r.p(90))}"]
        rows.append((label, *cells))
    heads = ["faults"] + [f"{h}, {names.get(g, g)}" for g in sorted(arms) for h in ("found", "precision",
                                                                                  "latency p50 / p90")]
    fa_rows = []
    fa = {g: {d["control"]: d for d in M.false_alarms([r for r in res if r.scenario.kind == "control"])}
          for g, res in arms.items()}
    for control in fa[min(arms)]:
        cells = []
        for g in sorted(arms):
            d = fa[g][control]
            kinds = ", ".join(f"{k} {v}" for k, v in sorted(d["false"].items())) or "none"
            cells.append(f"{sum(d['false'].values())} ({kinds})")
        fa_rows.append((control, fa[min(arms)][control]["runs"], f"{fa[min(arms)][control]['node_hours']:.0f}", *cells))
    return ["\n".join(["## Faults, per level", "",
            "Found: planted faults whose finding fired; precision over that class's firing episodes in those runs; "
            "latency from onset to `firing`.", "", _bench.md_table(heads, rows), "",
            "## False findings on fault-free runs", "",
            _bench.md_table(["control", "runs", "node-hours", *[names.get(g, str(g)) for g in sorted(arms)]],
                            fa_rows)])]


def main(argv: Sequence[str] | None = None) -> int:
    ap = _bench.parser(__doc__, "one seed, 1.25× slow GPUs and the clean control on 4 nodes")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--nodes", type=int, default=16, help="nodes per job (8 GPUs each)")
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--arms", default="0,1", help="shares of nodes with GPM to compare (default 0,1; 0.5: a mixed "
                                                   "fleet, the other half a model without GPM)")
    args = ap.parse_args(argv)
    if args.quick:
        args.seeds, args.nodes = 1, 4
    start = time.perf_counter()
    scs = plan(args.quick, args.seeds, args.nodes)
    arms: dict[float, list[RunResult]] = {float(g): [] for g in args.arms.split(",")}
    with mp.get_context("fork").Pool(args.procs) as pool:
        for i, (gpm, r) in enumerate(pool.imap_unordered(_one, [(sc, g) for sc in scs for g in arms]), 1):
            arms[gpm].append(r)
            print(f"[{i}/{len(arms) * len(scs)}] gpm={gpm:g} {r.scenario.name}: {sum(t.detected for t in r.truths)}/"
                  f"{len(r.truths)} found, {sum(e.label == 'fp' for e in r.episodes)} false", flush=True)
    facts = {"scenarios": f"{len(scs)} per arm ({len(arms)} arms), {args.seeds} seed(s), jobs of {args.nodes} "
                          "nodes; ranks push no comm_wait_s",
             "wall time": f"{time.perf_counter() - start:.0f} s on {args.procs} process(es)"}
    _bench.report("detection_gpm", "# Telemetry-only detection with and without GPM SM activity", facts,
                  "Method: `docs/detection-benchmark.md` (GPM section). The detectors are "
                  "`gpumond.rules.detectors.engine.evaluate` with the default `DetectorConfig`, persistence as "
                  "in the service, evaluated every 10 s.", *tables(arms), quick=args.quick)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
