"""PyTorch integration: each step's wait for the other ranks, with DDP's own all-reduce untouched.

    import gpumond.job.torch
    model = DistributedDataParallel(net)
    handle = gpumond.job.torch.instrument(model)       # one line; handle.remove() undoes it
    for x, y in handle.wrap(loader):                   # the reporter's wrap(): data wait, as without torch
        loss_fn(model(x), y).backward(); opt.step()

What a DDP step reports as `comm_wait_s` is the **exposed wait**: from the moment DDP launches the
step's last bucket (when backward has produced this rank's last gradient) to the end of the wait for
the last bucket. That is the time backward() is blocked waiting for the slowest rank; earlier buckets
wait overlapped with this rank's own backward compute. By default (BackwardTimer) no comm hook is
registered: a post-accumulate-grad hook marks the last gradient and an autograd final callback queued
behind DDP's finalisation marks the end, so DDP's C++ all-reduce runs as without gpumond. With
`via="hook"` (BucketTimer, CPU only) a comm hook runs DDP's default all-reduce (bitwise the same
arithmetic) and times each bucket from its launch to the completion of its future; it also gives the
sum of per-bucket waits (`StepWait.buckets_s`, for comparison; benchmarks/ddp_signal.py measures
both), at the cost of a Python call per bucket.

The two marks are events (gpumond.job.intervals): host clock readings on CPU; on CUDA, CUDA events on
the current stream, read back with `query()` a step or more later and never synchronised, so the
training thread never waits for the GPU. An FSDP2 (`fully_shard`) model is timed the same way around
each sharded module's forward all-gather (FsdpTimer).

Importing this module imports torch; `gpumond.job` itself never does.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

import gpumond.job
from gpumond.job.intervals import Event, HostEvent, Intervals
from gpumond.job.reporter import Reporter

log = logging.getLogger("gpumond.job")

__all__ = ["BackwardTimer", "BucketTimer", "CudaEvent", "FsdpTimer", "Instrumented", "StepTiming", "StepWait",
           "comm_hook", "instrument", "timed_allreduce"]


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


class CudaEvent:
    """A CUDA timing event on the current stream (the `Event` protocol of gpumond.job.intervals).

    `record()` enqueues it, `query()` asks whether the stream has passed it; neither waits. Elapsed
    times are read only after `query()` said so, so `elapsed_time` never blocks either.
    """

    __slots__ = ("_ev",)

    def __init__(self, event: Any = None) -> None:
        self._ev = event if event is not None else torch.cuda.Event(enable_timing=True)

    def record(self) -> None:
        self._ev.record()

    def query(self) -> bool:
        return bool(self._ev.query())

    def elapsed_s(self, end: Event) -> float:
        assert isinstance(end, CudaEvent)
        return self._ev.elapsed_time(end._ev) / 1e3


class _Report:
    """Where a timer's readings go: the reporter (now, or late for a deferred step) and `on_step`."""

    __slots__ = ("rep", "on_step")

    def __init__(self, rep: Reporter, on_step: Callable[[StepWait], None] | None) -> None:
        self.rep = rep
        self.on_step = on_step

    def wait(self, wait: StepWait) -> None:
        """A step's wait, measured before the step ended: it goes to the open step."""
        self.rep.add_comm_wait(wait.exposed_s)
        if self.on_step is not None:
            self.on_step(wait)

    def late(self, ticket: Hashable, seconds: float | None) -> None:
        """A step's wait read back from the `Intervals`: ticket None means the step is still open."""
        if ticket is None:
            if seconds is not None:
                self.rep.add_comm_wait(seconds)
        else:
            self.rep.resolve_comm_wait(ticket, seconds)  # type: ignore[arg-type]
        if seconds is not None and self.on_step is not None:
            self.on_step(StepWait(seconds, float("nan"), 0))


class StepTiming:
    """A timer's per-step intervals and where they go: host clock read at once, or GPU events read later.

    With `deferred` (CUDA events) a closed step gets a ticket from the reporter and is read by a later
    `poll()`; on the host it is read at once, while the step is still open.
    """

    def __init__(self, reporter: Reporter, new_event: Callable[[], Event], *, deferred: bool,
                 on_step: Callable[[StepWait], None] | None = None, max_lag: int = 8) -> None:
        self.report = _Report(reporter, on_step)
        self.deferred = deferred
        self.intervals = Intervals(new_event, self._read, max_lag=max_lag)

    def _read(self, ticket: Hashable, seconds: float | None) -> None:
        try:
            self.report.late(ticket, seconds)
        except Exception as exc:  # never disturb training (this runs inside backward() or forward())
            log.warning("gpumond: comm wait report failed, training continues unaffected: %r", exc)

    def close_step(self) -> None:
        """The step's intervals are marked: read them now (host) or once their events complete (GPU)."""
        iv = self.intervals
        if not self.deferred:
            if iv.close_step(None):
                iv.poll()
            return
        ticket = self.report.rep.defer_comm_wait()
        if ticket is None:
            iv.discard()
        elif not iv.close_step(ticket):
            self.report.rep.resolve_comm_wait(ticket, None)

    def cancel(self) -> None:
        self.intervals.cancel()


