"""PyTorch DDP integration: each step's wait for the other ranks, with DDP's own all-reduce untouched.

    import gpumond.job.torch
    model = DistributedDataParallel(net)
    reporter = gpumond.job.torch.instrument(model)     # one line
    for x, y in reporter.wrap(loader):                 # data wait, as without torch
        loss_fn(model(x), y).backward(); opt.step()

What a step reports as `comm_wait_s` is the **exposed wait**: from the moment DDP launches the
step's last bucket (when backward has produced this rank's last gradient) to the end of the wait for
the last bucket. That is the time backward() is blocked waiting for the slowest rank; earlier buckets
wait overlapped with this rank's own backward compute. By default (BackwardTimer) no comm hook is
registered: a post-accumulate-grad hook marks the last gradient and an autograd final callback queued
behind DDP's finalisation marks the end, so DDP's C++ all-reduce runs as without gpumond. With
`via="hook"` (BucketTimer) a comm hook runs DDP's default all-reduce (bitwise the same arithmetic) and
times each bucket from its launch to the completion of its future; it also gives the sum of
per-bucket waits (`StepWait.buckets_s`, for comparison; benchmarks/ddp_signal.py measures both), at
the cost of a Python call per bucket.

Importing this module imports torch; `gpumond.job` itself never does.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

import gpumond.job
from gpumond.job.reporter import Reporter

log = logging.getLogger("gpumond.job")

__all__ = ["BackwardTimer", "BucketTimer", "StepWait", "comm_hook", "instrument", "timed_allreduce"]


@dataclass(frozen=True, slots=True)
class StepWait:
    """One step's collective waits, in seconds of the host's monotonic clock."""

    exposed_s: float  # last bucket's launch → last completion: the time backward() blocked on peers
    buckets_s: float  # Σ over buckets of launch → completion (overlapping; for comparison only)
    buckets: int


class BucketTimer:
    """The comm hook's state: times the buckets of each step and hands the step's wait to `sink`.

    Callbacks arrive on the process group's threads (gloo runs two), so the per-step tally is locked;
    DDP waits for every bucket's future before backward() returns, so the step is complete (and
    handed over) before the training thread carries on.
    """

    def __init__(self, sink: Callable[[StepWait], None], *, process_group: Any = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._sink = sink
        self._group = process_group
        self._clock = clock
        self._lock = threading.Lock()
        self._on = True
        self._reset()

    def _reset(self) -> None:
        self._launched = 0
        self._done = 0
        self._last_launch: float | None = None
        self._last_done = 0.0
        self._sum = 0.0

    def launch(self, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        """DDP's default all-reduce of one bucket, timed."""
        t0 = self._clock()
        buffer = bucket.buffer()
        group = self._group if self._group is not None else dist.group.WORLD
        # What DDP does without a hook: multiply by 1/world size (rounded the same way, so the result is
        # bitwise equal even where 1/n is inexact), then sum over ranks.
        buffer.mul_(1.0 / group.size())
        fut = dist.all_reduce(buffer, group=group, async_op=True).get_future()
        if not self._on:
            return fut.then(_first)
        try:
            with self._lock:
                self._launched += 1
                if bucket.is_last():
                    self._last_launch = t0
        except Exception as exc:  # never disturb training: stop timing, keep reducing
            self._stop(exc)
        return fut.then(lambda f: self._completed(f, t0))

    def _completed(self, fut: torch.futures.Future[list[torch.Tensor]], t0: float) -> torch.Tensor:
        value = fut.value()[0]  # re-raises a failed all-reduce to DDP, as the default hook does
        if self._on:
            try:
                self._tally(t0, self._clock())
            except Exception as exc:
                self._stop(exc)
        return value

    def _tally(self, t0: float, t1: float) -> None:
        with self._lock:
            self._done += 1
            self._sum += t1 - t0
            self._last_done = max(self._last_done, t1)
            if self._last_launch is None or self._done < self._launched:
                return
            wait = StepWait(max(self._last_done - self._last_launch, 0.0), self._sum, self._done)
            self._reset()
        self._sink(wait)

    def _stop(self, exc: BaseException) -> None:
        self._on = False
        log.warning("gpumond: comm wait timing disabled, training continues unaffected: %r", exc)


