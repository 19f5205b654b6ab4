"""A real DDP training job (gloo; CPU, or CUDA) instrumented with gpumond.job.torch, with plantable faults.

Launched by torchrun, one process per rank:

    torchrun --standalone --nproc-per-node 4 benchmarks/ddp_job.py --steps 200 --out /tmp/run \
        --slow-rank 2 --slow-factor 1.25

Each rank trains a small MLP on synthetic data (one intra-op thread: the machine has 2 cores) and
writes <out>/rank<r>.jsonl: one line per step as the reporter pushed it (duration_s, data_wait_s,
comm_wait_s), plus the hook's StepWait (exposed and bucket-summed waits). Without --out and with
GPUMOND_ENDPOINT set it pushes to a real rules service instead. Faults:
- --slow-rank R --slow-factor F: rank R does F× the compute per step (extra matmuls before backward,
  calibrated at start to (F−1) × its own forward+backward time);
- --starve-rank R / --starve-all --starve-s S: the dataset's __getitem__ sleeps S per batch on R / on all;
  with both, --starve-rank-s S2 gives rank R its own, slower loader (an outlier inside a starved job).
With --device cuda every rank trains on the GPU (all ranks on GPU 0 when there is one: gloo, unlike NCCL,
accepts several ranks on one device) and --device-ms is GPU time (a one-block spin kernel, so the host
thread runs ahead as it does on a real GPU). --record DIR writes each step's waits beside pushing;
--count-syncs N counts the CUDA runtime's synchronising calls over N steps with torch's profiler.
Used by benchmarks/ddp_signal.py, benchmarks/ddp_overhead.py, benchmarks/gpu_field_check.py and the
end-to-end tests.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset

import gpumond.job
import gpumond.job.torch
from gpumond.job.transport import Reply


class Synthetic(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Deterministic random batches; `sleep_s` per item stands in for a slow input pipeline."""

    def __init__(self, n: int, dim: int, classes: int, seed: int, sleep_s: float = 0.0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, dim, generator=g)
        self.y = torch.randint(0, classes, (n,), generator=g)
        self.sleep_s = sleep_s

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return self.x[i], self.y[i]


def mlp(dim: int, width: int, depth: int, classes: int) -> nn.Module:
    layers: list[nn.Module] = [nn.Linear(dim, width), nn.ReLU()]
    for _ in range(depth - 1):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, classes))


class FileTransport:
    """Stands in for the rules service: appends every push's steps to a JSONL file (202 always)."""

    def __init__(self, path: Path) -> None:
        self.f = path.open("a")

    def post(self, body: bytes, timeout_s: float, *, early: bool = False) -> Reply:
        for s in json.loads(body)["steps"]:
            self.f.write(json.dumps({"kind": "push", **s}) + "\n")
        self.f.flush()
        return Reply(202)

    def close(self) -> None:
        self.f.close()


def add_device_time(model: nn.Module, seconds: float, pause: Callable[[float], None] = time.sleep) -> None:
    """Make each step take `seconds` more on this rank the way a GPU would: `pause` (on CPU the host thread
    blocks, not competing for the CPU; on CUDA a spin kernel on the stream), one third in the forward pass,
    two thirds in the backward, spread over the layers so that DDP's buckets become ready progressively as
    on a real device."""
    layers = [m for m in model.modules() if isinstance(m, nn.Linear)]
    fwd, bwd = seconds / 3 / len(layers), 2 * seconds / 3 / len(layers)
    for m in layers:
        m.register_forward_hook(lambda *_: pause(fwd))
        m.register_full_backward_hook(lambda *_: pause(bwd))


def spin_cycles_per_s() -> float:
    """Clock cycles per second as torch.cuda._sleep (a one-block spin kernel) counts them on the current GPU, measured
    with CUDA events; the benchmarks' one calibration of GPU time (also benchmarks/_field_loads.py's)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1_000_000)  # the first launch loads the kernel
    start.record()
    torch.cuda._sleep(20_000_000)
    end.record()
    end.synchronize()
    return 20_000_000 / (start.elapsed_time(end) / 1e3)


def gpu_pause() -> Callable[[float], None]:
    """`pause(seconds)` as GPU time: a one-block spin kernel (torch.cuda._sleep) of that length on the current
    stream. The kernel counts clock cycles: rank 0 measures cycles per second with CUDA events (once, before
    training: the only synchronisation it makes) and every rank uses its figure, so a slow rank's pauses are
    exactly its factor longer in cycles whatever each rank's calibration would have met on a shared GPU."""
    per_s = torch.zeros(1, dtype=torch.float64)
    if dist.get_rank() == 0:
        per_s[0] = spin_cycles_per_s()
    dist.broadcast(per_s, 0)
    cycles_per_s = float(per_s[0])
    return lambda seconds: torch.cuda._sleep(max(1, int(seconds * cycles_per_s)))


