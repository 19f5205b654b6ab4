"""Per-step overhead of the job SDK (wrap + step end) against a bare loop over the same iterable.

The loop body is empty, so the difference is the SDK's own cost per step on the training thread:
`wrap()`'s next (two clock reads, the step bookkeeping) plus the step's end (one tuple appended to
the bounded deque). The reporter's background thread runs all along, pushing to a receiver in a
separate process on 127.0.0.1 (so the receiver's work does not compete for this process's GIL while
the pusher's JSON encoding does, as it would in training).

Variants run interleaved: every round runs each once over the same in-memory list, in a freshly
shuffled order; the overhead is taken per round (variant − bare of the same round) and summarised
as min / median / p90 over rounds.

An empty step is the worst case for the queue: ~1 M steps/s overflow the 10,000-step deque
continuously, so the pusher encodes and sends a full queue every push interval. Real steps (≥ 1 ms)
never overflow it. The background thread's share of the CPU is therefore higher here than in training.

    python benchmarks/sdk_overhead.py            # ~1 min
    python benchmarks/sdk_overhead.py --quick    # a few seconds (smoke test)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _bench  # noqa: E402
from gpumond.job import Reporter  # noqa: E402
from gpumond.job.payload import encode, encode_head  # noqa: E402

TARGET_US = 10.0
TOKEN = "bench-token"
GPU = "GPU-be0c0000-0000-4000-8000-000000000000"


# ----- the receiver (runs in a child process: `sdk_overhead.py --serve`) ---------------------------
class _Receive(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    counts = {"pushes": 0, "steps": 0}

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.counts["pushes"] += 1
        self.counts["steps"] += len(body["steps"])
        self._reply(202, {"accepted": len(body["steps"])})

    def do_GET(self) -> None:  # noqa: N802
        self._reply(200, self.counts)

    def _reply(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


def serve() -> None:
    """Accept pushes on a free 127.0.0.1 port (printed on stdout) until killed; GET returns the counts."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Receive)
    print(server.server_address[1], flush=True)
    server.serve_forever()


def start_receiver() -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen([sys.executable, __file__, "--serve"], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    port = int(proc.stdout.readline())
    _bench.wait_http(f"http://127.0.0.1:{port}/", proc=proc)
    return proc, port


# ----- the variants ---------------------------------------------------------------------------------
def variants(rep: Reporter, off: Reporter) -> dict[str, Callable[[list[int]], None]]:
    """Loop bodies over the same data, each a plain function so all pay the same call overhead."""
    def bare(data: list[int]) -> None:
        for _ in data:
            pass

    def wrap_implicit(data: list[int]) -> None:
        for _ in rep.wrap(data):
            pass

    def wrap_step_end(data: list[int]) -> None:
        step_end = rep.step_end
        for _ in rep.wrap(data):
            step_end()

    def wrap_step_end_samples(data: list[int]) -> None:
        step_end = rep.step_end
        for _ in rep.wrap(data):
            step_end(32)

    def wrap_block(data: list[int]) -> None:
        step = rep.step
        for _ in rep.wrap(data):
            with step():
                pass

    def wrap_comm_wait(data: list[int]) -> None:
        step_end, comm_wait = rep.step_end, rep.comm_wait
        for _ in rep.wrap(data):
            with comm_wait():  # the timed collective of the docs' recipe, here an empty block
                pass
            step_end()

    def step_end_only(data: list[int]) -> None:
        step_end = rep.step_end
        for _ in data:
            step_end()

    def disabled(data: list[int]) -> None:
        step_end = off.step_end
        for _ in off.wrap(data):
            step_end()

    return {
        "bare loop (the floor)": bare,
        "`wrap()`, implicit step ends": wrap_implicit,
        "`wrap()` + `step_end()`": wrap_step_end,
        "`wrap()` + `step_end(samples=32)`": wrap_step_end_samples,
        "`wrap()` + `with step():`": wrap_block,
        "`wrap()` + `with comm_wait():` + `step_end()`": wrap_comm_wait,
        "`step_end()` alone (no wrap)": step_end_only,
        "disabled reporter: `wrap()` + `step_end()`": disabled,
    }


def run_rounds(funcs: dict[str, Callable[[list[int]], None]], data: list[int],
               rounds: int) -> dict[str, list[float]]:
    """Seconds per step of every variant in every round, variants shuffled within each round."""
    per_step: dict[str, list[float]] = {name: [] for name in funcs}
    order = list(funcs)
    rng = random.Random(1)
    for name in order:  # warm-up: the first pass pays for lazy allocations
        funcs[name](data)
    for _ in range(rounds):
        rng.shuffle(order)
        for name in order:
            t0 = time.perf_counter_ns()
            funcs[name](data)
            per_step[name].append((time.perf_counter_ns() - t0) / 1e9 / len(data))
    return per_step


def encode_cost(rounds: int = 200) -> float:
    """Seconds per step the push thread spends encoding a full 512-step batch (median)."""
    head = encode_head({"job": "llama-70b-r3", "rank": 17, "world_size": 64, "node": "gpu-node-03",
                        "gpu_uuid": "GPU-5b0c1a2e-3f4d-4e5f-8a9b-0c1d2e3f4a5b", "group": "pp-stage-2"})
    t0 = time.monotonic()
    records = [(1200 + i, t0 + 0.84 * i, 0.84, 0.02, 32) for i in range(512)]
    times = []
    for _ in range(rounds):
        start = time.perf_counter_ns()
        encode(head, records, time.time(), time.monotonic())
        times.append((time.perf_counter_ns() - start) / 1e9 / len(records))
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="short run for a smoke test")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, help="steps per loop (default 200,000; quick 50,000)")
    ap.add_argument("--rounds", type=int, help="rounds (default 40; quick 5)")
    ap.add_argument("--push-interval", type=float, default=1.0, help="the reporter's push_interval_s")
    args = ap.parse_args()
    if args.serve:
        serve()
        return
    steps = args.steps or (50_000 if args.quick else 200_000)
    rounds = args.rounds or (5 if args.quick else 40)

    proc, port = start_receiver()
    try:
        rep = Reporter(endpoint=f"http://127.0.0.1:{port}", token=TOKEN, job="bench", gpu_uuid=GPU,
                       push_interval_s=args.push_interval)
        off = Reporter(endpoint=None, token=None, job="bench", gpu_uuid=GPU)  # no endpoint: disabled
        assert rep.enabled and not off.enabled
        load_before = os.getloadavg()[0]
        started = time.monotonic()
        per_step = run_rounds(variants(rep, off), list(range(steps)), rounds)
        wall = time.monotonic() - started
        load = (load_before, os.getloadavg()[0])
        per_step_encode = encode_cost()
        rep.close(timeout_s=10)
        received = json.loads(_bench.fetch(f"http://127.0.0.1:{port}/"))
    finally:
        _bench.stop(proc)
    report(per_step, rep, received, steps, rounds, wall, args.push_interval, load, per_step_encode, args.quick)


