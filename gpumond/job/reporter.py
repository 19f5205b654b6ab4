"""The Reporter: times steps, data-loader and collective waits on the training thread, hands them to the pusher.

A step is the span between consecutive batch fetches through `wrap()`, unless it is ended
explicitly: `step_end()` ends the open step at once, and `with reporter.step():` makes the block
one step that every fetch inside it counts towards (use it for gradient accumulation).
`with reporter.comm_wait():` times a wait for the other ranks; it adds to the open step's comm
wait, or, between steps, to the next step's, as a fetch between steps belongs to the step it opens.
"""

from __future__ import annotations

import atexit
import logging
import os
import secrets
import signal
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from types import TracebackType
from typing import Any, TypeVar

from gpumond.job.device import local_gpu_uuid
from gpumond.job.early import DEFAULT as EARLY_PUSH
from gpumond.job.early import push_early as _push_early
from gpumond.job.payload import Record
from gpumond.job.pusher import Pusher
from gpumond.job.route import Route, resolve_route
from gpumond.job.settings import ConfigError, Identity, resolve_encoding, resolve_identity
from gpumond.job.stats import Stats
from gpumond.job.transport import Transport
from gpumond.wire.media import CONTENT_TYPES

log = logging.getLogger("gpumond.job")
T = TypeVar("T")

# What the open step is, if any.
_NONE = 0  # no step open: the next fetch opens one
_FETCH = 1  # opened by a fetch; the next fetch ends it
_BLOCK = 2  # inside `with step()`: fetches add their wait, only the block's end ends it
SIGTERM_FLUSH_S = 2.0  # torchrun waits 30 s between its SIGTERM and SIGKILL; a final push takes milliseconds


