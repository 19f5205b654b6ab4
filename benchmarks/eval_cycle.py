"""One evaluation cycle of the rules service at fleet scale, in process: wall and CPU time of
`Evaluator.evaluate` (expiry, snapshot, detectors, alert lifecycle), quiet and with pushes decoded and stored in
the same process, with the garbage collector as the service runs it, for one big job and for several smaller ones.

What the service does every `interval` seconds, without HTTP or a time-series database: the detection
benchmark's simulated cluster (benchmarks/detection/cluster.py: steps of ~2.6 s, scrapes every 5 s) is advanced
by one interval, every rank's new steps are stored through `RankStore.record` (columns, as the push API decodes
them), the new telemetry samples through `Evaluator.poll_telemetry` into a `GpuStore`, and then
`Evaluator.evaluate` runs: the same objects and the same code as the service, with its default RulesConfig.
Timed: wall (perf_counter), the evaluating thread's own CPU time (thread_time), and the time the cyclic garbage
collector spent in that window (gc.callbacks), with the daemon's collector thresholds (service.GC_THRESHOLDS).
Before the timed cycles, WARM_S of untimed ones (the jobs' baselines and structure learnt). Then each condition in
turn on the same jobs: quiet, and with a second thread decoding columnar push bodies (`payload.parse`) and
storing them (`RankStore.record`) at `--push-rate` records/s (0: as fast as it can), as ingest does in the
service: the wall/CPU gap then shows what sharing the interpreter with ingest costs; `--switch-interval` repeats
the push conditions under another `sys.setswitchinterval`. `--profile` adds a cProfile of one quiet cycle.

    python benchmarks/eval_cycle.py                  # ~8 min: 32,768 GPUs as 1 × 32,768 ranks and 4 × 8,192,
                                                     # quiet and with 65,536 pushed records/s
    python benchmarks/eval_cycle.py --quick          # seconds: 256 GPUs (smoke test)
    python benchmarks/eval_cycle.py --layouts 8192 --cycles 4 --recent-s 30 --recent-s 60 --recent-s 120 \
        --reference --name eval_cycle_window         # ~6 min: CPU per new step and per rank against recent_s,
                                                     # running statistics and the reference path in turn
"""

from __future__ import annotations

import cProfile
import gc
import io
import math
import pstats
import statistics
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _bench  # noqa: E402

from benchmarks.detection.cluster import Cluster, JobSpec  # noqa: E402
from benchmarks.detection.noise import Noise  # noqa: E402
from gpumond.config.rules import RulesConfig  # noqa: E402
from gpumond.rules.detectors.config import DetectorConfig  # noqa: E402
from gpumond.rules.evaluator import Evaluator  # noqa: E402
from gpumond.rules.service import GC_THRESHOLDS  # noqa: E402
from gpumond.rules.store import GpuStore, RankStore  # noqa: E402
from gpumond.rules.types import GpuSample, StepColumns, TelemetryBatch  # noqa: E402

INTERVAL_S = 5.0  # the service's default evaluation interval
# With judgements on arrival (--on-steps): telemetry is fetched on its own schedule (every 5 s by default), here
# between two periodic evaluations, so the pass after it measures the jobs' GPUs again (engine.Windowed): the
# dearer case for those passes.
FETCH_AT_S = 2
WARM_S = 80.0  # untimed cycles first: the baseline and the jobs' structure learnt, as in a running job
WINDOW_S = 310.0  # the cluster runs this long before the warm-up ends: every rank window holds a full 300 s


@dataclass(frozen=True, slots=True)
class Cycle:
    wall_s: float
    cpu_s: float
    gc_s: float  # the cyclic collector's time inside the timed window (any thread)
    feed_s: float  # untimed: storing the cycle's pushes and telemetry (what ingest does between evaluations)
    new_steps: int = 0  # steps stored since the previous evaluation


