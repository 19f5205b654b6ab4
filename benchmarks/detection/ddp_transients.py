"""Measure transient slowness on real DDP training: how often a healthy rank computes ≥ 1.15× slower than its
peers for a few consecutive steps, for how long, and by how much.

Launch (4 ranks, gloo on CPU; writes one JSON file per rank, then the report):

    torchrun --standalone --nproc-per-node 4 -m benchmarks.detection.ddp_transients --seconds 120 --out /tmp/tr
    python -m benchmarks.detection.ddp_transients --report /tmp/tr     # → benchmarks/results/ddp_transients.md

Each rank runs forward and backward of a small MLP on synthetic data, then all-reduces its gradients
(one flat tensor; `register_comm_hook` would overlap it with backward and blur the split), timing compute
and the collective apart. A rank's *relative compute* in a step is its compute time over the median of
all ranks' compute in that step, so whatever slows every rank (the input, the network) cancels and what
is left is that rank's own transient. An episode is a run of consecutive steps with relative compute
≥ `--factor` (1.15), which is what the straggler detector's short look would see.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "results" / "ddp_transients.md"


def _train(seconds: float, out: Path) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)  # one core per rank, as a GPU rank keeps one host thread busy
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(64, 256), torch.randn(64, 256)
    params = list(model.parameters())
    rows = []
    stop = torch.zeros(1)
    start = time.time()
    while True:
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(model(x), y).backward()
        t1 = time.perf_counter()
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        stop.fill_(1.0 if time.time() - start >= seconds else 0.0)
        dist.all_reduce(flat)
        dist.all_reduce(stop)  # every rank stops at the same step
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        rows.append((time.time(), t1 - t0, t2 - t1, t3 - t0))
        if stop.item() > 0:
            break
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{rank}.json").write_text(json.dumps({"rank": rank, "world": world, "steps": rows}))
    dist.destroy_process_group()


def _episodes(rel: list[float], factor: float) -> list[tuple[int, int]]:
    """(first step, length) of each run of consecutive steps with relative compute ≥ factor."""
    out, start = [], None
    for i, v in enumerate(rel + [0.0]):
        if v >= factor and start is None:
            start = i
        elif v < factor and start is not None:
            out.append((start, i - start))
            start = None
    return out


def report(src: Path, factor: float, min_len: int) -> str:
    """The markdown report from the ranks' JSON files."""
    ranks = [json.loads(p.read_text()) for p in sorted(src.glob("rank*.json"))]
    n = min(len(r["steps"]) for r in ranks)
    comp = [[r["steps"][i][1] for r in ranks] for i in range(n)]
    step_s = statistics.median(max(r["steps"][i][3] for r in ranks) for i in range(n))
    wall_s = ranks[0]["steps"][n - 1][0] - ranks[0]["steps"][0][0]
    lines = [
        "# Transient slowness on real DDP training", "",
        f"- **date**: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"- **setup**: {len(ranks)} ranks, torch DDP-style gradient all-reduce over gloo on CPU, one thread per "
        f"rank, a 256-512-256 MLP, batch 64; {n} steps in {wall_s:.0f} s (median step {step_s * 1e3:.1f} ms)",
        f"- **machine**: {os.cpu_count()} CPUs shared with other work (load average "
        f"{os.getloadavg()[0]:.1f} at the report): more contention than a training host, so read the rates "
        "as an upper bound for a busy host",
        f"- **command**: `torchrun --standalone --nproc-per-node {len(ranks)} -m benchmarks.detection.ddp_transients`",
        "",
        f"An episode: ≥ {min_len} consecutive steps in which a rank computes ≥ {factor:.2f}× the median rank of "
        "that step.", "",
        "| rank | episodes | per rank-hour | length p50 / p90 / max (steps) | length p50 / p90 / max (s) | "
        "factor p50 / p90 (episode median) | share of steps in an episode |",
        "| ---: | ---: | ---: | --- | --- | --- | ---: |",
    ]
    all_len_s: list[float] = []
    all_fac: list[float] = []
    total = 0
    for j, r in enumerate(ranks):
        rel = [comp[i][j] / statistics.median(comp[i]) for i in range(n)]
        eps = [(s, k) for s, k in _episodes(rel, factor) if k >= min_len]
        total += len(eps)
        lens = sorted(k for _, k in eps)
        secs = sorted(r["steps"][s + k - 1][0] - r["steps"][s][0] + r["steps"][s][3] for s, k in eps)
        facs = sorted(statistics.median(rel[s:s + k]) for s, k in eps)
        all_len_s += secs
        all_fac += facs
        inside = sum(lens) / n

        def q(xs: list[float], p: float) -> float:
            return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else float("nan")

        lines.append(f"| {r['rank']} | {len(eps)} | {len(eps) / wall_s * 3600:.0f} | "
                     f"{q(lens, .5):.0f} / {q(lens, .9):.0f} / {max(lens, default=0)} | "
                     f"{q(secs, .5):.2f} / {q(secs, .9):.2f} / {max(secs, default=0):.2f} | "
                     f"{q(facs, .5):.2f} / {q(facs, .9):.2f} | {inside:.1%} |")
    all_len_s.sort()
    all_fac.sort()
    lines += ["", f"All ranks: {total} episodes in {len(ranks) * wall_s / 3600:.3f} rank-hours = "
              f"{total / (len(ranks) * wall_s / 3600):.0f} per rank-hour; length p50 "
              f"{statistics.median(all_len_s) if all_len_s else 0:.2f} s, max {max(all_len_s, default=0):.2f} s; "
              f"factor p50 {statistics.median(all_fac) if all_fac else 0:.2f}.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Train (under torchrun) or report."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=120.0, help="training time per run (default 120)")
    ap.add_argument("--out", type=Path, default=Path("/tmp/ddp_transients"), help="where ranks write their steps")
    ap.add_argument("--report", type=Path, help="write the report from this directory instead of training")
    ap.add_argument("--factor", type=float, default=1.15, help="relative compute that counts as slowed")
    ap.add_argument("--min-steps", type=int, default=3, help="consecutive slowed steps that make an episode")
    a = ap.parse_args(argv)
    if a.report is not None:
        RESULTS.write_text(report(a.report, a.factor, a.min_steps) + "\n")
        print(RESULTS.read_text())
    else:
        _train(a.seconds, a.out)


if __name__ == "__main__":
    main()