def _capturing() -> bool:
    """Whether a CUDA graph is being captured on this thread's current stream (its events would not replay)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


class _Hooks:
    """What the timers share: the torch hook handles they hold and the step timing they feed."""

    _handles: list
    _timing: StepTiming

    def remove(self) -> None:
        """Unhook; steps still in flight are sent without their comm wait."""
        for h in self._handles:
            h.remove()
        self._handles = []
        self._timing.cancel()


class BackwardTimer(_Hooks):
    """Times each step's exposed wait without a comm hook: DDP's C++ all-reduce runs as without gpumond.

    Start: this rank's last gradient is accumulated (DDP launches the last bucket right after, in the
    same autograd node's post hook). End: DDP's backward is finalised (it has waited for every bucket).
    The first synchronised backward hooks every parameter to learn which one is accumulated last; from
    then on only that parameter's hook runs (one Python call per step instead of one per bucket), and
    two autograd final callbacks: the first, queued by that hook, queues the second, which therefore
    runs after DDP's own finalisation callback (queued when its last bucket was ready).

    Start and end are events of `timing`: host clock readings on CPU; on CUDA, events on the current
    stream, where DDP's finalisation has made the stream wait for the all-reduce (so the end event
    completes when the all-reduce has), read back steps later without a host synchronisation.
    """

    def __init__(self, model: torch.nn.parallel.DistributedDataParallel, timing: StepTiming) -> None:
        self._model = model
        self._timing = timing
        self._last: torch.Tensor | None = None
        self._task = -1
        self._on = False  # whether this backward is being timed
        self._learning = True
        params = [p for p in model.parameters() if p.requires_grad]
        self._handles = [p.register_post_accumulate_grad_hook(self._ready) for p in params]

    def _ready(self, param: torch.Tensor) -> None:
        # no_sync(): DDP does not all-reduce this backward, so there is no wait to report.
        if not self._model.require_backward_grad_sync:
            return
        self._last = param
        # Once per backward (keyed by its graph task, not a flag: a backward that raised never runs its
        # callbacks, and a flag would then stay set for good).
        task = torch._C._current_graph_task_id()
        if task != self._task:
            self._task = task
            iv = self._timing.intervals
            iv.discard()  # what a backward that raised left behind
            iv.poll()
            # Under CUDA graph capture the events would be recorded once, not per replay: time nothing.
            self._on = not (self._timing.deferred and _capturing())
            if not self._on:
                return
            torch.autograd.Variable._execution_engine.queue_callback(self._after_nodes)
        if self._on:
            self._timing.intervals.begin()

    def _after_nodes(self) -> None:
        torch.autograd.Variable._execution_engine.queue_callback(self._finalised)

    def _finalised(self) -> None:
        try:
            self._timing.intervals.end()
            if self._learning and self._last is not None:
                self._learning = False
                keep = self._last
                for h in self._handles:
                    h.remove()
                self._handles = [keep.register_post_accumulate_grad_hook(self._ready)]
            self._timing.close_step()
        except Exception as exc:  # never disturb training (an exception here would fail backward())
            log.warning("gpumond: comm wait report failed, training continues unaffected: %r", exc)


class FsdpTimer(_Hooks):
    """Times an FSDP2 (`fully_shard`) model's exposed all-gather wait in the forward pass, per step.

    Around every FSDP module's own pre-forward hook (which all-gathers the module's parameters and waits
    for them) a hook before it (`prepend=True`, registered after fully_shard) begins an interval and a hook
    after it ends it; the root module's forward end closes the step. On CPU the wait blocks the host; on
    CUDA, FSDP makes the compute stream wait for the all-gather, and the events recorded on it measure
    that wait on the GPU timeline. Forwards without autograd (evaluation) are not timed.
    """

    def __init__(self, root: torch.nn.Module, timing: StepTiming) -> None:
        from torch.distributed.fsdp import FSDPModule

        self._root = root
        self._timing = timing
        self._on = False
        mods = [m for m in root.modules() if isinstance(m, FSDPModule)]
        self._handles = []
        for m in mods:
            self._handles.append(m.register_forward_pre_hook(self._before, prepend=True))
            self._handles.append(m.register_forward_pre_hook(self._after))
        self._handles.append(root.register_forward_hook(self._done))

    def _before(self, module: torch.nn.Module, args: Any) -> None:
        if module is self._root:
            iv = self._timing.intervals
            iv.discard()  # a forward that raised
            iv.poll()
            self._on = torch.is_grad_enabled() and not (self._timing.deferred and _capturing())
        if self._on:
            self._timing.intervals.begin()

    def _after(self, module: torch.nn.Module, args: Any) -> None:
        if self._on:
            self._timing.intervals.end()

    def _done(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if self._on:
            self._on = False
            try:
                self._timing.close_step()
            except Exception as exc:
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
    return BucketTimer(_Report(rep, on_step).wait, process_group=process_group), timed_allreduce


def _backward_timing_available() -> bool:
    """Whether this torch has what BackwardTimer calls inside backward()."""
    return (hasattr(torch.Tensor, "register_post_accumulate_grad_hook")
            and hasattr(torch._C, "_current_graph_task_id")
            and hasattr(torch.autograd.Variable._execution_engine, "queue_callback"))


class Instrumented:
    """What `instrument()` returns: `.remove()` undoes it; anything else is the reporter's (`wrap`, `stats`, …)."""

    def __init__(self, reporter: Reporter, timer: BackwardTimer | FsdpTimer | BucketTimer | None) -> None:
        self.reporter = reporter
        self._timer = timer

    @property
    def timing(self) -> bool:
        """Whether comm waits are being measured (False on the setups that report none, and after remove())."""
        return self._timer is not None

    def remove(self) -> None:
        """Stop timing: hooks removed (a comm hook, which DDP cannot unregister, keeps reducing, untimed)."""
        timer, self._timer = self._timer, None
        if isinstance(timer, BucketTimer):
            timer._on = False
        elif timer is not None:
            timer.remove()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.reporter, name)


