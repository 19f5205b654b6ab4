"""The rules service's evaluation cycle at fleet scale, telemetry fetched from a real VictoriaMetrics.

One command, bounded: starts Debian's `victoria-metrics` on 127.0.0.1 and, every simulated cycle, imports one
scrape of synthetic agent series for NODES nodes × 8 GPUs (its `/api/v1/import/prometheus` API, the agent's
metric names and labels: gpumond_gpu_info, gpumond_gpu_up, SM clock, power, utilization, temperature, energy,
`up`) with planted faults: slow GPUs (SM clock 0.72×, power 0.6×) and starved GPUs (utilization 0.15, power 0.3).
The jobs: one job with a rank on every GPU of the NODES nodes (32,768 ranks at the default 4,096 nodes) and
SMALL jobs of 8 ranks on 8 more GPUs each; the starved GPUs' ranks push a data wait of half the step, the slow
GPUs' ranks a comm wait near 0 (the slowest rank waits least), every other rank ~0.1 s.

Steps go into the service's `RankStore` in process (`record` with the columnar batches the push API decodes
to; HTTP ingest is measured by rules_ingest.py), 20 steps per rank per cycle (2 steps/s). The service's own
`Evaluator` with the real `PrometheusSource` then runs what its loop runs: `poll_telemetry()` (the queries
against VictoriaMetrics, the join, GpuStore.add) and `evaluate()` (expiry, snapshot, detectors, findings),
each timed. The clock is simulated (10 s a cycle, the default evaluation interval) so that findings can reach
their persistence in CYCLES cycles; the sample timestamps follow it.

As 1 shard (one evaluator owns every job) and as 4 shards (each shard's evaluator owns the jobs of
crc32(job) mod 4 and fetches the whole fleet's telemetry, as a real shard does; run one after another).
Reported: per cycle fetch and evaluation seconds (the last cycles), RSS, and the findings against the planted
faults (found, missed, others).

    python benchmarks/fleet_scale.py            # 4,096 + 64 × 1 nodes, 8 cycles, 1 and 4 shards (~10 min)
    python benchmarks/fleet_scale.py --quick    # 64 nodes, seconds (smoke test)
"""

from __future__ import annotations

import argparse
import gc
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _bench  # noqa: E402

VM = "/usr/bin/victoria-metrics"
GPUS_PER_NODE = 8
CYCLE_S = 10.0
STEP_S = 0.5
START = 1_763_760_000.0
SMALL_RANKS = 8


def uuid(node: int, gpu: int) -> str:
    return f"GPU-{node:08x}-{gpu:04x}-4000-8000-000000000000"


class Fleet:
    """The synthetic fleet: nodes, jobs, the planted faults."""

    def __init__(self, nodes: int, small: int, faults: int) -> None:
        self.big_nodes = nodes
        self.nodes = nodes + small  # each small job on a node of its own
        self.small = small
        self.slow = {(n * 97 + 5) % nodes * GPUS_PER_NODE + 3 for n in range(faults)}  # big-job ranks
        self.starved = {(n * 89 + 11) % nodes * GPUS_PER_NODE + 6 for n in range(faults)} - self.slow
        self.small_slow = {0} if small else set()  # small job 0's rank 2

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


