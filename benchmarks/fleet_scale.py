"""The rules service at fleet scale, end to end: pushes over HTTP, telemetry from a real VictoriaMetrics, evaluation.

One command, bounded: starts Debian's `victoria-metrics` on 127.0.0.1 and, every simulated cycle, imports one
scrape of synthetic agent series for NODES nodes × 8 GPUs (its `/api/v1/import/prometheus` API, the agent's
metric names and labels: gpumond_gpu_info, gpumond_gpu_up, SM clock, power, utilization, temperature, energy,
the clock-event reasons the service reads, host CPU / iowait / disk / memory, `up`) with planted faults: slow
GPUs (SM clock 0.72×, power 0.6×) and starved GPUs (utilization 0.15, power 0.3). The jobs: one job with a rank
on every GPU of the NODES nodes (32,768 ranks at the default 4,096 nodes) and SMALL jobs of 8 ranks on 8 more
GPUs each; the starved GPUs' ranks push a data wait of half the step, the slow GPUs' ranks a comm wait near 0
(the slowest rank waits least), every other rank ~0.1 s; each step's duration and waits vary by a few per cent.
Silent stragglers (`--onsets`, three by default, one after another on ranks of their own): from its onset a
rank's steps are 1.25× long for `--episode-s` (every rank waits for it, so its peers' comm wait grows by the
difference) while its GPU's telemetry stays as any other's.

The rules service's own app (`gpumond.rules.http.build_app`, the daemon's guarded protocol, its GC
thresholds) serves under uvicorn in this process; PUSHERS load-generator processes send it what the ranks send
(benchmarks/_fleet_pushes.py): each rank's job SDK on its own cadence, a push every 5 s at its phase and an early
push after a step that stands out (gpumond/job/early.py), in the columnar encoding, straight to the shard
(`--via direct`) or to its node's relay, which forwards one batch per node every 2 s and soon after an early push
(`--via relay`, the format
the agent's relay sends: gpumond.wire.batch), over keep-alive connections. The simulated clock advances a second
at a time (a tick): what was sent up to it is pushed, then the service's own `Evaluator` (the real
`PrometheusSource` over the same store) runs at the service's default cadence: `evaluate()` every
evaluation_interval_s (5 s), and between, when the judge-on-steps thread would be free (its max_busy rest after
a pass, the pass's wall seconds taken as simulated ones), `judge_arrivals()` for the jobs whose steps landed.
Every 10 s (a cycle) a scrape is imported into VictoriaMetrics and `poll_telemetry()` fetches (the queries, the
join, GpuStore.add). The phases run one after another, so each is measured alone; the daemon overlaps them.
The shard's CPU is measured directly: this process's CPU over the run (less the scrape's generation and
import, the harness's work) per simulated second, split into ingest, fetch, periodic evaluations and
judgements on steps; and for each silent straggler, the simulated seconds from its onset to its finding firing.

As 1 shard (one evaluator owns every job), sustained for `--duration` wall seconds and at least until the service's
300 s window has filled (FILL_CYCLES cycles) and the last straggler's episode ended, then as 4 shards (each
shard's service gets the pushes of the jobs crc32(job) mod 4 routes to it, as the SDK routes, and fetches
telemetry for what its own jobs need, as a real shard does; `--cycles` cycles each, one after another).
Reported: the shard's CPU and the stragglers' latencies, per cycle fetch and evaluation seconds, ingest records/s
and server CPU per record, request p50/p99, RSS over time, and the findings against the planted faults (found,
missed, anything else at any cycle).

Telemetry is fetched for what the evaluator's detectors need (`--fetch need`, `--detail-s`), and by default (`--fetch
both`) also as before, every GPU every fetch, at the same instant into a store of its own: each fetch's wall,
series answered and VictoriaMetrics CPU (its /proc stat) side by side, in one run.

    python benchmarks/fleet_scale.py --one-shard-only --fetch need --detail-s 60 --via direct \
        --out fleet_scale_direct                # the shard at its defaults, ranks pushing directly (~30 min)
    python benchmarks/fleet_scale.py --one-shard-only --fetch need --detail-s 60 --via relay \
        --out fleet_scale_relay                 # the same through node relays (~25 min)
    python benchmarks/fleet_scale.py            # 4,096 + 64 × 1 nodes, 1 shard until its window is full,
                                                # then 4 shards, with --fetch both (~1 h)
    python benchmarks/fleet_scale.py --one-shard-only --sustain-cycles 13 --detail-s 120 \
        --out fleet_scale_detail_120            # another detail cadence beside it
    python benchmarks/fleet_scale.py --quick    # 64 nodes, seconds (smoke test)
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _bench  # noqa: E402
import _fleet_pushes as fp  # noqa: E402

VM = "/usr/bin/victoria-metrics"
GPUS_PER_NODE = 8
CYCLE_S = 10.0
TICK_S = 1.0  # what the ranks send, and the judgements on steps, advance a second at a time
TICKS_PER_CYCLE = round(CYCLE_S / TICK_S)
# The 1-shard run's least cycles: the rules service's 300 s window filled (its held steps then stop rising: the
# steady state a long-running job is in, or the store's max_steps_held cap first).
FILL_CYCLES = int(300 / CYCLE_S) + 1
STEP_S = 0.5
START = 1_763_760_000.0
SMALL_RANKS = 8
PUSHERS = 4  # load-generator processes, one keep-alive connection each
TOKEN = "fleet-scale-benchmark-token"
# The clock-event reasons the service selects (signals.GPU_SERIES); the agent exports every reason of every GPU.
MASK = "gpumond_gpu_clocks_event_reasons_bitmask"
# The silent stragglers' episodes: onsets (simulated s after the start), each this long and slow. Each begins a
# minute after the one before ended: a rank's SDK judges a step against its last minute of steps, so a slowdown
# right after another is no longer a step that stands out (no early push), as on a real job.
ONSETS_S = (60.0, 160.0, 260.0)
EPISODE_S = 40.0
SLOWDOWN = 1.25
REASONS = ("hw_thermal_slowdown", "sw_thermal_slowdown", "hw_slowdown", "sw_power_cap", "hw_power_brake_slowdown")


def uuid(node: int, gpu: int) -> str:
    return f"GPU-{node:08x}-{gpu:04x}-4000-8000-000000000000"


class Fleet:
    """The synthetic fleet: nodes, jobs, the planted faults."""

    def __init__(self, nodes: int, small: int, faults: int, mask: bool = True,
                 onsets: tuple[float, ...] = ONSETS_S, episode_s: float = EPISODE_S) -> None:
        self.mask = mask
        self.big_nodes = nodes
        self.nodes = nodes + small  # each small job on a node of its own
        self.small = small
        self.slow = {(n * 97 + 5) % nodes * GPUS_PER_NODE + 3 for n in range(faults)}  # big-job ranks
        self.starved = {(n * 89 + 11) % nodes * GPUS_PER_NODE + 6 for n in range(faults)} - self.slow
        self.small_slow = {0} if small else set()  # small job 0's rank 2
        # Silent stragglers (their steps SLOWDOWN × long, their telemetry as any other GPU's), one after another,
        # each on a node of its own (GPU 5: no other planted fault there).
        self.episodes = tuple(fp.Episode((n * 131 + 29) % nodes * GPUS_PER_NODE + 5, START + onset, episode_s, SLOWDOWN)
                              for n, onset in enumerate(onsets))

    def scrape(self, t: float) -> bytes:
        """One scrape of every agent at `t`, in the text exposition with timestamps (ms)."""
        ms = int(t * 1000)
        lines = []
        for node in range(self.nodes):
            inst = f'job="gpumond-agent",instance="node-{node:05d}:9480"'
            lines.append(f"up{{{inst}}} 1 {ms}")
            for gpu in range(GPUS_PER_NODE):
                g = f'{inst},gpu="{gpu}",uuid="{uuid(node, gpu)}"'
                rank = node * GPUS_PER_NODE + gpu
                slow = (node < self.big_nodes and rank in self.slow) or \
                    (node >= self.big_nodes and node - self.big_nodes in self.small_slow and gpu == 2)
                starved = node < self.big_nodes and rank in self.starved
                clock = 1.98e9 * (0.72 if slow else 1.0) * (1 + 0.002 * ((rank * 7 + ms // 1000) % 5))
                power = 700.0 * (0.6 if slow else 0.3 if starved else 0.92) * (1 + 0.003 * ((rank + ms // 1000) % 7))
                util = 0.15 if starved else 0.99
                lines += [f"gpumond_gpu_info{{{g},name=\"NVIDIA H100 80GB HBM3\"}} 1 {ms}",
                          f"gpumond_gpu_up{{{g}}} 1 {ms}",
                          f"gpumond_gpu_sm_clock_hertz{{{g}}} {clock:.0f} {ms}",
                          f"gpumond_gpu_sm_clock_max_hertz{{{g}}} 1980000000 {ms}",
                          f"gpumond_gpu_power_watts{{{g}}} {power:.1f} {ms}",
                          f"gpumond_gpu_power_limit_watts{{{g}}} 700 {ms}",
                          f"gpumond_gpu_utilization_ratio{{{g}}} {util} {ms}",
                          f"gpumond_gpu_temperature_celsius{{{g}}} {62 + rank % 9} {ms}",
                          f"gpumond_gpu_energy_joules_total{{{g}}} {power * (t - START + 1e5):.0f} {ms}"]
                lines += [f'gpumond_gpu_clocks_event_active{{{g},reason="{r}"}} 0 {ms}' for r in REASONS]
                if self.mask:  # the agent's bitmask of the same reasons (one series a GPU), unless an older agent
                    lines.append(f"{MASK}{{{g}}} 0 {ms}")
            lines += [f"gpumond_host_cpu_utilization_ratio{{{inst}}} 0.3 {ms}",
                      f"gpumond_host_cpu_iowait_ratio{{{inst}}} 0.01 {ms}",
                      f"gpumond_host_disk_read_bytes_total{{{inst}}} {int((t - START) * 5e7)} {ms}",
                      f"gpumond_host_memory_used_bytes{{{inst}}} 6e11 {ms}"]
        return ("\n".join(lines) + "\n").encode()

    def jobs(self) -> list[tuple[str, list[tuple[int, int, int]]]]:
        """(job, [(rank, node, gpu)]) of every job."""
        big = [(r, r // GPUS_PER_NODE, r % GPUS_PER_NODE) for r in range(self.big_nodes * GPUS_PER_NODE)]
        out = [("big-job", big)]
        for j in range(self.small):
            out.append((f"small-job-{j:03d}", [(r, self.big_nodes + j, r) for r in range(SMALL_RANKS)]))
        return out

    def planted(self) -> set[tuple[str, str, int]]:
        """(kind family, job, rank) the detectors should name."""
        out = {("straggler", "big-job", r) for r in self.slow} | {("io_starved", "big-job", r) for r in self.starved}
        return out | {("straggler", f"small-job-{j:03d}", 2) for j in self.small_slow}


def _kind(fleet: Fleet, job: str, rank: int) -> str:
    if job == "big-job":
        return "slow" if rank in fleet.slow else "starved" if rank in fleet.starved else "base"
    return "slow" if rank == 2 and int(job[-3:]) in fleet.small_slow else "base"


def _pusher(port: int, nodes: list[list], via: str, episodes: tuple, index: int, orders: mp.Queue,
            done: mp.Queue, relay_interval_s: float = fp.RELAY_INTERVAL_S) -> None:
    """A load-generator process: its nodes' ranks' SDKs (and with `via` relay their relays, _fleet_pushes). For each
    order (simulated time, tick) it sends what they send the shard up to that time, one request at a time over a
    keep-alive connection; replies with the latencies, failures, steps accepted, requests and early pushes."""
    import http.client

    import numpy as np

    from gpumond.wire.media import BATCH_COLUMNS_TYPE, CONTENT_TYPES

    senders = fp.Senders(nodes, via, START, STEP_S, episodes, relay_interval_s)
    batch = via == "relay"
    headers = {"Content-Type": BATCH_COLUMNS_TYPE if batch else CONTENT_TYPES["columns"],
               "Authorization": f"Bearer {TOKEN}"}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    while (order := orders.get()) is not None:
        t, tick = order
        bodies = senders.tick(t, np.random.default_rng((tick, index)))  # the same run, the same steps
        lat, failed, accepted = [], [], 0
        for body, steps in bodies:
            t0 = time.perf_counter()
            for attempt in (1, 2):
                try:
                    conn.request("POST", "/api/v1/push", body, headers)
                    resp = conn.getresponse()
                    text = resp.read()
                    break
                except (OSError, http.client.HTTPException) as e:
                    # The server closes a keep-alive connection idle past its deadline (the fetch and evaluation
                    # phases are longer): reconnect and send again once, as an HTTP client does on a stale one.
                    conn.close()
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                    if attempt == 2:
                        failed.append(f"{type(e).__name__}: {e}")
            else:
                continue
            lat.append(time.perf_counter() - t0)
            got = _bench.accepted_steps(resp.status, text, batch)
            accepted += got
            if got != steps:
                failed.append(f"HTTP {resp.status}, {got} of {steps} steps accepted: {text[:200]!r}")
        done.put((lat, failed[:5], len(failed), accepted, len(bodies), senders.early()))
    conn.close()


class Service:
    """The rules service's app under uvicorn in this process (the daemon's protocol and GC thresholds), over a
    RankStore the harness's evaluator reads; PUSHERS processes push to it, directly or as the nodes' relays."""

    def __init__(self, fleet: Fleet, owns, clock: list[float], via: str = "direct",
                 relay_interval_s: float = fp.RELAY_INTERVAL_S) -> None:
        import uvicorn

        from gpumond.config.rules import RulesConfig
        from gpumond.web.connections import ConnectionLimits
        from gpumond.web.protocols import guarded_protocol
        from gpumond.rules.http import build_app
        from gpumond.rules.ingest.stats import IngestStats
        from gpumond.rules.store import RankStore

        # One load generator per connection on one address: the per-client push rate would refuse it.
        self.config = RulesConfig.model_validate({"tokens": [TOKEN], "limits": {
            "pushes_per_second_per_client": 1e6, "burst": 1_000_000}})
        self.ranks = RankStore.from_config(self.config)
        self.stats = IngestStats(self.ranks)
        app = build_app(config=self.config, rank_store=self.ranks, findings=list, metrics=lambda: b"",
                        ready=lambda: (True, "ok"), clock=lambda: clock[0], stats=self.stats)
        self.port = _bench.free_port()
        nodes: dict[str, list[fp.Rank]] = {}
        for job, ranks in fleet.jobs():
            for rank, node, gpu in ranks if owns(job) else ():
                nodes.setdefault(f"node-{node:05d}", []).append(
                    fp.Rank(job, rank, len(ranks), f"node-{node:05d}", uuid(node, gpu), _kind(fleet, job, rank)))
        mine = list(nodes.values())
        # Forked before the server's thread starts (a fork copies only the forking thread); they connect later.
        ctx = mp.get_context("fork")
        self._orders = [ctx.Queue() for _ in range(PUSHERS)]
        self._done = ctx.Queue()
        self._procs = [ctx.Process(target=_pusher, args=(self.port, mine[i::PUSHERS], via, fleet.episodes, i, q,
                                                         self._done, relay_interval_s), daemon=True)
                       for i, q in enumerate(self._orders)]
        for p in self._procs:
            p.start()
        http, _ = guarded_protocol(ConnectionLimits())
        self._server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                     access_log=False, http=http, lifespan="off"))
        self._thread = threading.Thread(target=self._server.run, name="uvicorn", daemon=True)
        self._thread.start()
        _bench.wait_http(f"http://127.0.0.1:{self.port}/healthz", 30)
        self.ranks_pushed = sum(len(r) for r in mine)

    def push(self, t: float, tick: int) -> dict:
        """What every owned rank (or node relay) sends up to simulated time `t`, through HTTP; wall, server CPU,
        latencies, requests, early pushes so far."""
        cpu0, t0 = time.process_time(), time.perf_counter()
        for q in self._orders:
            q.put((t, tick))
        lat: list[float] = []
        failures: list[str] = []
        failed = records = requests = early = 0
        for _ in self._procs:
            got, why, n, stored, sent, early_so_far = self._done.get(timeout=1800)
            lat += got
            failures += why
            failed += n
            records += stored
            requests += sent
            early += early_so_far
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        return {"wall_s": wall, "cpu_s": cpu, "lat": lat, "failed": failed, "failures": failures[:3],
                "records": records, "requests": requests, "early": early}

    def close(self) -> None:
        _bench.stop_workers(self._orders, self._procs)
        self._server.should_exit = True
        self._thread.join(timeout=30)


class Timed:
    """Forwards to `inner`, adding up the wall seconds spent in the methods named: where an evaluation goes,
    measured around the stores and the source the evaluator is given (their code unchanged)."""

    def __init__(self, inner, names: tuple[str, ...]) -> None:
        self._inner = inner
        self.spent = dict.fromkeys(names, 0.0)

    def __getattr__(self, name: str):
        attr = getattr(self._inner, name)
        if name not in self.spent:
            return attr

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return attr(*args, **kwargs)
            finally:
                self.spent[name] += time.perf_counter() - t0
        return timed

    def take(self) -> dict[str, float]:
        """The seconds spent since the last take, by method."""
        out, self.spent = self.spent, dict.fromkeys(self.spent, 0.0)
        return out


def _profiled(call):
    """`call()` under cProfile; the functions that took most of it (cumulative) to stderr."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    try:
        return prof.runcall(call)
    finally:
        pstats.Stats(prof, stream=sys.stderr).sort_stats("cumulative").print_stats(30)


