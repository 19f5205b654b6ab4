"""The detection benchmark: planted faults and negative controls through the rules service's own detectors.

    python -m benchmarks.detection.run [--quick] [--seeds K] [--procs P]
    python -m benchmarks.detection.run --seed 0 --only "uneven sequence lengths" --no-big --no-scaling --out NAME

Writes benchmarks/results/detection.md (or detection_quick.md) and the PNG plots beside it. `--seed` and `--only`
run part of the plan, each scenario as the full run has it (a control's scenario seed is 1000 × seed + 500 + its
place in scenarios.CONTROLS: seed 503 is `--seed 0 --only "uneven sequence lengths"`), under a name of its own.
"""

from __future__ import annotations

import argparse
import inspect
import math
import multiprocessing as mp
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from gpumond.rules.detectors import engine

from benchmarks import _bench
from benchmarks.detection import metrics as M
from benchmarks.detection import scaling
from benchmarks.detection.cluster import Cluster
from gpumond.rules.findings import FINDINGS_PERSISTENCE

from benchmarks.detection.scenarios import (
    EVAL_S,
    NODE_SLOWDOWNS,
    OUTLIER_BASE_WAIT,
    OUTLIER_WAIT_FRACS,
    SLOWDOWNS,
    STEP_S,
    SUB_WAIT_FRACS,
    T0,
    WAIT_FRACS,
    Scenario,
    big_control,
    control_scenarios,
    fault_scenarios,
)
from benchmarks.detection.score import CLASSES, ON_STEPS_S, Episode, RunResult, run

RESULTS = Path(__file__).resolve().parents[1] / "results"
SCALING_FULL = (128, 512, 2048, 8192, 32768, 131072)
SCALING_QUICK = (128, 512, 2048)



def _where(path: Path) -> str:
    """`path` relative to the repository when it is inside it (a result file names no machine's paths)."""
    root = Path(__file__).resolve().parents[2]
    return path.resolve().relative_to(root).as_posix() if path.resolve().is_relative_to(root) else path.name

def plan(quick: bool, seeds: int, nodes: int | None = None, control_s: float = 1800.0,
         big: bool = True, seed: int | None = None, only: Sequence[str] = ()) -> list[Scenario]:
    """Every scenario of the run, longest first (so the pool finishes together). `nodes`, `control_s` and `big`
    shrink a full run to what a busy machine fits (one job size, shorter controls, no 1,024-node control); `seed`
    keeps that seed's scenarios alone and `only` those whose name holds one of its strings (each as in the full
    run: the same job size, duration and random streams), to chase one run."""
    out: list[Scenario] = []
    if quick:
        out += fault_scenarios(0, 16, slowdowns=(1.05, 1.25, 2.0), node_slowdowns=(1.25,), waits=(0.05, 0.2),
                               sub_waits=(0.02,), hangs=1, outliers=(0.4,))
        out += control_scenarios(0, 16, 300.0)  # judged as steps land: five times the evaluations of a 5 s tick
    else:
        sizes = (32, 64, 128, 16) if nodes is None else (nodes,)
        for s in range(seeds) if seed is None else (seed,):
            out += fault_scenarios(s, sizes[s % len(sizes)])
            out += control_scenarios(s, 64 if nodes is None else nodes, control_s)
        if big and seed in (None, 0):
            out.append(big_control(0, 1024, 1800.0))
    if only:
        out = [sc for sc in out if any(o in sc.name for o in only)]
    return sorted(out, key=lambda sc: -sc.nodes * sc.duration_s)


_CLUSTER_KW: dict = {}
_PUSH_S = inspect.signature(Cluster).parameters["push_s"].default  # how often a rank pushes


def _one(sc: Scenario) -> RunResult:
    return run(sc, **_CLUSTER_KW)