def build(layout: tuple[int, ...], seed: int = 0) -> tuple[Cluster, float]:
    """A cluster with one job per entry of `layout` (its ranks, 8 a node), run up to the warm-up's start."""
    jobs, first = [], 0
    for i, ranks in enumerate(layout):
        nodes = ranks // 8
        jobs.append(JobSpec(f"job-{i}", nodes, first_node=first, step_s=2.0))
        first += nodes
    c = Cluster(jobs, (), Noise(), seed=seed)
    now = c.t0 + WINDOW_S
    c.advance_to(now - WARM_S, telemetry_from=now - WARM_S - 70.0)
    return c, now


class Feed:
    """The simulated cluster as the service receives it: each rank's steps since its last push into the
    RankStore, and the samples scraped since the last fetch as a TelemetrySource."""

    name = "simulated"

    def __init__(self, cluster: Cluster) -> None:
        self.c = cluster
        self._pushed: dict[tuple[str, int], int] = {}
        self._fetched = -math.inf

    def advance(self, now: float) -> None:
        self.c.advance_to(now)
        for j in self.c.jobs:  # the simulator's own step objects: the service holds columns only
            for steps in j.recs:
                steps.clear()

    def push(self, store: RankStore, now: float) -> int:
        """Store every rank's steps since its last push; return how many steps were new."""
        new = 0
        for j in self.c.jobs:
            for w in j.windows(now).values():
                key = (w.info.job, w.info.rank)
                cols = w.columns
                i = int(np.searchsorted(cols.step, self._pushed.get(key, -1), "right"))
                if i < len(cols.step):
                    new += store.record(w.info, StepColumns(cols.step[i:], cols.values[:, i:]), w.last_push).accepted
                    self._pushed[key] = int(cols.step[-1])
                else:
                    store.record(w.info, StepColumns(cols.step[:0], cols.values[:, :0]), w.last_push)
        return new

    def fetch(self, need=None) -> TelemetryBatch:  # the simulated cluster's samples, whatever the need
        since, self._fetched = self._fetched, self.c.t
        # As a source decodes them: whole GpuSample objects (the simulator's fast ones lack the MIG fields).
        gpus = tuple(GpuSample(s.uuid, s.node, s.gpu, s.t, s.up, dict(s.values), s.jobs)
                     for dq in self.c.gpu_win.values() for s in dq if s.t > since)
        hosts = tuple(s for dq in self.c.host_win.values() for s in dq if s.t > since)
        return TelemetryBatch(self.c.t, gpus, hosts, self.c.absent)

    def close(self) -> None:
        pass


class GcTime:
    """Seconds the cyclic garbage collector ran since `take()` last asked (gc.callbacks)."""

    def __init__(self) -> None:
        self._t0 = 0.0
        self.total = 0.0
        self.full = 0  # generation-2 collections

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.total += time.perf_counter() - self._t0
            self.full += info.get("generation") == 2

    def take(self) -> float:
        out, self.total = self.total, 0.0
        return out