def _fsdp_root(model: torch.nn.Module) -> bool:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a torch without FSDP2
        return False
    return isinstance(model, FSDPModule)


def _devices(model: torch.nn.Module) -> set[torch.device]:
    return {p.device for p in model.parameters()}


def instrument(model: torch.nn.Module, reporter: Reporter | None = None, *, process_group: Any = None,
               on_step: Callable[[StepWait], None] | None = None, via: str = "backward",
               max_lag: int = 8) -> Instrumented:
    """Time `model`'s exposed collective wait each step and report it as comm_wait_s; returns a handle.

    `model` is a DistributedDataParallel model (the gradient all-reduce's wait at the end of backward)
    or an FSDP2 `fully_shard` root (the forward all-gathers' wait). `reporter` defaults to
    `gpumond.job.get_reporter()` (configured from the environment). `on_step`, if given, also receives
    every step's StepWait. `via="backward"` (default) times from this rank's last gradient to the end of
    DDP's backward, leaving DDP's C++ all-reduce alone (cheapest); `via="hook"` (DDP on CPU only)
    registers a timing comm hook instead (a Python call per bucket, but also StepWait.buckets_s;
    `process_group` applies to it only). On CUDA the waits are CUDA events read back without a host
    synchronisation, up to `max_lag` steps later (then dropped, counted in `stats.comm_waits_dropped`).
    Call before the first forward pass; `handle.remove()` undoes it. The handle passes any other
    attribute to the reporter (`handle.wrap(loader)`, `handle.stats`).
    """
    fsdp = _fsdp_root(model)
    if not fsdp and not isinstance(model, torch.nn.parallel.DistributedDataParallel):
        raise TypeError(f"instrument() takes a DistributedDataParallel model or an FSDP2 fully_shard() root "
                        f"(got {type(model).__name__}); see docs/job-sdk.md")
    if via not in ("backward", "hook"):
        raise ValueError(f"instrument(via={via!r}): use via='backward' (default) or via='hook'")
    if isinstance(max_lag, bool) or not isinstance(max_lag, int) or max_lag < 1:
        raise ValueError(f"instrument(max_lag={max_lag!r}): give a number of steps, at least 1")
    rep = reporter if reporter is not None else gpumond.job.get_reporter()
    devices = _devices(model)
    cuda = any(d.type == "cuda" for d in devices)
    if len(devices) > 1 or (cuda and len(getattr(model, "device_ids", None) or []) > 1):
        # One process driving several devices: which device's timeline is the wait on? Report nothing
        # rather than one device's view.
        log.warning("gpumond: the model spans several devices in one process (%s): comm wait not timed; "
                    "run one process per GPU", ", ".join(sorted(map(str, devices))))
        return Instrumented(rep, None)
    if cuda and via == "hook":
        raise ValueError("instrument(via='hook') times on the host, which cannot see a NCCL all-reduce finish; "
                         "use the default via='backward' on CUDA")
    if fsdp and via == "hook":
        raise ValueError("instrument(via='hook') is for DDP; an FSDP2 model is timed with the default")
    if not fsdp and via == "backward" and not _backward_timing_available():
        # The private autograd hooks it needs are in the torch gpumond is tested on (2.13), not in every
        # release; missing inside backward() they would raise into training, so say so once and use the hook.
        if cuda:
            log.warning("gpumond: this torch lacks the autograd hooks gpumond times CUDA DDP with: "
                        "comm wait not timed")
            return Instrumented(rep, None)
        log.warning("gpumond: this torch lacks the autograd hooks of via='backward'; timing with a comm hook "
                    "instead (via='hook', a little more overhead)")
        via = "hook"
    if via == "hook":
        state, hook = comm_hook(rep, process_group=process_group, on_step=on_step)
        model.register_comm_hook(state, hook)
        return Instrumented(rep, state)
    timing = StepTiming(rep, CudaEvent if cuda else HostEvent, deferred=cuda, on_step=on_step, max_lag=max_lag)
    timer: BackwardTimer | FsdpTimer = (FsdpTimer(model, timing) if fsdp
                                        else BackwardTimer(model, timing))  # type: ignore[arg-type]
    return Instrumented(rep, timer)
