"""torchrun worker for test_job_torch.py: the same DDP training with and without gpumond's comm hook.

Each rank trains two copies of one model from the same seed on the same batches, one plain and one
instrumented by gpumond.job.torch, and writes <out>/rank<r>.json: whether every parameter is bitwise
equal after the steps, and the comm_wait_s of every step its reporter pushed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

import gpumond.job
import gpumond.job.torch
from tests.fakes import FakeTransport

STEPS = 12


def build() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 5))


def main(out: Path, via: str) -> int:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    # A small bucket cap: several buckets per step, so the hook's per-bucket path is what is compared.
    plain = nn.parallel.DistributedDataParallel(build(), bucket_cap_mb=0.01)
    hooked = nn.parallel.DistributedDataParallel(build(), bucket_cap_mb=0.01)
    keep = FakeTransport()
    rep = gpumond.job.Reporter(job="eq", gpu_uuid=f"GPU-00000000-0000-4000-8000-{rank:012d}", transport=keep,
                               push_interval_s=60)
    gpumond.job.torch.instrument(hooked, rep, via=via)
    g = torch.Generator().manual_seed(100 + rank)
    batches = [(torch.randn(16, 32, generator=g), torch.randint(0, 5, (16,), generator=g)) for _ in range(STEPS)]
    for model in (plain, hooked):
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        loop = rep.wrap(batches) if model is hooked else batches
        for x, y in loop:
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    rep.close()
    equal = all(torch.equal(a, b) for a, b in zip(plain.parameters(), hooked.parameters()))
    changed = any(not torch.equal(a, b) for a, b in zip(build().parameters(), hooked.parameters()))
    (out / f"rank{rank}.json").write_text(json.dumps({"equal": equal, "trained": changed,
                                                      "comm": [s.get("comm_wait_s") for s in keep.steps()]}))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "backward"))
