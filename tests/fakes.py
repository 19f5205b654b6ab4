"""The fakes the tests share: a clock that moves only when told, a scheduler that runs only when told, a job-SDK
transport that keeps what it is sent, and a host process as the agent's job attribution reads it.

One of each, so every test steers time and reads pushes the same way (not a copy per module that drifts).
Stdlib and the job SDK only: tests/integration/ddp_equal_worker.py imports it inside torchrun workers.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable

from gpumond.job.transport import Reply


class FakeClock:
    """A clock (monotonic or unix: the caller picks `now`) that moves only when the test sets or advances it."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Deferred:
    """Runs nothing by itself: keeps each `(delay_s, fn)` it is asked to run later, for the test to run in order
    (the agent's scheduler, as the relay's early rounds use it)."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, Callable[[], object]]] = []

    def __call__(self, delay_s: float, fn: Callable[[], object]) -> None:
        self.calls.append((delay_s, fn))

    def run_next(self) -> float:
        """Run the oldest function still waiting; its delay."""
        delay_s, fn = self.calls.pop(0)
        fn()
        return delay_s


class FakeTransport:
    """Answers 202 (or the queued replies, in order) and keeps every body: raw, parsed, whether it was early, and the
    sending process."""

    def __init__(self, *replies: Reply) -> None:
        self.replies = list(replies)
        self.raw: list[bytes] = []
        self.bodies: list[dict] = []
        self.pids: set[int] = set()
        self.early: list[bool] = []  # per body: whether it was sent as an early push
        self.lock = threading.Lock()

    def post(self, body: bytes, timeout_s: float, *, early: bool = False) -> Reply:
        with self.lock:
            self.raw.append(body)
            self.early.append(early)
            self.bodies.append(json.loads(body))
            self.pids.add(os.getpid())
            return self.replies.pop(0) if self.replies else Reply(202)

    def close(self) -> None:
        pass

    def steps(self) -> list[dict]:
        """Every step pushed, in order."""
        return [s for b in self.bodies for s in b["steps"]]


class HostProcess:
    """A host process as JobAttributor reads it: its environment, a fixed start time, PID 1 as its parent."""

    def __init__(self, env: dict[str, str]) -> None:
        self._env = env

    def create_time(self) -> float:
        return 1.0

    def environ(self) -> dict[str, str]:
        return self._env

    def ppid(self) -> int:
        return 1
