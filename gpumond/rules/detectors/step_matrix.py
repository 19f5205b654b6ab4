"""A job's rank windows read into padded matrices (layout of ragged.to_matrix), from either source:
the windows' StepColumns (arrays the store keeps on ingest: one concatenation per field) or, when some
window has none, their StepRecord objects (one attribute lookup per field per step). Both give the same
matrices wherever a cell holds a step; rank_batch masks the padding."""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import chain
from operator import attrgetter
from typing import Protocol

import numpy as np

from gpumond.rules.detectors.ragged import gather, newest_first, to_matrix
from gpumond.rules.types import RankWindow, StepColumns, StepRecord

_END = attrgetter("end")
_READ = attrgetter("duration_s", "data_wait_s", "step")
_STEPS = attrgetter("steps")
_COLS = attrgetter("columns")
_COMM = attrgetter("comm_wait_s")
_PAD = StepRecord(-1, math.nan, math.nan, math.nan)  # fills the matrix where a rank has fewer steps; masked


class StepMatrices(Protocol):
    """counts: steps held per rank. ends(width): the (width, n) step ends. tail(k, depth): (durations,
    data waits, step numbers as floats, comm waits with NaN for none), each (depth, n), holding at least
    each rank's newest k[r] steps at the bottom."""

    counts: np.ndarray

    def ends(self, width: int) -> np.ndarray: ...

    def tail(self, k: np.ndarray, depth: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]: ...


def step_matrices(windows: Sequence[RankWindow]) -> StepMatrices:
    """From the columns when every window carries them, else from the step objects."""
    cols = list(map(_COLS, windows))
    if cols and None not in cols:
        return _FromColumns(cols)  # type: ignore[arg-type]
    return _FromObjects(windows)


class _FromColumns:
    """Reads only what is asked: the ends of the whole window (one field), the other fields of each rank's
    newest `depth` steps only (the recent steps are a fifth of a 300 s window)."""

    def __init__(self, cols: list[StepColumns]) -> None:
        self.counts = np.fromiter(map(len, cols), np.int64, len(cols))
        self._stops = np.cumsum(self.counts)
        self._cols = cols

    def ends(self, width: int) -> np.ndarray:
        flat = np.concatenate([c.values[0] for c in self._cols])
        return gather(flat, self._stops, self.counts, width, math.nan)

    def tail(self, k: np.ndarray, depth: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        taken = np.minimum(self.counts, depth)
        cuts = (self.counts - taken).tolist()
        stops = np.cumsum(taken)
        x = gather(np.concatenate([c.values[1:, i:] for c, i in zip(self._cols, cuts, strict=True)], axis=1),
                   stops, taken, depth, math.nan)
        numbers = gather(np.concatenate([c.step[i:] for c, i in zip(self._cols, cuts, strict=True)]), stops, taken,
                         depth, -1)
        # As floats, like the object path reads them: rank_batch refuses numbers past 2**53.
        return x[0], x[1], numbers.astype(float), x[2]


class _FromObjects:
    def __init__(self, windows: Sequence[RankWindow]) -> None:
        self._steps = list(map(_STEPS, windows))
        self.counts = np.fromiter(map(len, self._steps), np.int64, len(self._steps))

    def ends(self, width: int) -> np.ndarray:
        n = len(self._steps)
        return to_matrix(np.fromiter(map(_END, newest_first(self._steps, _PAD)), float, width * n), width, n)

    def tail(self, k: np.ndarray, depth: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        n = len(self._steps)
        # Only the newest k[r] of each rank are read (a fifth of a 300 s window, as usual).
        tails = [s[len(s) - j:] for s, j in zip(self._steps, k.tolist(), strict=True)]
        fields = chain.from_iterable(map(_READ, newest_first(tails, _PAD)))
        x = to_matrix(np.fromiter(fields, float, 3 * depth * n).reshape(-1, 3), depth, n)
        # comm_wait_s is optional: a list conversion turns None into NaN (np.fromiter cannot).
        comm = to_matrix(np.array(list(map(_COMM, newest_first(tails, _PAD))), dtype=float), depth, n)
        return x[..., 0], x[..., 1], x[..., 2], comm
