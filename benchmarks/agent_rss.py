"""Agent memory over a long accelerated run: `gpumond agent --sim 8 --sim-speed X`.

Sampling intervals are in simulated time, so with the default 1 s fast interval the agent attempts
X fast cycles per wall second (the wall interval is clamped at 10 ms by the agent). The full run lets
~10 simulated hours elapse in ≤ 10 wall minutes; the agent may not keep up with X cycles/s, so the
cycles it really ran are counted from outside, without adding anything to the agent:

- every few seconds a short burst of back-to-back scrapes (a new connection each) watches
  `gpumond_collector_duration_seconds{collector="nvml_fast"}`, which the agent rewrites every fast
  cycle; changes ÷ burst time is the achieved cycle rate (a lower bound if the value changed on every
  scrape, which the result flags), and rate × time between bursts, summed, is the cycle count.

Meanwhile VmRSS (/proc/PID/status) is sampled every 2 s and /metrics is scraped (gzip) every second
like a Prometheus would. Reported: start / peak / end RSS, VmHWM, and a least-squares fit of RSS
against simulated time over the second half of the run (KiB per simulated hour).

    python benchmarks/agent_rss.py            # ~9.5 min: speed 64, 562 s → 10 simulated hours
    python benchmarks/agent_rss.py --quick    # ~25 s: speed 64, 20 s → 21 simulated minutes
"""

from __future__ import annotations

import argparse
import http.client
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _bench  # noqa: E402

TARGET_MIB = 64.0
_FAST_DURATION = re.compile(rb'^gpumond_collector_duration_seconds\{collector="nvml_fast"\} (\S+)$', re.M)


