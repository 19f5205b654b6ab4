"""Where an evaluation's CPU goes, against the length of the detectors' recent window: which parts follow the
ranks, and which follow the steps of the last `recent_s`, for one big job stepping twice a second.

An evaluation that cost only what is new would cost the same per new step whatever `recent_s` is. This script
splits the cost of a periodic evaluation (`Evaluator.evaluate`) and of a judgement on arrival
(`Evaluator.judge_arrivals`) into their parts, at several `recent_s`, on the same simulated job (the detection
benchmark's cluster, benchmarks/detection/cluster.py, 0.5 s of compute a step; the job's step, which waits for
its slowest of 32,768 ranks and its collectives, comes out at ~1.4 s), stored as the service stores it (`RankStore.record`, columns), with the daemon's collector thresholds:

- the total is the evaluating thread's CPU (thread_time), median over the timed cycles, without a profiler;
- the parts come from one more cycle of each kind under cProfile (cumulative time of the functions that make
  each part, the sequential test's own time taken out of the detectors that call it). A profiler slows
  Python-level loops more than numpy calls, so the parts are shares of the profiled cycle, scaled to the
  unprofiled total: read them as where the time goes, not as exact seconds.

    python benchmarks/eval_phases.py                 # ~10 min: 32,768 ranks at recent_s 30, 60 and 120
    python benchmarks/eval_phases.py --quick         # seconds: 512 ranks (smoke test)
    python benchmarks/eval_phases.py --recent-s 60 --reference --name eval_phases_running
                                                     # ~6 min: the service's path against the reference path
                                                     # (Evaluator(running=False): nothing kept between judgements)
"""

from __future__ import annotations

import cProfile
import gc
import importlib
import pstats
import statistics
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _bench  # noqa: E402
from eval_cycle import Feed  # noqa: E402

from benchmarks.detection.cluster import Cluster, JobSpec  # noqa: E402
from benchmarks.detection.noise import Noise  # noqa: E402
from gpumond.config.rules import RulesConfig  # noqa: E402
from gpumond.rules.detectors.config import DetectorConfig  # noqa: E402
from gpumond.rules.evaluator import Evaluator  # noqa: E402
from gpumond.rules.service import GC_THRESHOLDS  # noqa: E402
from gpumond.rules.store import GpuStore, RankStore  # noqa: E402

INTERVAL_S = 5  # the service's periodic evaluation interval; judgements on arrival every second between
WINDOW_S = 310.0  # simulated before the timed cycles: every rank window holds its full 300 s
WARM_S = 80.0  # of which the last ones evaluated untimed (baselines, structure and long looks learnt)

# The parts, each the cumulative time of these functions (module path, function name). Disjoint: none calls
# another of a different part, except the sequential test, whose time is taken out of its callers' parts.
PARTS: tuple[tuple[str, str, tuple[tuple[str, str], ...]], ...] = (
    ("store", "expiry and snapshot of the stores (per rank and GPU)",
     (("rules/store.py", "expire"), ("rules/store.py", "jobs"), ("rules/store.py", "windows"),
      ("rules/store.py", "windows_on_demand"))),
    ("keys", "what changed since the job's last judgement (steps_key, inputs_key)",
     (("rules/detectors/engine.py", "steps_key"), ("rules/detectors/engine.py", "inputs_key"))),
    ("read", "the job's recent steps read into matrices (step_matrix.read_steps)",
     (("rules/detectors/step_matrix.py", "read_steps"),)),
    ("rank features", "each rank's medians over its recent steps (rank_batch)",
     (("rules/detectors/rank_batch.py", "job_rank_features"),)),
    ("step shares", "the steps placed by step number, per-step peer medians (sequential.step_shares)",
     (("rules/detectors/sequential.py", "step_shares"),)),
    ("sequential test", "deviations, their noise and suffix sums over the window (sequential.judge)",
     (("rules/detectors/sequential.py", "judge"),)),
    ("GPU features", "each GPU's medians over its recent samples (gpu_batch)",
     (("rules/detectors/gpu_batch.py", "gpu_features_many"),)),
    ("peer looks", "the straggler and starvation detectors but their sequential tests",
     (("rules/detectors/straggler.py", "detect_stragglers"), ("rules/detectors/io_starvation.py", "detect_io_starvation"))),
)
# Which parts read the recent window step by step (the rest are per rank, per GPU or per job).
_OF_WINDOW = ("read", "rank features", "step shares", "sequential test")


