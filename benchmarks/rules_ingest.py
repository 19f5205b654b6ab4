"""Ingest: step records per second accepted over HTTP by one rules-service process, vs prometheus-pushgateway.

Servers, all started by this script on 127.0.0.1:

- gpumond: the rules service's app (`gpumond.rules.http.build_app` over a `RankStore`, default
  limits except the per-client push rate, which one load generator on one address would exceed)
  under uvicorn, 1 worker, over the daemons' guarded httptools protocol (gpumond.web.connections and
  gpumond/web/protocols.py: timeouts and connection cap, default limits), as both daemons serve. A thread
  takes the detectors' snapshot (`RankStore.jobs`) and runs `expire` every 10 s, as the evaluation
  loop will, so their cost is inside the measurement.
- pushgateway: Debian's `prometheus-pushgateway`, in memory (`--persistence.file=""`), with its
  default consistency check, and again with `--push.disable-consistency-check` (its fastest mode,
  which its own help calls dangerous).
- optional (`--daemon`): the whole `gpumond rules` daemon with the same limits and no telemetry, so
  its detectors run over the pushed ranks every 10 s next to the ingest.

The same information to both: a push is one rank's 64 steps (step, end, duration_s, data_wait_s,
samples) plus who the rank is (job, rank, world_size, node, gpu_uuid). gpumond gets the push API's
JSON encoding (one server) and its columnar encoding (another server, same code: base64 8-byte columns
that wrk's LuaJIT packs through ffi); the Pushgateway gets, for grouping key job/<job>/rank/<rank>
(PUT: the group holds the rank's latest push, which is all it can hold), the text exposition of four
gauges with a `step` label — gpumond_step_{duration_seconds,data_wait_seconds,end_timestamp_seconds,samples}{step="N"} —
and gpumond_rank_info{world_size,node,gpu_uuid} 1. Ranks are 32 per job and pushed round-robin;
step numbers only ever grow, so every gpumond push is new data (the counters check it).

Load: `wrk` (Debian package), one thread, `--conns` keep-alive connections (closed loop), a Lua
script building each request. Before timing, every rank of the scenario is pushed once (so the
servers hold them all). Then rounds: every server gets one `--duration` cell per round, in a
freshly shuffled order. Records/s = 2xx pushes × 64 ÷ cell time (for gpumond also from its own
accepted-steps counter); latency p50/p99 as wrk measures it; CPU = utime+stime of the server; the
machine's 1-minute load average as each cell ends (on a shared machine it says how far p99 is the machine's).

Paced (`--paced RECORDS_PER_S`, default 65,536: a 32,768-rank job stepping twice a second): after the
rounds of the large scenario, every server gets one more cell in which wrk sends pushes on a schedule of
that many records/s across its connections (the Lua `delay()` hook; latency is timed from each push's
send, as wrk does, so a server that falls behind the schedule shows as a lower rate, not a longer queue).
p50/p99 push latency at that rate is the figure; a closed loop measures them at each server's maximum.

Scenarios: `--small` ranks (default 256 = 8 jobs) with all servers; `--large` ranks (default
32,768 = 1,024 jobs) without the consistency-checking Pushgateway, whose every push gathers every
group it holds, so its push time grows linearly with the groups held (~0.4 s per push at 1,024
groups on the development VM, 7 minutes to fill 1,024 ranks): it cannot be filled to 32,768 in
reasonable time. RSS of each server at start, after the fill and at the end.

    python benchmarks/rules_ingest.py            # ~8 min
    python benchmarks/rules_ingest.py --quick    # ~1 min (smoke test; needs wrk and the pushgateway)
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import multiprocessing as mp
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _bench  # noqa: E402

PUSHGATEWAY = "/usr/bin/prometheus-pushgateway"
TOKEN = "benchmark-token-0123456789"
STEPS = 64
RANKS_PER_JOB = 32
TARGET = 2.0
CPU_TARGET = 3.0  # the Pushgateway's CPU per record ÷ gpumond's
P99_TARGET_MS = 250.0
PACED_RECORDS_PER_S = 65_536  # a 32,768-rank job stepping twice a second
EVALUATION_INTERVAL_S = 10.0

LUA = r"""
local ffi = require("ffi")  -- wrk runs LuaJIT: the columnar body's 8-byte values through ffi
local kind, ranks, nsteps, token, base
local counter, step_of = 0, {}
local B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
local function b64(s)
  local out, n = {}, #s
  for i = 1, n - 2, 3 do
    local a, b, c = s:byte(i, i + 2)
    local v = a * 65536 + b * 256 + c
    out[#out + 1] = B64:sub(math.floor(v / 262144) + 1, math.floor(v / 262144) + 1)
      .. B64:sub(math.floor(v / 4096) % 64 + 1, math.floor(v / 4096) % 64 + 1)
      .. B64:sub(math.floor(v / 64) % 64 + 1, math.floor(v / 64) % 64 + 1) .. B64:sub(v % 64 + 1, v % 64 + 1)
  end
  local rest = n % 3
  if rest > 0 then
    local a, b = s:byte(n - rest + 1, n)
    local v = a * 65536 + (b or 0) * 256
    out[#out + 1] = B64:sub(math.floor(v / 262144) + 1, math.floor(v / 262144) + 1)
      .. B64:sub(math.floor(v / 4096) % 64 + 1, math.floor(v / 4096) % 64 + 1)
      .. (rest == 2 and B64:sub(math.floor(v / 64) % 64 + 1, math.floor(v / 64) % 64 + 1) or "=") .. "="
  end
  return table.concat(out)
end
local function doubles(n, f) local a = ffi.new("double[?]", n) for i = 0, n - 1 do a[i] = f(i) end
  return b64(ffi.string(a, 8 * n)) end
local function int64s(n, f) local a = ffi.new("int64_t[?]", n) for i = 0, n - 1 do a[i] = f(i) end
  return b64(ffi.string(a, 8 * n)) end
local const = {}
ffi.cdef[[
typedef struct { long tv_sec; long tv_nsec; } gpumond_timespec;
int clock_gettime(int clk, gpumond_timespec *ts);
]]
local ts = ffi.new("gpumond_timespec")
local function now_ms() ffi.C.clock_gettime(1, ts) return tonumber(ts.tv_sec) * 1000 + tonumber(ts.tv_nsec) / 1e6 end
local interval_ms, sent, t0 = 0, 0, nil  -- paced: one push every interval_ms across all connections (-t1)
function init(args)
  kind, ranks, nsteps, token, base = args[1], tonumber(args[2]), tonumber(args[3]), args[4], tonumber(args[5])
  counter = tonumber(args[6])
  local pushes_per_s = tonumber(args[7] or "0")
  if pushes_per_s > 0 then interval_ms = 1000 / pushes_per_s end
end
function delay()  -- before each push: wait for its slot on the schedule (0 when not paced or late)
  if interval_ms == 0 then return 0 end
  local now = now_ms()
  t0 = t0 or now
  local due = t0 + sent * interval_ms
  sent = sent + 1
  return math.max(0, math.floor(due - now))
end
local function uuid(r) return string.format("GPU-00000000-0000-0000-0000-%012x", r) end
function request()
  local r = counter % ranks
  counter = counter + 1
  local job, rank, node = "job-" .. math.floor(r / 32), r % 32, "node-" .. math.floor(r / 8)
  local first = base + (step_of[r] or 0)
  step_of[r] = (step_of[r] or 0) + nsteps
  local now, parts = os.time(), {}
  if kind == "columns" then
    if not const.duration then
      const.duration = doubles(nsteps, function() return 0.84 end)
      const.wait = doubles(nsteps, function() return 0.02 end)
      const.samples = int64s(nsteps, function() return 32 end)
    end
    local body = string.format('{"job":"%s","rank":%d,"world_size":32,"node":"%s","gpu_uuid":"%s","columns":'
      .. '{"step":"%s","end":"%s","duration_s":"%s","data_wait_s":"%s","samples":"%s"}}', job, rank, node, uuid(r),
      int64s(nsteps, function(i) return first + i end),
      doubles(nsteps, function(i) return now - (nsteps - i) * 0.1 end),
      const.duration, const.wait, const.samples)
    return wrk.format("POST", "/api/v1/push", {["Content-Type"] = "application/vnd.gpumond.columns+json",
      ["Authorization"] = "Bearer " .. token}, body)
  end
  if kind == "gpumond" then
    for i = 0, nsteps - 1 do
      parts[#parts + 1] = string.format('{"step":%d,"end":%.3f,"duration_s":0.84,"data_wait_s":0.02,"samples":32}',
        first + i, now - (nsteps - i) * 0.1)
    end
    local body = string.format('{"job":"%s","rank":%d,"world_size":32,"node":"%s","gpu_uuid":"%s","steps":[%s]}',
      job, rank, node, uuid(r), table.concat(parts, ","))
    return wrk.format("POST", "/api/v1/push", {["Content-Type"] = "application/json",
      ["Authorization"] = "Bearer " .. token}, body)
  end
  local names = {"gpumond_step_duration_seconds", "gpumond_step_data_wait_seconds",
                 "gpumond_step_end_timestamp_seconds", "gpumond_step_samples"}
  for k, name in ipairs(names) do
    parts[#parts + 1] = "# TYPE " .. name .. " gauge"
    for i = 0, nsteps - 1 do
      local v = (k == 1 and "0.84") or (k == 2 and "0.02")
                or (k == 3 and string.format("%.3f", now - (nsteps - i) * 0.1)) or "32"
      parts[#parts + 1] = string.format('%s{step="%d"} %s', name, first + i, v)
    end
  end
  parts[#parts + 1] = "# TYPE gpumond_rank_info gauge"
  parts[#parts + 1] = string.format('gpumond_rank_info{world_size="32",node="%s",gpu_uuid="%s"} 1', node, uuid(r))
  return wrk.format("PUT", "/metrics/job/" .. job .. "/rank/" .. rank,
    {["Content-Type"] = "text/plain; version=0.0.4"}, table.concat(parts, "\n") .. "\n")
end
done = function(summary, latency, requests)
  io.write(string.format('{"requests": %d, "duration_us": %d, "status": %d, "errors": %d, "p50_us": %d, '
    .. '"p99_us": %d}\n', summary.requests, summary.duration, summary.errors.status,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    latency:percentile(50), latency:percentile(99)))
end
"""


# ----- the gpumond server (run as a child: `rules_ingest.py --serve PORT`) ----------------------
def serve(port: int) -> None:
    """The rules service's app under uvicorn, with an evaluation-like snapshot thread, over the daemons'
    guarded protocol."""
    import uvicorn

    from gpumond.config.rules import RulesConfig
    from gpumond.rules.http import build_app
    from gpumond.rules.ingest.stats import IngestStats
    from gpumond.rules.store import RankStore

    config = RulesConfig.model_validate({"tokens": [TOKEN], "limits": {"pushes_per_second_per_client": 1e6,
                                                                       "burst": 1_000_000}})
    store = RankStore.from_config(config)
    stats = IngestStats(store)

    def metrics() -> bytes:
        lines = []
        for s in stats.series():
            labels = ",".join(f'{k}="{v}"' for k, v in s.labels)
            lines.append(f"{s.name}{{{labels}}} {s.value:.0f}")
        return ("\n".join(lines) + "\n").encode()

    def evaluate() -> None:
        while True:
            time.sleep(EVALUATION_INTERVAL_S)
            t0 = time.perf_counter()
            store.jobs(time.time())
            t1 = time.perf_counter()
            store.expire(time.time())
            print(json.dumps({"snapshot_s": t1 - t0, "expire_s": time.perf_counter() - t1}), file=sys.stderr,
                  flush=True)

    threading.Thread(target=evaluate, daemon=True).start()
    app = build_app(config=config, rank_store=store, findings=list, metrics=metrics, ready=lambda: (True, "ok"),
                    clock=time.time, stats=stats)
    from gpumond.web.connections import ConnectionLimits
    from gpumond.web.protocols import guarded_protocol

    http, _ = guarded_protocol(ConnectionLimits())
    uvicorn.run(app, host="127.0.0.1", port=port, workers=1, log_level="warning", access_log=False, http=http)


# ----- servers -----------------------------------------------------------------------------------
@dataclass
class Server:
    key: str
    label: str
    kind: str  # "gpumond" | "pgw"
    argv: list[str]
    port: int
    log: Path
    proc: subprocess.Popen | None = None
    cells: list[dict[str, float]] = field(default_factory=list)
    paced: dict[str, float] = field(default_factory=dict)
    rss_kib: dict[str, int] = field(default_factory=dict)
    held_at_end: str = ""
    held_steps: int = 0
    base: int = 0  # first step number of the next load run
    body: str = ""  # what wrk sends it, when not its kind's default: "columns" (the columnar push encoding)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        out = open(self.log, "wb")  # noqa: SIM115 - closed with the process
        self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        _bench.wait_http(self.url + ("/healthz" if self.kind == "gpumond" else "/-/healthy"), 60, self.proc)

    def cpu_s(self) -> float:
        return _bench.proc_cpu_s(self.proc.pid)  # type: ignore[union-attr]

    def rss(self) -> int:
        return _bench.proc_status_kib(self.proc.pid, "VmRSS")  # type: ignore[union-attr]

    def accepted_steps(self) -> int | None:
        if self.kind != "gpumond":
            return None
        text = _bench.fetch(self.url + "/metrics").decode()
        m = re.search(r'gpumond_rules_push_steps_total\{result="accepted"\} ([0-9.e+]+)', text)
        return int(float(m.group(1))) if m else None

    def held(self) -> str:
        if self.kind != "gpumond":
            return ""
        text = _bench.fetch(self.url + "/metrics").decode()
        held = {k: int(float(v)) for k, v in re.findall(r'gpumond_rules_held\{kind="(\w+)"\} ([0-9.e+]+)', text)}
        self.held_steps = held["steps"]
        return f"{held['ranks']:,} ranks, {held['steps']:,} steps"


def build(scenario: str, logdir: Path, with_checked_pgw: bool, daemon: bool) -> list[Server]:
    def port() -> int:
        return _bench.free_port()

    me = str(Path(__file__).resolve())
    servers = []
    p = port()
    servers.append(Server("gpumond", "gpumond ingest (guarded httptools), JSON pushes", "gpumond",
                          [sys.executable, me, "--serve", str(p)], p, logdir / "g.log"))
    p = port()
    servers.append(Server("gpumond_columns", "gpumond ingest (guarded httptools), columnar pushes", "gpumond",
                          [sys.executable, me, "--serve", str(p)], p, logdir / "gc.log", body="columns"))
    if daemon:
        config = logdir / "rules.yaml"
        config.write_text(f"tokens: [{TOKEN}]\nstate_dir: {logdir / 'rules-state'}\n"
                          f"limits: {{pushes_per_second_per_client: 1000000, burst: 1000000}}\n")
        p = port()
        exe = shutil.which("gpumond")
        argv = [exe] if exe else [sys.executable, "-m", "gpumond.cli"]
        servers.append(Server("daemon", "gpumond rules daemon (guarded httptools, with detectors)", "gpumond",
                              [*argv, "rules", "--config", str(config), "--listen", f"127.0.0.1:{p}",
                               "--log-level", "warning"], p, logdir / "d.log"))
    pgw = [PUSHGATEWAY, "--persistence.file=", "--log.level=warn"]
    if with_checked_pgw:
        p = port()
        servers.append(Server("pgw", "prometheus-pushgateway (defaults)", "pgw",
                              [*pgw, f"--web.listen-address=127.0.0.1:{p}"], p, logdir / "p.log"))
    p = port()
    servers.append(Server("pgw_nocheck", "prometheus-pushgateway --push.disable-consistency-check", "pgw",
                          [*pgw, "--push.disable-consistency-check", f"--web.listen-address=127.0.0.1:{p}"], p,
                          logdir / "pn.log"))
    for s in servers:
        s.log = logdir / f"{scenario}-{s.key}.log"
    return servers


# ----- load --------------------------------------------------------------------------------------
def _fill_worker(kind: str, port: int, ranks: range) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    bad = 0
    for r in ranks:
        job, rank, node, uuid = f"job-{r // RANKS_PER_JOB}", r % RANKS_PER_JOB, f"node-{r // 8}", \
            f"GPU-00000000-0000-0000-0000-{r:012x}"
        now = time.time()
        if kind == "gpumond":
            body = json.dumps({"job": job, "rank": rank, "world_size": RANKS_PER_JOB, "node": node, "gpu_uuid": uuid,
                               "steps": [{"step": i, "end": now - (STEPS - i) * 0.1, "duration_s": 0.84,
                                          "data_wait_s": 0.02, "samples": 32} for i in range(STEPS)]}).encode()
            conn.request("POST", "/api/v1/push", body, {"Content-Type": "application/json",
                                                        "Authorization": f"Bearer {TOKEN}"})
        else:
            lines = []
            for name, value in (("duration_seconds", "0.84"), ("data_wait_seconds", "0.02"),
                                ("end_timestamp_seconds", None), ("samples", "32")):
                lines.append(f"# TYPE gpumond_step_{name} gauge")
                lines += [f'gpumond_step_{name}{{step="{i}"}} {value or f"{now - (STEPS - i) * 0.1:.3f}"}'
                          for i in range(STEPS)]
            lines += ["# TYPE gpumond_rank_info gauge",
                      f'gpumond_rank_info{{world_size="32",node="{node}",gpu_uuid="{uuid}"}} 1']
            conn.request("PUT", f"/metrics/job/{job}/rank/{rank}", ("\n".join(lines) + "\n").encode(),
                         {"Content-Type": "text/plain; version=0.0.4"})
        response = conn.getresponse()
        response.read()
        bad += response.status >= 300
    conn.close()
    return bad


def fill(server: Server, ranks: int, procs: int = 4) -> float:
    """Push every rank once (so the server holds them all); seconds taken."""
    t0 = time.monotonic()
    with mp.get_context("fork").Pool(procs) as pool:
        bad = sum(pool.starmap(_fill_worker, [(server.kind, server.port, range(i, ranks, procs))
                                              for i in range(procs)]))
    if bad:
        raise RuntimeError(f"{server.label}: {bad} of {ranks} fill pushes failed")
    server.base = 1_000_000
    return time.monotonic() - t0


def load(server: Server, ranks: int, seconds: int, conns: int, script: Path, paced: float = 0.0) -> dict[str, float]:
    """One wrk run against the server (closed loop, or `paced` records/s); throughput, latency and CPU of the
    cell. A paced cell is not added to the server's closed-loop cells."""
    start_rank = random.randrange(ranks)
    argv = ["wrk", "-t1", f"-c{conns}", f"-d{seconds}s", "--timeout", "30s", "-s", str(script), server.url, "--",
            server.body or server.kind, str(ranks), str(STEPS), TOKEN, str(server.base), str(start_rank),
            f"{paced / STEPS:.3f}"]
    server.base += 10_000_000  # every run pushes step numbers no earlier run used
    accepted0, cpu0 = server.accepted_steps(), server.cpu_s()
    out = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 120, check=True).stdout
    cpu = server.cpu_s() - cpu0
    accepted1 = server.accepted_steps()
    r = json.loads(out.strip().splitlines()[-1])
    wall = r["duration_us"] / 1e6
    ok = r["requests"] - r["status"]
    cell = {"records_per_s": ok * STEPS / wall, "ok": ok, "wall": wall, "cpu": cpu, "pushes": r["requests"],
            "non_2xx": r["status"], "errors": r["errors"], "p50_ms": r["p50_us"] / 1e3, "p99_ms": r["p99_us"] / 1e3,
            # The machine's 1-minute load average as the cell ends: above its CPU count, runnable work waited
            # for a CPU (other benchmarks or builds on a shared machine), which shows first in p99.
            "load1": os.getloadavg()[0]}
    if accepted0 is not None and accepted1 is not None:
        cell["counter_records_per_s"] = (accepted1 - accepted0) / wall
    if not paced:
        server.cells.append(cell)
    return cell


# ----- the run -----------------------------------------------------------------------------------
def scenario(name: str, ranks: int, args: argparse.Namespace, logdir: Path, script: Path, with_checked_pgw: bool,
             paced: float = 0.0) -> tuple[list[Server], dict[str, float], list[dict[str, float]]]:
    servers = build(name, logdir, with_checked_pgw, args.daemon)
    fills: dict[str, float] = {}
    try:
        for s in servers:
            s.start()
        time.sleep(1.0)
        for s in servers:
            s.rss_kib["start"] = s.rss()
        for s in servers:
            print(f"[{name}] filling {s.label} with {ranks:,} ranks ...", file=sys.stderr, flush=True)
            fills[s.key] = fill(s, ranks)
            s.rss_kib["after fill"] = s.rss()
        time.sleep(2.0)
        rng = random.Random(11)
        for rnd in range(args.rounds):
            order = servers[:]
            rng.shuffle(order)
            for s in order:
                c = load(s, ranks, args.duration, args.conns, script)
                print(f"[{name}] round {rnd + 1}: {s.key:18} {c['records_per_s']:>10,.0f} records/s  "
                      f"p50 {c['p50_ms']:.1f} ms  p99 {c['p99_ms']:.1f} ms", file=sys.stderr, flush=True)
        if paced:
            for s in sorted(servers, key=lambda _: rng.random()):
                s.paced = load(s, ranks, args.duration, args.conns, script, paced=paced)
                print(f"[{name}] paced {paced:,.0f}/s: {s.key:18} {s.paced['records_per_s']:>10,.0f} records/s  "
                      f"p50 {s.paced['p50_ms']:.1f} ms  p99 {s.paced['p99_ms']:.1f} ms", file=sys.stderr, flush=True)
        if not args.quick:
            time.sleep(EVALUATION_INTERVAL_S + 1)  # one more snapshot after the load
        for s in servers:
            s.rss_kib["end"] = s.rss()
            s.held_at_end = s.held()
        snapshots = [json.loads(line) for s in servers if s.kind == "gpumond"
                     for line in s.log.read_text().splitlines() if line.startswith("{")]
    finally:
        for s in servers:
            if s.proc is not None:
                _bench.stop(s.proc)
    return servers, fills, snapshots


@dataclass
class Totals:
    """One server's cells of a scenario, summed: robust when a slow server completes few pushes."""

    records: int
    wall: float
    cpu: float
    p50_ms: float
    p99_ms: float

    @classmethod
    def of(cls, server: Server) -> Totals:
        done = [c for c in server.cells if c["ok"]]
        return cls(sum(int(c["ok"]) for c in server.cells) * STEPS, sum(c["wall"] for c in server.cells),
                   sum(c["cpu"] for c in server.cells),
                   statistics.median(c["p50_ms"] for c in done) if done else math.nan,
                   statistics.median(c["p99_ms"] for c in done) if done else math.nan)

    @property
    def rate(self) -> float:
        """Records/s; with no push completed, the bound one push would have given (shown as "<")."""
        return max(self.records, STEPS) / self.wall

    @property
    def cpu_per_record(self) -> float:
        return self.cpu / max(self.records, STEPS)

    def fmt_rate(self) -> str:
        return f"{'< ' if not self.records else ''}{self.rate:,.0f}"


def report(results: list[tuple[str, int, list[Server], dict[str, float], list[dict[str, float]]]],
           args: argparse.Namespace) -> str:
    out = ["# Rules-service ingest: step records/s over HTTP vs prometheus-pushgateway\n",
           _bench.machine_block({
               "pushgateway": _pgw_version(), "load generator": f"wrk {_wrk_version()}, -t1 -c{args.conns}",
               "setup": f"{args.rounds} round(s) × {args.duration} s per server per scenario, shuffled within "
                        f"each round; a push = one rank × {STEPS} steps; {RANKS_PER_JOB} ranks per job"}), ""]
    out.append("## Headline\n")
    out.append("Records/s ratio = gpumond's records ÷ the Pushgateway's over all their interleaved cells; "
               "CPU ratio = the Pushgateway's server CPU per record ÷ gpumond's (the figure least disturbed by "
               "other load on the machine).\n")
    rows = []
    for _, ranks, servers, _, _ in results:
        for g in (s for s in servers if s.kind == "gpumond"):
            for other in (s for s in servers if s.kind == "pgw"):
                tg, to = Totals.of(g), Totals.of(other)
                ratio = tg.rate / to.rate
                rounds = [a["ok"] / b["ok"] for a, b in zip(g.cells, other.cells) if b["ok"]]
                bound = "> " if not to.records else ""
                rows.append([f"{ranks:,}", g.label, other.label, f"{bound}{ratio:,.1f}×",
                             f"{min(rounds):,.1f}–{max(rounds):,.1f}×" if rounds else "n/a",
                             f"{bound}{to.cpu_per_record / tg.cpu_per_record:,.1f}×",
                             "yes" if ratio >= TARGET else "**no**",
                             "yes" if to.cpu_per_record >= CPU_TARGET * tg.cpu_per_record else "**no**"])
    out.append(_bench.md_table(["ranks held", "server", "vs", "records/s ratio", "per-round ratios",
                                "CPU per record ratio", f"records/s ≥ {TARGET:g}×", f"CPU ≥ {CPU_TARGET:g}× less"],
                               rows))
    for _, ranks, servers, fills, snaps in results:
        out.append(f"\n## {ranks:,} ranks ({ranks // RANKS_PER_JOB:,} jobs × {RANKS_PER_JOB})\n")
        rows = []
        for s in servers:
            t = Totals.of(s)
            counters = [c["counter_records_per_s"] * c["wall"] for c in s.cells if "counter_records_per_s" in c]
            counter = f"{sum(counters) / t.wall:,.0f}" if counters else "—"
            rows.append([s.label, t.fmt_rate(), counter, f"{t.p50_ms:,.1f} ms", f"{t.p99_ms:,.1f} ms",
                         f"{t.cpu_per_record * 1e6:,.2f} µs", f"{t.cpu / t.wall * 100:.0f} %",
                         f"{sum(c['pushes'] for c in s.cells):,}",
                         f"{sum(c['non_2xx'] + c['errors'] for c in s.cells):,}", _loads(s.cells)])
        out.append(_bench.md_table(["server", "records/s (2xx × 64)", "records/s (accepted counter)", "p50 push",
                                    "p99 push", "CPU / record", "CPU of a core", "pushes", "non-2xx + errors",
                                    "load average (1 min) at its cells' ends"], rows))
        out.append("")
        rows = []
        for s in servers:
            row = [s.label, f"{fills[s.key]:,.1f} s", f"{s.rss_kib['start'] / 1024:,.0f} MiB",
                   f"{s.rss_kib['after fill'] / 1024:,.0f} MiB", f"{s.rss_kib['end'] / 1024:,.0f} MiB",
                   s.held_at_end or "—"]
            if s.held_steps:
                per = (s.rss_kib["end"] - s.rss_kib["start"]) * 1024 / s.held_steps
                row[-1] += f" (~{per:,.0f} B RSS per step)"
            rows.append(row)
        out.append(_bench.md_table(["server", f"fill ({ranks:,} pushes, 4 clients)", "RSS at start",
                                    "RSS after fill", "RSS at end", "held at end"], rows))
        if any(s.paced for s in servers):
            out.append(f"\nPaced at {args.paced:,.0f} records/s ({args.paced / STEPS:,.0f} pushes/s over "
                       f"{args.conns} connections, one {args.duration} s cell each, after the rounds):\n")
            out.append(_bench.md_table(["server", "records/s reached", "p50 push", "p99 push", "CPU / record",
                                        "non-2xx + errors", "load average (1 min)", f"p99 ≤ {P99_TARGET_MS:g} ms"], [
                [s.label, f"{s.paced['records_per_s']:,.0f}", f"{s.paced['p50_ms']:,.1f} ms",
                 f"{s.paced['p99_ms']:,.1f} ms",
                 f"{s.paced['cpu'] / max(s.paced['ok'] * STEPS, 1) * 1e6:,.2f} µs",
                 f"{s.paced['non_2xx'] + s.paced['errors']:,.0f}", _loads([s.paced]),
                 ("yes" if s.paced["p99_ms"] <= P99_TARGET_MS else "**no**")
                 + ("" if s.paced["records_per_s"] >= 0.95 * args.paced else " (rate not reached)")]
                for s in servers if s.paced]))
        if snaps:
            snap = [x["snapshot_s"] for x in snaps]
            exp = [x["expire_s"] for x in snaps]
            out.append(f"\ngpumond evaluation-loop work every {EVALUATION_INTERVAL_S:g} s during the scenario "
                       f"({len(snap)} runs over the gpumond servers): `RankStore.jobs` snapshot median "
                       f"{statistics.median(snap) * 1e3:,.0f} ms / max {max(snap) * 1e3:,.0f} ms; `expire` median "
                       f"{statistics.median(exp) * 1e3:,.0f} ms / max {max(exp) * 1e3:,.0f} ms.")
    out.append(CAVEATS)
    return "\n".join(out)


def _loads(cells: list[dict[str, float]]) -> str:
    loads = [c["load1"] for c in cells if "load1" in c]
    if not loads:
        return "—"
    low, high = min(loads), max(loads)
    return f"{low:.1f}" if high - low < 0.05 else f"{low:.1f}–{high:.1f}"


CAVEATS = """
## Notes

- Records/s counts step records in pushes answered 2xx; for gpumond the accepted-steps counter
  (new records stored) agrees, since every push carries new step numbers.
- Per-client rate limiting is on in gpumond but raised above what the load generator (one token,
  one address) sends; everything else is the default config (caps, windows: max_steps_held
  bounds memory, so past 16,777,216 held steps ranks roll their own windows).
- The Pushgateway keeps only the latest push per rank (grouping key), gpumond keeps the window
  (up to window_s = 300 s and max_steps_per_rank = 2,048 steps per rank): gpumond holds more.
- The machine is a small VM shared with other work; wrk and the servers share its CPUs, and the
  Pushgateway (Go) may use both while gpumond (one Python process) uses one. Absolute figures
  drift; the interleaved ratios and CPU per record are the comparable ones. The load average is
  the machine's as each cell ended: above 2 (its CPUs), work waited for a CPU, and push latency
  (p99 first) measures that wait as much as the server.
"""


def _pgw_version() -> str:
    try:
        out = subprocess.run([PUSHGATEWAY, "--version"], capture_output=True, text=True, timeout=10)
        return (out.stdout or out.stderr).splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        return "unknown"


def _wrk_version() -> str:
    out = subprocess.run(["wrk", "-v"], capture_output=True, text=True, timeout=10)
    return (out.stdout or out.stderr).split("Copyright")[0].strip()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--serve", type=int, metavar="PORT", help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true", help="short run for a smoke test")
    ap.add_argument("--rounds", type=int, help="rounds (default 3, quick 1)")
    ap.add_argument("--duration", type=int, help="seconds of load per server per round (default 10, quick 2)")
    ap.add_argument("--conns", type=int, default=32, help="concurrent keep-alive connections (default 32)")
    ap.add_argument("--small", type=int, help="ranks in the small scenario (default 256, quick 64)")
    ap.add_argument("--large", type=int, help="ranks in the large scenario (default 32768, quick 1024)")
    ap.add_argument("--paced", type=float, metavar="RECORDS_PER_S",
                    help=f"the large scenario's paced cell, records/s (default {PACED_RECORDS_PER_S:,}; 0: none)")
    ap.add_argument("--daemon", action="store_true",
                    help="also run the whole `gpumond rules` daemon (detectors included, no telemetry)")
    ap.add_argument("--name", default="rules_ingest", help="result file name")
    args = ap.parse_args(argv)
    if args.serve:
        serve(args.serve)
        return 0
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.duration = args.duration or (2 if args.quick else 10)
    small = args.small or (64 if args.quick else 256)
    large = args.large or (1024 if args.quick else 32768)
    args.paced = PACED_RECORDS_PER_S / (8 if args.quick else 1) if args.paced is None else args.paced
    for exe in ("wrk", PUSHGATEWAY):
        if not shutil.which(exe):
            raise SystemExit(f"{exe} is not installed: apt-get install -y wrk prometheus-pushgateway")
    logdir = Path(tempfile.mkdtemp(prefix="gpumond-bench-ingest-"))
    script = logdir / "push.lua"
    script.write_text(LUA)
    try:
        results = []
        for name, ranks, checked in (("small", small, True), ("large", large, False)):
            servers, fills, snaps = scenario(name, ranks, args, logdir, script, checked,
                                             paced=args.paced if name == "large" else 0.0)
            results.append((name, ranks, servers, fills, snaps))
        _bench.write_result(args.name, report(results, args), quick=args.quick)
    finally:
        shutil.rmtree(logdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