def describe(e: Episode) -> str:
    """One line on a firing episode: what, on which rank, when (s into the run), and its strongest signal."""
    where = f"rank {e.rank} ({e.node})" if e.rank is not None else (e.node or e.job)
    sig = e.evidence.get("signals") or {}
    name, top = max(sig.items(), key=lambda kv: abs(kv[1].get("z", 0.0)), default=(None, {}))
    what = (f": {name}{' ' + top['look'] if 'look' in top else ''} z {top['z']} against {e.evidence.get('threshold_z')}"
            if name and "z" in top else "")
    return f"{e.kind} on {where} firing at {e.fired - T0:.0f} s{what}"


def _f(x: float, nd: int = 2) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{nd}f}"


def _s(x: float) -> str:
    return "–" if x is None or math.isnan(x) else f"{x:.0f} s"


def _by_step(faults: Sequence[RunResult], slowdown: float, step: float) -> M.Row:
    """GPU and node slowdowns of this factor on jobs of this base step time."""
    return M.row("", [r for r in faults if r.scenario.tags.get("step_s") == step],
                 lambda tr: tr.fault.kind in ("slow_gpu", "slow_node") and tr.fault.slowdown == slowdown)


def _verdict(ok: bool | None) -> str:
    return "–" if ok is None else ("**met**" if ok else "**missed**")


