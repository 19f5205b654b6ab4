"""What a hostile network does to the daemons: scrape latency under a slow-loris, and the rules
service under hostile input and label floods past every cap.

1. **Slow-loris.** `gpumond agent --sim 8` under `prlimit --nofile=1024`. /metrics is fetched on a fresh
   connection every 0.2 s, first alone, then while a client holds 1,100 connections that send a request head
   one byte a second and never finish it (reopening those the agent closes). Reported: latency quantiles
   and failures in both phases, and what the client saw closed.
2. **Hostile input.** `gpumond rules` with its default limits except the rate limit (raised so that the
   caps, not the rate, are what refuses), max_ranks 16,384 and max_gpus 8,192 (defaults 65,536: a flood
   past those takes ~4 min here) and max_steps_held 1,000,000 (default 16.7 M, ~3.5 GiB when full).
   Every request of tests/integration/hostile.py's generator (malformed JSON, lying lengths, deep nesting,
   NaN / huge numbers, control characters, odd headers) and then label floods past every cap (jobs, ranks,
   GPUs, steps). Reported: requests sent, the status histogram by kind, RSS before and after the floods.

    python benchmarks/hostile_network.py            # ~3 min
    python benchmarks/hostile_network.py --quick    # ~40 s, smaller floods and phases
"""

from __future__ import annotations

import argparse
import http.client
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import _bench  # noqa: E402

from tests.integration.hostile import SlowLoris, hostile_requests, raw_request, rss_bytes  # noqa: E402

TOKEN = "bench-token-0123456789"
LORIS = 1_100


def _scrape_latencies(port: int, seconds: float, period: float = 0.2) -> tuple[list[float], int]:
    """Fetch /metrics on a fresh connection every `period` s for `seconds`: (latencies of 200s, failures)."""
    lat: list[float] = []
    failures = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.perf_counter()
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            conn.request("GET", "/metrics")
            r = conn.getresponse()
            r.read()
            if r.status == 200:
                lat.append(time.perf_counter() - t0)
            else:
                failures += 1
        except (OSError, http.client.HTTPException):
            failures += 1
        finally:
            conn.close()
        time.sleep(max(0.0, period - (time.perf_counter() - t0)))
    return lat, failures


def _row(phase: str, lat: list[float], failures: int) -> list[object]:
    q = _bench.quantile
    return [phase, len(lat), failures] + [f"{q(lat, p) * 1000:.1f}" if lat else "-" for p in (0.5, 0.95, 0.99, 1.0)]


def slow_loris(seconds: float, work: Path) -> str:
    port = _bench.free_port()
    argv = [shutil.which("prlimit") or "prlimit", "--nofile=1024:1024", "--", sys.executable, "-m", "gpumond.cli",
            "agent", "--sim", "8", "--listen", f"127.0.0.1:{port}", "--node-name", "bench"]
    proc = _bench.Proc("agent", argv, work / "agent.log", cwd=work).start()
    try:
        proc.wait_http(f"http://127.0.0.1:{port}/healthz", 30)
        alone = _scrape_latencies(port, seconds)
        loris = SlowLoris(port, LORIS).start()
        try:
            under = _scrape_latencies(port, seconds)
        finally:
            loris.stop()
        after = _scrape_latencies(port, min(seconds, 5.0))
    finally:
        proc.terminate(10)
    lines = proc.log.read_text(errors="replace").splitlines()
    closed_lines = [line for line in lines if "logger=gpumond.serving" in line]
    table = _bench.md_table(["phase", "scrapes 200", "failed", "p50 ms", "p95 ms", "p99 ms", "max ms"],
                            [_row("alone", *alone), _row(f"under {LORIS}-connection slow-loris", *under),
                             _row("after", *after)])
    return (f"### Slow-loris: `gpumond agent --sim 8` under `prlimit --nofile=1024`\n\n{table}\n\n"
            f"The slow-loris client opened {loris.opened} connections in all ({loris.connect_failures} connects "
            f"failed) and saw {loris.closed_by_server} closed by the agent (evicted past the connection cap, "
            f"or by the 10 s head timeout) and reopened them; the agent wrote {len(closed_lines)} log lines "
            f"about it (rate-limited) and {len(lines)} lines in all, every one a logfmt line. Agent exit "
            f"status {proc.returncode}.\n")