def push_steps(store, fleet: Fleet, jobs, first: int, count: int, now: float, owns) -> float:
    """`count` steps per rank ending at `now`, into the store as the push API would; CPU seconds spent."""
    import numpy as np

    from gpumond.rules.types import RankInfo, StepColumns

    numbers = np.arange(first, first + count, dtype=np.int64)
    ends = now - (count - 1 - np.arange(count)) * STEP_S
    base = np.vstack([ends, np.full(count, STEP_S), np.full(count, 0.01), np.full(count, 0.1)])
    starved = base.copy()
    starved[2], starved[3] = 0.25, 0.0
    slow = base.copy()
    slow[3] = 0.002
    batches = {kind: StepColumns(numbers, v) for kind, v in (("base", base), ("starved", starved), ("slow", slow))}
    cpu0 = time.process_time()
    for job, ranks in jobs:
        if not owns(job):
            continue
        world = len(ranks)
        for rank, node, gpu in ranks:
            kind = "base"
            if job == "big-job":
                kind = "slow" if rank in fleet.slow else "starved" if rank in fleet.starved else "base"
            elif rank == 2 and int(job[-3:]) in fleet.small_slow:
                kind = "slow"
            store.record(RankInfo(job, rank, world, f"node-{node:05d}", uuid(node, gpu)), batches[kind], now)
    return time.process_time() - cpu0


def run_shard(url: str, fleet: Fleet, shard: tuple[int, int] | None, cycles: int, importer) -> dict:
    """Cycles of import → pushes → poll_telemetry → evaluate for one evaluator; timings and findings."""
    import psutil

    from gpumond.config.rules import RulesConfig
    from gpumond.job.routing import shard_of
    from gpumond.rules.evaluator import Evaluator
    from gpumond.rules.store import GpuStore, RankStore
    from gpumond.rules.telemetry.promql import PrometheusSource

    clock = [START]
    config = RulesConfig.model_validate({"tokens": ["x" * 20]})
    ranks, gpus = RankStore.from_config(config), GpuStore.from_config(config)
    source = PrometheusSource(url, clock=lambda: clock[0], timeout_s=60.0)
    ev = Evaluator(ranks, gpus, source, shard=shard, clock=lambda: clock[0])
    jobs = fleet.jobs()

    def owns(job: str) -> bool:
        return shard is None or shard_of(job, shard[1]) == shard[0]

    me = psutil.Process()
    gc.collect()
    rss0 = me.memory_info().rss
    per_cycle = int(CYCLE_S / STEP_S)
    rows = []
    try:
        for c in range(cycles):
            clock[0] = START + c * CYCLE_S
            import_s = importer(clock[0])
            push_cpu = push_steps(ranks, fleet, jobs, c * per_cycle, per_cycle, clock[0], owns)
            t0 = time.perf_counter()
            ev.poll_telemetry()
            t1 = time.perf_counter()
            findings = ev.evaluate()
            t2 = time.perf_counter()
            rows.append({"import_s": import_s, "push_cpu_s": push_cpu, "fetch_s": t1 - t0, "evaluate_s": t2 - t1,
                         "telemetry_ok": ev.telemetry_ok, "error": ev.telemetry_error, "gpus": gpus.counts().gpus,
                         "steps": ranks.counts().steps, "findings": len(findings)})
            print(f"[{shard or '1 shard'}] cycle {c + 1}: fetch {t1 - t0:.2f} s, evaluate {t2 - t1:.2f} s, "
                  f"{gpus.counts().gpus:,} GPUs, {ranks.counts().steps:,} steps, {len(findings)} findings",
                  file=sys.stderr, flush=True)
        rss = me.memory_info().rss - rss0
        found = {(f.kind, f.job, f.rank) for f in findings}
    finally:
        source.close()
    owned = {p for p in fleet.planted() if owns(p[1])}
    hit = {p for p in owned if any(k.startswith(p[0]) and (j, r) == (p[1], p[2]) for k, j, r in found)}
    extra = {f for f in found if not any(f[0].startswith(p[0]) and (f[1], f[2]) == (p[1], p[2]) for p in owned)}
    return {"shard": shard, "rows": rows, "rss": rss, "planted": len(owned), "hit": len(hit),
            "missed": sorted(owned - hit), "extra": sorted(extra, key=str), "steps": ranks.counts().steps}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="64 nodes, seconds (smoke test)")
    ap.add_argument("--nodes", type=int, help="nodes of the big job (default 4096, quick 64)")
    ap.add_argument("--small", type=int, help="small jobs, one node each (default 64, quick 4)")
    ap.add_argument("--cycles", type=int, default=8, help="evaluation cycles of 10 simulated seconds (default 8)")
    ap.add_argument("--faults", type=int, help="slow and starved GPUs planted in the big job (default 4 each)")
    args = ap.parse_args(argv)
    nodes = args.nodes or (64 if args.quick else 4096)
    fleet = Fleet(nodes, args.small if args.small is not None else (4 if args.quick else 64), args.faults or 4)
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

        results = [run_shard(url, fleet, None, args.cycles, importer)]
        for i in range(4):
            results.append(run_shard(url, fleet, (i, 4), args.cycles, importer))
        vm_rss = _bench.proc_status_kib(vm.pid, "VmRSS")
    finally:
        _bench.stop(vm)
        shutil.rmtree(data, ignore_errors=True)
    _bench.write_result("fleet_scale", report(results, fleet, args, vm_rss), quick=args.quick)
    return 0