def scrape(port: int, gzip_ok: bool) -> bytes:
    """One GET /metrics on a fresh connection (the first exchange of a connection is ACKed at once)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"} if gzip_ok else {})
        r = conn.getresponse()
        return r.read()
    finally:
        conn.close()


def burst(port: int, seconds: float) -> tuple[float, int, int]:
    """(elapsed s, scrapes, changes of the nvml_fast duration) over a burst of back-to-back scrapes."""
    t0 = time.monotonic()
    last, scrapes, changes = None, 0, 0
    while time.monotonic() - t0 < seconds:
        m = _FAST_DURATION.search(scrape(port, False))
        scrapes += 1
        v = m.group(1) if m else None
        if last is not None and v != last:
            changes += 1
        last = v
    return time.monotonic() - t0, scrapes, changes


def agent_argv(port: int, speed: float, config: Path) -> list[str]:
    exe = shutil.which("gpumond")
    base = [exe] if exe else [sys.executable, "-m", "gpumond.cli"]
    return [*base, "agent", "--sim", "8", "--sim-speed", f"{speed:g}", "--listen", f"127.0.0.1:{port}",
            "--config", str(config), "--log-level", "warning"]


def write_config(path: Path, state_dir: Path) -> None:
    from gpumond.config import AgentConfig

    lines = ["sampling: {fast_interval_s: 1, slow_interval_s: 30}"]
    if "state_dir" in AgentConfig.model_fields:  # keep the run's state out of /var/lib
        lines.append(f"state_dir: {state_dir}")
    path.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="~25 s run for a smoke test")
    ap.add_argument("--speed", type=float, default=64.0,
                    help="--sim-speed (default 64: 36,000 fast cycles asked for in 562 s, about what the agent "
                         "can run on this machine)")
    ap.add_argument("--sim-hours", type=float, help="simulated hours to run (default 10, quick: 20 s of wall time)")
    args = ap.parse_args(argv)
    sim_hours = args.sim_hours or ((20.0 * args.speed / 3600) if args.quick else 10.0)
    wall_s = sim_hours * 3600 / args.speed
    rss_every = 1.0 if args.quick else 2.0
    burst_every = 4.0 if args.quick else 10.0
    burst_s = 0.5

    tmp = Path(tempfile.mkdtemp(prefix="gpumond-bench-rss-"))
    config = tmp / "agent.yaml"
    write_config(config, tmp / "state")
    port = _bench.free_port()
    proc = _bench.Proc("agent", agent_argv(port, args.speed, config), tmp / "agent.log").start()
    try:
        proc.wait_http(f"http://127.0.0.1:{port}/metrics", 60)
        samples, bursts = run_load(proc, port, wall_s, rss_every, burst_every, burst_s, args.speed)
        cpu_s = _bench.proc_cpu_s(proc.pid)
        hwm = _bench.proc_status_kib(proc.pid, "VmHWM")
        threads = _bench.proc_status_kib(proc.pid, "Threads")
        series = _bench.count_series(scrape(port, False))
    finally:
        proc.terminate(10)
        tail = proc.tail(1000)
        shutil.rmtree(tmp, ignore_errors=True)
    if proc.returncode not in (0, -15):
        print("agent log tail:\n" + tail, file=sys.stderr)
    report(args, samples, bursts, cpu_s, hwm, threads, series, wall_s)
    return 0


def run_load(proc: _bench.Proc, port: int, wall_s: float, rss_every: float, burst_every: float,
             burst_s: float, speed: float) -> tuple[list[tuple[float, int]], list[tuple[float, float, int, int]]]:
    """Sample RSS, scrape every second, burst-count cycles; returns (rss samples, bursts)."""
    t0 = time.monotonic()
    samples: list[tuple[float, int]] = []      # (wall s since start, VmRSS KiB)
    bursts: list[tuple[float, float, int, int]] = []  # (wall s at burst start, burst s, scrapes, changes)
    next_rss = next_scrape = 0.0
    next_burst = 1.0
    while True:
        now = time.monotonic() - t0
        if now >= wall_s:
            break
        if not proc.alive:
            raise RuntimeError(f"agent exited with status {proc.returncode} after {now:.0f}s")
        if now >= next_rss:
            samples.append((now, _bench.proc_status_kib(proc.pid, "VmRSS")))
            next_rss += rss_every
        if now >= next_scrape:
            scrape(port, True)
            next_scrape += 1.0
        if now >= next_burst and now + burst_s < wall_s:
            elapsed, n, changes = burst(port, burst_s)
            bursts.append((now, elapsed, n, changes))
            next_burst += burst_every
        time.sleep(0.05)
    samples.append((time.monotonic() - t0, _bench.proc_status_kib(proc.pid, "VmRSS")))
    return samples, bursts


def report(args: argparse.Namespace, samples: list[tuple[float, int]], bursts: list[tuple[float, float, int, int]],
           cpu_s: float, hwm_kib: int, threads: int, series: int, wall_s: float) -> None:
    speed = args.speed
    sim_h = wall_s * speed / 3600
    mib = [kib / 1024 for _, kib in samples]
    start, peak, end = mib[0], max(mib), mib[-1]
    half = [(t * speed / 3600, kib) for t, kib in samples if t >= wall_s / 2]
    slope, _ = _bench.linear_fit([h for h, _ in half], [k for _, k in half])
    slope_all, _ = _bench.linear_fit([t * speed / 3600 for t, _ in samples], [k for _, k in samples])

    # Cycle count: each burst's rate holds from the previous boundary to the midpoint to the next one.
    rates = [(t + b / 2, ch / b, n, ch) for t, b, n, ch in bursts if b > 0]
    cycles, saturated = 0.0, sum(1 for _, _, n, ch in rates if ch >= n - 1)
    for i, (mid, rate, _, _) in enumerate(rates):
        lo = 0.0 if i == 0 else (rates[i - 1][0] + mid) / 2
        hi = wall_s if i == len(rates) - 1 else (mid + rates[i + 1][0]) / 2
        cycles += rate * (hi - lo)
    attempted = wall_s * min(speed, 100.0)  # one per simulated second; wall interval clamped at 10 ms
    rate_vals = [r for _, r, _, _ in rates]
    scrape_rates = [n / b for _, b, n, _ in bursts]

    timeline = []
    step = max(1, len(samples) // 10)
    for t, kib in samples[::step] + ([samples[-1]] if (len(samples) - 1) % step else []):
        timeline.append([f"{t:.0f}", f"{t * speed / 3600:.2f}", f"{kib / 1024:.1f}"])

    ok_size = peak <= TARGET_MIB
    parts = [
        "# Agent RSS over a long accelerated run (8 simulated GPUs)",
        "",
        _bench.machine_block({
            "run": f"`gpumond agent --sim 8 --sim-speed {speed:g}` (fast 1 s, slow 30 s in simulated time), "
                   f"{wall_s:.0f} s wall = {sim_h:.2f} simulated hours; "
                   f"VmRSS every {2.0 if not args.quick else 1.0:g} s, "
                   f"a gzip scrape every 1 s, a {bursts[0][1] if bursts else 0:.1f} s cycle-counting burst every "
                   f"{4.0 if args.quick else 10.0:g} s",
            "exposition": f"{series} series",
        }),
        "",
        "## Result",
        "",
        _bench.md_table(["measure", "value", "target"], [
            ["RSS at start (first sample after /metrics answered)", f"{start:.1f} MiB", ""],
            ["RSS peak (samples) / VmHWM", f"{peak:.1f} MiB / {hwm_kib / 1024:.1f} MiB",
             f"≤ {TARGET_MIB:g} MiB: {'yes' if ok_size and hwm_kib / 1024 <= TARGET_MIB else '**no**'}"],
            ["RSS at end", f"{end:.1f} MiB", ""],
            ["second half: RSS range", f"{min(k for _, k in half):,} – {max(k for _, k in half):,} KiB "
             f"({max(k for _, k in half) - min(k for _, k in half):,} KiB apart)", ""],
            ["second half: linear fit of RSS vs simulated time", f"{slope:+.1f} KiB per simulated hour "
             f"({slope * sim_h / 2:+.0f} KiB over the half)", "no growth trend"],
            ["whole run: linear fit of RSS vs simulated time", f"{slope_all:+.1f} KiB per simulated hour", ""],
            ["fast cycles run (estimated from bursts)", f"{cycles:,.0f} (attempted {attempted:,.0f})", ""],
            ["achieved fast-cycle rate, min / median / max over bursts",
             " / ".join(f"{x:.1f}" for x in (min(rate_vals), _median(rate_vals), max(rate_vals))) + " cycles/s"
             if rate_vals else "no bursts", ""],
            ["bursts where every scrape saw a new cycle (rate is then a lower bound)",
             f"{saturated} of {len(rates)} (scrapes/s in bursts: median {_median(scrape_rates):.0f})", ""],
            ["agent CPU over the run", f"{cpu_s:.1f} s ({100 * cpu_s / wall_s:.0f} % of one core)", ""],
            ["agent threads at the end", f"{threads}", ""],
        ]),
        "",
        "## RSS over time",
        "",
        _bench.md_table(["wall s", "simulated h", "VmRSS MiB"], timeline),
        "",
        "At this speed the scheduler asks for a fast cycle every "
        f"{max(1 / speed, 0.01) * 1000:.1f} ms of wall time; when a cycle is late the scheduler coalesces the "
        "missed runs, so the cycle count above is what the agent achieved, not one per simulated second. "
        "Memory depends on cycles run (allocations per cycle) and on simulated time (counters, XID/ECC "
        "history, job caches); the run covers both.",
    ]
    _bench.write_result("agent_rss", "\n".join(parts), quick=args.quick)


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    return (s[len(s) // 2] + s[(len(s) - 1) // 2]) / 2 if s else 0.0


if __name__ == "__main__":
    sys.exit(main())
