"""Windows of recent data, bounded in time and memory: per (job, rank) from pushes, per GPU and node from telemetry."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice
from types import MappingProxyType
from typing import TYPE_CHECKING

import numpy as np

from gpumond.push.steps import step_rows, step_samples
from gpumond.rules.columns import SampleBuffer, StepBuffer, StepView, sample_matrix, trailing_run
from gpumond.wire.identity import legacy_mig_uuid
from gpumond.rules.types import (GpuSample, GpuWindow, HostSample, RankInfo, RankWindow, StepColumns, StepRecord,
                                 TelemetryBatch)

if TYPE_CHECKING:
    from gpumond.config.rules import RulesConfig

CAPS = ("jobs", "ranks", "gpus", "steps")
_TRIM_LOOK = 8  # steps a trim reads one by one before comparing the whole window
_CAP_KEYS = {"jobs": "max_jobs", "ranks": "max_ranks", "gpus": "max_gpus", "steps": "max_steps_held"}


class CapExceeded(Exception):
    """A push would add a new job, rank or GPU (or steps for a new rank) past a cap; nothing was stored."""

    def __init__(self, cap: str, limit: int, what: str) -> None:
        super().__init__(f"{cap} cap reached: {limit} {cap} held (limits.{_CAP_KEYS[cap]}); new {what} refused, "
                         "data of those already held is still accepted")
        self.cap = cap


@dataclass(frozen=True, slots=True)
class RankCounts:
    """What a RankStore holds and has refused or dropped, for /metrics."""

    jobs: int
    ranks: int
    gpus: int
    steps: int
    steps_accepted: int
    steps_duplicate: int
    steps_stale: int  # older than the window when they arrived
    steps_refused: int  # did not fit under max_steps_held
    steps_per_rank_window: int  # beyond max_steps_per_rank in one push: older than what a rank's window keeps
    refused: Mapping[str, int]  # pushes refused, by cap
    expired: Mapping[str, int]  # dropped for silence, by "jobs" / "ranks" / "gpus"
    restarts: int = 0  # ranks whose process restarted (a push with a new incarnation)


@dataclass(frozen=True, slots=True)
class Stored:
    """What one push did: steps newly kept, and new steps not kept by reason (duplicates and stale apart)."""

    accepted: int
    per_rank_window: int = 0  # the push's oldest new steps past limits.max_steps_per_rank
    steps_held: int = 0  # new steps with no room under limits.max_steps_held
    duplicate: int = 0  # steps whose number this rank (this incarnation) already holds
    stale: int = 0  # steps that ended before the window: a clock behind by more than window_s, or a late retry
    restarted: bool = False  # a new incarnation of the rank: what the previous process pushed was let go

    def dropped(self) -> dict[str, int]:
        """Every step of the push not stored, by reason (non-zero only): {"duplicate": 3, "stale": 200}."""
        return {k: v for k, v in (("duplicate", self.duplicate), ("stale", self.stale),
                                  ("per_rank_window", self.per_rank_window), ("steps_held", self.steps_held)) if v}


class _Rank:
    """One (job, rank): its latest RankInfo and its steps in arrival order, as columns (no object per step)."""

    __slots__ = ("info", "incarnation", "cols", "last_push", "last_step", "view", "last_beat", "ended", "samples")

    def __init__(self, info: RankInfo, incarnation: str | None = None) -> None:
        self.info = info
        self.incarnation = incarnation  # the pushing process's id (the SDK's, per process); None: not sent
        self.cols = StepBuffer()
        self.last_push = 0.0
        self.last_step = -1  # highest step number ever held: steps above it cannot be duplicates
        self.view: RankWindow | None = None  # the last snapshot, reused until something changes
        self.last_beat: float | None = None  # the last push without steps (the SDK's heartbeat)
        self.ended = False  # the rank's last push said `final`: its process is ending
        self.samples = 0  # samples its new steps reported in total, kept across restarts (steps redone count again)


def _samples(per_step: np.ndarray | None) -> int:
    """The samples of a push's steps in total (-1, not reported, counts none); summed as float64 so that
    absurd values cannot wrap int64 into a negative total."""
    if per_step is None or not len(per_step):
        return 0
    return int(np.maximum(per_step, 0).sum(dtype=np.float64))


class RankStore:
    """Thread-safe per-(job, rank) windows of steps, held as columns, under caps on jobs, ranks, GPUs and steps."""

    def __init__(self, *, window_s: float, expire_after_s: float, max_jobs: int, max_ranks: int, max_gpus: int,
                 max_steps_per_rank: int, max_steps_held: int) -> None:
        self.window_s = window_s
        self.expire_after_s = expire_after_s
        self.limits = {"jobs": max_jobs, "ranks": max_ranks, "gpus": max_gpus, "steps": max_steps_held}
        self._per_rank = max_steps_per_rank
        self._lock = threading.Lock()
        self._jobs: dict[str, dict[int, _Rank]] = {}
        self._gpus: dict[str, int] = {}  # GPU UUID -> number of ranks on it
        self._ranks = 0
        self._steps = 0
        self._accepted = self._duplicate = self._stale = self._refused_steps = self._past_window = 0
        self._restarts = 0  # ranks whose process restarted (a new incarnation)
        self._refused = dict.fromkeys(CAPS, 0)
        self._expired = dict.fromkeys(("jobs", "ranks", "gpus"), 0)
        # Jobs whose every rank said it ended, released since the evaluator last asked (take_ended()).
        self._ended: set[str] = set()
        self.ended_total = 0
        # Jobs that got new steps since the evaluator last asked (take_fresh()), with when the first of them
        # landed: a job is judged when its steps arrive, not on a global tick. Set on every such push, so a
        # waiting judge wakes at once (pushes in between coalesce into one wake).
        self._landed: dict[str, float] = {}
        self._arrived = threading.Event()

    @classmethod
    def from_config(cls, config: RulesConfig) -> RankStore:
        """Built from a RulesConfig (window_s, expire_after_s and limits)."""
        limits = config.limits
        return cls(window_s=config.window_s, expire_after_s=config.expire_after_s,
                   max_jobs=limits.max_jobs, max_ranks=limits.max_ranks, max_gpus=limits.max_gpus,
                   max_steps_per_rank=limits.max_steps_per_rank, max_steps_held=limits.max_steps_held)

    # ----- writing ---------------------------------------------------------------------------------
    def add(self, info: RankInfo, steps: Sequence[StepRecord] | StepColumns, now: float) -> int:
        """Record a push; return how many steps were new and kept. Raises CapExceeded (nothing stored)."""
        return self.record(info, steps, now).accepted

    def record(self, info: RankInfo, steps: Sequence[StepRecord] | StepColumns, now: float,
               incarnation: str | None = None, *, final: bool = False) -> Stored:
        """Record a push; say what was kept and what was not, and why. Raises CapExceeded (nothing stored).

        `steps` are records or, as the push API decodes them, columns (step numbers within int64: an
        OverflowError otherwise, before anything is stored).

        A push whose `incarnation` differs from the one the rank holds comes from a restarted process (a
        torchelastic restart keeps the job and rank, and numbers its steps again from its checkpoint): the
        rank's held steps belong to a run that is over and are let go, so the new process's steps count
        instead of being taken for duplicates. A push without one (an older SDK) keeps the old behaviour.

        `final`: the rank's process is ending. Once every held rank of the job has said so, the job is
        released at once (its steps, ranks and GPUs) and reported by take_ended(), so that its findings
        resolve now rather than after expire_after_s."""
        cutoff = now - self.window_s
        batch = steps if isinstance(steps, StepColumns) else StepColumns(*step_rows(steps), step_samples(steps))
        with self._lock:
            job = self._jobs.get(info.job)
            rank = job.get(info.rank) if job is not None else None
            self._admit(info, job, rank, len(batch) > 0)
            if job is None:
                job = self._jobs[info.job] = {}
            if rank is None:
                rank = job[info.rank] = _Rank(info)
                self._ranks += 1
                self._gpus[info.gpu_uuid] = self._gpus.get(info.gpu_uuid, 0) + 1
            elif rank.info != info:
                self._move_gpu(rank.info.gpu_uuid, info.gpu_uuid)
                rank.info = info
            restarted = incarnation is not None and incarnation != rank.incarnation and rank.last_step >= 0
            if restarted:
                self._forget_steps(rank)
                self._restarts += 1
            if incarnation is not None:
                rank.incarnation = incarnation
            duplicate, stale = self._duplicate, self._stale
            numbers, values, highest, samples = self._fresh(rank, batch, cutoff)
            rank.samples += samples
            duplicate, stale = self._duplicate - duplicate, self._stale - stale
            self._trim(rank, cutoff)
            past_window = max(0, len(numbers) - self._per_rank)
            if past_window:
                # One rank's window keeps at most max_steps_per_rank: the push's oldest new steps would be
                # rolled out by its newest at once. Not a lack of room: named apart so the client knows.
                numbers, values = numbers[past_window:], values[:, past_window:]
                self._past_window += past_window
            no_room = self._fit(rank, len(numbers))
            if no_room:
                numbers, values = numbers[no_room:], values[:, no_room:]  # the oldest of the new steps go first
            rank.cols.extend(numbers, values)
            kept = len(numbers)
            self._steps += kept
            self._accepted += kept
            rank.last_step = max(rank.last_step, highest)
            rank.last_push = now
            if not len(batch):
                rank.last_beat = now
            rank.ended = final  # a push without it after one with it: the rank was restarted
            rank.view = None
            if kept:
                self._landed.setdefault(info.job, now)
                self._arrived.set()
            if final and all(r.ended for r in job.values()):
                self._release(info.job)
            return Stored(kept, past_window, no_room, duplicate, stale, restarted)

    def _forget_steps(self, rank: _Rank) -> None:
        """A restarted rank: its held steps (the previous process's) go; its step numbers start afresh."""
        self._steps -= len(rank.cols)
        rank.cols.clear()
        rank.last_step = -1
        rank.view = None

    def _release(self, name: str) -> None:
        """Drop a job whose ranks all ended (under the lock)."""
        for rank in self._jobs.pop(name).values():
            self._ranks -= 1
            self._steps -= len(rank.cols)
            self._release_gpu(rank.info.gpu_uuid)
        if len(self._ended) < self.limits["jobs"]:  # bounded even if nobody ever asks
            self._ended.add(name)
        self.ended_total += 1

    def take_ended(self) -> frozenset[str]:
        """Jobs released because every rank ended, since the last call."""
        with self._lock:
            ended, self._ended = frozenset(self._ended), set()
            return ended

    def _admit(self, info: RankInfo, job: dict[int, _Rank] | None, rank: _Rank | None, has_steps: bool) -> None:
        new_gpu = info.gpu_uuid not in self._gpus
        if rank is None:
            if job is None and len(self._jobs) >= self.limits["jobs"]:
                self._refuse("jobs", f"job {info.job!r}")
            if self._ranks >= self.limits["ranks"]:
                self._refuse("ranks", f"rank {info.rank} of job {info.job!r}")
            if new_gpu and len(self._gpus) >= self.limits["gpus"]:
                self._refuse("gpus", f"GPU {info.gpu_uuid}")
            if has_steps and self._steps >= self.limits["steps"]:
                self._refuse("steps", f"rank {info.rank} of job {info.job!r}")
        elif has_steps and not len(rank.cols) and self._steps >= self.limits["steps"]:
            # A rank created by a heartbeat (or emptied by its window) holds nothing it could roll: like a
            # new rank with steps, it is refused while the total is full, instead of accepting 0 forever.
            self._refuse("steps", f"steps for rank {info.rank} of job {info.job!r} (it holds none it could roll out)")
        if rank is not None and new_gpu and len(self._gpus) >= self.limits["gpus"] \
                and self._gpus.get(rank.info.gpu_uuid) != 1:
            # A rank moving to a new GPU frees its old one only when it was the last rank there.
            self._refuse("gpus", f"GPU {info.gpu_uuid}")

    def _refuse(self, cap: str, what: str) -> None:
        self._refused[cap] += 1
        raise CapExceeded(cap, self.limits[cap], what)

    def _move_gpu(self, old: str, new: str) -> None:
        if old == new:
            return
        self._gpus[new] = self._gpus.get(new, 0) + 1
        self._release_gpu(old)

    def _release_gpu(self, uuid: str) -> None:
        left = self._gpus[uuid] - 1
        if left:
            self._gpus[uuid] = left
        else:
            del self._gpus[uuid]

    def _fresh(self, rank: _Rank, batch: StepColumns, cutoff: float) -> tuple[np.ndarray, np.ndarray, int, int]:
        """The steps of a push neither already held (retries) nor older than the window, in push order, as
        (numbers, values), their highest number (-1 for none) and the samples they reported (a step the
        window or a cap then leaves out was still computed: its samples count)."""
        numbers, values = batch.step, batch.values
        n = len(numbers)
        if not n:
            return numbers, values, -1, 0
        ends = values[0]
        # The SDK's usual push: new steps in increasing order, all inside the window. One vectorised check,
        # because it is most of the work of a push.
        if numbers[0] > rank.last_step and ends.min() >= cutoff \
                and (n == 1 or bool((numbers[1:] > numbers[:-1]).all())):
            return numbers, values, int(numbers[-1]), _samples(batch.samples)
        live = np.flatnonzero(ends >= cutoff)
        self._stale += n - len(live)
        # Of the steps inside the window, the first of each number is new unless held; any later copy is a duplicate.
        keep = np.zeros(n, dtype=bool)
        keep[live[np.unique(numbers[live], return_index=True)[1]]] = True
        maybe_held = keep & (numbers <= rank.last_step)
        if maybe_held.any():  # only a retry or a restarted job pays for this look-up
            keep[maybe_held] = ~np.isin(numbers[maybe_held], rank.cols.numbers())
        self._duplicate += len(live) - int(keep.sum())
        fresh = numbers[keep]
        samples = None if batch.samples is None else batch.samples[keep]
        return fresh, values[:, keep], int(fresh.max()) if len(fresh) else -1, _samples(samples)

    def _fit(self, rank: _Rank, k: int) -> int:
        """Make room for `k` new steps under the per-rank cap and the global cap (rolling the rank's oldest
        out); return how many of the new ones found no room under the global cap."""
        held = len(rank.cols)
        # This rank may grow into the free room, or else only roll its own window.
        allowed = min(self._per_rank, held + max(0, self.limits["steps"] - self._steps))
        excess = held + k - allowed
        if excess <= 0:
            return 0
        drop_old = min(excess, held)
        rank.cols.drop(drop_old)
        self._steps -= drop_old
        drop_new = excess - drop_old
        # Only possible when the global cap is full (k <= max_steps_per_rank here).
        self._refused_steps += drop_new
        return drop_new

    def _trim(self, rank: _Rank, cutoff: float) -> int:
        """Drop the rank's oldest steps (in arrival order) that ended before `cutoff`."""
        cols = rank.cols
        if cols.oldest_end >= cutoff:  # the usual case (and a rank holding none: inf)
            return 0
        ends = cols.ends()
        # Usually a step or two rolled out since the last look: count them on a few floats, not the whole window.
        n = 0
        for end in ends[:_TRIM_LOOK].tolist():
            if not end < cutoff:
                break
            n += 1
        if n == _TRIM_LOOK:
            old = ends < cutoff
            n = len(old) if old.all() else int(old.argmin())
        cols.drop(n)
        self._steps -= n
        rank.view = None
        return n

    def expire(self, now: float) -> RankCounts:
        """Drop ranks silent for expire_after_s (and jobs and GPUs left empty), trim windows; return the counts."""
        silent_before, cutoff = now - self.expire_after_s, now - self.window_s
        with self._lock:
            for name in list(self._jobs):
                ranks = self._jobs[name]
                for number in list(ranks):
                    rank = ranks[number]
                    if rank.last_push < silent_before:
                        del ranks[number]
                        self._ranks -= 1
                        self._steps -= len(rank.cols)
                        self._expired["ranks"] += 1
                        gpus = len(self._gpus)
                        self._release_gpu(rank.info.gpu_uuid)
                        self._expired["gpus"] += gpus - len(self._gpus)
                    elif rank.cols.oldest_end < cutoff:  # checked here: a call per rank costs ~1 µs × ranks
                        self._trim(rank, cutoff)
                if not ranks:
                    del self._jobs[name]
                    self._expired["jobs"] += 1
            return self._counts()

    # ----- reading ---------------------------------------------------------------------------------
    def take_fresh(self) -> dict[str, float]:
        """The jobs that got new steps since the last call, each with when its first new steps landed; cleared."""
        with self._lock:
            fresh, self._landed = self._landed, {}
            self._arrived.clear()
            return fresh

    def wait_fresh(self, timeout: float) -> bool:
        """Block until some job has new steps not yet taken (True) or `timeout` seconds pass (False)."""
        return self._arrived.wait(timeout)

    def job_names(self) -> frozenset[str]:
        """The jobs held now."""
        with self._lock:
            return frozenset(self._jobs)

    def jobs(self, now: float, names: Iterable[str] | None = None) -> Mapping[str, Mapping[int, RankWindow]]:
        """An immutable snapshot: job -> rank -> RankWindow, steps within the window, oldest first (of every
        job held, or of those of `names` still held)."""
        # Each job is copied whole under the lock, one job at a time: pushes wait for at most one
        # job's copy, never the whole store, and detectors compare ranks within a job only.
        cutoff = now - self.window_s
        with self._lock:
            names = list(self._jobs) if names is None else [n for n in names if n in self._jobs]
        out: dict[str, Mapping[int, RankWindow]] = {}
        for name in names:
            with self._lock:
                ranks = self._jobs.get(name)
                if ranks is None:
                    continue  # expired meanwhile
                views: dict[int, RankWindow] = {}
                for number, rank in ranks.items():
                    if rank.cols.oldest_end < cutoff:  # checked here: a call per rank costs ~1 µs × ranks
                        self._trim(rank, cutoff)
                    if rank.view is None:
                        cols = rank.cols.columns()
                        rank.view = RankWindow(rank.info, StepView(cols), rank.last_push, cols, rank.last_beat,
                                               rank.ended, rank.samples)
                    views[number] = rank.view
            out[name] = MappingProxyType(views)
        return MappingProxyType(out)

    def counts(self) -> RankCounts:
        """Current sizes and counters."""
        with self._lock:
            return self._counts()

    def _counts(self) -> RankCounts:
        return RankCounts(len(self._jobs), self._ranks, len(self._gpus), self._steps, self._accepted,
                          self._duplicate, self._stale, self._refused_steps, self._past_window, dict(self._refused),
                          dict(self._expired), self._restarts)


# ----- GPU telemetry -----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class GpuCounts:
    """What a GpuStore holds and has refused or dropped, for /metrics."""

    gpus: int
    nodes: int
    samples: int
    refused_gpus: int  # samples of a new GPU past max_gpus
    refused_nodes: int
    expired_gpus: int
    expired_nodes: int


class GpuStore:
    """Thread-safe time windows of GpuSamples per GPU UUID and HostSamples per node, under caps."""

    def __init__(self, *, window_s: float, expire_after_s: float, max_gpus: int, max_samples: int) -> None:
        self.window_s = window_s
        self.expire_after_s = expire_after_s
        self.max_gpus = max_gpus
        self._max_samples = max_samples
        self._lock = threading.Lock()
        self._gpus: dict[str, deque[GpuSample]] = {}
        self._cols: dict[str, SampleBuffer] = {}  # the same samples as columns, aligned with each deque
        self._hosts: dict[str, deque[HostSample]] = {}
        self._absent: frozenset[str] = frozenset()
        self._refused_gpus = self._refused_nodes = self._expired_gpus = self._expired_nodes = 0
        # A MIG device's pre-R470 name (MIG-GPU-<parent>/<gi>/<ci>) → its MIG UUID, so a rank pushing either joins.
        self._aliases: dict[str, str] = {}
        # Fetches added so far: a judgement on arrival reuses a job's windowed picture only while no fetch landed
        # since it was measured (engine.Windowed.telemetry_seq).
        self.fetches = 0

    @classmethod
    def from_config(cls, config: RulesConfig) -> GpuStore:
        """Built from a RulesConfig (window_s, expire_after_s, limits.max_gpus / max_samples_per_gpu)."""
        limits = config.limits
        return cls(window_s=config.window_s, expire_after_s=config.expire_after_s,
                   max_gpus=limits.max_gpus, max_samples=limits.max_samples_per_gpu)

    def add(self, batch: TelemetryBatch) -> None:
        """Append one fetch: samples go to their GPU's and node's windows; absent nodes are remembered."""
        with self._lock:
            # A sample passed on by a fetch that did not ask about its GPU again (telemetry/promql_need) is the
            # window's newest itself: left out here, before its columns are built (at 33,000 GPUs most of a batch).
            fresh = [g for g in batch.gpus if not ((w := self._gpus.get(g.uuid)) and w[-1] is g)]
        # Built for the new samples before taking the lock again: a fetch's samples at once, vectorised.
        matrix = sample_matrix(fresh).T
        with self._lock:
            for g, column in zip(fresh, matrix, strict=True):
                if self._append(self._gpus, g.uuid, g, self._cols, column):
                    self._refused_gpus += 1
                elif g.parent_uuid is not None and g.gpu_instance is not None and g.compute_instance is not None:
                    self._aliases[legacy_mig_uuid(g.parent_uuid, g.gpu_instance, g.compute_instance)] = g.uuid
            for h in batch.hosts:
                # A node has at least one GPU, so max_gpus bounds nodes too.
                if self._append(self._hosts, h.node, h):
                    self._refused_nodes += 1
            self._absent = batch.absent_nodes
            self.fetches += 1

    def _append(self, series: dict, key: str, sample: GpuSample | HostSample,
                cols: dict[str, SampleBuffer] | None = None, column: np.ndarray | None = None) -> bool:
        window = series.get(key)
        if window is None:
            if len(series) >= self.max_gpus:
                return True
            window = series[key] = deque(maxlen=self._max_samples)
            if cols is not None:
                cols[key] = SampleBuffer()
        if window and (sample.t < window[-1].t or sample is window[-1]):
            # A late sample from a slow fetch: the window stays in time order. The newest sample itself: passed on by
            # a fetch that did not ask about this GPU again (telemetry/promql_need), not a new reading.
            return False
        buffer = cols[key] if cols is not None else None
        if buffer is not None and len(window) == window.maxlen:
            buffer.drop(1)  # the deque drops its oldest on this append
        window.append(sample)
        if buffer is not None:
            buffer.append(column)
        cutoff = sample.t - self.window_s
        dropped = 0
        while window[0].t < cutoff:
            window.popleft()
            dropped += 1
        if buffer is not None and dropped:
            buffer.drop(dropped)
        return False

    def window(self, uuid: str, since: float) -> GpuWindow:
        """The GPU's samples taken at or after `since`, oldest first (empty when unknown), with their columns."""
        return self.windows((uuid,), since)[uuid]

    def windows(self, uuids: Iterable[str], since: float) -> dict[str, GpuWindow]:
        """{uuid: window(uuid, since)} for each of `uuids`, read at once: how many of each GPU's newest samples
        were taken at or after `since` is found from the columns' times for all of them together (one numpy
        pass), so no sample object is read to find it; then only those samples are taken from the deque.
        Read one GPU at a time, the times were a Python loop over sample objects (~10 µs a GPU at 32,768)."""
        out: dict[str, GpuWindow] = {}
        with self._lock:
            known, series, buffers = [], [], []
            for u in uuids:
                key = self._aliases.get(u, u)
                out[u] = _UNKNOWN  # replaced below where known: the order asked is kept
                window = self._gpus.get(key)
                if window is None:
                    continue
                known.append(u)
                series.append(window)
                buffers.append(self._cols[key])
            if not known:
                return out
            newest = trailing_run([b.times() for b in buffers], since)
            for u, window, buffer, k in zip(known, series, buffers, newest.tolist(), strict=True):
                # From the newest end: only the k samples taken are touched, not the whole window.
                samples = tuple(islice(reversed(window), k))[::-1] if k else ()
                out[u] = GpuWindow(samples, buffer.columns(k))
        return out

    def windows_on_demand(self, uuids: Iterable[str], since: float) -> Mapping[str, GpuWindow]:
        """windows(uuids, since) as a mapping that reads each GPU's window when it is first asked for: a judgement on
        arrival asks only for its candidates' GPUs (activity evidence), not for every GPU of a big job, and reading
        all of them was a fifth of its cost at 32,768 GPUs."""
        return _OnDemand(self, tuple(dict.fromkeys(uuids)), since)

    def hosts(self, node: str, since: float) -> tuple[HostSample, ...]:
        """The node's host samples taken at or after `since`, oldest first."""
        with self._lock:
            return _since(self._hosts.get(node, ()), since)

    def uuids(self) -> frozenset[str]:
        """Every GPU with a window."""
        with self._lock:
            return frozenset(self._gpus)

    def absent_nodes(self) -> frozenset[str]:
        """Nodes whose agent could not be reached in the latest fetch (never stragglers)."""
        with self._lock:
            return self._absent

    def expire(self, now: float) -> GpuCounts:
        """Drop GPUs and nodes with no sample for expire_after_s, trim the rest to the window."""
        silent_before, cutoff = now - self.expire_after_s, now - self.window_s
        with self._lock:
            self._expired_gpus += _expire(self._gpus, silent_before, cutoff, self._cols)
            self._expired_nodes += _expire(self._hosts, silent_before, cutoff)
            self._aliases = {old: new for old, new in self._aliases.items() if new in self._gpus}
            return self._counts()

    def counts(self) -> GpuCounts:
        """Current sizes and counters."""
        with self._lock:
            return self._counts()

    def _counts(self) -> GpuCounts:
        return GpuCounts(len(self._gpus), len(self._hosts), sum(len(w) for w in self._gpus.values()),
                         self._refused_gpus, self._refused_nodes, self._expired_gpus, self._expired_nodes)


_UNKNOWN = GpuWindow((), None)  # a GPU without telemetry


class _OnDemand(Mapping[str, GpuWindow]):
    """GpuStore.windows_on_demand: each GPU's window read from the store the first time it is asked for."""

    def __init__(self, store: GpuStore, uuids: tuple[str, ...], since: float) -> None:
        self._store, self._uuids, self._since = store, uuids, since
        self._known = frozenset(uuids)
        self._read: dict[str, GpuWindow] = {}

    def __getitem__(self, uuid: str) -> GpuWindow:
        if uuid not in self._known:
            raise KeyError(uuid)
        window = self._read.get(uuid)
        if window is None:
            window = self._read[uuid] = self._store.window(uuid, self._since)
        return window

    def __iter__(self) -> Iterator[str]:
        return iter(self._uuids)

    def __len__(self) -> int:
        return len(self._uuids)

    def read_all(self) -> None:
        """Read every window not read yet, at once (GpuStore.windows): for a judgement that reads them all."""
        left = [u for u in self._uuids if u not in self._read]
        if left:
            self._read.update(self._store.windows(left, self._since))


def _since(window: deque | tuple, since: float) -> tuple:
    """The samples taken at or after `since`, oldest first, read from the newest end: the recent look is a fifth
    of the window, and copying the whole window touched every sample held (a cache miss each at 32,768 GPUs)."""
    newest = []
    for s in reversed(window):  # windows are in time order (add() keeps them so)
        if not s.t >= since:
            break
        newest.append(s)
    newest.reverse()
    return tuple(newest)


def _expire(series: dict[str, deque], silent_before: float, cutoff: float,
            cols: dict[str, SampleBuffer] | None = None) -> int:
    dropped = 0
    for key in list(series):
        window = series[key]
        if not window or window[-1].t < silent_before:
            del series[key]
            if cols is not None:
                del cols[key]
            dropped += 1
            continue
        n = 0
        while len(window) > 1 and window[0].t < cutoff:
            window.popleft()  # the newest stays, so its time still says when the series was last seen
            n += 1
        if n and cols is not None:
            cols[key].drop(n)
    return dropped