def count_syncs(prof: Any) -> dict[str, int]:
    """How many times the CUDA runtime's synchronising calls ran in a torch.profiler trace."""
    # The calls that block the host until the GPU catches up (cudaMemcpy: the synchronous copy).
    names = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")
    counts = dict.fromkeys(names, 0)
    for ev in prof.events():
        if ev.name in counts:
            counts[ev.name] += 1
    return counts


def burn_units(n: int, a: torch.Tensor) -> None:
    """n units of extra compute (a slow GPU's longer kernels)."""
    for _ in range(n):
        a = torch.tanh(a @ a) * 0.5


def calibrate(model: nn.Module, loss_fn: nn.Module, x: torch.Tensor, y: torch.Tensor,
              unit: torch.Tensor) -> tuple[float, float]:
    """(median forward+backward seconds, median seconds of one burn unit) on this rank, no communication."""
    fb, bu = [], []
    for _ in range(15):
        t = time.perf_counter()
        loss_fn(model(x), y).backward()
        fb.append(time.perf_counter() - t)
        t = time.perf_counter()
        burn_units(4, unit)
        bu.append((time.perf_counter() - t) / 4)
    model.zero_grad(set_to_none=True)
    return statistics.median(fb), statistics.median(bu)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=5, help="steps before timing starts (not written)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--bucket-mb", type=float, default=25.0, help="DDP bucket_cap_mb (small: several buckets)")
    ap.add_argument("--workers", type=int, default=0, help="DataLoader num_workers")
    ap.add_argument("--no-hook", action="store_true", help="plain DDP, nothing instrumented")
    ap.add_argument("--via", choices=("backward", "hook"), default="backward", help="instrument(model, via=...)")
    ap.add_argument("--slow-rank", type=int, default=-1)
    ap.add_argument("--slow-factor", type=float, default=1.0)
    ap.add_argument("--device-ms", type=float, default=0.0,
                    help="emulated device time per step (host blocks, as on a GPU); the slow rank's is × factor")
    ap.add_argument("--slow-mode", choices=("device", "cpu"), default="device",
                    help="device: the slow rank's device time × factor; cpu: extra real matmuls, "
                         "(factor−1) × its forward+backward time (competes for the CPU cores)")
    ap.add_argument("--starve-rank", type=int, default=-1)
    ap.add_argument("--starve-all", action="store_true")
    ap.add_argument("--starve-s", type=float, default=0.0, help="seconds per batch the starved loader sleeps")
    ap.add_argument("--starve-rank-s", type=float, default=None,
                    help="seconds per batch the --starve-rank loader sleeps (default: --starve-s)")
    ap.add_argument("--gpu-uuids", help="comma-separated GPU UUIDs, one per rank (pushing to a real service)")
    ap.add_argument("--out", type=Path, help="write per-step records here instead of pushing")
    ap.add_argument("--duration-s", type=float, default=0.0, help="train for this long instead of --steps")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="cuda: train on the GPU (rank r on GPU r mod the GPU count)")
    ap.add_argument("--record", type=Path, help="also write each step's waits to <DIR>/rank<r>.waits.jsonl")
    ap.add_argument("--count-syncs", type=int, default=0, metavar="STEPS",
                    help="profile STEPS steps after warm-up; write the synchronising CUDA calls to "
                         "<--record DIR>/rank<r>.syncs.json")
    args = ap.parse_args(argv)

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cpu")
    if args.device == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit(f"ddp_job: --device cuda, but this torch ({torch.__version__}) sees no GPU")
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count())
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    classes = 10
    net = mlp(args.dim, args.width, args.depth, classes).to(device)
    loss_fn = nn.CrossEntropyLoss()
    starved = args.starve_all or rank == args.starve_rank
    sleep_s = args.starve_rank_s if rank == args.starve_rank and args.starve_rank_s is not None else args.starve_s
    # One batch per __getitem__ sleep: the loader sleeps sleep_s per batch.
    data = Synthetic(args.batch * 64, args.dim, classes, seed=rank,
                     sleep_s=(sleep_s / args.batch) if starved else 0.0)
    loader = DataLoader(data, batch_size=args.batch, shuffle=True, num_workers=args.workers,
                        persistent_workers=args.workers > 0, drop_last=True)

    extra = 0
    unit = torch.randn(64, 64)
    slow = rank == args.slow_rank and args.slow_factor > 1.0
    if args.device_ms > 0:
        add_device_time(net, args.device_ms / 1e3 * (args.slow_factor if slow and args.slow_mode == "device" else 1.0),
                        gpu_pause() if device.type == "cuda" else time.sleep)
    if slow and args.slow_mode == "cpu":
        fb, bu = calibrate(net, loss_fn, data.x[:args.batch], data.y[:args.batch], unit)
        extra = max(1, round((args.slow_factor - 1.0) * fb / bu))
    model = nn.parallel.DistributedDataParallel(net, bucket_cap_mb=args.bucket_mb)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    out = None
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        out = (args.out / f"rank{rank}.jsonl").open("w")
        reporter = gpumond.job.Reporter(job="ddp-job", gpu_uuid=_uuid(rank), push_interval_s=0.5,
                                        transport=FileTransport(args.out / f"rank{rank}.pushes.jsonl"))
    else:  # the environment says where to push (GPUMOND_ENDPOINT, GPUMOND_TOKEN, GPUMOND_JOB_ID, …)
        uuid = args.gpu_uuids.split(",")[rank] if args.gpu_uuids else None
        reporter = gpumond.job.init(gpu_uuid=uuid, push_interval_s=1.0)
    waits: list[Any] = []
    record = None
    if args.record is not None:
        args.record.mkdir(parents=True, exist_ok=True)
        record = (args.record / f"rank{rank}.waits.jsonl").open("w")
    if not args.no_hook:
        def on_step(w: Any) -> None:
            waits.append(w)
            if record is not None:
                record.write(json.dumps({"exposed_s": w.exposed_s}) + "\n")
        gpumond.job.torch.instrument(model, reporter, on_step=on_step, via=args.via)
    profiler = None

    if rank == 0:
        print(f"gpumond-ddp-job: training started at {time.time():.3f}", flush=True)
    ddp_buckets = None
    done, t_end = 0, (time.monotonic() + args.duration_s if args.duration_s else None)
    epoch = 0
    while True:
        batches = reporter.wrap(loader) if not args.no_hook else iter(loader)
        for x, y in batches:
            if device.type != "cpu":
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            if args.count_syncs and done == args.warmup:
                profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                              torch.profiler.ProfilerActivity.CUDA])
                profiler.__enter__()
            elif profiler is not None and done == args.warmup + args.count_syncs:
                profiler.__exit__(None, None, None)
                if args.record is not None:
                    (args.record / f"rank{rank}.syncs.json").write_text(json.dumps(
                        {"steps": args.count_syncs, "hook": not args.no_hook, "counts": count_syncs(profiler)}))
                profiler = None
            t0 = time.perf_counter()
            loss = loss_fn(model(x), y)
            if extra:
                burn_units(extra, unit)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if out is not None and done >= args.warmup and waits:
                w = waits[-1]
                if ddp_buckets is None:  # DDP rebuilds its buckets after the first step; count them once
                    ddp_buckets = len(model.reducer._get_zeros_like_grad_buckets())
                out.write(json.dumps({"kind": "hook", "step": done, "compute_s": time.perf_counter() - t0,
                                      "exposed_s": w.exposed_s, "buckets_s": w.buckets_s,
                                      "buckets": w.buckets, "ddp_buckets": ddp_buckets}) + "\n")
            done += 1
            stop = t_end is not None and time.monotonic() >= t_end
            if t_end is not None:
                # Every rank must run the same number of steps: rank 0's clock decides for all.
                flag = torch.tensor([1.0 if stop else 0.0])
                dist.broadcast(flag, 0)
                stop = bool(flag.item())
            elif done >= args.steps + args.warmup:
                stop = True
            if stop:
                break
        else:
            epoch += 1
            continue
        break
    reporter.step_end()
    reporter.close()
    if record is not None:
        record.close()
    if out is not None:
        out.write(json.dumps({"kind": "meta", "rank": rank, "world": world, "extra_units": extra,
                              "starved": starved}) + "\n")
        out.close()
    dist.barrier()
    dist.destroy_process_group()
    return 0


def _uuid(rank: int) -> str:
    return f"GPU-00000000-0000-4000-8000-{rank:012d}"


if __name__ == "__main__":
    sys.exit(main())