class BackwardTimer:
    """Times each step's exposed wait without a comm hook: DDP's C++ all-reduce runs as without gpumond.

    Start: this rank's last gradient is accumulated (DDP launches the last bucket right after, in the
    same autograd node's post hook). End: DDP's backward is finalised (it has waited for every bucket).
    The first synchronised backward hooks every parameter to learn which one is accumulated last; from
    then on only that parameter's hook runs (one Python call per step instead of one per bucket), and
    two autograd final callbacks: the first, queued by that hook, queues the second, which therefore
    runs after DDP's own finalisation callback (queued when its last bucket was ready).
    """

    def __init__(self, model: torch.nn.parallel.DistributedDataParallel, sink: Callable[[StepWait], None], *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._model = model
        self._sink = sink
        self._clock = clock
        self._ready_at = 0.0
        self._last: torch.Tensor | None = None
        self._task = -1
        self._learning = True
        params = [p for p in model.parameters() if p.requires_grad]
        self._handles = [p.register_post_accumulate_grad_hook(self._ready) for p in params]

    def _ready(self, param: torch.Tensor) -> None:
        # no_sync(): DDP does not all-reduce this backward, so there is no wait to report.
        if not self._model.require_backward_grad_sync:
            return
        self._ready_at = self._clock()
        self._last = param
        # Once per backward (keyed by its graph task, not a flag: a backward that raised never runs its
        # callbacks, and a flag would then stay set for good).
        task = torch._C._current_graph_task_id()
        if task != self._task:
            self._task = task
            torch.autograd.Variable._execution_engine.queue_callback(self._after_nodes)

    def _after_nodes(self) -> None:
        torch.autograd.Variable._execution_engine.queue_callback(self._finalised)

    def _finalised(self) -> None:
        wait = max(self._clock() - self._ready_at, 0.0)
        if self._learning and self._last is not None:
            self._learning = False
            keep = self._last
            for h in self._handles:
                h.remove()
            self._handles = [keep.register_post_accumulate_grad_hook(self._ready)]
        try:
            self._sink(StepWait(wait, float("nan"), 0))
        except Exception as exc:  # never disturb training (an exception here would fail backward())
            log.warning("gpumond: comm wait report failed, training continues unaffected: %r", exc)


# No annotations: DDP checks a hook's annotations against the real types, and this module's are strings
# (postponed evaluation). DDP also wants a function (it reads __name__), so the timer is the hook's state.
def timed_allreduce(timer, bucket):  # type: ignore[no-untyped-def]
    """The comm hook registered with DDP: `timer.launch(bucket)`."""
    return timer.launch(bucket)


def _first(fut: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
    return fut.value()[0]


def comm_hook(reporter: Reporter | None = None, *, process_group: Any = None,
              on_step: Callable[[StepWait], None] | None = None) -> tuple[BucketTimer, Callable[..., Any]]:
    """(state, hook) for `ddp.register_comm_hook(state, hook)`, or a framework's equivalent (Lightning's
    `DDPStrategy(ddp_comm_state=state, ddp_comm_hook=hook)`), reporting each step's wait to `reporter`."""
    rep = reporter if reporter is not None else gpumond.job.get_reporter()

    def sink(wait: StepWait) -> None:
        rep.add_comm_wait(wait.exposed_s)
        if on_step is not None:
            on_step(wait)

    return BucketTimer(sink, process_group=process_group), timed_allreduce


def _backward_timing_available() -> bool:
    """Whether this torch has what BackwardTimer calls inside backward()."""
    return (hasattr(torch.Tensor, "register_post_accumulate_grad_hook")
            and hasattr(torch._C, "_current_graph_task_id")
            and hasattr(torch.autograd.Variable._execution_engine, "queue_callback"))


def instrument(model: torch.nn.parallel.DistributedDataParallel, reporter: Reporter | None = None, *,
               process_group: Any = None, on_step: Callable[[StepWait], None] | None = None,
               via: str = "backward") -> Reporter:
    """Time `model`'s exposed gradient all-reduce wait each step and report it as comm_wait_s; returns the reporter.

    `reporter` defaults to `gpumond.job.get_reporter()` (configured from the environment). `on_step`,
    if given, also receives every step's StepWait. `via="backward"` (default) times from this rank's
    last gradient to the end of DDP's backward, leaving DDP's C++ all-reduce alone (cheapest);
    `via="hook"` registers a timing comm hook instead (costs a Python call per bucket, but also
    measures each bucket: StepWait.buckets_s; `process_group` applies to it only).
    Call before the first forward pass.
    """
    if not isinstance(model, torch.nn.parallel.DistributedDataParallel):
        raise TypeError(f"instrument() takes a DistributedDataParallel model (got {type(model).__name__}); "
                        "for FSDP see docs/job-sdk.md")
    if via not in ("backward", "hook"):
        raise ValueError(f"instrument(via={via!r}): use via='backward' (default) or via='hook'")
    rep = reporter if reporter is not None else gpumond.job.get_reporter()
    if any(p.is_cuda for p in model.parameters()):
        # NCCL completes a work's future when the all-reduce is enqueued on the GPU, not when it has run:
        # host clocks would read ~0 for every rank. Timing it needs CUDA events, not implemented yet.
        log.warning("gpumond: comm wait is timed only for CPU (gloo) DDP so far; on CUDA time the loss "
                    "all-reduce with reporter.comm_wait() (docs/job-sdk.md)")
        return rep
    if via == "backward" and not _backward_timing_available():
        # The private autograd hooks it needs are in the torch gpumond is tested on (2.13), not in every
        # release; missing inside backward() they would raise into training, so say so once and use the hook.
        log.warning("gpumond: this torch lacks the autograd hooks of via='backward'; timing with a comm hook "
                    "instead (via='hook', a little more overhead)")
        via = "hook"
    if via == "hook":
        model.register_comm_hook(*comm_hook(rep, process_group=process_group, on_step=on_step))
        return rep

    def sink(wait: StepWait) -> None:
        rep.add_comm_wait(wait.exposed_s)
        if on_step is not None:
            on_step(wait)

    BackwardTimer(model, sink)
    return rep
