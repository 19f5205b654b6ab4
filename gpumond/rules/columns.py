"""Columnar copies of the store's windows, kept up to date as data arrives so a snapshot costs O(1).

A buffer holds the live rows in cells [start, stop) of preallocated arrays. Appends write at `stop` and
beyond; expiry only moves `start`; when the cells run out the live rows move to new, larger arrays. So a
cell inside any view handed out is never written again: snapshots are read by the evaluator thread while
ingest goes on, without copying and without a lock.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gpumond.rules.types import StepColumns, StepRecord

_MIN_CAP = 16


def _frozen(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


def step_rows(steps: Sequence[StepRecord]) -> tuple[np.ndarray, np.ndarray]:
    """(step numbers as int64, (4, n) float64 of end, duration_s, data_wait_s, comm_wait_s with NaN for None).
    Raises OverflowError for a step number outside int64."""
    numbers = np.array([s.step for s in steps], dtype=np.int64)
    values = np.array([(s.end, s.duration_s, s.data_wait_s, s.comm_wait_s) for s in steps], dtype=float)
    return numbers, values.reshape(-1, 4).T


def step_columns(steps: Sequence[StepRecord]) -> StepColumns | None:
    """Read-only columns of `steps` (None when a step number does not fit int64)."""
    try:
        numbers, values = step_rows(steps)
    except OverflowError:
        return None
    return StepColumns(_frozen(numbers), _frozen(np.ascontiguousarray(values)))


class StepBuffer:
    """One rank's steps in arrival order, as growable columns aligned with the store's deque."""

    __slots__ = ("_step", "_values", "_start", "_stop", "_broken")

    def __init__(self) -> None:
        self._step = np.empty(0, dtype=np.int64)
        self._values = np.empty((4, 0))
        self._start = self._stop = 0
        self._broken = False  # a step number did not fit int64: rebuilt from the records when asked

    def __len__(self) -> int:
        return self._stop - self._start

    def extend(self, steps: Sequence[StepRecord]) -> None:
        """Append steps after those held."""
        if not steps:
            return
        if self._broken:
            self._start = self._stop = 0  # rebuilt from the records anyway
            return
        try:
            numbers, values = step_rows(steps)
        except OverflowError:
            self._broken = True
            return
        k = len(numbers)
        if self._stop + k > len(self._step):
            self._grow(k)
        self._step[self._stop:self._stop + k] = numbers
        self._values[:, self._stop:self._stop + k] = values
        self._stop += k

    def _grow(self, k: int) -> None:
        # New arrays, never a shift in place: views handed out keep seeing the old cells.
        live = self._stop - self._start
        cap = max(_MIN_CAP, 2 * (live + k))
        step = np.empty(cap, dtype=np.int64)
        values = np.empty((4, cap))
        step[:live] = self._step[self._start:self._stop]
        values[:, :live] = self._values[:, self._start:self._stop]
        self._step, self._values, self._start, self._stop = step, values, 0, live

    def drop(self, n: int) -> None:
        """Forget the `n` oldest steps."""
        if self._broken:
            return
        self._start += n
        assert self._start <= self._stop

    def columns(self, steps: Sequence[StepRecord]) -> StepColumns | None:
        """Read-only views of the steps held; `steps` are the same steps as records, read only to rebuild
        after a step number that did not fit (None while one is still held)."""
        if self._broken:
            cols = step_columns(steps)
            if cols is None:
                return None
            self._broken = False
            self._step, self._values = np.array(cols.step), np.array(cols.values)
            self._start, self._stop = 0, len(steps)
        a, b = self._start, self._stop
        return StepColumns(_frozen(self._step[a:b]), _frozen(self._values[:, a:b]))
