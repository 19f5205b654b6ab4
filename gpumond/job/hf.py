"""Hugging Face Trainer integration: `gpumond.job.hf.attach(trainer)` before `trainer.train()`.

Each optimizer step is one gpumond step (gradient accumulation included); its data wait is the time
from the previous step's end to this one's start (the Trainer fetches a step's batches then); its comm
wait is timed on the model the Trainer wrapped in DDP (or FSDP2), `trainer.model_wrapped`, by
gpumond.job.torch.instrument(). Install with `pip install 'gpumond[hf]'`.
"""

from __future__ import annotations

from typing import Any

from transformers import Trainer, TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from gpumond.job.loop import LoopSteps
from gpumond.job.reporter import Reporter

__all__ = ["GpumondCallback", "attach"]


class GpumondCallback(TrainerCallback):
    """Reports every optimizer step of `trainer` to the gpumond rules service.

    The Trainer hands callbacks the unwrapped model, so this one is given the trainer, to reach the
    wrapped one; `attach()` makes and adds it. `reporter` defaults to one made at train start with the
    Trainer's process index and count; keyword arguments (`group=`, `gpu_uuid=`, …) go to it.
    """

    def __init__(self, trainer: Trainer, reporter: Reporter | None = None, **reporter_kwargs: Any) -> None:
        self.trainer = trainer
        self.steps = LoopSteps(reporter, **reporter_kwargs)

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       **kwargs: Any) -> None:
        # accelerate has wrapped the model by now (Trainer sets model_wrapped before this event).
        self.steps.start(self.trainer.model_wrapped, rank=args.process_index, world_size=args.world_size)

    def on_step_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                      **kwargs: Any) -> None:
        self.steps.begin()

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> None:
        self.steps.end(step=state.global_step)

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: Any) -> None:
        self.steps.stop()


def attach(trainer: Trainer, reporter: Reporter | None = None, **reporter_kwargs: Any) -> GpumondCallback:
    """Add a GpumondCallback for `trainer` to it and return it."""
    callback = GpumondCallback(trainer, reporter, **reporter_kwargs)
    trainer.add_callback(callback)
    return callback