@dataclass(frozen=True, slots=True)
class Measured:
    kind: str  # "periodic" or "on arrival"
    recent_s: float
    path: str  # "running" (the service's) or "reference" (Evaluator(running=False))
    new_steps: float  # steps stored since the previous judgement of the job (median)
    recent_steps: float  # steps held a rank that ended in the last recent_s (mean over ranks)
    cpu_s: float  # median, unprofiled
    parts: dict[str, float]  # seconds, shares of the profiled cycle scaled to cpu_s
    other: float


def build(ranks: int, step_s: float, seed: int = 0) -> tuple[Cluster, float]:
    c = Cluster([JobSpec("job-0", ranks // 8, step_s=step_s)], (), Noise(), seed=seed)
    now = c.t0 + WINDOW_S
    c.advance_to(now - WARM_S, telemetry_from=now - WARM_S - 70.0)
    return c, now


def _check_parts() -> None:
    """Every function a part names exists where it says (a renamed one would silently count as 0 s)."""
    for _part, _what, funcs in PARTS:
        for path, fn in funcs:
            module = importlib.import_module("gpumond." + path.removesuffix(".py").replace("/", "."))
            owner = module if hasattr(module, fn) else next(
                (c for c in vars(module).values() if isinstance(c, type) and c.__module__ == module.__name__
                 and fn in vars(c)), None)
            if owner is None:
                raise SystemExit(f"eval_phases: {fn} is not in gpumond/{path}: update PARTS")


def _parts(profile: cProfile.Profile, total_profiled: float) -> dict[str, float]:
    """Each part's share of the profiled cycle (0–1). The sequential test is only called from inside the peer
    looks (straggler.py, io_starvation.py), so its time is taken out of theirs."""
    cum = dict.fromkeys((p for p, _, _ in PARTS), 0.0)
    for (path, _line, name), (_cc, _nc, _tt, ct, _callers) in pstats.Stats(profile).stats.items():  # type: ignore[attr-defined]
        for part, _what, funcs in PARTS:
            if any(path.endswith(f) and name == fn for f, fn in funcs):
                cum[part] += ct
    cum["peer looks"] -= cum["sequential test"]
    return {p: t / total_profiled for p, t in cum.items()}


@dataclass
class _Service:
    """One rules service's stores and evaluator at one recent_s, fed the same steps and samples as the others."""

    recent_s: float
    path: str
    store: RankStore
    feed: Feed
    ev: Evaluator
    timed: dict[str, list[tuple[float, int]]] = field(default_factory=lambda: {"periodic": [], "on arrival": []})
    profiled: dict[str, tuple[cProfile.Profile, float]] = field(default_factory=dict)


def run(ranks: int, step_s: float, windows: list[float], cycles: int, reference: bool = False) -> list[Measured]:
    """One simulated job fed to one service per window (stores of their own: a judgement on arrival takes its
    store's fresh jobs), each judged in turn on the same steps, the order rotating from cycle to cycle, so that
    the machine's drift falls on every window alike."""
    t0 = time.perf_counter()
    c, now = build(ranks, step_s)
    config = RulesConfig.model_validate({"tokens": ["x" * 20]})
    clock = [now - WARM_S]
    services = []
    for w in windows:
        for path in ("running", "reference") if reference else ("running",):
            store, gpus, feed = RankStore.from_config(config), GpuStore.from_config(config), Feed(c)
            ev = Evaluator(store, gpus, feed, clock=lambda: clock[0], detectors=replace(DetectorConfig(), recent_s=w),
                           running=path == "running")
            services.append(_Service(w, path, store, feed, ev))

    def second(fetch: bool) -> int:
        clock[0] += 1.0
        services[0].feed.advance(clock[0])  # the one cluster every feed reads
        news = {s.feed.push(s.store, clock[0]) for s in services}
        if fetch:
            for s in services:
                s.ev.poll_telemetry()
        assert len(news) == 1, "the services were fed different steps"
        return news.pop()

    while clock[0] < now:  # the warm-up: the service's cadence, untimed
        for i in range(INTERVAL_S):
            second(i == 2)
        for s in services:
            s.ev.evaluate()
    print(f"  built and warmed in {time.perf_counter() - t0:.0f} s, {services[0].store.counts().steps:,} steps "
          "held a service", flush=True)

    def call(s: _Service, kind: str, new: int, prof: bool) -> None:
        fn = s.ev.judge_arrivals if kind == "on arrival" else s.ev.evaluate
        if prof:
            p = cProfile.Profile()
            c0 = time.thread_time()
            p.runcall(fn)
            s.profiled[kind] = (p, time.thread_time() - c0)
        else:
            c0 = time.thread_time()
            fn()
            s.timed[kind].append((time.thread_time() - c0, new))

    for i in range(cycles + 1):
        prof = i == cycles  # one more cycle of each kind under the profiler, not timed with the others
        order = services[i % len(services):] + services[:i % len(services)]
        # A second of steps judged on arrival, then the rest of the interval (telemetry fetched in it) and the
        # periodic evaluation, which judges the job whole on the interval's steps.
        arrived = second(False)
        for s in order:
            call(s, "on arrival", arrived, prof)
        rest = sum(second(j == 0) for j in range(INTERVAL_S - 1))
        for s in order:
            call(s, "periodic", arrived + rest, prof)
        print(f"  cycle {i + 1} of {cycles + 1}{' (profiled)' if prof else ''}", flush=True)
    out = []
    for s in services:
        recent = _recent_steps(s.store, clock[0], clock[0] - s.recent_s)
        for kind, xs in s.timed.items():
            cpu = statistics.median(t for t, _ in xs)
            parts = {p: share * cpu for p, share in _parts(*s.profiled[kind]).items()}
            out.append(Measured(kind, s.recent_s, s.path, statistics.median(n for _, n in xs), recent, cpu, parts,
                                cpu - sum(parts.values())))
            print(f"  recent_s {s.recent_s:g} {s.path} {kind}: {cpu:.3f} s CPU; " +
                  ", ".join(f"{p} {v:.3f}" for p, v in parts.items()), flush=True)
    return out


def _recent_steps(store: RankStore, now: float, since: float) -> float:
    windows = [w for ranks in store.jobs(now).values() for w in ranks.values()]
    held = [int((w.columns.values[0] >= since).sum()) for w in windows if w.columns is not None]
    return sum(held) / max(len(held), 1)


def main(argv: list[str] | None = None) -> int:
    ap = _bench.parser(__doc__, "512 ranks, one cycle of each kind per window")
    ap.add_argument("--ranks", type=int, default=32768, help="the job's ranks, 8 a node (default 32,768)")
    ap.add_argument("--step-s", type=float, default=0.5,
                    help="each rank's compute per step (default 0.5 s; the job's step also waits for its slowest rank)")
    ap.add_argument("--recent-s", type=float, action="append", default=None, metavar="S",
                    help="the detectors' recent window, repeatable (default: 30, 60 and 120)")
    ap.add_argument("--cycles", type=int, default=3, help="timed cycles of each kind per window (default 3)")
    ap.add_argument("--reference", action="store_true",
                    help="also judge each window on the reference path (Evaluator(running=False): the per-step "
                         "medians and the peer looks found afresh every judgement), in turn on the same steps")
    ap.add_argument("--name", default="eval_phases", help="results file name under benchmarks/results/")
    args = ap.parse_args(argv)
    if args.ranks < 8 or args.ranks % 8 or args.step_s <= 0 or args.cycles < 1:
        ap.error("--ranks must be a positive multiple of 8, --step-s above 0, --cycles at least 1")
    _check_parts()
    gc.set_threshold(*GC_THRESHOLDS)  # the daemon's collector settings (service.serve sets them)
    windows = args.recent_s or [30.0, 60.0, 120.0]
    ranks, cycles = (512, 1) if args.quick else (args.ranks, args.cycles)
    print(f"{ranks:,} ranks, {args.step_s:g} s of compute a step, recent_s " + ", ".join(f"{w:g}" for w in windows),
          flush=True)
    rows = sorted(run(ranks, args.step_s, windows, cycles, args.reference),
                  key=lambda m: (m.kind, m.recent_s, m.path != "running"))
    _report(args, ranks, cycles, rows)
    return 0


def _report(args, ranks: int, cycles: int, rows: list[Measured]) -> None:
    names = [p for p, _, _ in PARTS]
    sections = []
    for kind in ("periodic", "on arrival"):
        mine = [m for m in rows if m.kind == kind]
        if not mine:
            continue
        table = _bench.md_table(
            ("recent_s", "path", "recent steps a rank", "new steps", "CPU", "per new step", "per rank", *names, "other",
             "of them, reading the window"),
            [(f"{m.recent_s:g} s", m.path, f"{m.recent_steps:.0f}", f"{m.new_steps:,.0f}", f"{m.cpu_s:.3f} s",
              f"{m.cpu_s / max(m.new_steps, 1) * 1e6:.1f} µs", f"{m.cpu_s / ranks * 1e6:.1f} µs",
              *(f"{m.parts[p]:.3f}" for p in names), f"{m.other:.3f}",
              f"{sum(m.parts[p] for p in _OF_WINDOW) / m.cpu_s:.0%}") for m in mine])
        growth = ""
        running = [m for m in mine if m.path == "running"]
        if len(running) > 1:
            a, b = running[0], running[-1]
            scale = b.recent_steps / max(a.recent_steps, 1)
            grew = {p: b.parts[p] - a.parts[p] for p in names}
            window_grew = sum(grew[p] for p in _OF_WINDOW)
            growth = (f"\n\nFrom recent_s {a.recent_s:g} to {b.recent_s:g} s (recent steps ×{scale:.1f}): the CPU "
                      f"went {a.cpu_s:.3f} → {b.cpu_s:.3f} s; the parts that read the window grew by "
                      f"{window_grew:+.3f} s ("
                      + ", ".join(f"{p} {grew[p]:+.3f}" for p in _OF_WINDOW) + "), the rest by "
                      f"{sum(grew[p] for p in names if p not in _OF_WINDOW) + b.other - a.other:+.3f} s.")
        what = ("`Evaluator.evaluate` every 5 s: every job with something new judged whole"
                if kind == "periodic" else
                "`Evaluator.judge_arrivals` on a second of new steps: the sequential tests against the last "
                "periodic picture")
        against = ""
        for m in mine:
            ref = next((x for x in mine if x.path == "reference" and x.recent_s == m.recent_s), None)
            if m.path == "running" and ref is not None:
                against += (f"\n\nAt recent_s {m.recent_s:g} s the running path took {m.cpu_s / ref.cpu_s:.2f}× the "
                            f"reference's CPU ({m.cpu_s:.3f} against {ref.cpu_s:.3f} s; peer looks "
                            f"{m.parts['peer looks']:.3f} against {ref.parts['peer looks']:.3f} s).")
        sections.append(f"## {kind.capitalize()}: {what}\n\n" + table + growth + against)
    legend = "\n".join(f"- **{p}**: {what}" for p, what, _ in PARTS)
    _bench.report(args.name, "# Where an evaluation's CPU goes, against the recent window's length",
                  {"job": f"1 × {ranks:,} ranks, {args.step_s:g} s of compute a step (the steps a rank holds in each "
                          "window: the table's second column)", "timed cycles": str(cycles),
                   "note": "2 CPU cores shared with other work: compare the windows within this run"},
                  "CPU: the evaluating thread's, median over the timed cycles, unprofiled. Parts: shares of one "
                  "more cycle of the same kind run under cProfile, scaled to that CPU (a profiler slows Python "
                  "loops more than numpy calls: where the time goes, not exact seconds). *Other*: the rest (the "
                  "engine's own loop, findings and the alert lifecycle, profiler skew). *Reading the window*: the "
                  "parts that go over each rank's recent steps (read, rank features, step shares, sequential "
                  "test).\n\n" + legend,
                  *sections, quick=args.quick)


if __name__ == "__main__":
    raise SystemExit(main())
