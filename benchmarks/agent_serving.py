"""Serving /metrics for 8 GPUs: server CPU per series served, for gpumond, the naive pattern and node_exporter.

Servers, all started by this script on 127.0.0.1 and all running for the whole benchmark:

- `gpumond agent --sim 8`: serves bytes rendered once per sample cycle (plain, or gzip when asked).
- naive (start_http_server): benchmarks/naive_exporter.py, NVML read and `generate_latest` per scrape,
  under prometheus-client's own threading WSGI server (HTTP/1.0: one connection per request).
- naive (make_asgi_app + uvicorn): the same collector under uvicorn (httptools when installed, no guard).
- node_exporter: Debian's `/usr/bin/prometheus-node-exporter` with its default collectors, on its own output.

Cost per series = (utime + stime of the server process over the load window, from /proc/PID/stat)
÷ requests ÷ series in the response. The agent keeps sampling at 1 Hz while it serves: that
background CPU is measured on its own (all servers idle, same window) and reported separately; the
per-series figures are given both raw and with each server's own idle rate subtracted.

Load: `wrk` (Debian package) when installed, else benchmarks/_loadgen.py; closed loop, fixed duration,
1 and 4 connections, with and without `Accept-Encoding: gzip`. Cells run in rounds, shuffled within
each round, so every server sees the same machine conditions.

    python benchmarks/agent_serving.py            # ~5 min
    python benchmarks/agent_serving.py --quick    # ~30 s (smoke test)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _bench  # noqa: E402
import _loadgen  # noqa: E402

NODE_EXPORTER = "/usr/bin/prometheus-node-exporter"
TARGET_VS_NODE_EXPORTER = 3.0
TARGET_VS_NAIVE = 10.0

WRK_REPORT = r"""
done = function(summary, latency, requests)
  io.write(string.format('{"requests": %d, "duration_us": %d, "bytes": %d, "connect": %d, "read": %d, ' ..
    '"write": %d, "status": %d, "timeout": %d, "p50_us": %d, "p99_us": %d, "mean_us": %f, "max_us": %d}\n',
    summary.requests, summary.duration, summary.bytes, summary.errors.connect, summary.errors.read,
    summary.errors.write, summary.errors.status, summary.errors.timeout,
    latency:percentile(50), latency:percentile(99), latency.mean, latency.max))