class Reporter:
    """Measures steps of one training process and pushes them to the rules service; never raises."""

    def __init__(self, endpoint: str | None = None, token: str | None = None, job: str | None = None,
                 rank: int | None = None, world_size: int | None = None, node: str | None = None,
                 gpu_uuid: str | None = None, group: str | None = None, shards: int | None = None,
                 ca_file: str | None = None, cert_file: str | None = None, key_file: str | None = None,
                 push_interval_s: float = 5.0,
                 max_queue: int = 10_000, max_steps_per_push: int = 512, timeout_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time,
                 transport: Transport | None = None, handle_sigterm: bool = True,
                 encoding: str | None = None, push_early: bool = True, relay: str | None = None) -> None:
        # Hot-path state comes first, so a reporter whose setup fails below is still safe to call.
        self._off = True
        self._closed = False
        self._pid = os.getpid()
        self._clock = clock
        self._open = _NONE
        self._depth = 0
        self._start = self._last_end = self._wait = 0.0
        self._next_step = 0
        self._recorded = 0
        self._block_samples: int | None = None
        self._block = _StepBlock(self)
        self._comm: float | None = None  # comm wait of the open (or next) step; None: not measured
        self._comm_block = _CommWait(self)
        # Comm waits read after their step is recorded (GPU timing): index of the step's record → its tally,
        # and the records held back until theirs arrives, in order (see defer_comm_wait()).
        self._late: dict[int, _Late] = {}
        self._held: deque[tuple[Record, _Late | None]] = deque()
        self._late_lost = 0
        self._q: deque[Record] = deque(maxlen=1)
        self._max_queue = 1
        self._early_next = -float("inf")  # no early push before this (the rule's min_gap_s after the last)
        self._pusher: Pusher | None = None
        self._identity: Identity | None = None
        self.incarnation: str | None = None  # this process's id in every push (set once configured)
        self._reason: str | None = None
        try:
            _check_numbers(push_interval_s, max_queue, max_steps_per_push, timeout_s)
            route: Route | None = None
            form = resolve_encoding(encoding, os.environ)
            if transport is None:
                # Before the GPU lookup: without a place to send to there is no point running nvidia-smi.
                route = resolve_route(endpoint, token, shards, relay, (ca_file, cert_file, key_file))
            self._identity = resolve_identity(job=job, rank=rank, world_size=world_size, node=node,
                                              gpu_uuid=gpu_uuid, group=group, environ=os.environ,
                                              find_gpu=local_gpu_uuid,
                                              gpu_optional=route is not None and route.relay is not None)
            if route is not None:
                transport = route.transport(self._identity, CONTENT_TYPES[form], clock)
            assert transport is not None  # route is set exactly when no transport was given
            self._q = deque(maxlen=max_queue)
            self._max_queue = max_queue
            # One id per process: a restarted process (same job and rank, step numbers reused from a
            # checkpoint) is told apart by the service, which then counts its steps instead of taking them
            # for duplicates. Optional in the contract: an older service ignores it.
            self.incarnation = f"{self._pid:x}-{secrets.token_hex(6)}"
            head = {**self._identity.head(), "incarnation": self.incarnation}
            self._pusher = Pusher(self._q, head, transport, interval_s=push_interval_s,
                                  max_steps=max_steps_per_push, timeout_s=timeout_s, clock=clock, wall=wall,
                                  encoding=form, early=EARLY_PUSH if push_early else None)
            self._start = self._last_end = clock()
            self._pusher.start()
        except ConfigError as exc:
            self._disable(str(exc))
            return
        except Exception as exc:  # whatever went wrong, training must go on
            self._disable(f"unexpected error while configuring: {exc!r}")
            return
        atexit.register(self.close)
        if handle_sigterm:
            _on_sigterm(self)
        # A forked child (a DataLoader worker) inherits this object but not the thread: make it inert.
        os.register_at_fork(after_in_child=_make_inert_in_child(weakref.ref(self)))
        self._off = False

    # ----- state ------------------------------------------------------------------------------------
    @property
    def enabled(self) -> bool:
        """True while steps are being recorded and pushed."""
        return not self._off

    @property
    def identity(self) -> Identity | None:
        """Job, rank, world size, node, GPU UUID and group as pushed; None if misconfigured."""
        return self._identity

    @property
    def stats(self) -> Stats:
        """A snapshot of the counters."""
        pusher = self._pusher
        if pusher is None:
            return Stats(last_error=self._reason)
        # Read in this order so that racing with both threads can only under-count overflow drops.
        recorded = self._recorded
        held = len(self._held)
        queued = len(self._q)
        taken = pusher.taken
        overflow = max(0, recorded - held - queued - taken)
        return Stats(pushed_steps=pusher.pushed, dropped_steps=pusher.dropped + overflow,
                     failed_pushes=pusher.failed, queue_len=held + queued + pusher.pending_len,
                     comm_waits_dropped=self._late_lost, last_error=self._reason or pusher.last_error,
                     dropped_by_service=pusher.service_dropped)

    def _disable(self, reason: str) -> None:
        self._off = True
        if self._reason is None:  # one warning per reporter, whatever else goes wrong later
            log.warning("gpumond: step reporting disabled, training continues unaffected: %s", reason)
        self._reason = f"disabled: {reason}"

    def _fail(self, exc: BaseException) -> None:
        """A bug in our bookkeeping: stop measuring rather than disturb training."""
        self._disable(f"internal error: {exc!r}")

    # ----- the hot path -----------------------------------------------------------------------------
    def wrap(self, iterable: Iterable[T]) -> Iterator[T]:
        """Iterate `iterable`, timing each next() as data-loader wait; a fetch ends the step before it."""
        return _Timed(self, iter(iterable))

    def step_end(self, samples: int | None = None, step: int | None = None,
                 comm_wait_s: float | None = None) -> None:
        """End the open step now (or, with none open, record the span since the previous step ended).

        `comm_wait_s`, when given, is the step's comm wait, replacing what `comm_wait()` measured in it.
        """
        if self._off:
            return
        try:
            now = self._clock()
            if self._open == _NONE:
                self._start, self._wait = self._last_end, 0.0
            if step is not None:
                self._next_step = int(step)
            if samples is not None and (type(samples) is not int or samples < 0):
                samples = _as_count(samples)
            if comm_wait_s is not None:
                self._comm = _as_seconds(comm_wait_s)
            self._record(now, samples)
        except Exception as exc:
            self._fail(exc)

    def fetched(self, wait_s: float) -> None:
        """A batch has just arrived after `wait_s` seconds of waiting for it, fetched by a loop that is not
        wrap()'s (a framework's): counted as wrap() counts its own fetches (it ends the step before it, if
        one is open from a fetch, and opens the next with this data wait)."""
        if self._off:
            return
        try:
            now = self._clock()
            waited = _as_seconds(wait_s)
            self._fetched(now - (waited or 0.0), now)
        except Exception as exc:
            self._fail(exc)

    def step(self, samples: int | None = None) -> _StepBlock:
        """`with reporter.step():` — the block is one step; fetches inside it add to its data wait."""
        if self._depth == 0:
            self._block_samples = None if samples is None else _as_count(samples)
        return self._block

    def comm_wait(self) -> _CommWait:
        """`with reporter.comm_wait():` — the block's time is this step's wait for the other ranks."""
        return self._comm_block

    def add_comm_wait(self, seconds: float) -> None:
        """Add `seconds` to the open step's comm wait, as a `comm_wait()` block would (a framework hook's timing).

        Call it from the training thread, or from another thread while the training thread is blocked
        on the collective it timed (gpumond.job.torch does this from DDP's comm hook).
        """
        if self._off:
            return
        try:
            waited = _as_seconds(seconds)
            if waited is not None:
                comm = self._comm
                self._comm = waited if comm is None else comm + waited
        except Exception as exc:
            self._fail(exc)

    def defer_comm_wait(self) -> int | None:
        """Say that the open step's comm wait will be known only later; returns the ticket to resolve it with.

        For a timing read asynchronously (CUDA events, read steps later): the step's record is held back
        (in order, with those after it) until `resolve_comm_wait(ticket, seconds)`, at most
        `_MAX_HELD` records; past that the oldest goes out without it, counted in
        `stats.comm_waits_dropped`. Same thread rule as add_comm_wait().
        """
        if self._off:
            return None
        try:
            index = self._recorded  # the index the open step's record will have
            late = self._late.get(index)
            if late is None:
                late = self._late[index] = _Late()
            late.pending += 1
            return index
        except Exception as exc:
            self._fail(exc)
            return None

    def resolve_comm_wait(self, ticket: int | None, seconds: float | None) -> None:
        """The deferred comm wait of the step `ticket` names: `seconds`, or None when it was not measured."""
        if self._off or ticket is None:
            return
        try:
            late = self._late.get(ticket)
            if late is None:
                late = next((lt for rec, lt in self._held if lt is not None and lt.index == ticket), None)
            if late is None or late.pending <= 0:
                return  # already sent without it (counted then)
            late.pending -= 1
            waited = None if seconds is None else _as_seconds(seconds)
            if waited is None:
                late.lost = True
            else:
                late.seconds += waited
            self._release()
        except Exception as exc:
            self._fail(exc)

    def _record(self, end: float, samples: int | None) -> None:
        step = self._next_step
        self._next_step = step + 1
        index = self._recorded
        self._recorded = index + 1
        # Comm wait goes in only when measured (the push then omits it); the encoder fits it to the step.
        comm = self._comm
        if comm is None:
            record: Record = (step, end, end - self._start, self._wait, samples)
        else:
            self._comm = None
            record = (step, end, end - self._start, self._wait, samples, comm)
        pusher = self._pusher
        if pusher is None:
            return
        # max_queue bounds every step not yet pushed: the queue, the records held for a late comm wait and the
        # batch the push thread has in hand (retried through an outage). The oldest queued go first; the stats
        # derive how many from the counts, as they do for what deque(maxlen) itself drops.
        if self._late or self._held:
            late = self._late.pop(index, None)
            if self._make_room(pusher, 1):
                if late is not None:
                    late.index = index
                self._held.append((record, late))
                self._release()
        else:
            self._q.append(record)  # deque(maxlen) drops the oldest itself when full, in C: the hot path
            if pusher.in_hand:  # a batch in hand counts too (only while a push is out or being retried)
                self._make_room(pusher, 0)
        self._last_end = end
        self._open = _NONE
        if _push_early(end - self._start, pusher.early_above, end, self._early_next):
            self._early_next = end + EARLY_PUSH.min_gap_s
            pusher.nudge()

    def _make_room(self, pusher: Pusher, more: int) -> bool:
        """Drop the oldest queued steps until `more` steps fit within max_queue beside the queue, the held records
        and the push thread's batch in hand; False when there is nothing queued left to drop."""
        q = self._q
        while len(q) + len(self._held) + pusher.in_hand + more > self._max_queue:
            if not q:
                return False  # the batch in hand and the held records fill max_queue
            try:
                q.popleft()
            except IndexError:  # the push thread took it meanwhile: look again
                pass
        return True

    def _release(self, everything: bool = False) -> None:
        """Queue the held records whose late comm wait is in (all of them with `everything`), oldest first."""
        held = self._held
        while held:
            record, late = held[0]
            if late is not None and late.pending > 0 and not everything and len(held) <= _MAX_HELD:
                return
            held.popleft()
            if late is not None:
                if late.pending > 0 or late.lost:
                    late.pending = 0  # a resolve that comes after this finds nothing to do
                    self._late_lost += 1
                else:
                    comm = record[5] if len(record) > 5 else 0.0
                    record = (*record[:5], comm + late.seconds)
            self._q.append(record)

    def _fetched(self, t0: float, t1: float | None) -> None:
        """A fetch asked at t0 returned at t1 (None: the iterable is exhausted)."""
        try:
            mode = self._open
            if mode == _BLOCK:
                if t1 is not None:
                    self._wait += t1 - t0
                return
            if mode == _FETCH:
                self._record(t0, None)  # the previous batch's step ends when the next one is asked for
            if t1 is not None:
                self._open, self._start, self._wait = _FETCH, t0, t1 - t0
        except Exception as exc:
            self._fail(exc)

    def _block_enter(self) -> None:
        if self._off:
            return
        try:
            self._depth += 1
            if self._depth > 1:
                return  # nested blocks are one step: the outermost one
            if self._open == _FETCH:
                self._open = _BLOCK  # the batch just fetched belongs to this block's step
            elif self._open == _NONE:
                self._open, self._start, self._wait = _BLOCK, self._clock(), 0.0
        except Exception as exc:
            self._fail(exc)

    def _block_exit(self, ok: bool) -> None:
        if self._off or self._depth == 0:
            return
        try:
            self._depth -= 1
            if self._depth or self._open == _NONE:
                return
            now = self._clock()
            if ok:
                self._record(now, self._block_samples)
            else:
                # A step that raised did not complete; its time says nothing about training speed.
                self._open, self._last_end, self._comm = _NONE, now, None
                late = self._late.pop(self._recorded, None)
                if late is not None:
                    late.pending = 0  # its late reading, if one comes, belongs to no record
        except Exception as exc:
            self._fail(exc)

    # ----- lifecycle --------------------------------------------------------------------------------
    def close(self, timeout_s: float = 5.0) -> None:
        """Stop recording and flush what can be pushed within `timeout_s`; idempotent, no-op in a forked child."""
        if self._closed or os.getpid() != self._pid:
            self._off = True
            return
        self._closed = True
        self._off = True
        atexit.unregister(self.close)
        try:
            self._release(everything=True)  # steps still waiting for a late comm wait go without it
            self._late.clear()
        except Exception as exc:
            log.warning("gpumond: error while closing the reporter: %r", exc)
        if self._pusher is not None:
            try:
                self._pusher.close(timeout_s)
            except Exception as exc:  # at exit, of all times, nothing may escape
                log.warning("gpumond: error while closing the reporter: %r", exc)

    def __enter__(self) -> Reporter:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


