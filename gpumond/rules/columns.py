"""Columnar copies of the store's windows, kept up to date as data arrives so a snapshot costs O(1).

A buffer holds the live rows in cells [start, stop) of preallocated arrays. Appends write at `stop` and
beyond; expiry only moves `start`; when the cells run out the live rows move to new, larger arrays. So a
cell inside any view handed out is never written again: snapshots are read by the evaluator thread while
ingest goes on, without copying and without a lock.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gpumond.rules.types import GPU_SIGNALS, SAMPLE_ROWS, GpuColumns, GpuSample, StepColumns, StepRecord

_MIN_CAP = 16


def _frozen(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


def _read_only(*arrays: np.ndarray) -> tuple[np.ndarray, ...]:
    return tuple(_frozen(a.view()) for a in arrays)


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

    __slots__ = ("_step", "_values", "_read", "_start", "_stop", "_broken")

    def __init__(self) -> None:
        self._step = np.empty(0, dtype=np.int64)
        self._values = np.empty((4, 0))
        self._read = _read_only(self._step, self._values)  # slices of read-only views are read-only: no flag per snapshot
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
        self._read = _read_only(step, values)

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
            self._read = _read_only(self._step, self._values)
            self._start, self._stop = 0, len(steps)
        a, b = self._start, self._stop
        step, values = self._read
        return StepColumns(step[a:b], values[:, a:b])


# ----- GPU samples -------------------------------------------------------------------------------
_BITS = 2.0 ** np.arange(len(GPU_SIGNALS))


def sample_matrix(samples: Sequence[GpuSample]) -> np.ndarray:
    """The (SAMPLE_ROWS, n) GpuColumns matrix of `samples` (a telemetry batch at once: one conversion)."""
    rows = [[s.t, s.up, *map(s.values.get, GPU_SIGNALS)] for s in samples]
    m = np.array(rows, dtype=float).reshape(-1, 2 + len(GPU_SIGNALS))  # an absent signal (None) becomes NaN
    nan = np.isnan(m[:, 2:])
    out = np.empty((SAMPLE_ROWS, len(rows)))
    out[:2] = m[:, :2].T
    out[2] = ~nan @ _BITS
    for r, j in zip(*np.nonzero(nan), strict=True):  # NaN: absent, or a NaN the agent sent (then present)
        if GPU_SIGNALS[j] in samples[r].values:
            out[2, r] += _BITS[j]
    out[3:] = m[:, 2:].T
    return out


def gpu_columns(samples: Sequence[GpuSample]) -> GpuColumns:
    """Read-only columns of `samples`."""
    return GpuColumns(_frozen(sample_matrix(samples)))


class SampleBuffer:
    """One GPU's samples in window order, as a growable GpuColumns matrix aligned with the store's deque."""

    __slots__ = ("_data", "_read", "_start", "_stop")

    def __init__(self) -> None:
        self._data = np.empty((SAMPLE_ROWS, 0))
        self._read = _frozen(self._data.view())
        self._start = self._stop = 0

    def __len__(self) -> int:
        return self._stop - self._start

    def append(self, column: np.ndarray) -> None:
        """Append one sample's column of sample_matrix."""
        if self._stop == self._data.shape[1]:
            live = self._stop - self._start
            data = np.empty((SAMPLE_ROWS, max(_MIN_CAP, 2 * (live + 1))))
            data[:, :live] = self._data[:, self._start:self._stop]  # new cells: views handed out keep the old
            self._data, self._start, self._stop = data, 0, live
            self._read = _frozen(data.view())
        self._data[:, self._stop] = column
        self._stop += 1

    def drop(self, n: int) -> None:
        """Forget the `n` oldest samples."""
        self._start += n
        assert self._start <= self._stop

    def columns(self, newest: int) -> GpuColumns:
        """Read-only view of the `newest` latest samples."""
        return GpuColumns(self._read[:, self._stop - newest:self._stop])
