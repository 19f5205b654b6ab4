"""Per-step peer medians kept from one judgement of a job to the next, found again only for the steps that changed.

Every judgement takes, for each step of a job's recent window, medians over the step's ranks: when the step ended
and began (sequential.step_shares) and each peer group's compute and data-wait shares (sequential.judge). Between
two judgements most of those rows hold the same cells: only the newest steps gain cells as ranks push them, and the
oldest lose cells as they leave the window. A row equal bit for bit to the row of the same step number, over the
same ranks in the same order, at the job's last judgement has the median found then: it is taken, not found again.
So the partitions follow the steps that changed, not the window; what still reads every cell of the window is one
pass of equality, at a fraction of a partition's cost. The result is the reference's (`row_nanmedian` of every
row) exactly: a median of a row depends on that row alone, and a row is reused only when every bit is the same.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass

import numpy as np

from gpumond.rules.detectors.stats import row_nanmedian


@dataclass(frozen=True, slots=True)
class RowMedians:
    """One matrix's rows at a judgement: their step numbers (increasing), their cells' bits, and their medians."""

    numbers: np.ndarray  # (rows,)
    bits: np.ndarray  # (rows, n) int64: the float64 cells' bit patterns
    medians: np.ndarray  # (rows,)


class PeerRows:
    """The per-step peer medians of one judgement of a job, taken from its last judgement's (`last`) where a row
    is unchanged; `kept()` is what the next judgement takes. With `reuse` False every median is found afresh and
    nothing is kept (the reference path)."""

    __slots__ = ("_last", "_kept", "_reuse", "rows", "reused")

    def __init__(self, last: Mapping[Hashable, RowMedians] | None = None, reuse: bool = True) -> None:
        self._last = last or {}
        self._kept: dict[Hashable, RowMedians] = {}
        self._reuse = reuse
        self.rows = 0  # rows asked for, in this judgement…
        self.reused = 0  # …and of those, taken from the last judgement (or from this one: the same matrix again)

    def medians(self, key: Hashable, x: np.ndarray, numbers: np.ndarray) -> np.ndarray:
        """row_nanmedian(x) for the (rows, n) matrix `x` whose rows are the steps `numbers` (increasing); `key`
        names the matrix (what its cells are, and which ranks its columns are, in order)."""
        self.rows += len(x)
        if not self._reuse:
            return row_nanmedian(x)
        bits = np.ascontiguousarray(x, dtype=np.float64).view(np.int64)
        out = np.empty(len(x))
        todo = np.ones(len(x), dtype=bool)
        prev = self._kept.get(key, self._last.get(key))
        if prev is not None and len(prev.numbers) and len(x) and prev.bits.shape[1] == bits.shape[1]:
            at = np.minimum(np.searchsorted(prev.numbers, numbers), len(prev.numbers) - 1)
            found = np.flatnonzero(prev.numbers[at] == numbers)
            same = found[(prev.bits[at[found]] == bits[found]).all(axis=1)]
            out[same] = prev.medians[at[same]]
            todo[same] = False
            self.reused += len(same)
        if todo.all():
            out = row_nanmedian(x)
        elif todo.any():
            out[todo] = row_nanmedian(x[todo])
        # Copies: the caller owns x and the medians returned, and may write into them after.
        self._kept[key] = RowMedians(np.array(numbers, dtype=np.int64), bits.copy(), out.copy())
        return out

    def kept(self) -> Mapping[Hashable, RowMedians]:
        """The medians of this judgement's matrices, for the next judgement of the job."""
        return dict(self._kept)