def report(results: Sequence[RunResult], scal: list[dict], args: argparse.Namespace, wall: float) -> str:
    faults = [r for r in results if r.scenario.kind == "fault"]
    controls = [r for r in results if r.scenario.kind == "control"]
    T = M.truths(faults)
    slow = lambda lo, hi=99.0, vis=None: (lambda tr: tr.fault.kind == "slow_gpu"  # noqa: E731
                                          and lo <= tr.fault.slowdown < hi
                                          and (vis is None or tr.fault.visible == vis))
    starved = lambda lo, hi: (lambda tr: tr.fault.kind in ("starved_rank", "starved_node", "starved_job",  # noqa: E731
                                                           "starved_outlier")
                              and lo <= tr.fault.wait_frac < hi)
    # --- the targets ---
    r110 = M.row("slowdown ≥ 1.10", faults, slow(1.10))
    r105 = M.row("slowdown 1.05", faults, slow(1.05, 1.06))
    r103 = M.row("slowdown 1.03", faults, slow(1.03, 1.04))
    w20 = M.row("wait ≥ 20 %", faults, starved(0.2, 1.0), cls="starved_rank")
    w5 = M.row("wait 5–20 %", faults, starved(0.05, 0.2), cls="starved_rank")
    sub_eps = sum(1 for r in faults if r.scenario.faults[0].kind == "starved_sub"
                  for e in r.episodes if e.kind.startswith("io_"))
    sub_runs = sum(1 for r in faults if r.scenario.faults[0].kind == "starved_sub")
    apart_ok, apart_n = M.told_apart(faults)
    mix = M.mixed(results, exclude=lambda tr: tr.fault.kind == "slow_gpu" and tr.fault.slowdown < 1.04)
    lat_slow = M.row("slowdown ≥ 1.25", faults, lambda tr: tr.fault.kind in ("slow_gpu", "slow_node")
                     and tr.fault.slowdown >= 1.25)
    lat_hang = M.row("hang", faults, lambda tr: tr.fault.kind == "hung_rank")
    lat_125 = M.row("slowdown 1.25", faults, lambda tr: tr.fault.kind in ("slow_gpu", "slow_node")
                    and 1.25 <= tr.fault.slowdown < 1.26)
    lat_200 = M.row("slowdown 2.0", faults, lambda tr: tr.fault.kind in ("slow_gpu", "slow_node")
                    and tr.fault.slowdown >= 2.0)
    lat_110 = M.row("slowdown 1.10", faults, lambda tr: tr.fault.kind in ("slow_gpu", "slow_node")
                    and 1.10 <= tr.fault.slowdown < 1.11)
    lat_w20 = M.row("starved rank ≥ 20 %", faults, lambda tr: tr.fault.kind == "starved_rank"
                    and tr.fault.wait_frac >= 0.2)
    n_false = sum(sum(d["false"].values()) for d in M.false_alarms(controls))
    fa = M.false_alarms(controls)
    big = [d for d in fa if d["nodes"] >= 1024]
    big_false = sum(sum(d["false"].values()) for d in big)
    big_jobdays = sum(d["job_hours"] for d in big) / 24.0
    all_false = sum(sum(d["false"].values()) for d in fa)
    all_nh = sum(d["node_hours"] for d in fa)
    s32 = next((s for s in scal if s["gpus"] == 32768), None)
    lin = _linearity(scal)
    lines = []
    tgt = [
        ("slowdown ≥ 1.10: precision ≥ 0.97", _f(r110.precision), _verdict(r110.precision >= 0.97)),
        ("slowdown ≥ 1.10: recall ≥ 0.97", _f(r110.recall), _verdict(r110.recall >= 0.97)),
        ("slowdown 1.05: recall ≥ 0.85", _f(r105.recall), _verdict(r105.recall >= 0.85)),
        ("slowdown 1.03: report only", f"recall {_f(r103.recall)}, precision {_f(r103.precision)}", "–"),
        ("data wait ≥ 20 %: recall ≥ 0.98", _f(w20.recall), _verdict(w20.recall >= 0.98)),
        ("data wait 5–20 %: recall ≥ 0.85", _f(w5.recall), _verdict(w5.recall >= 0.85)),
        ("data wait < 5 %: no findings", f"{sub_eps} io findings in {sub_runs} runs", _verdict(sub_eps == 0)),
        ("starved rank told apart from starved job ≥ 95 %", f"{apart_ok}/{apart_n} = {_f(apart_ok / max(apart_n, 1))}",
         _verdict(apart_n > 0 and apart_ok / apart_n >= 0.95)),
        ("F1 over the mixed set ≥ 0.95", f"{_f(mix.f1)} (P {_f(mix.precision)}, R {_f(mix.recall)})",
         _verdict(mix.f1 >= 0.95)),
        ("latency, slowdown ≥ 1.25: p50 ≤ 12 s, p90 ≤ 20 s", f"p50 {_s(lat_slow.p(50))}, p90 {_s(lat_slow.p(90))}",
         _verdict(lat_slow.p(50) <= 12 and lat_slow.p(90) <= 20)),
        ("latency, 2.0× no worse than 1.25× (p50)", f"{_s(lat_200.p(50))} vs {_s(lat_125.p(50))}",
         _verdict(round(lat_200.p(50)) <= round(lat_125.p(50))) if lat_200.lat and lat_125.lat else "–"),
        ("latency, slowdown 1.10: p50 ≤ 35 s", f"p50 {_s(lat_110.p(50))}",
         _verdict(lat_110.p(50) <= 35) if lat_110.lat else "–"),
        ("latency, starved rank ≥ 20 % wait: p50 ≤ 12 s", f"p50 {_s(lat_w20.p(50))}",
         _verdict(lat_w20.p(50) <= 12) if lat_w20.lat else "–"),
        ("latency, hangs: report only", f"p50 {_s(lat_hang.p(50))}, p90 {_s(lat_hang.p(90))}", "–"),
        ("false findings: 0 in every negative control", f"{n_false} in {len(controls)} runs", _verdict(n_false == 0)),
        ("fault-free: false findings per job-day at 1,024 nodes (bound)",
         f"{big_false} in {big_jobdays * 24:.1f} job-hours: 95 % upper bound "
         f"{(3.0 if big_false == 0 else float('nan')) / big_jobdays:.0f} per job-day"
         if big_jobdays else "not measured in this run", "–"),
        (f"evaluation at 32,768 GPUs: CPU share of one core at {EVAL_S:g} s",
         f"{s32['eval_s']:.2f} s = {s32['eval_s'] / EVAL_S:.0%}" if s32 else "not measured in this run",
         _verdict(s32["eval_s"] / EVAL_S <= 0.5) if s32 else "–"),
        ("linear in N up to 131,072", lin, "–"),
    ]
    n_runs = len(results)
    lines += [f"# Detection benchmark{' (quick: a smoke test, numbers not to be quoted)' if args.quick else ''}", "",
              _bench.machine_block({"detectors": f"`{_where(Path(engine.__file__).parent)}`"
                                                 + ("; ranks push no comm_wait_s (telemetry only)"
                                                    if _CLUSTER_KW.get("comm_wait") is False
                                                    else "; ranks push comm_wait_s")
                                                 + ("; only every 5 s (no early pushes)"
                                                    if _CLUSTER_KW.get("early_push") is False
                                                    else ", early after a step that stands out")
                                                 + (f"; GPM on {_CLUSTER_KW['gpm']:.0%} of nodes"
                                                    if _CLUSTER_KW.get("gpm") else ""),
                                    "scenarios": f"{len(faults)} fault runs, {len(controls)} fault-free runs "
                                                 f"({n_runs} in all), "
                                                 + (f"{args.seeds} seed(s)" if args.seed is None
                                                    else f"seed {args.seed} alone")
                                                 + (f", only {' / '.join(args.only)}" if args.only
                                                    else ""),
                                    "wall time": f"{wall:.0f} s on {args.procs} process(es)"}), "",
              "What runs: `gpumond.rules.detectors.engine.evaluate` and `gpumond.rules.findings.advance` "
              f"(default `DetectorConfig`, `FINDINGS_PERSISTENCE`: {FINDINGS_PERSISTENCE.k} of "
              f"{FINDINGS_PERSISTENCE.n} looks of {FINDINGS_PERSISTENCE.look_s:g} s (evaluations in one look: seen only if "
              f"all saw it) and {FINDINGS_PERSISTENCE.min_s:g} s of wall time, at once on "
              f"sequential evidence) every {EVAL_S:g} s (the service's default; 2 s in one control)"
              + (", and between those on each job whose steps landed, at most every "
                 f"{_CLUSTER_KW.get('on_steps_s', ON_STEPS_S):g} s (judge_on_steps)"
                 if _CLUSTER_KW.get("on_steps_s", ON_STEPS_S) is not None else ", on that schedule alone")
              + " over the "
              "simulated cluster of `benchmarks/detection/` — the service's code, not a copy. Method, physics and matching rules: "
              "`docs/detection-benchmark.md`.", "",
              "## The targets", "", _bench.md_table(("target", "measured", "verdict"), tgt), ""]
    # --- per class and level ---
    rows = []
    for s in SLOWDOWNS:
        for vis in (True, False):
            rows.append(M.row(f"straggler GPU {s:.2f} {'throttled' if vis else 'silent'}", faults,
                              slow(s, s + 0.001, vis)))
    for s in NODE_SLOWDOWNS:
        for vis in (True, False):
            rows.append(M.row(f"straggler node {s:.2f} {'throttled' if vis else 'silent'}", faults,
                              lambda tr, s=s, vis=vis: tr.fault.kind == "slow_node" and tr.fault.slowdown == s
                              and tr.fault.visible == vis))
    for kind, name in (("starved_rank", "starved rank"), ("starved_node", "starved node (per rank)"),
                       ("starved_job", "starved job")):
        for w in WAIT_FRACS:
            rows.append(M.row(f"{name} {w:.0%}", faults, lambda tr, kind=kind, w=w: tr.fault.kind == kind
                              and tr.fault.wait_frac == w))
    for w in OUTLIER_WAIT_FRACS:
        rows.append(M.row(f"starved rank {w:.0%} in a job waiting {OUTLIER_BASE_WAIT:.0%}", faults,
                          lambda tr, w=w: tr.fault.kind == "starved_outlier" and tr.fault.wait_frac == w))
    rows.append(M.row("hung rank (localised)", faults, lambda tr: tr.fault.kind == "hung_rank"))
    hung = [tr for tr in T if tr.fault.kind == "hung_rank"]
    lines += ["## Per class and level", "",
              "Recall over planted faults (a starved node counts its 8 ranks); precision over the firing "
              "episodes of that class in those runs (false ones include findings on healthy GPUs of the same "
              "job); latency from onset to `firing`.", "",
              _bench.md_table(("fault", "n", "recall", "precision", "F1", "latency p50", "latency p90"),
                              [(r.label, r.n, _f(r.recall), _f(r.precision), _f(r.f1), _s(r.p(50)), _s(r.p(90)))
                               for r in rows if r.n]), ""]
    if hung:
        lines += [f"Hangs detected without the rank (`hung_rank` with no rank, same job): "
                  f"{sum(tr.unlocalised for tr in hung)}/{len(hung)}; localised: "
                  f"{sum(tr.detected for tr in hung)}/{len(hung)}.", ""]
    for s in SUB_WAIT_FRACS:
        sub = [r for r in faults if r.scenario.faults[0].kind == "starved_sub" and r.scenario.faults[0].wait_frac == s]
        if sub:
            n_io = sum(1 for r in sub for e in r.episodes if e.kind.startswith("io_"))
            lines += [f"Rank waiting {s:.0%} (below the 5 % line): {n_io} io findings in {len(sub)} runs.", ""]
    ok, n = M.cause_accuracy(faults)
    lines += [f"Likely cause (host CPU / iowait) right for {ok}/{n} detected starved ranks whose cause shows on "
              "the host.", ""]
    tot = M.class_totals(results)
    lines += ["## Per class, all runs", "",
              "Precision here also counts false findings of the class in the fault-free runs.", "",
              _bench.md_table(("class", "faults", "recall", "true episodes", "false episodes", "precision", "F1"),
                              [(c, r.n, _f(r.recall), r.tp, r.fp, _f(r.precision), _f(r.f1))
                               for c, r in tot.items()]), ""]
    # --- latency ---
    lat_rows = [lat_slow, lat_125, lat_200, lat_110, lat_hang,
                M.row("straggler GPU ≥ 1.25 throttled", faults, slow(1.25, vis=True)),
                M.row("straggler GPU ≥ 1.25 silent", faults, slow(1.25, vis=False)), lat_w20,
                M.row("starved node (per rank) ≥ 20 %", faults, lambda tr: tr.fault.kind == "starved_node"
                      and tr.fault.wait_frac >= 0.2),
                M.row("starved rank in a job waiting 12 %", faults, lambda tr: tr.fault.kind == "starved_outlier")]
    lines += ["## Detection latency", "", "From fault onset to the first evaluation where the finding is `firing`; "
              f"evaluations every {EVAL_S:g} s at a random phase to the onset.", "",
              _bench.md_table(("faults", "detected", "p50", "p90", "max"),
                              [(r.label, f"{r.detected}/{r.n}", _s(r.p(50)), _s(r.p(90)),
                                _s(max(r.lat) if r.lat else float("nan"))) for r in lat_rows]), ""]
    parts = M.latency_parts(faults, lambda tr: tr.fault.kind in ("slow_gpu", "slow_node")
                            and tr.fault.slowdown >= 1.25)
    lines += ["### Where the latency goes (slowdowns ≥ 1.25×)", "",
              "Per fault kind and base step time: onset to the first evaluation that flagged the entity (the "
              "detectors: the first slow step must end, reach the service in the rank's next push "
              f"(every {_CLUSTER_KW.get('push_s', _PUSH_S):g} s, or at once when the step stands out: below) and be "
              "evaluated, and the evidence must cross its "
              "threshold and minimum duration), then what the persistence added; `at once`: flagged and firing "
              "at the same evaluation (sequential or corroborated evidence). A synchronous step is ~1.3× the "
              "base compute, and the slow rank lengthens every step by its factor.", "",
              _bench.md_table(("fault", "base step", "n", "flagged p50", "persistence added p50", "at once",
                               "firing p50"),
                              [(f"{d['kind']} {d['visible']}", f"{d['step_s']:g} s", d["n"], _s(d["flagged_p50"]),
                                _s(d["added_p50"]), f"{d['at_once']}/{d['n']}", _s(d["total_p50"]))
                               for d in parts]), ""]
    by_step = []
    for step in STEP_S:
        cells = []
        for sv in (1.25, 2.0):
            r = _by_step(faults, sv, step)
            cells.append(f"{_s(r.p(50))} ({r.detected}/{r.n})" if r.n else "–")
        by_step.append((f"{step:g} s", *cells))
    lines += ["### 1.25× against 2.0×, by base step time", "",
              "Latency p50 (detected/planted) of GPU and node slowdowns of each factor on jobs of each base step "
              "time: a slow step reaches the service only when it ends, and a 2.0× rank doubles the step's "
              "compute, so each level's p50 over all runs depends on which step times its runs drew.", "",
              _bench.md_table(("base step", "1.25×", "2.0×"), by_step), ""]
    fault_push = [r.pushes for r in faults]
    ctl_push = [r.pushes for r in controls]
    if any(e for _, e in fault_push + ctl_push):
        def share(xs: list[tuple[int, int]]) -> str:
            reg, early = sum(x for x, _ in xs), sum(e for _, e in xs)
            return f"{early:,} early beside {reg:,} regular ({early / max(reg, 1):.1%} more requests)"
        lines += ["### Pushes", "",
                  "The simulated ranks push every "
                  f"{_CLUSTER_KW.get('push_s', _PUSH_S):g} s and, as the SDK does (`gpumond.job.early`, the same "
                  "function), at once after a step that stands out against their last minute (at least 32 steps), "
                  f"at most once a second. Requests in the fault runs: {share(fault_push)}; in the fault-free runs: "
                  f"{share(ctl_push)}.", ""]
    # --- false alarms ---
    fa_rows = []
    for d in fa:
        nf = sum(d["false"].values())
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(d["false"].items())) or "none"
        fa_rows.append((d["control"], d["runs"], d["nodes"], f"{d['node_hours']:.0f}", nf,
                        f"{1000 * nf / d['node_hours']:.1f}", f"{24 * nf / d['job_hours']:.0f}", kinds))
    lines += ["## False alarms on fault-free runs", "",
              "Every firing episode in a run without a planted fault is false. Rates with zero events have a "
              "one-sided 95 % upper bound of 3 / exposure.", "",
              _bench.md_table(("run", "runs", "nodes", "node-hours", "false findings", "per 1,000 node-h",
                               "per job-day", "by kind"), fa_rows), "",
              f"All fault-free runs: {all_false} false findings in {all_nh:.0f} node-hours = "
              f"{1000 * all_false / max(all_nh, 1e-9):.1f} per 1,000 node-hours.", ""]
    # --- confusion ---
    conf = M.confusion(results)
    cols = (*CLASSES, "none")
    lines += ["## Confusion matrix", "",
              "Rows: planted truth (per fault; per rank for a starved node); `none` counts false findings in "
              "fault-free runs. Columns: the class reported on that entity (the right class if it fired at all, "
              "else the first other class touching the entity or its job).", "",
              _bench.md_table(("truth \\ reported", *cols),
                              [(t, *[conf.get(t, {}).get(c, 0) for c in cols]) for t in (*CLASSES, "none")]), ""]
    # --- scaling ---
    if scal:
        lines += ["## Evaluation time against N", "",
                  "One `evaluate` over a full window (rank windows of 300 s with ~115 steps each, 12 telemetry "
                  "samples per GPU), one core, garbage collector off while timing, median of the runs; jobs of "
                  "at most 1,024 nodes.", "",
                  _bench.md_table(("GPUs", "jobs", "steps held", "GPU samples", "evaluation", "per GPU", "runs"),
                                  [(f"{s['gpus']:,}", s["jobs"], f"{s['steps_held']:,}", f"{s['gpu_samples']:,}",
                                    f"{s['eval_s']:.3f} s", f"{1e6 * s['eval_s'] / s['gpus']:.0f} µs", s["runs"])
                                   for s in scal]), "", f"Linearity: {lin}.", ""]
        prof = next((s for s in scal if "profile_rows" in s), None)
        if prof:
            lines += [f"Where the time goes at {prof['gpus']:,} GPUs (cProfile, own time):", "",
                      _bench.md_table(("function", "calls", "own", "cumulative"),
                                      [(f"`{fn}`", f"{nc:,}", f"{tt:.3f} s", f"{ct:.3f} s")
                                       for fn, nc, tt, ct in prof["profile_rows"]]), ""]
    # The evaluation-time plot exists only when scaling was measured (plots() draws it from `scal`).
    lines += ["## Plots", "", "![recall vs slowdown](detection_recall_slowdown.png) "
              "![recall vs wait](detection_recall_wait.png)"
              + (" ![eval time](detection_eval_time.png)" if scal else ""), ""]
    return "\n".join(lines)