class Counted:
    """A PrometheusSource whose answers are counted (series answered since the last take), and which ignores the
    evaluator's TelemetryNeed when `legacy` (every GPU, every fetch: the fetch before it had one)."""

    def __init__(self, source, legacy: bool) -> None:
        self.source, self.name, self._legacy = source, source.name, legacy
        self.series = 0
        query = source._query  # noqa: SLF001 - counted where the answers are decoded, the source's code unchanged

        def counted(promql: str, t: float):
            rows = query(promql, t)
            if not isinstance(rows, str):
                self.series += len(rows)
            return rows
        source._query = counted  # noqa: SLF001

    def fetch(self, need=None):
        return self.source.fetch(None if self._legacy else need)

    def take(self) -> int:
        out, self.series = self.series, 0
        return out

    def close(self) -> None:
        self.source.close()


def run_shard(url: str, fleet: Fleet, shard: tuple[int, int] | None, cycles: int, duration_s: float,
              importer, vm_pid: int, fetch: str = "both", detail_s: float = 0.0, profile: bool = False,
              via: str = "direct", on_steps: bool = True, relay_interval_s: float = fp.RELAY_INTERVAL_S,
              evaluation_interval_s: float | None = None, max_busy: float | None = None) -> dict:
    """Cycles of 10 simulated seconds for one shard's service, one second (a tick) at a time: every tick what the
    ranks (or their nodes' relays, `via`) send over HTTP, then a periodic evaluation every evaluation_interval_s
    (5 s, the default) or else, when the service's judge-on-steps thread would be free, a judgement of the jobs
    whose steps landed (`Evaluator.judge_arrivals`, its cadence the default judge_on_steps); every cycle's first
    tick also imports a scrape into VictoriaMetrics and fetches telemetry. Measurements per cycle, the process's
    CPU by phase, and when each silent straggler's finding fired.

    `fetch`: `need` (the evaluator's TelemetryNeed narrows the fetch, `detail_s` its cadence), `legacy` (every
    GPU, every fetch), or `both`: the evaluator on `need`, and a `legacy` fetch into a store of its own at the same
    instant each cycle, measured alike (its wall, series answered and VictoriaMetrics CPU), whose newest samples
    of the suspects' GPUs are compared with the evaluator's."""
    import psutil

    from gpumond.config.rules import RulesConfig
    from gpumond.rules.evaluator import Evaluator
    from gpumond.rules.store import GpuStore
    from gpumond.rules.telemetry.promql import PrometheusSource
    from gpumond.rules.telemetry.promql_join import IDENTITY
    from gpumond.wire.routing import shard_of

    def owns(job: str) -> bool:
        return shard is None or shard_of(job, shard[1]) == shard[0]

    clock = [START]
    me = psutil.Process()
    gc.collect()
    rss0 = me.memory_info().rss
    service = Service(fleet, owns, clock, via, relay_interval_s)
    # The service's defaults: its cadence (judge_on_steps off with `on_steps` False, to see what it adds).
    config = RulesConfig.model_validate({"tokens": ["x" * 20],
                                         "judge_on_steps": {"enabled": on_steps,
                                                            **({"max_busy": max_busy} if max_busy is not None else {})},
                                         **({"evaluation_interval_s": evaluation_interval_s}
                                            if evaluation_interval_s is not None else {})})
    gpus = GpuStore.from_config(config)
    source = PrometheusSource(url, clock=lambda: clock[0], timeout_s=60.0, detail_s=detail_s)
    counted = Counted(source, legacy=fetch == "legacy")
    shadow = Counted(PrometheusSource(url, clock=lambda: clock[0], timeout_s=60.0), legacy=True) \
        if fetch == "both" else None
    shadow_gpus = GpuStore.from_config(config)
    timed_source = Timed(counted, ("fetch",))
    timed_ranks = Timed(service.ranks, ("take_ended", "expire", "jobs"))
    timed_gpus = Timed(gpus, ("add", "expire", "window", "hosts", "absent_nodes"))
    ev = Evaluator(timed_ranks, timed_gpus, timed_source, shard=shard, clock=lambda: clock[0],
                   cadence=config.judge_on_steps)
    eval_every = round(config.evaluation_interval_s / TICK_S)
    on_steps = config.judge_on_steps.enabled
    owned = {p for p in fleet.planted() if owns(p[1])}
    # A silent straggler's finding, and the big job's own slowdown while one is on, are what happened: not "other".
    silent = {("big-job", e.rank) for e in fleet.episodes} | ({("big-job", None)} if fleet.episodes else set())
    onsets = {e.rank: {"episode": e, "pending": None, "firing": None, "by": None, "judge_wall": None}
              for e in fleet.episodes if owns("big-job")}
    rows, extra_ever = [], set()
    extra_evidence: list = []  # (simulated s, by which judgement, Finding)
    extra_fired: set = set()
    began = time.perf_counter()
    findings: tuple = ()
    judge_free_at = START  # the judge-on-steps thread rests after a pass (max_busy), on the simulated clock
    tick = 0
    cpu_begin = time.process_time()
    try:
        c = 0
        while c < cycles or time.perf_counter() - began < duration_s:
            cpu0 = time.process_time()
            pushes, evals, judges = [], [], []
            spent_cpu = dict.fromkeys(("ingest", "fetch", "evaluate", "judge", "import", "legacy"), 0.0)
            for j in range(TICKS_PER_CYCLE):
                tick += 1
                clock[0] = t = START + tick * TICK_S
                if j == 0:  # the agents' scrape of this cycle, into VictoriaMetrics (the harness's work, not the shard's)
                    import_t, p0 = t, time.process_time()
                    import_s = importer(t)
                    spent_cpu["import"] += time.process_time() - p0
                pushed = service.push(t, tick)
                spent_cpu["ingest"] += pushed["cpu_s"]
                pushes.append(pushed)
                if j == 0:
                    need = ev._need if fetch != "legacy" else None  # noqa: SLF001 - what the next fetch is given
                    detail = source._cadence.due(t, need, source._tiers.kept(IDENTITY))  # noqa: SLF001
                    # A fetch between detail fetches asks no tier at all (promql_need): only a detail fetch refreshes.
                    refresh = detail and IDENTITY in source._tiers.plan(t)  # noqa: SLF001
                    p0, vm0, t0 = time.process_time(), _bench.proc_cpu_s(vm_pid), time.perf_counter()
                    ev.poll_telemetry()
                    t1, vm1 = time.perf_counter(), _bench.proc_cpu_s(vm_pid)
                    spent_cpu["fetch"] += time.process_time() - p0
                    fetch_s = t1 - t0
                    legacy = None
                    if shadow is not None:
                        p0, s0 = time.process_time(), time.perf_counter()
                        batch = shadow.fetch()
                        shadow_gpus.add(batch)
                        legacy = {"fetch_s": time.perf_counter() - s0, "vm_cpu_s": _bench.proc_cpu_s(vm_pid) - vm1,
                                  "series": shadow.take(), "error": batch.errors[:1]}
                        suspects = sorted(need.suspects) if need is not None else []
                        legacy["suspects"] = len(suspects)
                        legacy["equal"] = sum(1 for u in suspects if (w := gpus.window(u, 0.0)) and
                                              (v := shadow_gpus.window(u, 0.0)) and w[-1] == v[-1])
                        spent_cpu["legacy"] += time.process_time() - p0
                    series = counted.take()
                p0, e0 = time.process_time(), time.perf_counter()
                if tick % eval_every == 0:
                    last = c + 1 >= cycles and time.perf_counter() - began >= duration_s and j == TICKS_PER_CYCLE - 1
                    findings = _profiled(ev.evaluate) if profile and last else ev.evaluate()
                    evals.append(time.perf_counter() - e0)
                    spent_cpu["evaluate"] += time.process_time() - p0
                    by = "periodic"
                elif on_steps and t >= judge_free_at:
                    before = ev.judgements_on_steps
                    rest, _ = ev.judge_arrivals()
                    if ev.judgements_on_steps == before:
                        continue  # nothing landed that may be judged yet: the thread sleeps on
                    took = time.perf_counter() - e0
                    spent_cpu["judge"] += time.process_time() - p0
                    judges.append(took)
                    # The thread rests after a pass so that these take at most max_busy of a core: its wall
                    # seconds here, taken as the service's seconds on this machine.
                    judge_free_at = t + took + rest
                    findings = ev.findings()
                    by = "on steps"
                else:
                    continue
                took = time.perf_counter() - e0
                found = {(f.kind, f.job, f.rank) for f in findings}
                extra = {f for f in found if not ((f[1], f[2]) in silent and f[0] in ("straggler", "job_slowdown"))
                         and not any(f[0].startswith(p[0]) and f[1:] == p[1:] for p in owned)}
                for f in findings:  # what each other finding rested on when first seen and when it fired, if it did
                    key = (f.kind, f.job, f.rank)
                    if key in extra and (key not in extra_ever or (f.state == "firing" and key not in extra_fired)):
                        extra_evidence.append((t - START, by, f))
                        extra_ever.add(key)
                        if f.state == "firing":
                            extra_fired.add(key)
                        print(f"other finding at {t - START:.0f} s ({by}): {f.kind} {f.job} r{f.rank} {f.state} "
                              f"{json.dumps(f.evidence, default=str)}", file=sys.stderr, flush=True)
                _onset_marks(onsets, findings, t, by, took)
            cpu_cycle = time.process_time() - cpu0
            spent = {**timed_source.take(), **{f"ranks.{k}": v for k, v in timed_ranks.take().items()},
                     **{f"gpus.{k}": v for k, v in timed_gpus.take().items()}}
            push = _merged(pushes)
            rows.append({"at_s": time.perf_counter() - began, "t": import_t, "import_s": import_s, "push": push,
                         "fetch_s": fetch_s, "evaluate_s": max(evals, default=0.0), "evals": evals,
                         "judges": judges, "error": ev.telemetry_error,
                         "vm_cpu_s": vm1 - vm0, "series": series, "detail": detail, "legacy": legacy,
                         "refresh": refresh, "spent": spent, "load": os.getloadavg()[0],
                         "gpus": gpus.counts().gpus, "steps": service.ranks.counts().steps,
                         "rss": me.memory_info().rss - rss0, "findings": len(findings),
                         "cpu": {**spent_cpu, "service": cpu_cycle - spent_cpu["import"] - spent_cpu["legacy"]}})
            lat = sorted(push["lat"]) or [math.nan]
            print(f"[{shard or '1 shard'}, {via}] cycle {c + 1} at {rows[-1]['at_s']:.0f} s: push {push['wall_s']:.1f} s "
                  f"({push['requests']:,} requests, {push['records'] / push['wall_s']:,.0f} rec/s, p99 "
                  f"{_bench.quantile(lat, 0.99) * 1e3:.0f} ms, {push['failed']} failed {push['failures'][:1]}, "
                  f"{push['early']:,} early so far), fetch {fetch_s:.2f} s "
                  f"({'detail' if detail else 'between'}, {series:,} series, VM CPU {vm1 - vm0:.2f} s"
                  + (f"; legacy {legacy['fetch_s']:.2f} s, {legacy['series']:,} series, VM CPU "
                     f"{legacy['vm_cpu_s']:.2f} s, suspects equal {legacy['equal']}/{legacy['suspects']}"
                     if legacy else "")
                  + f"), evaluate {' + '.join(f'{x:.2f}' for x in evals)} s, on steps {len(judges)} × "
                  f"{sum(judges) / max(1, len(judges)):.2f} s, service CPU {rows[-1]['cpu']['service']:.2f} s, "
                  f"{rows[-1]['gpus']:,} GPUs, {rows[-1]['steps']:,} steps, "
                  f"{len(findings)} findings, RSS +{rows[-1]['rss'] / 2**20:,.0f} MiB, telemetry error {ev.telemetry_error}, "
                  f"{'refresh' if refresh else 'between refreshes'}, "
                  + ", ".join(f"{k} {v:.2f} s" for k, v in spent.items()),
                  file=sys.stderr, flush=True)
            c += 1
    finally:
        counted.close()
        if shadow is not None:
            shadow.close()
        service.close()
    found = {(f.kind, f.job, f.rank) for f in findings}
    hit = {p for p in owned if any(k.startswith(p[0]) and (j, r) == (p[1], p[2]) for k, j, r in found)}
    return {"shard": shard, "rows": rows, "planted": len(owned), "hit": len(hit), "missed": sorted(owned - hit),
            "extra": sorted(extra_ever, key=str), "extra_fired": extra_fired, "extra_evidence": extra_evidence,
            "relay_interval_s": relay_interval_s, "ranks": service.ranks_pushed, "via": via,
            "onsets": list(onsets.values()), "sim_s": tick * TICK_S, "cpu_total_s": time.process_time() - cpu_begin,
            "judgements": ev.judgements_on_steps, "eval_every_s": config.evaluation_interval_s,
            "on_steps": (config.judge_on_steps.min_interval_s, config.judge_on_steps.max_busy) if on_steps else None}