def report(results: list[dict], fleet: Fleet, args: argparse.Namespace, vm_rss_kib: int) -> str:
    gpus = fleet.nodes * GPUS_PER_NODE
    rows = []
    for r in results:
        last = r["rows"][-3:]  # windows full enough that every detector runs
        fetch = max(x["fetch_s"] for x in last)
        evaluate = max(x["evaluate_s"] for x in last)
        rows.append([f"{r['shard'][0]}/{r['shard'][1]}" if r["shard"] else "1 shard (all jobs)",
                     f"{last[-1]['gpus']:,}", f"{r['steps']:,}", f"{fetch:.2f} s", f"{evaluate:.2f} s",
                     f"**{fetch + evaluate:.2f} s**", f"{max(x['import_s'] for x in last):.2f} s",
                     f"{r['rss'] / 2**20:,.0f} MiB", f"{r['hit']}/{r['planted']}",
                     ", ".join(f"{k} {j} r{n}" for k, j, n in r["missed"]) or "—",
                     ", ".join(f"{k} {j} r{n}" for k, j, n in r["extra"][:6]) + (" …" if len(r["extra"]) > 6 else "")
                     or "—"])
    return "\n".join([
        "# Fleet scale: the rules service's evaluation cycle with telemetry from VictoriaMetrics\n",
        _bench.machine_block({
            "victoria-metrics": _vm_version(),
            "setup": f"{fleet.big_nodes:,} nodes × {GPUS_PER_NODE} GPUs for one {fleet.big_nodes * GPUS_PER_NODE:,}-rank "
                     f"job + {fleet.small} jobs of {SMALL_RANKS} ranks on a node each ({gpus:,} GPUs); "
                     f"{args.cycles} cycles of {CYCLE_S:g} simulated s, {int(CYCLE_S / STEP_S)} steps per rank per "
                     f"cycle; planted: {len(fleet.slow)} slow + {len(fleet.starved)} starved GPUs in the big job, "
                     f"{len(fleet.small_slow)} slow in a small job"}),
        "",
        "## One evaluation cycle (the worst of the last three)\n",
        _bench.md_table(["evaluator", "GPUs fetched", "steps held", "fetch (queries + join + store)",
                         "evaluate (expiry + snapshot + detectors)", "cycle", "VictoriaMetrics import of the scrape",
                         "RSS growth", "planted found", "missed", "other findings"], rows),
        "",
        f"VictoriaMetrics RSS at the end: {vm_rss_kib / 1024:,.0f} MiB. A shard fetches the whole fleet's telemetry "
        "(its jobs' GPUs are anywhere), so 4 shards cost 4 fetches; only the evaluation splits. The big job lands "
        "on one shard whole.",
        "",
        "Steps are stored in process (`RankStore.record` with columns), not over HTTP: the HTTP ingest is "
        "rules_ingest.md. The clock is simulated; fetch and evaluate are wall time on a shared 2-vCPU VM.",
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