def report(per_step: dict[str, list[float]], rep: Reporter, received: dict, steps: int, rounds: int,
           wall: float, interval: float, load: tuple[float, float], per_step_encode: float, quick: bool) -> None:
    """Write the Markdown result."""
    bare = per_step["bare loop (the floor)"]
    rows = []
    for name, times in per_step.items():
        lo, med, p90 = _bench.spread(times)
        if name.startswith("bare"):
            rows.append([name, _bench.fmt_us(lo), _bench.fmt_us(med), _bench.fmt_us(p90), "—", "—"])
            continue
        paired = [t - b for t, b in zip(times, bare)]
        p_lo, p_med, p_p90 = _bench.spread(paired)
        within = "yes" if p_med * 1e6 <= TARGET_US else "**no**"
        rows.append([name, _bench.fmt_us(lo), _bench.fmt_us(med), _bench.fmt_us(p90),
                     f"{_bench.fmt_us(p_lo)} / **{_bench.fmt_us(p_med)}** / {_bench.fmt_us(p_p90)}", within])
    headline = statistics.median(t - b for t, b in zip(per_step["`wrap()` + `step_end()`"], bare))
    stats = rep.stats
    parts = [
        "# Job SDK overhead per training step (`wrap()` + step end) vs a bare loop",
        "",
        _bench.machine_block({
            "setup": f"{steps:,} steps per loop over an in-memory list, {rounds} rounds, 7 variants shuffled "
                     f"within each round, plus one warm-up pass each; timing loop {wall:.0f} s; gc enabled",
            "machine load": f"1-min load average {load[0]:.2f} before, {load[1]:.2f} after the timing loop "
                            f"(this benchmark accounts for about 1; more is other work on the shared VM)",
            "background": f"the reporter's push thread running throughout, push_interval_s={interval:g}, "
                          f"max_queue=10,000, max_steps_per_push=512, to a stdlib HTTP receiver in a "
                          f"separate process on 127.0.0.1",
        }),
        "",
        f"**Overhead of `wrap()` + `step_end()`: {_bench.fmt_us(headline)} per step** (median of per-round "
        f"differences from the bare loop; target ≤ {TARGET_US:g} µs).",
        "",
        _bench.md_table(["variant", "min", "median", "p90", "overhead vs bare, per round: min / median / p90",
                         f"≤ {TARGET_US:g} µs?"], rows),
        "",
        "Times are per step (loop time ÷ steps). The overhead columns pair each round's variant with the "
        "bare loop of the same round.",
        "",
        "## The push thread meanwhile",
        "",
        _bench.md_table(["", "steps"], [
            ["recorded by the enabled reporter (incl. warm-up)", f"{stats.pushed_steps + stats.dropped_steps:,}"],
            ["pushed (202 from the receiver)", f"{stats.pushed_steps:,}"],
            ["dropped (queue overflow: empty steps outrun any push rate)", f"{stats.dropped_steps:,}"],
            ["received by the receiver", f"{received['steps']:,} in {received['pushes']:,} pushes"],
        ]),
        "",
        f"The push thread's own work, off the training thread but sharing its GIL: encoding a full batch "
        f"of 512 steps costs {_bench.fmt_us(per_step_encode)} per step (median of 200 encodes), plus one "
        "HTTP request per batch.",
        "",
        f"Failed pushes: {stats.failed_pushes}. Every push the pusher reported as done arrived "
        f"({'yes' if received['steps'] == stats.pushed_steps else '**no**'}). The drops are by design: "
        "with nothing in the loop body the training thread records ~10⁶ steps/s into a 10,000-step queue "
        "that is pushed once a second; a real step (milliseconds or more) leaves the queue nearly empty.",
    ]
    _bench.write_result("sdk_overhead", "\n".join(parts), quick=quick)


if __name__ == "__main__":
    main()
