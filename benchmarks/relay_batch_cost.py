"""The rules service's CPU per step: each rank pushing its own columnar push, against the node relay's batch of
the same pushes (one request per node and job per interval), in the columnar batch the relay sends and in the
line batch it sent before (one columnar push a line).

A real `gpumond rules` daemon on loopback; this process sends, over one kept-alive connection, the pushes of
`--nodes` nodes × 8 ranks, each push 4 steps (2 s of a rank stepping twice a second: the relay's default
interval), first one request per push, then one batch per node of the same pushes in each batch format (fresh
step numbers, so every step is stored every way). An empty columnar batch per node (no pushes) is the request's
own cost, which no body format can save. The service's CPU time (utime + stime from /proc) over each phase, per step
stored, is the figure; the ratio within the run is what to quote.

    python benchmarks/relay_batch_cost.py            # ~1 min
    python benchmarks/relay_batch_cost.py --quick    # a few seconds (smoke test)
"""

from __future__ import annotations

import base64
import json
import sys
import tempfile
import time
from array import array
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _bench  # noqa: E402
from gpumond.wire.batch import encode_batch, encode_columns_batch  # noqa: E402
from gpumond.wire.media import BATCH_COLUMNS_TYPE, BATCH_TYPE, COLUMNS_TYPE  # noqa: E402

TOKEN = "relay-batch-bench-token-0123456789"
RANKS_PER_NODE = 8
STEPS_PER_PUSH = 4


def push(node: int, rank: int, first: int, now: float) -> bytes:
    """One rank's columnar push of STEPS_PER_PUSH steps (what the relay forwards as one batch line)."""
    steps = array("q", range(first, first + STEPS_PER_PUSH))
    ends = array("d", [now - (STEPS_PER_PUSH - i) * 0.5 for i in range(STEPS_PER_PUSH)])
    columns = {"step": steps, "end": ends, "duration_s": array("d", [0.5] * STEPS_PER_PUSH),
               "data_wait_s": array("d", [0.01] * STEPS_PER_PUSH)}
    body = {"job": f"job-{node}", "rank": rank, "world_size": RANKS_PER_NODE, "node": f"node-{node}",
            "gpu_uuid": f"GPU-{node:08x}-0000-4000-8000-{rank:012x}",
            "columns": {k: base64.b64encode(v.tobytes()).decode() for k, v in columns.items()}}
    return json.dumps(body, separators=(",", ":")).encode()


# way -> (Content-Type, the requests of one node's pushes in one interval), in the order the phases run.
WAYS = {
    "one push per rank (direct)": (COLUMNS_TYPE, lambda job, bodies: bodies),
    "one line batch per node and interval (the relay before)": (BATCH_TYPE, lambda job, bodies: [encode_batch(job, bodies)]),
    "one columnar batch per node and interval (relay)": (BATCH_COLUMNS_TYPE,
                                                         lambda job, bodies: [encode_columns_batch(job, bodies)]),
    "an empty columnar batch per node and interval (the request alone)": (
        BATCH_COLUMNS_TYPE, lambda job, bodies: [encode_columns_batch(job, [])]),
}


def phase(client: httpx.Client, url: str, rules: _bench.Proc, nodes: int, rounds: int, first: int,
          way: str) -> tuple[float, int, int]:
    """(service CPU seconds, steps stored, requests) for `rounds` intervals of every node's ranks."""
    content_type, requests_of = WAYS[way]
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": content_type}
    cpu0 = _bench.proc_cpu_s(rules.pid)
    stored = requests = 0
    for r in range(rounds):
        now = time.time()
        for node in range(nodes):
            bodies = [push(node, rank, first + r * STEPS_PER_PUSH, now) for rank in range(RANKS_PER_NODE)]
            for body in requests_of(f"job-{node}", bodies):
                answer = client.post(url, content=body, headers=headers)
                assert answer.status_code == 202, answer.text
                got = answer.json()
                stored += sum(x["accepted"] for x in got["results"]) if "results" in got else got["accepted"]
                requests += 1
    return _bench.proc_cpu_s(rules.pid) - cpu0, stored, requests