class Pushes:
    """A thread decoding and storing 64-step columnar pushes for ranks of a job the evaluator never sees, at
    `rate` records/s (0: as fast as it can)."""

    def __init__(self, rate: float) -> None:
        self._rate = rate
        from gpumond.config.rules import LimitsConfig
        from gpumond.job.payload import encode_head, encoder
        from gpumond.push.body import columns_model
        from gpumond.rules.store import RankStore

        limits = LimitsConfig()
        self._model = columns_model(limits.max_string_len, limits.max_steps_per_push)
        self._store = RankStore(window_s=300.0, expire_after_s=600.0, max_jobs=16, max_ranks=1 << 16,
                                max_gpus=1 << 16, max_steps_per_rank=256, max_steps_held=1 << 24)
        self._bodies = []
        now = time.time()
        encode = encoder("columns")
        for r in range(256):
            head = {"job": "ingest", "rank": r, "world_size": 256, "node": f"in-{r // 8}",
                    "gpu_uuid": f"GPU-{r:08x}-0000-4000-8000-000000000000"}
            # The SDK's own encoder: (step, end, duration, data wait, samples, comm wait), ends on the unix clock.
            records = [(i, now - (64 - i) * 0.5, 0.84, 0.02, None, 0.11) for i in range(64)]
            self._bodies.append(encode(encode_head(head, "columns"), records, 0.0, 0.0))
        self._stop = threading.Event()
        self.records = 0
        self.cpu_s = self.elapsed_s = 0.0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        from gpumond.push.body import parse

        t0, began = time.thread_time(), time.perf_counter()
        i = 0
        while not self._stop.is_set():
            if self._rate and self.records >= self._rate * (time.perf_counter() - began):
                self._stop.wait(0.002)  # ahead of the rate: idle, as ingest between requests
                continue
            push = parse(self._model, self._bodies[i % len(self._bodies)])
            # After the first round these are retries of held steps: the store's duplicate check, still a push.
            self._store.add(push.rank_info(), push.step_columns(), time.time())
            self.records += 64
            i += 1
        self.cpu_s = time.thread_time() - t0
        self.elapsed_s = time.perf_counter() - began

    def __enter__(self) -> Pushes:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


@dataclass(frozen=True, slots=True)
class Condition:
    """What runs beside the timed evaluations: concurrent pushes, and the interpreter's switch interval."""

    pushes: float | None  # records/s pushed meanwhile (0: as fast as the thread can); None: no pushes
    switch_s: float | None = None  # None: the interpreter's default

    @property
    def name(self) -> str:
        sw = "" if self.switch_s is None else f", switch {self.switch_s * 1e3:g} ms"
        what = "quiet" if self.pushes is None else "pushes " + (f"{self.pushes:,.0f}/s" if self.pushes else "unpaced")
        return what + sw


def run(layout: tuple[int, ...], cycles: int, conditions: list[Condition], profile: bool,
        recent_s: float = DetectorConfig().recent_s, reference: bool = False, on_steps: int = 0) -> dict:
    """Build and warm up once, then `cycles` timed cycles of INTERVAL_S under each condition in turn (the same
    jobs, going on); with `profile`, one more quiet cycle under cProfile. `recent_s`: the detectors' window.
    `reference`: a second evaluator on the same stores runs the reference path (no running statistics:
    Evaluator(running=False)) on every cycle too, the two in turn (which first alternates), each timed alone.
    `on_steps`: then this many cycles as the service runs them with judge_on_steps: every second the steps pushed,
    and the jobs whose steps landed judged on arrival (`Evaluator.judge_arrivals`, resting as the service does),
    then the periodic evaluation (which judges those jobs again: engine.Judged.arrival says why)."""
    t_build = time.perf_counter()
    c, now = build(layout)
    config = RulesConfig.model_validate({"tokens": ["x" * 20]})
    ranks, gpus = RankStore.from_config(config), GpuStore.from_config(config)
    feed = Feed(c)
    clock = [now - WARM_S]
    detectors = replace(DetectorConfig(), recent_s=recent_s)
    ev = Evaluator(ranks, gpus, feed, clock=lambda: clock[0], detectors=detectors)
    # Sharing the stores is sound here: no job ends, and each evaluator reads its own snapshot of them.
    ref = Evaluator(ranks, gpus, None, clock=lambda: clock[0], detectors=detectors, running=False) \
        if reference else None
    new = [0]

    def cycle() -> float:
        clock[0] += INTERVAL_S
        feed.advance(clock[0])
        f0 = time.perf_counter()
        new[0] = feed.push(ranks, clock[0])
        ev.poll_telemetry()
        return time.perf_counter() - f0

    while clock[0] < now:
        cycle()
        ev.evaluate()
        if ref is not None:
            ref.evaluate()
    t_build = time.perf_counter() - t_build
    by_condition = {}
    default_switch = sys.getswitchinterval()
    for cond in conditions:
        out: list[Cycle] = []
        out_ref: list[Cycle] = []
        gc_time = GcTime()
        gc.callbacks.append(gc_time)
        load = Pushes(cond.pushes) if cond.pushes is not None else None
        if cond.switch_s is not None:
            sys.setswitchinterval(cond.switch_s)
        if load is not None:
            load.__enter__()
        try:
            for i in range(cycles):
                feed_s = cycle()
                both = [(ev, out), (ref, out_ref)] if ref is not None else [(ev, out)]
                for evaluator, into in both if i % 2 == 0 else both[::-1]:
                    gc_time.take()
                    w0, c0 = time.perf_counter(), time.thread_time()
                    evaluator.evaluate()
                    into.append(Cycle(time.perf_counter() - w0, time.thread_time() - c0, gc_time.take(), feed_s,
                                      new[0]))
                if ref is not None:  # the same findings on both paths, cycle after cycle
                    assert repr(ev.findings()) == repr(ref.findings()), "running and reference paths differ"
        finally:
            if load is not None:
                load.__exit__()
            sys.setswitchinterval(default_switch)
            gc.callbacks.remove(gc_time)
        by_condition[cond] = {"cycles": out, "reference_cycles": out_ref, "full_gcs": gc_time.full,
                              "push_records_per_s": load.records / load.elapsed_s if load else None}
        print(f"{_layout_name(layout)} recent_s {recent_s:g} {cond.name}: " + "; ".join(  # as it goes: a long run cut short still says it
            f"wall {x.wall_s:.3f} s cpu {x.cpu_s:.3f} s gc {x.gc_s:.3f} s" for x in out), flush=True)
    result = {"layout": layout, "conditions": by_condition, "steps_held": ranks.counts().steps,
              "build_s": t_build, "samples_held": gpus.counts().samples, "findings": len(ev.findings())}
    if on_steps:
        result["on_steps"] = _on_steps(ev, feed, ranks, clock, on_steps)
    if profile:
        cycle()
        pr = cProfile.Profile()
        pr.runcall(ev.evaluate)
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(30)
        result["profile"] = s.getvalue().split("\n", 1)[1].replace(str(_bench.REPO) + "/", "")
    return result


