"""Lightning integration: `Trainer(callbacks=[gpumond.job.lightning.GpumondCallback()])`.

Each training batch is one gpumond step; its data wait is the time from the previous batch's end to this
one's start (Lightning's fetch, made then); its comm wait is timed on the model Lightning wrapped in DDP
(or an FSDP2 root) by gpumond.job.torch.instrument(). Install with `pip install 'gpumond[lightning]'`.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl

from gpumond.job.loop import LoopSteps
from gpumond.job.reporter import Reporter

__all__ = ["GpumondCallback"]


class GpumondCallback(pl.Callback):
    """Reports every training batch of `Trainer.fit` as a step to the gpumond rules service.

    `reporter` defaults to one made at fit start with the trainer's rank and world size (the rest from the
    environment, as gpumond.job.init does); keyword arguments (`group=`, `gpu_uuid=`, …) go to it.
    """

    def __init__(self, reporter: Reporter | None = None, **reporter_kwargs: Any) -> None:
        self.steps = LoopSteps(reporter, **reporter_kwargs)

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # After the strategy has wrapped the model (DDP) and before the first batch.
        self.steps.start(trainer.strategy.model, rank=trainer.global_rank, world_size=trainer.world_size)

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        self.steps.begin()

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self.steps.end()  # numbered by the reporter: with gradient accumulation global_step repeats

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.steps.stop()

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self.steps.stop()
