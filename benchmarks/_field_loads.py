"""The loads the GPU field check puts on the GPU, one process driven line by line from stdin.

    python benchmarks/_field_loads.py --device cuda     # then write "tiny", "matmul", "idle", "stop" lines

Each line switches the load and is answered `ready <load>` once the load runs at its steady state (so the
check measures only then): `idle` launches nothing; `tiny` launches a one-thread-block kernel back to back
(torch.cuda._sleep: a kernel is always running, on one SM of the GPU's many: utilization high, SM activity
low, the busy-but-idle case); `matmul` multiplies 8192×8192 bf16 matrices in a loop (the tensor pipes
busy). The queue of launched work is bounded by an event every few launches, so `stop` ends within a
fraction of a second. With `--device cpu` the same protocol runs small CPU stand-ins, which only prove the
protocol (benchmarks/gpu_field_check.py --sim).
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Callable

import torch
from ddp_job import spin_cycles_per_s  # this folder is on the path: the script runs as benchmarks/_field_loads.py

LOADS = ("idle", "tiny", "matmul")
TINY_KERNEL_S = 50e-6  # one tiny kernel's length: launches keep up with it easily
BATCH = 16  # launches between queue-bounding events


def cuda_step(load: str, device: torch.device) -> Callable[[], None]:
    """One batch of launches of `load` on the GPU, bounded: waits for the batch before the previous one."""
    if load == "tiny":
        cycles = max(1, int(spin_cycles_per_s() * TINY_KERNEL_S))

        def launch() -> None:
            torch.cuda._sleep(cycles)
    else:
        a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
        b = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
        out = torch.empty_like(a)

        def launch() -> None:
            torch.matmul(a, b, out=out)
    pending: list[torch.cuda.Event] = []

    def step() -> None:
        for _ in range(BATCH):
            launch()
        ev = torch.cuda.Event()
        ev.record()
        pending.append(ev)
        if len(pending) > 2:
            pending.pop(0).synchronize()
    return step


def cpu_step(load: str, device: torch.device) -> Callable[[], None]:
    """Stand-ins on the CPU: a tiny op back to back, or a small matmul (the protocol, not the GPU)."""
    a = torch.randn(4 if load == "tiny" else 256, 4 if load == "tiny" else 256)

    def step() -> None:
        torch.mm(a, a)
        time.sleep(0.001)
    return step


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--warmup-s", type=float, default=2.0, help="seconds a load runs before `ready`")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    make = cuda_step if args.device == "cuda" else cpu_step
    wanted = [""]  # nothing asked yet: launch nothing, announce nothing
    lock = threading.Lock()

    def read_commands() -> None:
        for line in sys.stdin:
            with lock:
                wanted[0] = line.strip()
        with lock:
            wanted[0] = "stop"

    threading.Thread(target=read_commands, daemon=True).start()
    current, step, since = "", None, 0.0
    announced = True
    while True:
        with lock:
            want = wanted[0]
        if want == "stop":
            break
        if want != current:
            if want not in LOADS:
                print(f"error unknown load {want!r} (expected one of {', '.join(LOADS)}, or stop)", flush=True)
                return 2
            if args.device == "cuda" and step is not None:
                torch.cuda.synchronize()  # the previous load's work ends before the next starts
            current, since, announced = want, time.monotonic(), False
            step = None if want == "idle" else make(want, device)
        if step is None:
            time.sleep(0.01)
        else:
            step()
        if not announced and time.monotonic() - since >= args.warmup_s:
            print(f"ready {current}", flush=True)
            announced = True
    if args.device == "cuda" and step is not None:
        torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
