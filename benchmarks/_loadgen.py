"""Fallback HTTP load generator (used only when `wrk` is not installed).

Closed loop like wrk: `--conns` worker processes, each one keep-alive connection (reopened when the
server closes it, as HTTP/1.0 servers do), sending GET requests back to back for `--duration`
seconds. Prints one JSON line shaped like the wrk report of agent_serving.py.

    python benchmarks/_loadgen.py http://127.0.0.1:9480/metrics --conns 4 --duration 5 [--gzip]
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import sys
import time
from urllib.parse import urlsplit


def _worker(url: str, duration: float, gzip_ok: bool, start_at: float, q: mp.Queue) -> None:
    parts = urlsplit(url)
    path = parts.path or "/"
    headers = {"Accept-Encoding": "gzip"} if gzip_ok else {}
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    lat: list[float] = []
    nbytes = errors = status_errors = 0
    while time.monotonic() < start_at:
        time.sleep(0.001)
    end = start_at + duration
    pc = time.perf_counter
    while time.monotonic() < end:
        t0 = pc()
        try:
            conn.request("GET", path, headers=headers)
            r = conn.getresponse()
            body = r.read()
            if r.status != 200:
                status_errors += 1
            if r.will_close:
                conn.close()
        except (OSError, http.client.HTTPException):
            errors += 1
            conn.close()
            continue
        lat.append(pc() - t0)
        nbytes += len(body)
    conn.close()
    q.put((lat, nbytes, errors, status_errors))


def run(url: str, conns: int, duration: float, gzip_ok: bool) -> dict[str, float]:
    """Drive `url` for `duration` s with `conns` closed-loop connections; wrk-shaped summary."""
    ctx = mp.get_context("fork")
    q: mp.Queue = ctx.Queue()
    start_at = time.monotonic() + 0.2
    procs = [ctx.Process(target=_worker, args=(url, duration, gzip_ok, start_at, q)) for _ in range(conns)]
    for p in procs:
        p.start()
    results = [q.get(timeout=duration + 60) for _ in procs]
    for p in procs:
        p.join()
    lat = sorted(x for r in results for x in r[0])
    n = len(lat)

    def pct(p: float) -> float:
        return lat[min(n - 1, int(p / 100 * n))] * 1e6 if n else 0.0

    return {"requests": n, "duration_us": duration * 1e6, "bytes": sum(r[1] for r in results),
            "connect": 0, "read": sum(r[2] for r in results), "write": 0,
            "status": sum(r[3] for r in results), "timeout": 0, "p50_us": pct(50), "p99_us": pct(99),
            "mean_us": (sum(lat) / n * 1e6) if n else 0.0, "max_us": lat[-1] * 1e6 if n else 0.0}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("--conns", type=int, default=1)
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--gzip", action="store_true")
    a = ap.parse_args(argv)
    print(json.dumps(run(a.url, a.conns, a.duration, a.gzip)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