_MAX_HELD = 64  # records held back for a late comm wait; GPU timing reads a step within a few


class _Late:
    """A step's comm wait still to come: how many readings are outstanding and what has come so far."""

    __slots__ = ("index", "pending", "seconds", "lost")

    def __init__(self) -> None:
        self.index = -1  # the step's record index, once recorded
        self.pending = 0
        self.seconds = 0.0
        self.lost = False


class _Timed:
    """The iterator `wrap()` returns."""

    __slots__ = ("_rep", "_it")

    def __init__(self, rep: Reporter, it: Iterator[Any]) -> None:
        self._rep = rep
        self._it = it

    def __iter__(self) -> _Timed:
        return self

    def __next__(self) -> Any:
        rep = self._rep
        if rep._off:
            return next(self._it)
        clock = rep._clock
        t0 = clock()
        try:
            item = next(self._it)
        except StopIteration:
            rep._fetched(t0, None)
            raise
        rep._fetched(t0, clock())
        return item


class _StepBlock:
    """The reusable context manager behind `reporter.step()` (one object: nothing allocated per step)."""

    __slots__ = ("_rep",)

    def __init__(self, rep: Reporter) -> None:
        self._rep = rep

    def __enter__(self) -> None:
        self._rep._block_enter()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self._rep._block_exit(et is None)