def _merged(pushes: list[dict]) -> dict:
    """One cycle's pushes (a tick's each) as one: walls, CPU and counts added, latencies joined."""
    out = {k: sum(p[k] for p in pushes) for k in ("wall_s", "cpu_s", "failed", "records", "requests")}
    return {**out, "lat": [v for p in pushes for v in p["lat"]], "failures": [f for p in pushes for f in p["failures"]][:3],
            "early": pushes[-1]["early"]}


def _onset_marks(onsets: dict, findings, t: float, by: str, took: float) -> None:
    """Mark, for each silent straggler whose episode began, when its finding was first pending and first firing
    (simulated s after its onset), which judgement fired it and that judgement's wall seconds."""
    for rank, mark in onsets.items():
        ep = mark["episode"]
        if t < ep.onset or mark["firing"] is not None:
            continue
        states = {f.state for f in findings if f.job == "big-job" and f.rank == rank and f.kind.startswith("straggler")}
        if states and mark["pending"] is None:
            mark["pending"] = t - ep.onset
        if "firing" in states:
            mark.update(firing=t - ep.onset, by=by, judge_wall=took)


def fetch_variants(url: str, t: float, vm_pid: int, repeat: int = 2) -> list[list[str]]:
    """One whole-fleet fetch at `t` as a refresh (every query in full) and between refreshes (promql_tiers), the
    best of `repeat`, measured in one run: wall, this process's CPU (queries, decode, join), VictoriaMetrics' CPU."""
    from gpumond.rules.telemetry.promql import DEFAULT_REFRESH_S, PrometheusSource

    rows = []
    # Both primed: the first fetch of a source asks the per-reason throttle series too (promql_tiers), a refresh
    # after it only where some live GPU lacks the bitmask.
    for name, refresh_s, primed in (("refresh: every query in full", 0.0, True),
                                    (f"between refreshes (every {DEFAULT_REFRESH_S:g} s)", DEFAULT_REFRESH_S, True)):
        best = None
        for _ in range(repeat):
            source = PrometheusSource(url, clock=lambda: t, timeout_s=120.0, refresh_s=refresh_s)
            try:
                if primed:
                    source.fetch()  # the refresh whose rows the timed fetch reuses
                gc.collect()
                vm0, cpu0, t0 = _bench.proc_cpu_s(vm_pid), time.process_time(), time.perf_counter()
                batch = source.fetch()
                got = (time.perf_counter() - t0, time.process_time() - cpu0, _bench.proc_cpu_s(vm_pid) - vm0)
            finally:
                source.close()
            if batch.errors:
                raise RuntimeError(f"{name}: {batch.errors[:2]}")
            best = got if best is None or got[0] < best[0] else best
        assert best is not None
        rows.append([name, f"{len(batch.gpus):,}", f"{best[0]:.2f} s", f"{best[1]:.2f} s", f"{best[2]:.2f} s"])
    return rows


