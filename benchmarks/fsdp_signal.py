"""Where a slow rank's skew shows up in FSDP2 (`fully_shard`) training, and what gpumond.job.torch measures of it.

    python benchmarks/fsdp_signal.py [--quick] [--slow 1.0,2.0] [--steps 20] [--device-ms 200]

Real FSDP2 over gloo on CPU processes under torchrun (2 ranks): an MLP of 4 sharded blocks + the
sharded root, emulated device time per step (the host blocks in the layers' forward and backward
hooks, one third forward, two thirds backward, as ddp_job.add_device_time does), rank 1's slowed by
the factor given. Per rank it reports the medians of: gpumond's measured comm wait (the forward
all-gather waits, `instrument(root, on_step=...)`), the whole forward, the whole backward, the step.
The fast rank waiting more where the slow rank waits less is the signal; the expected skew per step is
(factor − 1) × the device time. benchmarks/gpu_field_check.py runs the worker with `--device cuda` (every rank
on the one GPU over gloo, device time as ddp_job.py's GPU spin kernels, the wait from CUDA events).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import _bench  # noqa: E402

SKIP = 3  # warm-up steps left out of the medians: lazy init, first all-gathers


def worker(out: Path, steps: int, device_ms: float, slow: float, device_type: str = "cpu") -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.fsdp import fully_shard

    import gpumond.job.torch
    from gpumond.job import Reporter
    from torch.distributed.device_mesh import init_device_mesh

    from ddp_job import add_device_time, gpu_pause

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    device = torch.device("cpu")
    if device_type == "cuda":
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    net = nn.Sequential(*[nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64)) for _ in range(4)],
                        nn.Linear(64, 10)).to(device)
    add_device_time(net, device_ms / 1e3 * (slow if rank == 1 else 1.0),
                    gpu_pause() if device.type == "cuda" else time.sleep)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))  # over the default (gloo) group
    for block in list(net)[:4]:
        fully_shard(block, mesh=mesh)
    fully_shard(net, mesh=mesh)

    class Keep:
        def post(self, body: bytes, timeout_s: float, *, early: bool = False):  # type: ignore[no-untyped-def]
            from gpumond.job.transport import Reply
            return Reply(202)

        def close(self) -> None:
            pass

    waits: list[float] = []
    rep = Reporter(transport=Keep(), job="fsdp", gpu_uuid=f"GPU-00000000-0000-4000-8000-{rank:012d}")
    gpumond.job.torch.instrument(net, rep, on_step=lambda w: waits.append(w.exposed_s))
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(rank)
    rows = []
    for _ in rep.wrap(range(steps)):
        x = torch.randn(32, 64, generator=g).to(device)
        t0 = time.monotonic()
        out_ = net(x)
        t1 = time.monotonic()
        out_.sum().backward()
        t2 = time.monotonic()
        opt.step()
        opt.zero_grad(set_to_none=True)
        rows.append((t1 - t0, t2 - t1, time.monotonic() - t0))
    rep.close()
    fw, bw, st = (statistics.median(c) for c in zip(*rows[SKIP:]))
    (out / f"rank-{rank}.json").write_text(json.dumps({
        "wait": statistics.median(waits[SKIP:]), "waits": waits[SKIP:], "forward": fw, "backward": bw, "step": st}))
    dist.destroy_process_group()


def main() -> int:
    ap = _bench.parser(__doc__, "rank 1 at 2×, 6 steps of 10 ms")
    ap.add_argument("--slow", help="rank 1's device-time factors, one run each (default 1.0,2.0; --quick: 2.0)")
    ap.add_argument("--steps", type=int, help=f"steps, the first {SKIP} not counted (default 20; --quick: 6)")
    ap.add_argument("--device-ms", type=float, help="default 200 (--quick: 10)")
    ap.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--factor", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help=argparse.SUPPRESS)
    a = ap.parse_args()
    steps = a.steps or (6 if a.quick else 20)
    device_ms = a.device_ms or (10.0 if a.quick else 200.0)
    if a.worker is not None:
        worker(a.worker, steps, device_ms, a.factor, a.device)
        return 0
    rows = []
    for factor in (float(f) for f in (a.slow or ("2.0" if a.quick else "1.0,2.0")).split(",")):
        print(f"… rank 1 at {factor:g}×", file=sys.stderr, flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            _bench.torchrun(Path(__file__).resolve(), 2, ["--worker", tmp, "--factor", str(factor), "--device-ms",
                                                          str(device_ms), "--steps", str(steps)], timeout_s=900)
            got = [json.loads((Path(tmp) / f"rank-{r}.json").read_text()) for r in (0, 1)]
        for r, g in enumerate(got):
            rows.append([f"{factor:g}×", r, "slow" if r == 1 and factor != 1 else "",
                         *(f"{g[k] * 1e3:.1f}" for k in ("wait", "forward", "backward", "step"))])
    _bench.report(
        "fsdp_signal", "# FSDP2: where a slow rank's skew shows, and gpumond's forward all-gather wait",
        {"torch": _bench._version("torch"),
         "job": f"torchrun, 2 ranks, gloo on CPU, one intra-op thread per rank; FSDP2 "
                f"fully_shard on 4 blocks (64→128→64) + root, batch 32; {device_ms:g} ms "
                f"emulated device time per step (rank 1 × factor); {steps} steps, "
                f"medians after {SKIP} warm-up steps",
         "note": "a shared 2-core VM with other work running; one run per row"},
        _bench.md_table(["rank 1 factor", "rank", "", "gpumond comm wait ms (forward all-gathers)", "forward ms",
                         "backward ms", "step ms"], rows),
        "The expected skew per step is (factor − 1) × the device time, one third of it built "
        "in forward, two thirds in backward. The forward includes the measured all-gather wait; backward "
        "(reduce-scatters included) is not instrumented (docs/job-sdk.md, FSDP2).",
        quick=a.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