class _CommWait:
    """The reusable context manager behind `reporter.comm_wait()`: one object, so nothing is allocated
    per block but the two clock readings; nested blocks count once, as the outermost."""

    __slots__ = ("_rep", "_t0", "_depth")

    def __init__(self, rep: Reporter) -> None:
        self._rep = rep
        self._t0 = 0.0
        self._depth = 0

    def __enter__(self) -> None:
        depth = self._depth
        self._depth = depth + 1  # counted even while off, so that enters and exits always pair up
        if depth == 0 and not self._rep._off:
            try:
                self._t0 = self._rep._clock()
            except Exception as exc:
                self._rep._fail(exc)

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        # A collective that raised still kept this rank waiting: counted (a `step()` block it leaves is dropped).
        depth = self._depth - 1
        self._depth = depth
        rep = self._rep
        if depth or rep._off:
            return
        try:
            waited = rep._clock() - self._t0
            comm = rep._comm
            rep._comm = waited if comm is None else comm + waited
        except Exception as exc:
            rep._fail(exc)


_live: weakref.WeakSet[Reporter] = weakref.WeakSet()
_handler_lock = threading.Lock()


def _on_sigterm(rep: Reporter) -> None:
    """Close `rep` on SIGTERM (what torchrun sends the surviving workers when it tears a job down, and what
    schedulers send at the end of a time limit), so its final push tells the rules service the job ended.

    Only where SIGTERM still has its default action and from the main thread (Python's rule): a handler
    the program set is never replaced. After closing, the default action is restored and the signal raised
    again, so the process still dies of SIGTERM, with the exit status its launcher expects.
    """
    with _handler_lock:
        _live.add(rep)
        if threading.current_thread() is not threading.main_thread():
            return
        try:
            if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
                return  # the program's own handler, or ours already
            signal.signal(signal.SIGTERM, _sigterm)
        except (ValueError, OSError):  # no signals here (an embedded interpreter): atexit still closes
            pass