def main() -> None:
    ap = _bench.parser(__doc__, "2 nodes × 20 intervals")
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=120, help="intervals per phase per repeat")
    ap.add_argument("--repeats", type=int, default=3, help="phases alternate this many times each")
    args = ap.parse_args()
    if args.quick:
        args.nodes, args.rounds, args.repeats = 2, 20, 1
    # One client sends what every rank would: the per-client rate limit is lifted (each rank is its own client).
    # Ingest only, as relay_scale.py measures it: evaluation costs the same steps whichever way they came.
    rules, base = _bench.start_rules(Path(tempfile.mkdtemp(prefix="relay-batch-")), [TOKEN], log={"level": "warning"},
                                     evaluation_interval_s=3600, judge_on_steps={"enabled": False},
                                     power_slack={"enabled": False},
                                     limits={"pushes_per_second_per_client": 100_000, "burst": 100_000})
    results: dict[str, list[tuple[float, int, int]]] = {way: [] for way in WAYS}
    try:
        url = f"{base}/api/v1/push"
        with httpx.Client(timeout=30) as client:
            first = 0
            phase(client, url, rules, args.nodes, 5, first, next(iter(WAYS)))  # warm-up: every rank held once
            first += 5 * STEPS_PER_PUSH
            for _ in range(args.repeats):
                for way in WAYS:
                    results[way].append(phase(client, url, rules, args.nodes, args.rounds, first, way))
                    first += args.rounds * STEPS_PER_PUSH
    finally:
        rules.terminate()
    rows = []
    per_request = {}
    per_step = {}
    for way, runs in results.items():
        cpu = sum(r[0] for r in runs)
        steps = sum(r[1] for r in runs)
        requests = sum(r[2] for r in runs)
        per_request[way] = cpu / requests
        per_step[way] = cpu / steps if steps else None
        rows.append((way, f"{requests:,}", f"{steps:,}", f"{cpu:.2f}",
                     _bench.fmt_us(cpu / steps) if steps else "–", _bench.fmt_us(cpu / requests)))
    direct, lines, columns, empty = WAYS

    def times(a: str, b: str) -> float:  # a quick run's few 10 ms ticks may read 0 CPU
        return per_step[a] / per_step[b] if per_step[b] else float("inf")

    _bench.report(
        "relay_batch_cost", "# The rules service's CPU per step: pushes per rank against the relay's batches",
        {"command": " ".join(sys.argv), "setup": f"{args.nodes} nodes × {RANKS_PER_NODE} ranks, {STEPS_PER_PUSH} "
         f"steps a push (2 s at 2 steps/s), {args.rounds} intervals per phase, phases in turn {args.repeats}×; "
         "one kept-alive connection from this process to the `gpumond rules` daemon (default config but the per-client "
         "rate limit lifted: here one client sends what every rank would; evaluation set apart, "
         "`evaluation_interval_s` 3600 and `judge_on_steps` off, so the figure is ingest)",
         "note": "the machine's 2 vCPUs are shared with other work: compare the ways within the run"},
        _bench.md_table(("path", "requests", "steps stored", "service CPU s", "CPU per step", "CPU per request"), rows),
        f"**The columnar batch costs the service {times(direct, columns):.1f}× less CPU per step than "
        f"a push per rank** and {times(lines, columns):.2f}× less than the line batch (same pushes, every "
        f"step stored every way). A columnar batch of {RANKS_PER_NODE} pushes cost "
        f"{_bench.fmt_us(per_request[columns])}, of which the request alone (an empty batch: the HTTP parse, the "
        f"connection guard, the ASGI task, the answer) {_bench.fmt_us(per_request[empty])}: what is left, "
        f"{_bench.fmt_us(per_request[columns] - per_request[empty])}, is the batch's parse, checks and store.",
        quick=args.quick)


if __name__ == "__main__":
    main()
