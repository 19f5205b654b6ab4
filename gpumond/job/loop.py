"""What the framework integrations (gpumond.job.lightning, gpumond.job.hf) share: steps of a loop gpumond does not run.

A framework fetches its batches and steps its optimizer itself and tells a callback when; `LoopSteps`
turns those calls into gpumond steps: `begin()` when a step's input has been fetched (the data wait is
the time since the previous step ended), `end()` when the optimizer step is done, and
`instrument(model)` to time the collective wait of the model the framework wrapped. Importing it
imports torch.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch

import gpumond.job
from gpumond.job.reporter import Reporter
from gpumond.job.torch import Instrumented, instrument

log = logging.getLogger("gpumond.job")

__all__ = ["LoopSteps"]


def _timeable(model: object) -> bool:
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return True
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        return False
    return isinstance(model, FSDPModule)


class LoopSteps:
    """One gpumond step per framework training step; see the module docstring."""

    def __init__(self, reporter: Reporter | None = None, *, clock: Callable[[], float] = time.monotonic,
                 **reporter_kwargs: Any) -> None:
        self._given = reporter
        self._kwargs = reporter_kwargs
        self._clock = clock
        self.reporter: Reporter | None = reporter
        self.handle: Instrumented | None = None
        self.timed = False  # whether start() found a model whose comm wait it could time
        self._ended: float | None = None

    def start(self, model: object, **identity: Any) -> None:
        """Training starts: make the reporter (unless one was given) and time `model`'s collective wait."""
        if self.reporter is None:
            # Through gpumond.job.init, so that code calling gpumond.job.* reports to the same reporter.
            self.reporter = gpumond.job.init(**{**identity, **self._kwargs})
        self._ended = self._clock()
        if _timeable(model):
            self.handle = instrument(model, self.reporter)  # type: ignore[arg-type]
            self.timed = self.handle.timing
        else:
            log.warning("gpumond: the framework's model is a %s, neither DDP nor FSDP2: steps and data wait "
                        "are reported, comm wait is not", type(model).__name__)

    def begin(self) -> None:
        """A step's input has been fetched: the time since the previous step ended was spent waiting for it."""
        rep, ended = self.reporter, self._ended
        if rep is not None and ended is not None:
            rep.fetched(self._clock() - ended)

    def end(self, samples: int | None = None, step: int | None = None) -> None:
        """The step (forward, backward, optimizer) is done."""
        if self.reporter is not None:
            self.reporter.step_end(samples, step)
        self._ended = self._clock()

    def stop(self) -> None:
        """Training is over: unhook, and close the reporter this made (a given one is the caller's)."""
        if self.handle is not None:
            self.handle.remove()
            self.handle = None
        if self.reporter is not None and self._given is None:
            self.reporter.close()
            self.reporter = None
        self._ended = None