def _on_steps(ev: Evaluator, feed: Feed, ranks: RankStore, clock: list[float],
              cycles: int) -> list[tuple[float, float, int]]:
    """(CPU of the judgements on arrival in the interval, CPU of the periodic evaluation after them, how many passes
    of judgements on arrival there were) per cycle."""
    out = []
    ready_at = clock[0]  # the service's judge rests after each pass so that passes take at most max_busy of a core
    for _ in range(cycles):
        arrivals, passes = 0.0, 0
        for second in range(int(INTERVAL_S)):
            clock[0] += 1.0
            feed.advance(clock[0])
            feed.push(ranks, clock[0])
            if second == FETCH_AT_S:
                ev.poll_telemetry()
            # The last second's steps land as the periodic evaluation starts; a pass is due once its rest is over.
            if second < INTERVAL_S - 1 and clock[0] >= ready_at:
                c0 = time.thread_time()
                rest, _ = ev.judge_arrivals()
                took = time.thread_time() - c0
                arrivals += took
                passes += 1
                ready_at = clock[0] + took + rest
        c0 = time.thread_time()
        ev.evaluate()
        out.append((arrivals, time.thread_time() - c0, passes))
    return out


def _layout_name(layout: tuple[int, ...]) -> str:
    return f"{len(layout)} × {layout[0]:,}" if len(set(layout)) == 1 else " + ".join(f"{x:,}" for x in layout)


