"""A deterministic stand-in for CUDA timing events (the one thing these tests cannot run): a stream whose
progress the test moves by hand, and events that complete when the stream has passed them.

It offers only what gpumond's `Event` protocol allows (record, query, elapsed_s): a timer that tried to
synchronise would fail on the missing method, and reading an elapsed time before both events report
complete raises, as `cudaEventElapsedTime` does with cudaErrorNotReady.
"""

from __future__ import annotations

from collections.abc import Callable


class FakeStream:
    """The GPU timeline: `at` is where the next recorded event lands, `done` how far the GPU has got."""

    def __init__(self, at: Callable[[], float] | None = None) -> None:
        self.t = 0.0  # stream time of the next record, moved by the test (or read from `at`)
        self._at = at
        self.done = -1.0  # every event at or before this time has completed
        self.queries = 0
        self.created = 0

    def now(self) -> float:
        return self._at() if self._at is not None else self.t

    def reach(self, t: float) -> None:
        """The GPU has run everything enqueued up to stream time t."""
        self.done = max(self.done, t)

    def event(self) -> FakeEvent:
        self.created += 1
        return FakeEvent(self)


class FakeEvent:
    __slots__ = ("_stream", "at")

    def __init__(self, stream: FakeStream) -> None:
        self._stream = stream
        self.at: float | None = None

    def record(self) -> None:
        self.at = self._stream.now()

    def query(self) -> bool:
        self._stream.queries += 1
        return self.at is not None and self.at <= self._stream.done

    def elapsed_s(self, end: FakeEvent) -> float:
        if not (self.query() and end.query()):
            raise RuntimeError("CUDA error: device not ready")
        assert self.at is not None and end.at is not None
        return end.at - self.at