def query_breakdown(url: str, t: float, vm_pid: int) -> list[list[str]]:
    """Each query of a refresh and of a fetch between refreshes, run alone one after another at `t`: series
    answered, bytes, wall, VictoriaMetrics' CPU, this process's decode CPU."""
    import httpx

    from gpumond.rules.telemetry.promql import DEFAULT_LOADS, DEFAULT_REFRESH_S, build_queries, vector_rows
    from gpumond.rules.telemetry.promql_tiers import Tiers

    tiers = Tiers(build_queries(300.0), DEFAULT_REFRESH_S)
    client = httpx.Client(timeout=300)
    measured: list[dict[str, tuple]] = []
    try:
        for _ in range(2):  # the refresh, then a fetch between refreshes
            asked, answered, got = tiers.plan(t), {}, {}
            for key, query in asked.items():
                vm0, t0 = _bench.proc_cpu_s(vm_pid), time.perf_counter()
                r = client.get(url + "/api/v1/query", params={"query": query, "time": f"{t:.3f}", "nocache": "1"})
                wall, vm = time.perf_counter() - t0, _bench.proc_cpu_s(vm_pid) - vm0
                cpu0 = time.process_time()
                rows = vector_rows(r.status_code, r.content, DEFAULT_LOADS)
                decode = time.process_time() - cpu0
                if isinstance(rows, str):
                    raise RuntimeError(f"{query}: {rows}")
                answered[key] = rows
                got[key] = (len(rows), len(r.content), wall, vm, decode)
            tiers.merge(asked, answered, t)
            measured.append(got)
    finally:
        client.close()

    def cells(m: tuple | None) -> list[str]:
        if m is None:
            return ["—"] * 5
        return [f"{m[0]:,}", f"{m[1] / 1e6:.1f} MB", f"{m[2]:.2f} s", f"{m[3]:.2f} s", f"{m[4]:.2f} s"]

    out = [[f"`{key}`", *cells(measured[0].get(key)), *cells(measured[1].get(key))] for key in measured[0]]
    total = [tuple(sum(m[k][i] for k in m) for i in range(5)) for m in measured]
    return out + [["**all**", *cells(total[0]), *cells(total[1])]]


