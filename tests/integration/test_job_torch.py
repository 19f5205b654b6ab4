"""gpumond.job.torch on real torch: DDP over gloo on CPU processes launched by torchrun, a real DataLoader.

Every subprocess is bounded by a timeout; the DDP runs use 3-4 ranks of one intra-op thread each.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

import gpumond.job.torch  # noqa: E402
from gpumond.job import Reporter  # noqa: E402
from tests.fakes import FakeTransport  # noqa: E402

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_S = 120.0


def torchrun(script: Path, nproc: int, *args: str) -> None:
    """Run `script` under torchrun on 127.0.0.1 with `nproc` ranks; fail with its output if it fails."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           f"--nproc-per-node={nproc}", str(script), *args],
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=env, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.parametrize(("world", "via"), [(4, "backward"), (3, "hook")])
def test_instrument_leaves_parameters_bitwise_equal_and_reports_every_step(tmp_path: Path, world: int,
                                                                           via: str) -> None:
    # The comm hook at 3 ranks: 1/3 is inexact, and dividing by 3 (torch's allreduce_hook) is not bitwise DDP.
    torchrun(REPO / "tests/integration/ddp_equal_worker.py", world, str(tmp_path), via)
    for rank in range(world):
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert got["trained"], "the parameters did not move: the comparison would prove nothing"
        assert got["equal"], f"rank {rank}: parameters differ with the hook"
        assert len(got["comm"]) == 12
        assert all(isinstance(c, float) and c >= 0 for c in got["comm"]), got["comm"]


def _medians(out: Path, world: int) -> dict[int, float]:
    medians = {}
    for rank in range(world):
        steps = [json.loads(line) for line in (out / f"rank{rank}.pushes.jsonl").read_text().splitlines()]
        comm = [s.get("comm_wait_s") for s in steps]
        assert len(comm) >= 20 and all(c is not None for c in comm), f"rank {rank}: a step without comm_wait_s"
        medians[rank] = statistics.median(comm)
    return medians


def test_the_slow_rank_waits_least(tmp_path: Path) -> None:
    # Emulated device time (the host blocks as on a GPU): 4 ranks share 2 cores, so CPU work would be
    # time-shared and blur who is slow; see benchmarks/results/ddp_signal.md.
    torchrun(REPO / "benchmarks/ddp_job.py", 4, "--steps", "30", "--out", str(tmp_path), "--device-ms", "20",
             "--slow-rank", "2", "--slow-factor", "1.5", "--batch", "16", "--width", "128", "--dim", "32",
             "--bucket-mb", "0.05")
    medians = _medians(tmp_path, 4)
    assert min(medians, key=medians.__getitem__) == 2, medians
    hooks = [json.loads(line) for line in (tmp_path / "rank0.jsonl").read_text().splitlines()]
    assert max(h.get("ddp_buckets", 0) for h in hooks) > 1, "one bucket: the overlap path was not exercised"


class Slow(Dataset[torch.Tensor]):
    """Items that take `sleep_s` each to load, in whichever process loads them."""

    def __init__(self, n: int, sleep_s: float) -> None:
        self.n, self.sleep_s = n, sleep_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(self.sleep_s)
        return torch.full((4,), float(i))


def _loader_run(load_s: float, step_s: float) -> tuple[list[dict[str, float]], list[torch.Tensor], FakeTransport]:
    keep = FakeTransport()
    rep = Reporter(job="dl", gpu_uuid="GPU-00000000-0000-4000-8000-000000000001", transport=keep, push_interval_s=60)
    # Workers, pinned memory (a no-op without CUDA, still the code path users run) and prefetching.
    loader = DataLoader(Slow(48, load_s), batch_size=4, num_workers=2, prefetch_factor=2, pin_memory=True,
                        persistent_workers=False)
    got = []
    for batch in rep.wrap(loader):
        got.append(batch)
        time.sleep(step_s)
    rep.close()
    steps = [s for p in keep.bodies for s in p["steps"]]  # type: ignore[union-attr]
    return steps, got, keep


@pytest.mark.filterwarnings("ignore:.pin_memory. argument is set as true but no accelerator")
def test_wrap_with_worker_processes_pinning_and_prefetch() -> None:
    fed, batches, keep = _loader_run(load_s=0.001, step_s=0.04)
    starved, _, _ = _loader_run(load_s=0.03, step_s=0.001)
    # Every batch is one step, recorded once, by the parent only (the forked workers stay silent).
    assert [s["step"] for s in fed] == list(range(12))
    assert keep.pids == {os.getpid()}
    assert torch.equal(torch.cat(batches)[:, 0], torch.arange(48.0))
    for steps in (fed, starved):
        assert all(0 <= s["data_wait_s"] <= s["duration_s"] for s in steps)
    # Two workers each loading 4 items x 30 ms, against 1 ms of work: the loop waits for nearly all of it;
    # fed (4 ms a batch against 40 ms of work), the workers keep ahead once both have started (the first
    # fetch from each waits for its process to start, longer on a loaded machine).
    share = [statistics.median(s["data_wait_s"] / s["duration_s"] for s in run[2:]) for run in (fed, starved)]
    assert share[1] > 0.5 > share[0], share


def test_instrument_refuses_a_model_that_is_not_ddp() -> None:
    with pytest.raises(TypeError, match="DistributedDataParallel"):
        gpumond.job.torch.instrument(nn.Linear(2, 2), Reporter(transport=FakeTransport(), job="x",
                                                                     gpu_uuid="GPU-00000000-0000-4000-8000-000000000001"))


class _Boom(torch.autograd.Function):
    """Identity forward whose backward raises: a training step that fails in backward()."""

    @staticmethod
    def forward(ctx, x):  # type: ignore[no-untyped-def]
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def]
        raise RuntimeError("boom in backward")


def test_backward_timing_skips_no_sync_and_survives_a_backward_that_raises(one_rank_group) -> None:
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)))
    waits: list[float] = []
    gpumond.job.torch.instrument(model, Reporter(transport=FakeTransport(), job="x",
                                                 gpu_uuid="GPU-00000000-0000-4000-8000-000000000001"),
                                 on_step=lambda w: waits.append(w.exposed_s))
    x = torch.randn(4, 8)
    model(x).sum().backward()
    assert len(waits) == 1 and waits[0] >= 0.0
    with model.no_sync():  # gradient accumulation: DDP all-reduces nothing, so there is no wait to report
        model(x).sum().backward()
    assert len(waits) == 1
    with pytest.raises(RuntimeError, match="boom"):  # the user's error, not ours
        _Boom.apply(model(x)).sum().backward()
    model(x).sum().backward()  # the next good step is reported again
    model(x).sum().backward()
    assert len(waits) == 3


def test_instrument_names_the_modes_it_takes() -> None:
    with pytest.raises(ValueError, match="via='backward' \\(default\\) or via='hook'"):
        gpumond.job.torch.instrument(nn.parallel.DistributedDataParallel.__new__(nn.parallel.DistributedDataParallel),
                                     Reporter(transport=FakeTransport(), job="x",
                                              gpu_uuid="GPU-00000000-0000-4000-8000-000000000001"), via="fast")
