"""What gpumond.job.torch costs a real DDP training step: comm hook + wrap() + pushes, against plain DDP.

    python benchmarks/ddp_overhead.py [--quick] [--world 1,4]

For each world size the driver starts a receiver on 127.0.0.1 that answers pushes with 202, and runs
itself under torchrun. Every rank trains copies of one model on the same in-memory batches: plain
DDP iterating the loader, and DDP instrumented by gpumond.job.torch with the loader wrapped, pushing
every second over HTTP. A third copy runs torch's own Python all-reduce hook, untimed,
to separate what any Python comm hook costs from what gpumond adds. Rounds run them in a shuffled order (the same on every rank); each
round times `--steps` steps of each (fetch → forward → backward → optimizer step) and the result is the
per-round ratio of median step times. World size 1 shows the integration's own CPU cost without the
other ranks' noise; 4 is real multi-process training (4 ranks on a shared 2-core VM: noisy).
A step is ~10 ms: 10 ms of emulated device time (the host blocks in the layers' hooks, as on a GPU)
plus a small MLP's real CPU work.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import _bench  # noqa: E402


VARIANTS = ("plain", "python hook", "gpumond", "gpumond via hook")


def worker(out: Path, rounds: int, steps: int, device_ms: float, variants: list[str], budget_s: float) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn

    import gpumond.job
    import gpumond.job.torch
    from ddp_job import add_device_time, mlp

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()

    def build() -> nn.Module:
        torch.manual_seed(0)
        net = mlp(64, 128, 3, 10)
        add_device_time(net, device_ms / 1e3)
        return nn.parallel.DistributedDataParallel(net, bucket_cap_mb=0.05)

    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    models = {name: build() for name in variants}
    if "python hook" in models:
        # torch's own Python all-reduce hook, untimed: what any Python comm hook costs, gpumond's or not.
        models["python hook"].register_comm_hook(None, default_hooks.allreduce_hook)
    rep = gpumond.job.init(job="overhead", gpu_uuid=f"GPU-00000000-0000-4000-8000-{rank:012d}", push_interval_s=1.0)
    if "gpumond" in models:
        gpumond.job.torch.instrument(models["gpumond"], rep)  # the default: no comm hook, DDP's C++ all-reduce
    if "gpumond via hook" in models:
        gpumond.job.torch.instrument(models["gpumond via hook"], rep, via="hook")
    g = torch.Generator().manual_seed(rank)
    data = [(torch.randn(32, 64, generator=g), torch.randint(0, 10, (32,), generator=g)) for _ in range(steps)]
    opts = {name: torch.optim.SGD(m.parameters(), lr=0.01) for name, m in models.items()}
    order = random.Random(7)  # the same order on every rank: they must run the same model at the same time
    times: dict[str, list[float]] = {name: [] for name in models}
    began = time.monotonic()
    for _ in range(rounds):
        # On a loaded machine a round can take many times longer: stop at the budget, every rank at the same round.
        stop = torch.tensor([1.0 if rank == 0 and time.monotonic() - began > budget_s else 0.0])
        dist.broadcast(stop, 0)
        if stop.item():
            break
        names = list(models)
        order.shuffle(names)
        for name in names:
            model, opt = models[name], opts[name]
            it = rep.wrap(data) if name.startswith("gpumond") else iter(data)
            ts = []
            t = time.perf_counter()
            for x, y in it:
                nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                now = time.perf_counter()
                ts.append(now - t)
                t = now
            times[name].append(statistics.median(ts[1:]))  # the first includes the loop's start
    stats = rep.stats
    rep.close()
    if rank == 0:
        out.write_text(json.dumps({"times": times, "pushed": stats.pushed_steps, "dropped": stats.dropped_steps,
                                   "rounds": len(times["plain"])}))
    dist.destroy_process_group()


def median_ci(xs: list[float], z: float = 1.96) -> tuple[float, float]:
    """A distribution-free ~95 % confidence interval of the median of sorted `xs`: the order statistics
    n/2 ∓ z·√n/2 (the binomial(n, ½) count below the median, normally approximated)."""
    n = len(xs)
    half = z * math.sqrt(n) / 2
    return xs[max(0, math.floor(n / 2 - half))], xs[min(n - 1, math.ceil(n / 2 + half) - 1)]


class _Accept(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(202)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: object) -> None:
        pass


def drive(world: int, rounds: int, steps: int, device_ms: float, variants: list[str],
          budget_s: float) -> dict[str, object]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Accept)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "out.json"
            _bench.torchrun(Path(__file__).resolve(), world,
                            ["--worker", str(out), "--rounds", str(rounds), "--steps", str(steps),
                             "--device-ms", str(device_ms), "--variants", ",".join(variants),
                             "--budget-s", str(budget_s)],
                            env={"GPUMOND_ENDPOINT": f"http://127.0.0.1:{server.server_port}",
                                 "GPUMOND_TOKEN": "bench"},
                            timeout_s=budget_s + 1800)
            return json.loads(out.read_text())
    finally:
        server.shutdown()


def main() -> int:
    ap = _bench.parser(__doc__, "2 ranks, 2 rounds of 5 steps")
    ap.add_argument("--world", help="world sizes, comma-separated (default 1,4; --quick: 2)")
    ap.add_argument("--rounds", type=int, help="default 40 (--quick: 2)")
    ap.add_argument("--steps", type=int, help="default 50 (--quick: 5)")
    ap.add_argument("--device-ms", type=float, default=10.0)
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help="which of plain, 'python hook', gpumond, 'gpumond via hook' to run (plain always)")
    ap.add_argument("--name", default="ddp_overhead", help="result file name in benchmarks/results/")
    ap.add_argument("--budget-s", type=float, default=float("inf"),
                    help="stop each world size's rounds after this many seconds (the rounds done are stated)")
    ap.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args()
    world_sizes = a.world or ("2" if a.quick else "1,4")
    rounds = a.rounds or (2 if a.quick else 40)
    steps = a.steps or (5 if a.quick else 50)
    variants = ["plain"] + [v for v in a.variants.split(",") if v in VARIANTS and v != "plain"]
    if a.worker is not None:
        worker(a.worker, rounds, steps, a.device_ms, variants, a.budget_s)
        return 0
    rows = []
    others = variants[1:]
    for world in (int(w) for w in world_sizes.split(",")):
        print(f"… {world} rank(s)", file=sys.stderr, flush=True)
        got = drive(world, rounds, steps, a.device_ms, variants, a.budget_s)
        t = got["times"]

        def ratio(a: str, b: str) -> str:
            rs = sorted(x / y for x, y in zip(t[a], t[b]))  # type: ignore[index]
            lo, med, hi = _bench.quantile(rs, 0.1), statistics.median(rs), _bench.quantile(rs, 0.9)
            clo, chi = median_ci(rs)
            return (f"{(med - 1) * 100:+.2f} % [{(clo - 1) * 100:+.2f}, {(chi - 1) * 100:+.2f}] "
                    f"({(lo - 1) * 100:+.2f} … {(hi - 1) * 100:+.2f})")

        rows.append([world, got["rounds"], *(f"{statistics.median(t[k]) * 1e3:.3f}" for k in variants),  # type: ignore[index]
                     *(ratio(k, "plain") for k in others), got["pushed"], got["dropped"]])
    _bench.report(
        a.name, "# gpumond.job.torch overhead on real DDP steps",
        {"torch": _bench._version("torch"),
         "job": f"torchrun, gloo on CPU, one intra-op thread per rank; MLP 64→128×3→10, "
                f"batch 32, {a.device_ms:g} ms emulated device time per step, 3 buckets; "
                f"up to {rounds} interleaved rounds × {steps} steps per variant"
                + (f", at most {a.budget_s:g} s per world size" if a.budget_s < float("inf") else ""),
         "note": "a shared 2-core VM with other work running"},
        _bench.md_table(["ranks", "rounds", *(f"{k} step ms" for k in variants), *(f"{k} vs plain" for k in others),
                         "steps pushed (rank 0)", "dropped"], rows),
        "Step times are medians of per-round medians; the comparisons are per-round ratios − 1: median "
        "[95 % confidence interval of the median, from the order statistics: distribution-free] "
        "(p10 … p90 of the rounds)."
        + (" *Python hook*: torch's `default_hooks.allreduce_hook`, untimed — what registering any "
           "Python comm hook costs, whoever's." if "python hook" in variants else ""),
        "gpumond = `gpumond.job.torch.instrument(model)` (default: no comm hook; one post-accumulate-grad "
        "hook and two autograd final callbacks per step) + `reporter.wrap(loader)` + the push thread sending "
        "every second over HTTP to a receiver on 127.0.0.1 (every instrumented model pushes through it)."
        + (" via=\"hook\": the same with `instrument(model, via=\"hook\")` (a comm hook timing every bucket)."
           if "gpumond via hook" in variants else ""),
        quick=a.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