def main(argv: list[str] | None = None) -> int:
    ap = _bench.parser(__doc__, "256 GPUs, one cycle a condition")
    ap.add_argument("--cycles", type=int, default=4, help="timed cycles per layout and condition (default 4)")
    ap.add_argument("--profile", action="store_true", help="cProfile one quiet cycle of each layout (to the results)")
    ap.add_argument("--layouts", default="32768;8192,8192,8192,8192",
                    help="jobs' ranks, comma-separated, layouts separated by ';' (default: 1 × 32,768 and 4 × 8,192)")
    ap.add_argument("--push-rate", type=float, action="append", default=None, metavar="RECORDS_PER_S",
                    help="also time cycles with a thread pushing this many records/s meanwhile (0: as fast as it can; "
                         "repeatable; default 65,536, a 32,768-rank job's two steps a second)")
    ap.add_argument("--switch-interval", type=float, action="append", default=[], metavar="S",
                    help="also time cycles with pushes under sys.setswitchinterval(S) (repeatable; the default is "
                         "the interpreter's, 0.005 s)")
    ap.add_argument("--recent-s", type=float, action="append", default=None, metavar="S",
                    help="the detectors' recent window (recent_s); repeatable: the same layouts at each, side by side, "
                         "for the CPU per new step and per rank against the window's length (default: 60)")
    ap.add_argument("--reference", action="store_true",
                    help="also time the reference path (no running statistics: Evaluator(running=False)) on the same "
                         "cycles, in turn with the running path, and check both give the same findings")
    ap.add_argument("--on-steps", type=int, default=0, metavar="CYCLES",
                    help="then time this many cycles with judgements on arrival every second before each periodic "
                         "evaluation (judge_on_steps, as the service runs), quiet")
    ap.add_argument("--name", default="eval_cycle", help="results file name under benchmarks/results/")
    args = ap.parse_args(argv)
    gc.set_threshold(*GC_THRESHOLDS)  # the daemon's collector settings (service.serve sets them)
    if args.push_rate is None:
        args.push_rate = [65536.0]
    layouts = [tuple(int(x) for x in part.split(",")) for part in args.layouts.split(";") if part]
    cycles = args.cycles
    if args.quick:
        layouts, cycles = [(256,), (128, 128)], 1
    conditions = [Condition(None)] + [Condition(rate) for rate in args.push_rate] \
        + [Condition(rate, x) for rate in args.push_rate for x in args.switch_interval]
    rows, profiles, per_step, on_steps = [], [], [], []
    windows = args.recent_s or [DetectorConfig().recent_s]
    for layout, recent_s in ((x, w) for x in layouts for w in windows):
        r = run(layout, cycles, conditions, args.profile and recent_s == windows[0], recent_s, args.reference,
                args.on_steps)
        if "on_steps" in r:
            quiet = statistics.median(x.cpu_s for x in r["conditions"][conditions[0]]["cycles"])
            arrivals = statistics.median(a for a, _, _ in r["on_steps"])
            tick = statistics.median(t for _, t, _ in r["on_steps"])
            each = statistics.median(a / n for a, _, n in r["on_steps"] if n)
            on_steps.append((_layout_name(layout), f"{recent_s:g} s", f"{quiet:.3f} s", f"{arrivals:.3f} s",
                             " ".join(str(n) for _, _, n in r["on_steps"]), f"{each:.3f} s",
                             f"{tick:.3f} s", " ".join(f"{a:.3f} + {t:.3f}" for a, t, _ in r["on_steps"]),
                             f"{(arrivals + tick) / INTERVAL_S:.0%}"))
        for cond, m in r["conditions"].items():
            cyc = m["cycles"]
            wall = statistics.median(x.wall_s for x in cyc)
            cpu = statistics.median(x.cpu_s for x in cyc)
            gcs = statistics.median(x.gc_s for x in cyc)
            new = statistics.median(x.new_steps for x in cyc)
            paths = [("running", cyc)] + ([("reference", m["reference_cycles"])] if args.reference else [])
            for path, timed in paths:
                used = statistics.median(x.cpu_s for x in timed)
                per_step.append((_layout_name(layout), f"{recent_s:g} s", cond.name, path, f"{new:,.0f}",
                                 f"{used:.3f} s", f"{used / max(new, 1) * 1e6:.2f} µs",
                                 f"{used / sum(layout) * 1e6:.1f} µs"))
            rows.append((_layout_name(layout) + (f", recent_s {recent_s:g}" if len(windows) > 1 else ""),
                         cond.name, f"{r['steps_held']:,}",
                         f"{r['samples_held']:,}", f"{wall:.3f} s", f"{cpu:.3f} s", f"{cpu / INTERVAL_S:.0%}",
                         f"{gcs:.3f} s", str(m["full_gcs"]),
                         f"{m['push_records_per_s']:,.0f}" if m["push_records_per_s"] else "–",
                         " ".join(f"{x.wall_s:.2f}" for x in cyc), str(r["findings"])))
        if "profile" in r:
            profiles.append(f"### cProfile of one quiet cycle, {_layout_name(layout)}\n\n```\n{r['profile'].strip()}\n```")
        _report(args, layouts, cycles, rows, profiles, per_step, on_steps)  # a run cut short keeps what it measured
    return 0