def _linearity(scal: list[dict]) -> str:
    big = [s for s in scal if s["gpus"] >= 2048]
    if len(big) < 2:
        return "not measured (needs sizes ≥ 2,048)"
    per = [s["eval_s"] / s["gpus"] * 1e6 for s in big]
    return (f"time per GPU {min(per):.0f}–{max(per):.0f} µs from {big[0]['gpus']:,} to {big[-1]['gpus']:,} GPUs "
            f"(ratio {max(per) / min(per):.2f}; 1.00 is perfectly linear)")


def plots(results: Sequence[RunResult], scal: list[dict], suffix: str) -> None:
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    faults = [r for r in results if r.scenario.kind == "fault"]
    fig, ax = plt.subplots(figsize=(6, 4))
    for vis, style in ((True, "o-"), (False, "s--")):
        xs, ys = [], []
        for s in SLOWDOWNS:
            r = M.row("", faults, lambda tr, s=s, vis=vis: tr.fault.kind == "slow_gpu"
                      and tr.fault.slowdown == s and tr.fault.visible == vis)
            if r.n:
                xs.append(SLOWDOWNS.index(s)), ys.append(r.recall)
        ax.plot(xs, ys, style, label="throttled GPU" if vis else "silent GPU")
    ax.axhline(0.97, color="grey", lw=0.8, ls=":")
    ax.set(xlabel="slowdown (categories)", ylabel="recall", ylim=(-0.02, 1.02), title="Straggler recall")
    ax.set_xticks(range(len(SLOWDOWNS)), [f"{s:g}" for s in SLOWDOWNS])
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / f"detection_recall_slowdown{suffix}.png", dpi=110)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(6, 4))
    for kind, style in (("starved_rank", "o-"), ("starved_node", "s--"), ("starved_job", "^-.")):
        xs, ys = [], []
        for w in WAIT_FRACS:
            r = M.row("", faults, lambda tr, w=w, kind=kind: tr.fault.kind == kind and tr.fault.wait_frac == w)
            if r.n:
                xs.append(100 * w), ys.append(r.recall)
        ax.plot(xs, ys, style, label=kind.replace("_", " "))
    ax.set(xlabel="data-wait fraction of the step (%)", ylabel="recall", ylim=(-0.02, 1.02),
           title="I/O starvation recall")
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / f"detection_recall_wait{suffix}.png", dpi=110)
    plt.close(fig)
    if scal:
        fig, ax = plt.subplots(figsize=(6, 4))
        g = [s["gpus"] for s in scal]
        ax.loglog(g, [s["eval_s"] for s in scal], "o-", label="measured")
        ref = scal[-1]["eval_s"] / scal[-1]["gpus"]
        ax.loglog(g, [ref * x for x in g], ":", color="grey", label="linear")
        ax.axhline(1.0, color="red", lw=0.8, ls="--", label="1 s")
        ax.axvline(32768, color="red", lw=0.5, ls=":")
        ax.set(xlabel="GPUs", ylabel="one evaluation (s)", title="Evaluation time, one core")
        ax.legend()
        fig.tight_layout()
        fig.savefig(RESULTS / f"detection_eval_time{suffix}.png", dpi=110)
        plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a ≤ 60 s smoke run (numbers not to be quoted)")
    ap.add_argument("--seeds", type=int, default=3, help="seeds of the full run (default 3)")
    ap.add_argument("--procs", type=int, default=2, help="worker processes for the scenarios (default 2)")
    ap.add_argument("--no-scaling", action="store_true", help="skip evaluation time against N")
    ap.add_argument("--no-comm-wait", action="store_true",
                    help="ranks push no comm_wait_s (an SDK that does not time a collective): telemetry-only "
                         "straggler localisation")
    ap.add_argument("--no-early-push", action="store_true",
                    help="ranks push only every 5 s (an SDK with push_early=False), not also at once after a step "
                         "that stands out")
    ap.add_argument("--gpm", type=float, default=0.0,
                    help="share of nodes whose GPUs export GPM SM/tensor activity (Hopper and later; default 0)")
    ap.add_argument("--no-judge-on-steps", action="store_true",
                    help="evaluate on the periodic schedule alone (judge_on_steps.enabled: false), for a before/after")
    ap.add_argument("--out", default=None, help="result name (default detection / detection_quick)")
    ap.add_argument("--nodes", type=int, default=None,
                    help="one job size for every fault run and control (default: 32, 64, 128, 16 by seed; 64)")
    ap.add_argument("--control-s", type=float, default=1800.0, help="seconds each control runs (default 1800)")
    ap.add_argument("--no-big", action="store_true", help="skip the 1,024-node fault-free control")
    ap.add_argument("--seed", type=int, default=None,
                    help="run this seed's scenarios alone, as the full run has them (a control's scenario seed is "
                         "1000 × seed + 500 + its place in scenarios.CONTROLS); needs --out")
    ap.add_argument("--only", action="append", default=[], metavar="TEXT",
                    help="keep only the scenarios whose name holds TEXT (e.g. 'uneven sequence lengths', "
                         "'slow_gpu 1.05'); repeat for more; needs --out")
    args = ap.parse_args(argv)
    if (args.seed is not None or args.only) and not args.out:
        ap.error("--seed and --only run part of the benchmark: name its result with --out (e.g. --out detection_chase), "
                 "so it never replaces detection.md")
    if args.no_comm_wait:
        _CLUSTER_KW["comm_wait"] = False
    if args.gpm:
        _CLUSTER_KW["gpm"] = args.gpm
    if args.no_early_push:
        _CLUSTER_KW["early_push"] = False
    if args.no_judge_on_steps:
        _CLUSTER_KW["on_steps_s"] = None
    if args.quick:
        args.seeds = 1
    start = time.perf_counter()
    scs = plan(args.quick, args.seeds, args.nodes, args.control_s, not args.no_big, args.seed, args.only)
    if not scs:
        ap.error(f"no scenario of the plan matches --only {args.only}: see the names in benchmarks/detection/scenarios.py")
    results: list[RunResult] = []
    with mp.get_context("fork").Pool(args.procs) as pool:
        for i, r in enumerate(pool.imap_unordered(_one, scs), 1):
            results.append(r)
            print(f"[{i}/{len(scs)}] {r.scenario.name} ({r.scenario.nodes} nodes, seed {r.scenario.seed}): "
                  f"{sum(t.detected for t in r.truths)}/{len(r.truths)} found, "
                  f"{sum(e.label == 'fp' for e in r.episodes)} false", flush=True)
            for e in r.episodes:
                if e.label == "fp":
                    print(f"    false {describe(e)}", flush=True)
    scal: list[dict] = []
    if not args.no_scaling:
        for n in (SCALING_QUICK if args.quick else SCALING_FULL):
            s = scaling.measure(n, repeats=1 if n >= 131072 else 3, profile=(n == 32768))
            scal.append(s)
            print(f"scaling {n} GPUs: {s['eval_s']:.3f} s", flush=True)
    suffix = "_quick" if args.quick else ""
    if args.out:
        suffix = "_" + args.out.removeprefix("detection").strip("_") if args.out != "detection" else ""
    RESULTS.mkdir(exist_ok=True)
    plots(results, scal, suffix)
    text = report(results, scal, args, time.perf_counter() - start)
    if args.quick:
        text = text.replace("(detection_recall_slowdown.png)", "(detection_recall_slowdown_quick.png)") \
                   .replace("(detection_recall_wait.png)", "(detection_recall_wait_quick.png)") \
                   .replace("(detection_eval_time.png)", "(detection_eval_time_quick.png)")
    if suffix and not args.quick:
        for name in ("recall_slowdown", "recall_wait", "eval_time"):
            text = text.replace(f"(detection_{name}.png)", f"(detection_{name}{suffix}.png)")
    _bench.write_result(args.out or "detection", text, quick=args.quick)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