end
"""


@dataclass
class Server:
    key: str
    label: str
    argv: list[str]
    port: int
    proc: _bench.Proc | None = None
    series: list[int] = field(default_factory=list)
    plain_bytes: int = 0
    gzip_bytes: int = 0
    idle_cpu_per_s: float = 0.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    @property
    def n_series(self) -> float:
        return statistics.mean(self.series)


@dataclass
class Cell:
    server: str
    gzip: bool
    conns: int
    runs: list[dict[str, float]] = field(default_factory=list)


def _gpumond_argv(port: int, config: Path, cmd: list[str] | None = None) -> list[str]:
    exe = shutil.which("gpumond")
    base = cmd or ([exe] if exe else [sys.executable, "-m", "gpumond.cli"])
    return [*base, "agent", "--sim", "8", "--listen", f"127.0.0.1:{port}", "--log-level", "warning",
            "--config", str(config)]


def build_servers(include_node_exporter: bool, config: Path, dcgm_config: Path | None = None) -> list[Server]:
    naive = [sys.executable, str(Path(__file__).resolve().parent / "naive_exporter.py")]
    servers = [Server("gpumond", "gpumond agent --sim 8 (cached bytes)", [], _bench.free_port())]
    servers[0].argv = _gpumond_argv(servers[0].port, config)
    if dcgm_config is not None:  # the same agent with dcgm-exporter's names exported as well
        p = _bench.free_port()
        servers.append(Server("variant_dcgm", "gpumond agent --sim 8 with exposition.dcgm_compat on",
                              _gpumond_argv(p, dcgm_config), p))
    p = _bench.free_port()
    servers.append(Server("naive_wsgi", "naive: start_http_server, NVML + generate_latest per scrape",
                          [*naive, "--port", str(p), "--server", "wsgi"], p))
    p = _bench.free_port()
    servers.append(Server("naive_asgi", "naive: make_asgi_app under uvicorn, NVML + generate_latest per scrape",
                          [*naive, "--port", str(p), "--server", "asgi"], p))
    if include_node_exporter:
        p = _bench.free_port()
        servers.append(Server("node_exporter", "prometheus-node-exporter (Debian, default collectors)",
                              [NODE_EXPORTER, f"--web.listen-address=127.0.0.1:{p}"], p))
    return servers


def write_config(path: Path, state_dir: Path, extra: str = "") -> None:
    """Defaults, except that any state the agent keeps goes to a temporary directory, not /var/lib."""
    from gpumond.config import AgentConfig

    path.write_text((f"state_dir: {state_dir}\n" if "state_dir" in AgentConfig.model_fields else "{}\n") + extra)


def load(url: str, conns: int, seconds: int, gzip_ok: bool, use_wrk: bool, script: Path) -> dict[str, float]:
    """One closed-loop load run; a wrk-shaped summary dict."""
    if not use_wrk:
        return _loadgen.run(url, conns, seconds, gzip_ok)
    argv = ["wrk", "-t1", f"-c{conns}", f"-d{seconds}s", "--timeout", "10s", "-s", str(script)]
    if gzip_ok:
        argv += ["-H", "Accept-Encoding: gzip"]
    out = subprocess.run([*argv, url], capture_output=True, text=True, timeout=seconds + 60, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="short run for a smoke test (~30 s)")
    ap.add_argument("--rounds", type=int, help="rounds over all cells (default 5, quick 1)")
    ap.add_argument("--duration", type=int, help="whole seconds of load per cell (default 3, quick 1)")
    ap.add_argument("--idle", type=float, help="seconds of the idle window (default 20, quick 3)")
    ap.add_argument("--loadgen", choices=["auto", "wrk", "python"], default="auto")
    ap.add_argument("--only", help="comma-separated server keys to run (gpumond, naive_wsgi, naive_asgi, "
                                   "node_exporter, variant_dcgm)")
    ap.add_argument("--dcgm-compat", action="store_true",
                    help="also serve from an agent with exposition.dcgm_compat on (the cost of the switch); "
                         "e.g. --dcgm-compat --only gpumond,variant_dcgm --name agent_serving_dcgm_compat")
    ap.add_argument("--name", default="agent_serving", help="result file name (default agent_serving)")
    args = ap.parse_args(argv)
    rounds = args.rounds or (1 if args.quick else 5)
    seconds = args.duration or (1 if args.quick else 3)
    idle_s = args.idle or (3.0 if args.quick else 20.0)
    use_wrk = args.loadgen == "wrk" or (args.loadgen == "auto" and shutil.which("wrk") is not None)
    if args.loadgen == "wrk" and not shutil.which("wrk"):
        raise SystemExit("wrk is not installed (apt-get install -y wrk), or use --loadgen python")
    have_ne = os.access(NODE_EXPORTER, os.X_OK)

    logdir = Path(tempfile.mkdtemp(prefix="gpumond-bench-serving-"))
    config = logdir / "agent.yaml"
    write_config(config, logdir / "state")
    dcgm_config = None
    if args.dcgm_compat:
        dcgm_config = logdir / "agent-dcgm.yaml"
        write_config(dcgm_config, logdir / "state-dcgm", "exposition: {dcgm_compat: {enabled: true}}\n")
    servers = build_servers(have_ne, config, dcgm_config)
    if args.only:
        keep = set(args.only.split(","))
        servers = [s for s in servers if s.key in keep or s.key == "gpumond"]
    script = logdir / "report.lua"
    script.write_text(WRK_REPORT)
    try:
        for s in servers:
            s.proc = _bench.Proc(s.key, s.argv, logdir / f"{s.key}.log").start()
        for s in servers:
            s.proc.wait_http(s.url, 60)
        time.sleep(2.0)  # let the agent's first cycles and the scheduler settle
        return run(args, servers, rounds, seconds, idle_s, use_wrk, script, have_ne)
    finally:
        for s in servers:
            if s.proc is not None:
                s.proc.terminate(10)
        shutil.rmtree(logdir, ignore_errors=True)


def run(args: argparse.Namespace, servers: list[Server], rounds: int, seconds: int, idle_s: float,
        use_wrk: bool, script: Path, have_ne: bool) -> int:
    by_key = {s.key: s for s in servers}
    for s in servers:
        body = _bench.fetch(s.url)
        s.series.append(_bench.count_series(body))
        s.plain_bytes = len(body)
        s.gzip_bytes = len(_bench.fetch(s.url, gzip_ok=True))

    # Idle background CPU: every server idle over the same window.
    before = {s.key: _bench.proc_cpu_s(s.proc.pid) for s in servers}  # type: ignore[union-attr]
    t0 = time.monotonic()
    time.sleep(idle_s)
    wall = time.monotonic() - t0
    for s in servers:
        s.idle_cpu_per_s = (_bench.proc_cpu_s(s.proc.pid) - before[s.key]) / wall  # type: ignore[union-attr]

    cells = [Cell(s.key, gz, c) for s in servers for gz in (False, True) for c in (1, 4)]
    rng = random.Random(7)
    t_load = time.monotonic()
    for _ in range(rounds):
        rng.shuffle(cells)
        for cell in cells:
            s = by_key[cell.server]
            pid = s.proc.pid  # type: ignore[union-attr]
            c0, w0 = _bench.proc_cpu_s(pid), time.monotonic()
            rep = load(s.url, cell.conns, seconds, cell.gzip, use_wrk, script)
            c1, w1 = _bench.proc_cpu_s(pid), time.monotonic()
            rep["cpu_s"], rep["wall_s"] = c1 - c0, w1 - w0
            cell.runs.append(rep)
    load_s = time.monotonic() - t_load
    for s in servers:
        s.series.append(_bench.count_series(_bench.fetch(s.url)))

    def per_request(run: dict[str, float], s: Server, minus_idle: bool) -> float:
        cpu = run["cpu_s"] - (s.idle_cpu_per_s * run["wall_s"] if minus_idle else 0.0)
        return cpu / max(run["requests"], 1)

    def per_series(run: dict[str, float], s: Server, minus_idle: bool) -> float:
        return per_request(run, s, minus_idle) / s.n_series

    cells.sort(key=lambda c: ([s.key for s in servers].index(c.server), c.gzip, c.conns))
    cost_rows, perf_rows = [], []
    med: dict[tuple[str, bool, int, bool], float] = {}
    for cell in cells:
        s = by_key[cell.server]
        raw = [per_series(r, s, False) for r in cell.runs]
        net = [per_series(r, s, True) for r in cell.runs]
        preq = [per_request(r, s, False) for r in cell.runs]
        med[(cell.server, cell.gzip, cell.conns, False)] = statistics.median(raw)
        med[(cell.server, cell.gzip, cell.conns, True)] = statistics.median(net)
        enc = "gzip" if cell.gzip else "plain"
        errors = sum(r["connect"] + r["read"] + r["write"] + r["status"] + r["timeout"] for r in cell.runs)
        cost_rows.append([
            s.label, enc, cell.conns, f"{s.n_series:.0f}",
            f"{statistics.median(preq) * 1e6:,.0f} µs",
            f"{min(raw) * 1e6:.3f} / {statistics.median(raw) * 1e6:.3f} / {max(raw) * 1e6:.3f}",
            f"{statistics.median(net) * 1e6:.3f}",
        ])
        rps = [r["requests"] / (r["duration_us"] / 1e6) for r in cell.runs]
        perf_rows.append([
            s.label, enc, cell.conns, f"{statistics.median(rps):,.0f}",
            f"{statistics.median(r['p50_us'] for r in cell.runs) / 1000:.2f} ms",
            f"{statistics.median(r['p99_us'] for r in cell.runs) / 1000:.2f} ms",
            f"{(s.gzip_bytes if cell.gzip else s.plain_bytes):,}",
            f"{sum(int(r['requests']) for r in cell.runs):,}", errors,
        ])

    # Headline ratios: other server's per-series cost ÷ gpumond's, same encoding and concurrency,
    # paired within each round (both cells ran in the same round) and of the medians.
    head_rows = []
    others = [k for k in ("node_exporter", "naive_wsgi", "naive_asgi") if k in by_key]
    others += [k for k in by_key if k.startswith("variant")]
    cell_of = {(c.server, c.gzip, c.conns): c for c in cells}
    targets = {"node_exporter": TARGET_VS_NODE_EXPORTER, "naive_wsgi": TARGET_VS_NAIVE,
               "naive_asgi": TARGET_VS_NAIVE}
    for other in others:
        for gz in (False, True):
            for conns in (1, 4):
                g, o = cell_of[("gpumond", gz, conns)], cell_of[(other, gz, conns)]
                cols = []
                for minus_idle in (False, True):
                    ratio = med[(other, gz, conns, minus_idle)] / med[("gpumond", gz, conns, minus_idle)]
                    paired = [per_series(ro, by_key[other], minus_idle) / per_series(rg, by_key["gpumond"],
                                                                                         minus_idle)
                              for rg, ro in zip(g.runs, o.runs)]
                    cols.append(f"{ratio:.1f}× (rounds {min(paired):.1f}–{max(paired):.1f})")
                if other in targets:
                    ok = med[(other, gz, conns, False)] / med[("gpumond", gz, conns, False)] >= targets[other]
                    verdict = f"≥ {targets[other]:g}×: {'yes' if ok else '**no**'}"
                else:
                    verdict = "— (< 1× = the variant is cheaper)"
                head_rows.append([by_key[other].label, "gzip" if gz else "plain", conns, *cols, verdict])

    switch_rows = []
    if "variant_dcgm" in by_key:  # what turning exposition.dcgm_compat on costs, per request and per second
        base, dcgm = by_key["gpumond"], by_key["variant_dcgm"]
        for gz in (False, True):
            for conns in (1, 4):
                req = [statistics.median(per_request(r, s, False) for r in cell_of[(s.key, gz, conns)].runs)
                       for s in (base, dcgm)]
                switch_rows.append(["gzip" if gz else "plain", conns,
                                    f"{req[0] * 1e6:,.0f} µs", f"{req[1] * 1e6:,.0f} µs", f"{req[1] / req[0]:.2f}×"])

    idle_rows = [[s.label, f"{s.idle_cpu_per_s * 1e3:.1f} ms/s", f"{s.idle_cpu_per_s * 100:.1f} %"]
                 for s in servers]
    versions = {}
    if have_ne:
        versions["node_exporter"] = _bench.tool_version(NODE_EXPORTER)
    if use_wrk:
        v = subprocess.run(["wrk", "--version"], capture_output=True, text=True)
        versions["load generator"] = ((v.stdout or v.stderr).splitlines() or ["wrk"])[0].split(" Copyright")[0] + \
            ", `-t1`, closed loop"
    else:
        versions["load generator"] = ("benchmarks/_loadgen.py (wrk not installed, or --loadgen python): "
                                      "one process per connection")

    parts = [
        "# Serving /metrics for 8 GPUs: server CPU per series served",
        "",
        _bench.machine_block({
            **versions,
            "setup": f"{rounds} round(s) × {len(cells)} cells ({len(servers)} servers × plain/gzip × 1/4 "
                     f"connections), "
                     f"{seconds:g} s of load per cell, cells shuffled within each round; load phase "
                     f"{load_s:.0f} s; idle window {idle_s:g} s. CPU = utime+stime of the server process "
                     f"(/proc/PID/stat, {_bench.CLK_TCK} ticks/s).",
        }),
        "",
        "## Headline: how much more CPU per series served the others spend than gpumond",
        "",
        "Ratio of medians (and the range of per-round ratios). *Raw* charges everything the server "
        "process did during the load window, including the agent's own 1 Hz sampling; *minus idle* "
        "subtracts each server's idle rate (below) over the window.",
        "",
        _bench.md_table(["vs", "encoding", "conns", "raw", "minus idle", "target"], head_rows),
        "",
        "## Cost per series served",
        "",
        _bench.md_table(["server", "encoding", "conns", "series", "CPU / request (median)",
                         "CPU µs / series raw: min / median / max", "CPU µs / series minus idle (median)"],
                        cost_rows),
        "",
        "## Throughput and latency (as seen by the load generator)",
        "",
        _bench.md_table(["server", "encoding", "conns", "requests/s (median)", "p50 latency", "p99 latency",
                         "response bytes", "requests (all rounds)", "errors"], perf_rows),
        "",
        *([
            "## The cost of exposition.dcgm_compat",
            "",
            f"Series per scrape {by_key['gpumond'].n_series:.0f} → {by_key['variant_dcgm'].n_series:.0f}; "
            f"response {by_key['gpumond'].plain_bytes:,} → {by_key['variant_dcgm'].plain_bytes:,} bytes plain, "
            f"{by_key['gpumond'].gzip_bytes:,} → {by_key['variant_dcgm'].gzip_bytes:,} gzip; idle (sampling) CPU "
            f"{by_key['gpumond'].idle_cpu_per_s * 1e3:.1f} → {by_key['variant_dcgm'].idle_cpu_per_s * 1e3:.1f} ms/s.",
            "",
            _bench.md_table(["encoding", "conns", "CPU / request, off (median)", "CPU / request, on (median)",
                             "on ÷ off"], switch_rows),
            "",
        ] if switch_rows else []),
        "## Idle background CPU (no requests, all servers up)",
        "",
        _bench.md_table(["server", "CPU", "of one core"], idle_rows),
        "",
        "The agent's idle CPU is its sampling (fast cycle every 1 s: NVML reads, series, render + gzip; "
        "slow cycle every 30 s), the XID thread waiting on events (the simulated `nvmlEventSetWait` "
        "polls every 20 ms) and the scheduler. The naive servers sample nothing when idle.",
        "",
        "Caveats: load generator and servers share the 2 CPUs; node_exporter's systemd collector fails "
        "here (no system bus in this container) and node_exporter then does less work than on a real "
        "host. The naive servers' per-scrape cost includes NVML reads through the simulator's Python "
        "callbacks (a real driver's calls cost CPU too, partly in the kernel).",
    ]
    _bench.write_result(args.name, "\n".join(parts), quick=args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