def _report(args, layouts: list[tuple[int, ...]], cycles: int, rows: list, profiles: list[str],
            per_step: list, on_steps: list) -> None:
    against = _bench.md_table(("jobs × ranks", "recent_s", "beside it", "path", "new steps a cycle", "evaluate CPU",
                               "CPU per new step", "CPU per rank"), per_step)
    table = _bench.md_table(("jobs × ranks", "beside it", "steps held", "GPU samples held", "evaluate wall",
                             "evaluate CPU", f"CPU share at {INTERVAL_S:g} s", "GC in it", "full GCs",
                             "push records/s meanwhile", "each cycle (wall s)", "findings"), rows)
    _bench.report(args.name, "# One evaluation cycle at fleet scale (in process)",
                  {"GPUs": " / ".join(_layout_name(x) for x in layouts), "timed cycles": str(cycles),
                   "note": "2 CPU cores shared with other work: ratios within this run, not absolute figures"},
                  "## Evaluation per cycle\n\nMedian over the timed cycles (GC: median time the cyclic collector ran "
                  "inside one timed evaluation; full GCs: generation-2 collections in all timed cycles); every "
                  f"cycle judges the steps pushed since the previous one ({INTERVAL_S:g} s of jobs stepping every "
                  "~2.6 s). Findings: pending and firing at the end (no fault is planted).\n\n" + table,
                  "## Against the window's length\n\nThe same cycles per new step (stored since the previous "
                  "evaluation) and per rank, for each `recent_s` (`--recent-s`): an evaluation that cost only what "
                  "is new would hold these flat as the window grows. Path: `running`, the service's (running statistics: each "
                  "job's per-step peer medians kept between its judgements, detectors/peer_rows.py); `reference` "
                  "(`--reference`), every median found afresh, timed on the same cycles in turn with it.\n\n" + against,
                  *([_ON_STEPS + _bench.md_table(("jobs × ranks", "recent_s", "periodic evaluation alone",
                                                  "judgements on arrival in the interval",
                                                  "passes a cycle", "one judgement on arrival",
                                                  "periodic evaluation after them", "each cycle (CPU s)",
                                                  "share of a core"),
                                                 on_steps)] if on_steps else []),
                  *profiles, quick=args.quick)


_ON_STEPS = ("## With judgements on arrival\n\nQuiet cycles as the service runs them with `judge_on_steps` "
             "(`--on-steps`): every second the steps pushed since, and the jobs whose steps landed judged on arrival "
             "(a pass rests as the service's does, so that passes take at most `max_busy`, half a core; telemetry is "
             f"fetched {FETCH_AT_S} s into the interval, so the pass after it measures the GPUs again), then the "
             "periodic evaluation, which judges every job with something new again. CPU of the evaluating thread, "
             "median over the cycles; the first column is the quiet periodic evaluation above; the last, evaluation's "
             "share of one core over the interval.\n\n")


if __name__ == "__main__":
    raise SystemExit(main())