def _positive(v: str) -> float:
    x = float(v)
    if not x > 0:
        raise argparse.ArgumentTypeError(f"{v}: must be above 0")
    return x


def _whole_ticks(v: str) -> float:
    """An interval the harness can keep: a whole number of its simulated-second ticks, at least one."""
    x = _positive(v)
    if x < TICK_S or x / TICK_S != round(x / TICK_S):
        raise argparse.ArgumentTypeError(f"{v}: must be a whole multiple of the harness's {TICK_S:g} s tick")
    return x


def _share(v: str) -> float:
    x = _positive(v)
    if x > 1:
        raise argparse.ArgumentTypeError(f"{v}: a share of one core, at most 1")
    return x


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="64 nodes, --cycles cycles (6), no sustained run (smoke test)")
    ap.add_argument("--nodes", type=int, help="nodes of the big job (default 4096, quick 64)")
    ap.add_argument("--small", type=int, help="small jobs, one node each (default 64, quick 4)")
    ap.add_argument("--cycles", type=int, default=6,
                    help="evaluation cycles of 10 simulated seconds per shard (6); the 1-shard run runs at least "
                         f"{FILL_CYCLES}, its 300 s window filled (with --quick: --cycles)")
    ap.add_argument("--duration", type=float, help="wall seconds the 1-shard run is sustained (default 600, quick 0)")
    ap.add_argument("--faults", type=int, help="slow and starved GPUs planted in the big job (default 4 each)")
    ap.add_argument("--one-shard-only", action="store_true", help="skip the 4-shard runs (their fetch is the same)")
    ap.add_argument("--fetch-only", action="store_true",
                    help="import --cycles scrapes, then only compare query shapes (benchmarks/_fetch_probe.py), "
                         "before and after VictoriaMetrics merged its parts; prints the table")
    ap.add_argument("--old-agents", action="store_true",
                    help="agents without the clock-event bitmask gauge (per-reason series only)")
    ap.add_argument("--fetch", choices=("both", "need", "legacy"), default="both",
                    help="how the evaluator's telemetry is fetched: `need` (narrowed to what its detectors need, "
                         "rules/telemetry/promql_need), `legacy` (every GPU every fetch), or `both` (default): the "
                         "evaluator on `need` and a legacy fetch at the same instant each cycle, measured alike")
    ap.add_argument("--detail-s", type=float, default=60.0,
                    help="telemetry.prometheus.detail_s of the need fetch (60: every 6th cycle asks every GPU's "
                         "values; 0: every cycle, narrowed to the shard's nodes)")
    ap.add_argument("--sustain-cycles", type=int,
                    help=f"cycles of the 1-shard run (default {FILL_CYCLES}: its 300 s window filled; quick: --cycles)")
    ap.add_argument("--out", default="fleet_scale",
                    help="the result's name: benchmarks/results/<out>.md (fleet_scale; a second setting beside it)")
    ap.add_argument("--via", choices=("direct", "relay"), default="direct",
                    help="how the ranks' steps reach the shard: `direct` (each rank's SDK pushes every 5 s and early "
                         "after a step that stands out) or `relay` (the same SDK pushes to its node's relay, which "
                         "forwards one batch per node every 2 s: docs/job-sdk.md \"The node relay\")")
    ap.add_argument("--relay-interval-s", type=_positive, default=fp.RELAY_INTERVAL_S,
                    help=f"with --via relay: how often each node's relay forwards what it holds (relay.interval_s; "
                         f"default {fp.RELAY_INTERVAL_S:g}, the agent's); early pushes still go ~50 ms after they land")
    ap.add_argument("--evaluation-interval-s", type=_whole_ticks,
                    help="the service's evaluation_interval_s (default: the service's, 5 s): how often every job is "
                         "judged whole; judgements on steps go on between")
    ap.add_argument("--max-busy", type=_share,
                    help="the service's judge_on_steps.max_busy (default: the service's, 0.5): the share of a core "
                         "judgements on steps may take")
    ap.add_argument("--onsets", type=lambda v: tuple(float(x) for x in v.split(",") if x),
                    help="simulated seconds after the start at which a silent straggler (its steps "
                         f"{SLOWDOWN:g}× long, its telemetry normal) begins, each on a rank of its own (default "
                         f"{','.join(f'{x:g}' for x in ONSETS_S)}; quick 15; '' for none)")
    ap.add_argument("--episode-s", type=float, default=EPISODE_S,
                    help=f"how long each silent straggler stays slow (default {EPISODE_S:g} s)")
    ap.add_argument("--no-judge-on-steps", action="store_true",
                    help="judge_on_steps off (the periodic evaluations alone): what the default's judgements add")
    ap.add_argument("--profile", action="store_true",
                    help="profile the 1-shard run's last evaluation (cProfile, top functions to stderr)")
    args = ap.parse_args(argv)
    from gpumond.rules.service import GC_THRESHOLDS

    gc.set_threshold(*GC_THRESHOLDS)  # the daemon's setting (service.serve)
    nodes = args.nodes or (64 if args.quick else 4096)
    duration = args.duration if args.duration is not None else (0.0 if args.quick else 600.0)
    onsets = args.onsets if args.onsets is not None else ((15.0,) if args.quick else ONSETS_S)
    fleet = Fleet(nodes, args.small if args.small is not None else (4 if args.quick else 64), args.faults or 4,
                  mask=not args.old_agents, onsets=onsets, episode_s=args.episode_s)
    if not shutil.which(VM):
        raise SystemExit(f"{VM} is not installed: apt-get install -y victoria-metrics")
    data = Path(tempfile.mkdtemp(prefix="gpumond-bench-vm-"))
    port = _bench.free_port()
    url = f"http://127.0.0.1:{port}"
    vm = subprocess.Popen([VM, f"-storageDataPath={data}", f"-httpListenAddr=127.0.0.1:{port}", "-retentionPeriod=100y",
                           "-search.latencyOffset=0s", "-loggerLevel=ERROR", "-search.maxUniqueTimeseries=10000000"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _bench.wait_http(url + "/health", 60, vm)
        import httpx

        client = httpx.Client(timeout=300)

        def importer(t: float) -> float:
            t0 = time.perf_counter()
            r = client.post(url + "/api/v1/import/prometheus", content=fleet.scrape(t))
            r.raise_for_status()
            client.get(url + "/internal/force_flush").raise_for_status()
            return time.perf_counter() - t0

        if args.fetch_only:
            return fetch_only(url, fleet, args.cycles, importer, vm.pid, args.quick)
        # Until the window has filled and the last silent straggler's episode is over (unless --quick).
        episodes_end = math.ceil((max(onsets, default=0.0) + args.episode_s) / CYCLE_S) if onsets else 0
        sustain = args.sustain_cycles or (args.cycles if args.quick else max(args.cycles, FILL_CYCLES, episodes_end))
        results = [run_shard(url, fleet, None, sustain, duration, importer, vm.pid, args.fetch, args.detail_s,
                             profile=args.profile, via=args.via, on_steps=not args.no_judge_on_steps,
                                 relay_interval_s=args.relay_interval_s,
                                 evaluation_interval_s=args.evaluation_interval_s, max_busy=args.max_busy)]
        last = results[0]["rows"][-1]["t"]  # the last scrape's instant
        ways = fetch_variants(url, last, vm.pid, 2 if args.quick else 1)
        per_query = query_breakdown(url, last, vm.pid)
        for i in range(0 if args.one_shard_only else 4):
            results.append(run_shard(url, fleet, (i, 4), args.cycles, 0.0, importer, vm.pid, args.fetch,
                                     args.detail_s, via=args.via, on_steps=not args.no_judge_on_steps,
                                     relay_interval_s=args.relay_interval_s,
                                     evaluation_interval_s=args.evaluation_interval_s, max_busy=args.max_busy))
        vm_rss = _bench.proc_status_kib(vm.pid, "VmRSS")
    finally:
        _bench.stop(vm)
        shutil.rmtree(data, ignore_errors=True)
    _bench.write_result(args.out, report(results, ways, per_query, fleet, args, duration, vm_rss),
                        quick=args.quick)
    return 0


def fetch_only(url: str, fleet: Fleet, cycles: int, importer, vm_pid: int, quick: bool) -> int:
    """Import `cycles` scrapes, compare query shapes, merge VictoriaMetrics' parts, compare again (stdout)."""
    import _fetch_probe

    t = START
    for i in range(max(1, cycles)):
        t = START + i * CYCLE_S
        print(f"import {i + 1}: {importer(t):.2f} s", file=sys.stderr, flush=True)
    gpus = fleet.nodes * GPUS_PER_NODE
    out = ["# Fleet scale: what a telemetry query costs VictoriaMetrics, by its shape\n",
           _bench.machine_block({
               "victoria-metrics": _vm_version(),
               "setup": f"{gpus:,} GPUs ({fleet.nodes:,} nodes), {max(1, cycles)} scrapes {CYCLE_S:g} s apart "
                        "imported, each query at the last one's instant; the median of 5 runs of each, one after "
                        "another, after one untimed warm-up query; VictoriaMetrics CPU from its /proc stat (other "
                        "processes on the shared 2-CPU machine do not count, its own background merges do)"}),
           "", "## Right after the last import (parts not yet merged)\n",
           _fetch_probe.table(_fetch_probe.probe(url, t, vm_pid, MASK, gpus))]
    merged = _fetch_probe.force_merge(url, t)
    out += ["", f"## After /internal/force_merge (it answered in {merged:.1f} s)\n",
            _fetch_probe.table(_fetch_probe.probe(url, t, vm_pid, MASK, gpus)), "", _fetch_probe.NOTE]
    _bench.write_result("fleet_scale_fetch", "\n".join(out), quick=quick)
    return 0


def _fetch_means(rows: list[dict]) -> list[str]:
    """Mean series answered, VictoriaMetrics CPU and wall per fetch: the need fetch's, then the legacy one's."""
    def mean(xs: list[float]) -> float:
        return sum(xs) / len(xs) if xs else math.nan

    legacy = [x["legacy"] for x in rows if x["legacy"]]
    cells = [f"{mean([x['series'] for x in rows]):,.0f}", f"{mean([x['vm_cpu_s'] for x in rows]):.2f} s",
             f"{mean([x['fetch_s'] for x in rows]):.2f} s"]
    return cells + ([f"{mean([x['series'] for x in legacy]):,.0f}", f"{mean([x['vm_cpu_s'] for x in legacy]):.2f} s",
                     f"{mean([x['fetch_s'] for x in legacy]):.2f} s"] if legacy else ["—"] * 3)


def fetch_table(rows: list[dict], args: argparse.Namespace) -> tuple[list[list[str]], str]:
    """Each cycle's need fetch against its legacy fetch, and one line on their means."""
    out = []
    for i, x in enumerate(rows):
        lg = x["legacy"]
        out.append([f"{i + 1}", "detail" if x["detail"] else "between", f"{x['series']:,}", f"{x['fetch_s']:.2f} s",
                    f"{x['vm_cpu_s']:.2f} s", *([f"{lg['series']:,}", f"{lg['fetch_s']:.2f} s",
                                                 f"{lg['vm_cpu_s']:.2f} s", f"{lg['equal']}/{lg['suspects']}"]
                                                if lg else ["—"] * 4)])
    steady = rows[1:] or rows
    means = _fetch_means(steady)
    line = (f"**1 shard, VictoriaMetrics CPU per cycle (mean over cycles 2–{len(rows)}): need {means[1]}, legacy "
            f"{means[4]}**; series answered per fetch: need {means[0]}, legacy {means[3]}; fetch wall: need "
            f"{means[2]}, legacy {means[5]} (`--fetch {args.fetch} --detail-s {args.detail_s:g}`).")
    return out, line


def _other_evidence(results: list[dict]) -> list[str]:
    """What each finding that nobody planted rested on when it was first seen (a false finding must be explained)."""
    out = []
    for r in results:
        name = f"{r['shard'][0]}/{r['shard'][1]}" if r["shard"] else "1 shard (all jobs)"
        for at, by, f in r["extra_evidence"]:
            out.append(f"- {name}, {at:.0f} s after the start ({by}): {f.kind} {f.job} rank {f.rank} ({f.state}): "
                       f"`{json.dumps(f.evidence, default=str, sort_keys=True)}`")
    return ["## Findings nobody planted: what each rested on when first seen, and when it fired if it did\n",
            "A finding is pending until the alert lifecycle's persistence (two of three looks over "
            "`findings.min_duration_s`, or sequential or corroborated evidence) makes it fire; only a firing one "
            "alerts anyone. The detectors' per-group budget of 10⁻⁴ false flags an evaluation means a few pending "
            "flags on a fleet of hundreds of jobs; persistence is what keeps them from firing.\n", *out, ""] \
        if out else []


def _pct(xs: list[float], q: float) -> str:
    return f"{_bench.quantile(sorted(xs), q) * 1e3:,.0f} ms" if xs else "—"


def cpu_section(result: dict, steady_cycles: int = 10) -> str:
    """The shard's CPU measured: this process's CPU (ingest under uvicorn, fetch, evaluations, judgements on steps)
    over the simulated seconds it covered, for the whole run and its last `steady_cycles` cycles."""
    def cells(rows: list[dict]) -> list[str]:
        sim = len(rows) * CYCLE_S
        part = {k: sum(x["cpu"][k] for x in rows) for k in ("service", "ingest", "fetch", "evaluate", "judge")}
        other = part["service"] - part["ingest"] - part["fetch"] - part["evaluate"] - part["judge"]
        evals = sum(len(x["evals"]) for x in rows)
        judges = sum(len(x["judges"]) for x in rows)
        return [f"{sim:,.0f} s", f"{part['service']:,.1f} s", f"**{part['service'] / sim:.2f}**",
                *(f"{part[k] / sim:.2f}" for k in ("ingest", "fetch", "evaluate", "judge")), f"{other / sim:.2f}",
                f"{evals} × {part['evaluate'] / max(1, evals):.2f} s", f"{judges} × {part['judge'] / max(1, judges):.2f} s"]

    rows = result["rows"]
    steady = rows[-steady_cycles:]
    first = len(rows) - len(steady) + 1
    table = _bench.md_table(
        ["span", "simulated", "shard CPU", "**cores** (CPU s per simulated s)", "ingest", "fetch",
         "periodic evaluations", "judgements on steps", "other", "evaluations × CPU each", "judgements × CPU each"],
        [["whole run", *cells(rows)], [f"cycles {first}–{len(rows)}", *cells(steady)]])
    return "\n".join([
        f"## The shard's CPU, measured ({result['via']})\n",
        table,
        "",
        "The shard's CPU is this process's (the service's app under uvicorn, its stores, the evaluator and its "
        "fetches; the load generators and VictoriaMetrics are other processes), utime + stime over every tick, less "
        "what the harness itself spends here apart from the service: generating and importing each cycle's scrape "
        "into VictoriaMetrics" + (" and the legacy fetch beside the need fetch" if any(x["legacy"] for x in rows)
                                  else "") + ". *Cores*: that CPU over the simulated seconds the run covered, i.e. "
        "CPU-seconds per second of the fleet's life. *Ingest*: the process's CPU while the ticks' pushes were "
        "being sent and answered (nothing else runs in it then); *fetch*: around poll_telemetry (queries, decode, "
        "join, GpuStore.add); *periodic evaluations*: `evaluate()` every "
        f"{result['eval_every_s']:g} simulated s (`evaluation_interval_s`); *judgements on steps*: "
        + ("`judge_arrivals()` between them (`judge_on_steps`: a job at most every "
           f"{result['on_steps'][0]:g} s, the passes at most {result['on_steps'][1]:g} of a core: after a pass of "
           "d wall seconds the next waits d × (1 − max_busy) / max_busy, taken here as simulated seconds)"
           if result["on_steps"] else "none (`--no-judge-on-steps`: the periodic evaluations alone)")
        + "; *other*: "
        "the rest (the harness's queues to its load generators, its per-cycle bookkeeping and printing, the "
        "server's idle timers), counted in the total. The last cycles hold a window "
        f"at least {(first - 1) * CYCLE_S / 300:.0%} full.",
    ])


def onset_section(result: dict, episode_s: float) -> str:
    """Each silent straggler's onset and when its finding fired."""
    marks = result["onsets"]
    if not marks:
        return ""
    rows = []
    for m in marks:
        ep = m["episode"]
        node = ep.rank // GPUS_PER_NODE
        rows.append([f"{ep.onset - START:g} s", f"big-job rank {ep.rank} (node-{node:05d}, GPU {ep.rank % GPUS_PER_NODE})",
                     f"{ep.slowdown:g}×", "—" if m["pending"] is None else f"{m['pending']:g} s",
                     "not within the episode" if m["firing"] is None else f"**{m['firing']:g} s**", m["by"] or "—",
                     "—" if m["judge_wall"] is None else f"{m['judge_wall']:.2f} s"])
    fired = sorted(m["firing"] for m in marks if m["firing"] is not None)
    p50 = f"{_bench.quantile(fired, 0.5):g} s" if len(fired) == len(marks) else \
        f"— ({len(marks) - len(fired)} of {len(marks)} not found)"
    return "\n".join([
        f"## Silent stragglers: from onset to the finding firing ({result['via']})\n",
        f"**p50 {p50}** over {len(marks)} onsets (target ≤ 15 s).",
        "",
        _bench.md_table(["onset (simulated, after the start)", "rank", "slowdown", "first pending after",
                         "firing after", "fired by", "that judgement's wall"], rows),
        "",
        f"Each straggler's steps are {marks[0]['episode'].slowdown:g}× long from its onset for {episode_s:g} s "
        "(every rank of the job waits for it: its peers' comm wait grows by the difference, its own stays near 0) "
        "while its GPU's telemetry stays as any other's (no clock, power or throttle change); each begins a minute "
        "or more after the one before ended, since an SDK judges a step against its rank's last minute of steps "
        "(a slowdown right after another pushes nothing early). The ranks run the "
        "job SDK's own cadence (benchmarks/_fleet_pushes.py, with gpumond/job/early.py's rule and history): a push "
        "every 5 s at each rank's phase, and an early push after a step that stands out, at most one a second"
        + (f", each to the node's relay, which forwards what it holds every {result['relay_interval_s']:g} s at its "
           "own phase, and 50 ms after an "
           "early push (at most one such round a second, as the agent's relay does)" if result["via"] == "relay"
           else ", straight to the shard")
        + ". Resolution: one simulated second (a tick: what was sent up to it is pushed, then a periodic "
        f"evaluation every {result['eval_every_s']:g} s or else a judgement on steps when the judge-on-steps thread is free); the time is "
        "the judgement's simulated instant, and the judgement itself then takes the wall seconds in the last "
        "column before its finding is out. The job's own slowdown while a straggler is on (`job_slowdown`, the "
        "job's steps 1.25× its baseline) is true and not listed among the other findings.",
    ])


def report(results: list[dict], ways: list[list[str]], per_query: list[list[str]], fleet: Fleet,
           args: argparse.Namespace, duration: float, vm_rss_kib: int) -> str:
    gpus = fleet.nodes * GPUS_PER_NODE
    rows, ingest = [], []
    for r in results:
        name = f"{r['shard'][0]}/{r['shard'][1]}" if r["shard"] else "1 shard (all jobs)"
        last = r["rows"][-3:]  # windows full enough that every detector runs
        between = [x for x in r["rows"][1:] if not x["refresh"]][-3:]
        refreshes = [x for x in r["rows"][1:] if x["refresh"]] or r["rows"][:1]  # the first one is cold
        fetch = max((x["fetch_s"] for x in between), default=math.nan)
        evaluate = max(x["evaluate_s"] for x in last)
        rows.append([name, f"{last[-1]['gpus']:,}", f"{last[-1]['steps']:,}", f"{fetch:.2f} s",
                     f"{max(x['fetch_s'] for x in refreshes):.2f} s", f"{evaluate:.2f} s",
                     f"**{fetch + evaluate:.2f} s**", f"{max(x['import_s'] for x in last):.2f} s",
                     f"{r['hit']}/{r['planted']}", ", ".join(f"{k} {j} r{n}" for k, j, n in r["missed"]) or "—",
                     ", ".join(f"{k} {j} r{n}" + ("" if (k, j, n) in r["extra_fired"] else " (pending only)")
                               for k, j, n in r["extra"][:6]) + (" …" if len(r["extra"]) > 6 else "") or "—"])
        pushes = [x["push"] for x in r["rows"][1:]] or [x["push"] for x in r["rows"]]  # the first fills the store
        records = sum(p["records"] for p in pushes)
        wall = sum(p["wall_s"] for p in pushes)
        cpu = sum(p["cpu_s"] for p in pushes)
        lat = [v for p in pushes for v in p["lat"]]
        requests = sum(p["requests"] for p in pushes)
        ingest.append([name, r["via"], f"{r['ranks']:,}", f"{len(pushes)}", f"{requests:,}",
                       f"{pushes[-1]['early']:,}", f"{records:,}",
                       f"{records / wall:,.0f}" if wall else "—",
                       f"{cpu / records * 1e6:.1f} µs" if records else "—", _pct(lat, 0.5), _pct(lat, 0.99),
                       f"{sum(p['failed'] for p in pushes):,}"])
    sustained = results[0]["rows"]
    need_rows, need_sum = fetch_table(sustained, args)
    per_shard = [[f"{r['shard'][0]}/{r['shard'][1]}" if r["shard"] else "1 shard (all jobs)",
                  *_fetch_means(r["rows"][1:] or r["rows"])] for r in results]
    breakdown = []
    for i, x in enumerate(sustained):
        sp = x["spent"]
        windows = sp["gpus.window"] + sp["gpus.hosts"] + sp["gpus.absent_nodes"]
        stores = sp["ranks.take_ended"] + sp["ranks.expire"] + sp["gpus.expire"] + sp["ranks.jobs"] + windows
        breakdown.append([f"{i + 1}", "refresh" if x["refresh"] else "between", f"{x['steps']:,}",
                          f"{sp['fetch']:.2f} s", f"{sp['gpus.add']:.2f} s",
                          f"{sp['ranks.take_ended'] + sp['ranks.expire']:.2f} s", f"{sp['gpus.expire']:.2f} s",
                          f"{sp['ranks.jobs']:.2f} s", f"{windows:.2f} s",
                          f"{sum(x['evals']) + sum(x['judges']) - stores:.2f} s"])
    step = max(1, len(sustained) // 12)
    rss = [[f"{x['at_s']:,.0f} s", f"{i + 1}", f"{x['steps']:,}", f"{x['rss'] / 2**20:,.0f} MiB",
            f"{x['fetch_s']:.2f} s", f"{x['evaluate_s']:.2f} s"]
           for i, x in enumerate(sustained) if i % step == 0 or i == len(sustained) - 1]
    return "\n".join([
        "# Fleet scale: pushes over HTTP, telemetry from VictoriaMetrics, the evaluation cycle\n",
        _bench.machine_block({
            "victoria-metrics": _vm_version(),
            "load average": "1-minute load at the end of each cycle: "
                            + "–".join(f"{f(x['load'] for r in results for x in r['rows']):.1f}" for f in (min, max))
                            + f" on {os.cpu_count()} CPUs (this benchmark's own processes included)",
            "setup": f"{fleet.big_nodes:,} nodes × {GPUS_PER_NODE} GPUs for one "
                     f"{fleet.big_nodes * GPUS_PER_NODE:,}-rank job + {fleet.small} jobs of {SMALL_RANKS} ranks on a "
                     f"node each ({gpus:,} GPUs), every rank stepping every {STEP_S:g} s; "
                     + ("each rank's SDK pushes (columnar) every 5 s and early after a step that stands out, to its "
                        f"node's relay, which forwards one batch per node every {args.relay_interval_s:g} s"
                        if args.via == "relay" else
                        "each rank's SDK pushes (columnar) every 5 s and early after a step that stands out, directly")
                     + f", from {PUSHERS} load-generator processes, a simulated second at a time; the service's "
                     + ("cadence at its defaults (a periodic evaluation every 5 s, judgements on steps between); a "
                        if args.evaluation_interval_s is None and args.max_busy is None else
                        f"cadence (a periodic evaluation every {args.evaluation_interval_s or 5:g} s, judgements on "
                        f"steps between taking at most {args.max_busy or 0.5:g} of a core); a ")
                     + f"scrape imported and telemetry fetched every {CYCLE_S:g} simulated s (a cycle); 1 shard "
                     f"{len(results[0]['rows'])} cycles "
                     + ("(--sustain-cycles), " if args.sustain_cycles else
                        f"(at least {duration:g} s, until its 300 s window filled and the last silent straggler's "
                        "episode ended, unless --quick), ")
                     + ("no 4-shard runs (--one-shard-only)" if args.one_shard_only else
                        f"then each of 4 shards {args.cycles} cycles")
                     + f"; planted: {len(fleet.slow)} "
                     f"slow + {len(fleet.starved)} starved GPUs in the big job, {len(fleet.small_slow)} slow in a "
                     f"small job, from the start; {len(fleet.episodes)} silent stragglers one after another"}),
        "",
        cpu_section(results[0]),
        "",
        onset_section(results[0], args.episode_s),
        "",
        "## One evaluation cycle (the worst of the last three; an evaluation: the worst periodic one)\n",
        _bench.md_table(["evaluator", "GPUs fetched", "steps held", "fetch between refreshes (queries + join + store)",
                         "fetch at a refresh", "evaluate (expiry + snapshot + detectors)", "cycle between refreshes",
                         "VictoriaMetrics import of the scrape", "planted found (last cycle)", "missed",
                         "other findings (any cycle)"], rows),
        "",
        "A fetch asks what changes rarely (identity, MIG devices, max clock, power limit, which throttle reasons "
        "exist) in full once a minute, a refresh, and reuses it in between (gpumond/rules/telemetry/promql_tiers.py; "
        "at 10 s a cycle, every 6th fetch is a refresh). The first cycle's refresh (cold caches) is left out of "
        "\"fetch at a refresh\" when a later one ran.",
        "",
        *_other_evidence(results),
        f"## Telemetry fetched for need against every GPU every fetch ({args.fetch})\n",
        need_sum,
        "",
        _bench.md_table(["shard", "need: series answered per fetch (mean)", "need: VictoriaMetrics CPU per fetch",
                         "need: fetch wall", "legacy: series answered per fetch", "legacy: VictoriaMetrics CPU per fetch",
                         "legacy: fetch wall"], per_shard),
        "",
        "Every cycle but each run's first (which knows no need yet). The need fetch (gpumond/rules/telemetry/"
        "promql_need.py) is given the evaluator's TelemetryNeed: its jobs' GPUs and the GPUs in a finding. A "
        f"detail fetch (every {args.detail_s:g} s here, `--detail-s`) asks every needed GPU's values, narrowed to "
        "their nodes when they are at most half the fleet's; in between, every target's `up` and the agents' alerts "
        "of the fleet and everything about the suspects' nodes, the rest passed on. The legacy fetch, at the same "
        "instant into a store of its own, asks every GPU every fetch (the tiers of promql_tiers still apply). "
        "VictoriaMetrics CPU is its /proc stat over each fetch alone; series answered are the rows the fetch decoded "
        "(a `… != 0` query's server also reads the series it drops).",
        "",
        "### Each cycle (1 shard, sustained)\n",
        _bench.md_table(["cycle", "need fetch", "series", "wall", "VictoriaMetrics CPU", "legacy: series", "wall",
                         "VictoriaMetrics CPU", "suspects' newest sample = legacy's"], need_rows),
        "",
        "## Where each cycle goes (1 shard, sustained)\n",
        _bench.md_table(["cycle", "tier", "steps held", "queries + decode + join", "GpuStore.add",
                         "RankStore take_ended + expire", "GpuStore.expire", "RankStore.jobs (snapshot)",
                         "GpuStore windows + hosts", "detectors + alerts (the rest)"], breakdown),
        "",
        "Measured around the stores and the source the evaluator is given (benchmarks/fleet_scale.py `Timed`): "
        "the rest of `evaluate()` is the detectors (features, gpu_batch, straggler, I/O starvation, ...) and the "
        "alert lifecycle.",
        "",
        "## Each query alone (one after another, at the last cycle's instant)\n",
        _bench.md_table(["query (join key)", "first fetch (a refresh): series", "bytes", "wall", "VictoriaMetrics CPU",
                         "decode CPU", "between: series", "bytes", "wall", "VictoriaMetrics CPU", "decode CPU"], per_query),
        "",
        "VictoriaMetrics spends CPU on every series a query selects, even one a filter then drops (`… != 0`): the "
        "narrowed throttle query saves the answer's bytes and their decoding, not the scan. So the throttle reasons "
        f"are asked as the agents' one bitmask series per GPU (`{MASK}`); the per-reason series "
        "(`gpumond_gpu_clocks_event_active`, 5 a GPU) only by the first fetch and while some live GPU lacks a "
        "bitmask" + (" (here: every agent is an older one, --old-agents)" if fleet.mask is False else "") + ".",
        "",
        "## One whole-fleet fetch, at a refresh and between refreshes "
        f"({'best of 2' if args.quick else 'one each'}, the 4-worker pool, the default decoder)\n",
        _bench.md_table(["fetch", "GPUs", "fetch wall", "rules CPU (queries, decode, join)",
                         "VictoriaMetrics CPU"], ways),
        "",
        "## Ingest over HTTP (every cycle's push phase but the first)\n",
        _bench.md_table(["service", "via", "ranks pushing", "cycles", "requests", "early pushes (SDK, whole run)",
                         "records", "records/s", "server CPU per record", "request p50", "request p99",
                         "failed requests"], ingest),
        "",
        "## RSS of the service (1 shard, sustained) over time\n",
        _bench.md_table(["elapsed", "cycle", "steps held", "RSS growth", "fetch", "evaluate"], rss),
        "",
        f"VictoriaMetrics RSS at the end: {vm_rss_kib / 1024:,.0f} MiB. Each shard asks the whole fleet for the "
        "identity, every GPU's and target's `up` and the agents' alerts (fleet remediation reads them), and its own "
        "jobs' nodes for the rest (when they are at most half the fleet). The big job lands on one shard whole.",
        "",
        "RSS growth is the harness process's (the service's stores, its app, the evaluator; not the load "
        "generators) over its start. Server CPU per record is this process's CPU during the push phase (nothing "
        "else runs in it then) over the records pushed. The clock is simulated; every figure is wall time on a "
        "2-vCPU VM shared with other work (VictoriaMetrics, the load generators and the service on the same two "
        "CPUs).",
    ])


def _vm_version() -> str:
    """The Debian package's version (the binary prints none)."""
    try:
        out = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "victoria-metrics"], capture_output=True,
                             text=True, timeout=10)
        return f"victoria-metrics {out.stdout.strip()} (Debian)" if out.stdout.strip() else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


if __name__ == "__main__":
    sys.exit(main())
