"""Columnar copies of the store's windows, kept up to date as data arrives so a snapshot costs O(1).

A buffer holds the live rows in cells [start, stop) of preallocated arrays. Appends write at `stop` and
beyond; expiry only moves `start`; when the cells run out the live rows move to new arrays with a little
room. So a cell inside any view handed out is never written again: snapshots are read by the evaluator
thread while ingest goes on, without copying and without a lock.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from gpumond.push.steps import step_rows
from gpumond.rules.types import GPU_SIGNALS, SAMPLE_ROWS, GpuColumns, GpuSample, StepColumns, StepRecord

_MIN_CAP = 16


def _frozen(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


def step_columns(steps: Sequence[StepRecord]) -> StepColumns | None:
    """Read-only columns of `steps` (None when a step number does not fit int64)."""
    try:
        numbers, values = step_rows(steps)
    except OverflowError:
        return None
    return StepColumns(_frozen(numbers), _frozen(np.ascontiguousarray(values)))


class StepView(Sequence[StepRecord]):
    """A rank's held steps read as StepRecords, made one at a time from its columns when asked.

    The store keeps no object per step (an object and its floats cost ~250 bytes, the columns 40): whoever
    reads `RankWindow.steps` pays for the records it reads, when it reads them. `samples` is not held."""

    __slots__ = ("_cols",)

    def __init__(self, cols: StepColumns) -> None:
        self._cols = cols

    def __len__(self) -> int:
        return len(self._cols)

    def _record(self, i: int) -> StepRecord:
        c = self._cols
        comm = float(c.values[3, i])
        return StepRecord(int(c.step[i]), float(c.values[0, i]), float(c.values[1, i]), float(c.values[2, i]),
                          None, None if comm != comm else comm)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return tuple(self._record(j) for j in range(*i.indices(len(self))))
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("step index out of range")
        return self._record(i)

    def __iter__(self):  # type: ignore[override]
        c = self._cols
        for step, end, duration, wait, comm in zip(c.step.tolist(), *c.values.tolist()):
            yield StepRecord(step, end, duration, wait, None, None if comm != comm else comm)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, str):
            return len(self) == len(other) and tuple(self) == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"StepView({len(self)} steps)"


_ROWS = 5  # step number (int64 bits), end, duration_s, data_wait_s, comm_wait_s
_MIN_ROOM = 16


class StepBuffer:
    """One rank's held steps in arrival order, as one preallocated (5, capacity) block of columns.

    Row 0 holds the step numbers (int64 viewed in place), rows 1..4 the StepColumns values. Growth leaves
    an eighth of the live steps as room (at least 16 cells), so held capacity stays within ~6 % of the
    steps on average instead of the 50 % a doubling would waste: RSS per held step is what bounds a shard."""

    __slots__ = ("_block", "_read", "_start", "_stop", "oldest_end")

    def __init__(self) -> None:
        self._set(np.empty((_ROWS, 0)))
        self._start = self._stop = 0
        # The oldest held step's end (inf when none), as a float: the store checks it for every rank on every
        # snapshot and expiry, and reading it from the block costs a numpy scalar each (~60 ms at 32,768 ranks).
        self.oldest_end = math.inf

    def _set(self, block: np.ndarray) -> None:
        self._block = block
        read = _frozen(block.view())  # slices of a read-only view are read-only: no flag per snapshot
        self._read = (read[0].view(np.int64), read[1:])

    def __len__(self) -> int:
        return self._stop - self._start

    def extend(self, numbers: np.ndarray, values: np.ndarray) -> None:
        """Append k steps (int64 numbers, (4, k) float64 values) after those held."""
        k = len(numbers)
        if not k:
            return
        if self._stop + k > self._block.shape[1]:
            self._grow(k)
        a, b = self._stop, self._stop + k
        self._block[0, a:b].view(np.int64)[:] = numbers
        self._block[1:, a:b] = values
        if a == self._start:
            self.oldest_end = float(values[0, 0])
        self._stop = b

    def _grow(self, k: int) -> None:
        # New cells, never a shift in place: views handed out keep seeing the old ones.
        live = self._stop - self._start
        block = np.empty((_ROWS, live + k + max(_MIN_ROOM, live // 16)))
        block[:, :live] = self._block[:, self._start:self._stop]
        self._set(block)
        self._start, self._stop = 0, live

    def drop(self, n: int) -> None:
        """Forget the `n` oldest steps."""
        self._start += n
        assert self._start <= self._stop
        self.oldest_end = float(self._block[1, self._start]) if self._start < self._stop else math.inf

    def clear(self) -> None:
        """Forget every step, and the cells that held them."""
        self._set(np.empty((_ROWS, 0)))
        self._start = self._stop = 0
        self.oldest_end = math.inf

    def numbers(self) -> np.ndarray:
        """The held step numbers (read-only int64 view)."""
        return self._read[0][self._start:self._stop]

    def ends(self) -> np.ndarray:
        """The held steps' ends (read-only view)."""
        return self._read[1][0, self._start:self._stop]

    def columns(self) -> StepColumns:
        """Read-only views of the steps held."""
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

    def times(self) -> np.ndarray:
        """The held samples' times, oldest first (read-only view)."""
        return self._read[0, self._start:self._stop]


def trailing_run(times: Sequence[np.ndarray], since: float) -> np.ndarray:
    """For each array of times, how many of its last elements are all >= `since` (a NaN stops the run, as
    it fails the comparison): what reading a window back from its newest sample, stopping at the first one
    taken before `since`, keeps. All arrays at once: one concatenation and a segmented max, no Python loop."""
    lengths = np.fromiter(map(len, times), np.int64, len(times))
    if not lengths.any():
        return lengths
    flat = np.concatenate(times)
    stops = np.cumsum(lengths)
    starts = stops - lengths
    # The last position in each array that is not >= since (-1 where every one is), then what follows it.
    before = np.where(flat >= since, -1, np.arange(len(flat)))
    held = lengths > 0
    last = np.full(len(times), -1)
    last[held] = np.maximum.reduceat(before, starts[held])
    return np.where(last >= starts, stops - 1 - last, lengths)
