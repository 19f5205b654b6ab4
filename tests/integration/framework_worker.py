"""One rank of a tiny real Lightning or Hugging Face Trainer run, under torchrun (gloo, CPU), with gpumond's callback.

    python -m torch.distributed.run --nproc-per-node 2 framework_worker.py {lightning|hf} OUT_DIR STEPS

Reports to the rules service named by GPUMOND_ENDPOINT / GPUMOND_TOKEN / GPUMOND_JOB_ID; writes the rank's
reporter stats and comm-wait count to OUT_DIR/rank-N.json. Rank 1 is planted slow (SLOW_S more per step).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
from torch import nn

SLOW_S = 0.02


def _data(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 16, generator=g)
    return x, x.sum(dim=1, keepdim=True)


# Both ranks pause in the last step, so the rules service evaluates the pushed steps (every 0.5 s) before
# the callback's close() at the end of training ends the job and releases its series.
LINGER_S = 2.0


def run_lightning(steps: int, rank: int) -> object:
    import lightning.pytorch as pl
    from lightning.pytorch.strategies import DDPStrategy
    from torch.utils.data import DataLoader, TensorDataset

    from gpumond.job.lightning import GpumondCallback

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))

        def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
            if rank == 1:
                time.sleep(SLOW_S)
            if batch_idx == steps - 1:
                time.sleep(LINGER_S)
            x, y = batch
            return nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):  # type: ignore[no-untyped-def]
            return torch.optim.SGD(self.parameters(), lr=0.01)

    callback = GpumondCallback(push_interval_s=0.5)
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy=DDPStrategy(process_group_backend="gloo"),
                         max_steps=steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[callback])
    trainer.fit(Tiny(), DataLoader(TensorDataset(*_data(8 * 2 * steps)), batch_size=8))
    return callback


def run_hf(steps: int, rank: int, out: Path) -> object:
    from transformers import Trainer, TrainingArguments

    from gpumond.job.hf import attach

    class Tiny(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
            self.calls = 0

        def forward(self, x, labels):  # type: ignore[no-untyped-def]
            if rank == 1:
                time.sleep(SLOW_S)
            self.calls += 1  # one forward per step: no gradient accumulation, no evaluation
            if self.calls == steps:
                time.sleep(LINGER_S)
            return {"loss": nn.functional.mse_loss(self.net(x), labels)}

    x, y = _data(8 * 2 * steps)
    rows = [{"x": x[i], "labels": y[i]} for i in range(len(x))]
    args = TrainingArguments(output_dir=str(out / "hf"), max_steps=steps, per_device_train_batch_size=8,
                             use_cpu=True, ddp_backend="gloo", report_to=[], save_strategy="no",
                             logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0)
    trainer = Trainer(model=Tiny(), args=args, train_dataset=rows)
    callback = attach(trainer, push_interval_s=0.5)
    trainer.train()
    return callback


def main() -> None:
    framework, out, steps = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
    rank = int(os.environ["RANK"])
    os.environ["GPUMOND_GPU_UUID"] = f"GPU-00000000-0000-4000-8000-{rank:012d}"
    torch.set_num_threads(1)
    callback = run_lightning(steps, rank) if framework == "lightning" else run_hf(steps, rank, out)
    import gpumond.job

    stats = gpumond.job.get_reporter().stats  # the reporter the callback made (and closed at the end)
    (out / f"rank-{rank}.json").write_text(json.dumps({
        "pushed_steps": stats.pushed_steps, "dropped_steps": stats.dropped_steps,
        "failed_pushes": stats.failed_pushes, "last_error": stats.last_error,
        "timed": callback.steps.timed}))  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
