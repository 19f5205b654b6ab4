"""A synchronous data-parallel training job simulated with threads, reporting through the real job SDK.

Each rank is a thread: it fetches a batch through `reporter.wrap` (a starved rank's loader sleeps), computes
for `step_s` stretched by its GPU's clock deficit (read from its agent's /metrics), then waits on a barrier
with every other rank, as an all-reduce would. So step times equalise across ranks exactly as in real
synchronous training, and only GPU telemetry, data wait and comm wait can tell who is at fault: each rank
reports its barrier wait as its comm wait, and the slowest rank is the one that waits least.

Host thread scheduling is not part of the simulated cluster, so it is kept out of the signals: waking 24
threads one GIL hand-off at a time takes milliseconds on a loaded machine. A rank's comm wait ends when the
last rank arrives, as a real collective's does (NCCL peers spin and finish together), and its simulated GPU
computes from when the collective released it, not from when its thread got to run. Counted as waiting,
that lateness made whichever rank arrived last (a starved one too) look like it computed more than its
peers; counted as computing, it made the ranks that are usually woken last look slow.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

from gpumond.job import Reporter


class ClockFactors:
    """Per (node, gpu) compute-time multiplier, refreshed from the agents by the caller."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._f: dict[tuple[str, int], float] = {}

    def set(self, node: str, gpu: int, factor: float) -> None:
        with self._lock:
            self._f[(node, gpu)] = factor

    def get(self, node: str, gpu: int) -> float:
        with self._lock:
            return self._f.get((node, gpu), 1.0)


class SimulatedJob:
    """`world_size` rank threads stepping in lockstep until stop()."""

    def __init__(self, *, job: str, ranks: list[tuple[str, int, str]], endpoint: str, token: str, step_s: float,
                 clock_factors: ClockFactors, data_wait: Callable[[int], float]) -> None:
        self._ranks = ranks  # rank → (node, gpu index, gpu uuid)
        self._step_s = step_s
        self._factors = clock_factors
        self._data_wait = data_wait
        self._stop = threading.Event()
        self._released = 0.0  # when the last rank arrived at the current barrier (monotonic)
        self._barrier = threading.Barrier(len(ranks), action=self._release)
        self._threads: list[threading.Thread] = []
        self.reporters = [Reporter(endpoint=endpoint, token=token, job=job, rank=r, world_size=len(ranks),
                                   node=node, gpu_uuid=uuid, push_interval_s=2.0)
                          for r, (node, _, uuid) in enumerate(ranks)]

    def start(self) -> None:
        for r in range(len(self._ranks)):
            t = threading.Thread(target=self._run, args=(r,), name=f"demo-rank-{r}", daemon=True)
            t.start()
            self._threads.append(t)

    def _release(self) -> None:
        # Run by the last rank to arrive, before any is woken: every rank reads it before the next barrier.
        self._released = time.monotonic()

    def _loader(self, rank: int) -> Iterator[int]:
        i = 0
        while not self._stop.is_set():
            wait = self._data_wait(rank)
            if wait > 0:
                time.sleep(wait)
            yield i
            i += 1

    def _run(self, rank: int) -> None:
        node, gpu, _ = self._ranks[rank]
        rep = self.reporters[rank]
        try:
            late = 0.0  # how long after the last collective's release this thread got to run
            for _batch in rep.wrap(self._loader(rank)):
                compute_until = time.monotonic() - late + self._step_s * self._factors.get(node, gpu)
                time.sleep(max(0.0, compute_until - time.monotonic()))
                arrived = time.monotonic()
                self._barrier.wait(timeout=30)  # the all-reduce: everyone waits for the slowest
                woke = time.monotonic()
                released = self._released
                late = woke - released
                rep.step_end(comm_wait_s=max(0.0, released - arrived))
                if self._stop.is_set():
                    break
        except threading.BrokenBarrierError:
            return

    def stop(self) -> None:
        self._stop.set()
        self._barrier.abort()
        for t in self._threads:
            t.join(timeout=5)
        for rep in self.reporters:
            rep.close(timeout_s=2)