LIMITS = {"pushes_per_second_per_client": 1_000_000, "burst": 1_000_000, "max_ranks": 16_384, "max_gpus": 8_192,
          "max_steps_held": 1_000_000}


def hostile_input(floods: dict[str, int], work: Path) -> str:
    port = _bench.free_port()
    config = work / "rules.yaml"
    config.write_text(f"listen: 127.0.0.1:{port}\ntokens: [{TOKEN}]\nstate_dir: {work / 'state'}\n"
                      f"limits: {LIMITS}\n")
    proc = _bench.Proc("rules", [sys.executable, "-m", "gpumond.cli", "rules", "--config", str(config)],
                       work / "rules.log", cwd=work).start()
    by_kind: dict[str, Counter] = {}
    try:
        proc.wait_http(f"http://127.0.0.1:{port}/healthz", 30)
        rss_before = rss_bytes(proc.pid)
        t0 = time.monotonic()
        movable = min(floods["ranks"], LIMITS["max_ranks"]) - 1
        for kind, request, half_close in hostile_requests(TOKEN, floods=floods, movable_ranks=movable,
                                                          held_jobs=min(floods["jobs"], 2048)):
            group = kind if kind.startswith("flood") else "hostile"
            by_kind.setdefault(group, Counter())[raw_request(port, request, half_close=half_close)] += 1
        elapsed = time.monotonic() - t0
        rss_after = rss_bytes(proc.pid)
        held = _bench.fetch(f"http://127.0.0.1:{port}/metrics").decode()
    finally:
        proc.terminate(10)
    statuses = sorted({s for c in by_kind.values() for s in c}, key=lambda s: (s is None, s or 0))
    rows = [[k, sum(c.values())] + [c.get(s, 0) for s in statuses] for k, c in by_kind.items()]
    total = sum(by_kind.values(), Counter())
    rows.append(["**all**", sum(total.values())] + [total.get(s, 0) for s in statuses])
    table = _bench.md_table(["kind", "requests"] + ["closed" if s is None else str(s) for s in statuses], rows)
    held_lines = "\n".join(line for line in held.splitlines() if line.startswith("gpumond_rules_held"))
    fivexx = sum(n for s, n in total.items() if s is not None and s >= 500)
    return (f"### Hostile input and label floods: `gpumond rules`\n\n"
            f"{sum(total.values())} requests in {elapsed:.0f} s, one connection each; **{fivexx} × 5xx**. "
            f"`closed`: the server closed without an answer (a request it cannot frame).\n\n{table}\n\n"
            f"RSS before the hostile input and floods {rss_before / 2**20:.1f} MiB, after "
            f"{rss_after / 2**20:.1f} MiB (floods: {floods}). Held afterwards:\n\n```\n{held_lines}\n```\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="short phases and small floods (a smoke test)")
    args = ap.parse_args()
    seconds = 8.0 if args.quick else 30.0
    floods = ({"jobs": 300, "ranks": 300, "gpus": 300, "steps": 20_000} if args.quick else
              {"jobs": 2_100, "ranks": 16_500, "gpus": 8_300, "steps": 1_100_000})
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        parts = [slow_loris(seconds, work), hostile_input(floods, work)]
    text = "\n".join([f"# Hostile network{' (quick)' if args.quick else ''}\n", _bench.machine_block({
        "note": "a shared 2-CPU machine with other work running: latencies are indicative"}), "", *parts])
    _bench.write_result("hostile_network", text, quick=args.quick)


if __name__ == "__main__":
    main()