def _sigterm(signum: int, frame: object) -> None:
    try:
        for rep in list(_live):
            rep.close(SIGTERM_FLUSH_S)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


def _make_inert_in_child(ref: weakref.ref[Reporter]) -> Callable[[], None]:
    """An at-fork hook that silences the reporter in the child; a weak reference, so it keeps nothing alive."""
    def hook() -> None:
        rep = ref()
        if rep is not None:
            rep._off = True
            rep._closed = True
            rep._q.clear()  # the parent pushes these; the child must not hold them either
            rep._held.clear()
    return hook


def _check_numbers(push_interval_s: float, max_queue: int, max_steps_per_push: int, timeout_s: float) -> None:
    """Reject settings that would make the pusher spin, stall or hold nothing."""
    for name, value in (("push_interval_s", push_interval_s), ("timeout_s", timeout_s)):
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value < float("inf"):
            raise ConfigError(f"{name} must be a positive number of seconds (got {value!r})")
    for name, value in (("max_queue", max_queue), ("max_steps_per_push", max_steps_per_push)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"{name} must be a positive integer (got {value!r})")


def _as_seconds(value: object) -> float | None:
    """A duration from a float-like (numpy, tensor item); None when it is not a finite one >= 0."""
    try:
        seconds = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return None
    return seconds if 0.0 <= seconds < float("inf") else None


def _as_count(samples: object) -> int | None:
    """A sample count from an int-like (numpy, tensor item); None when it is not one."""
    try:
        value = int(samples)  # type: ignore[call-overload]
    except (TypeError, ValueError, OverflowError):
        return None
    return value if value >= 0 else None
