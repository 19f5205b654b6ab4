"""Medians of many small groups at once (a job's ranks or GPUs), with the exact arithmetic of stats.median.

The detectors take a median of each rank's ~30 steps and of each GPU's ~12 samples, for thousands of ranks
per job. One Python sort per group costs microseconds in interpreter overhead; here every group is a row
of a padded matrix sorted in one numpy call. The result equals stats.median bit for bit: the same order
statistics, and the even case computed as 0.5 * (lo + hi) like stats.median. Callers route NaN elsewhere
(numpy and `sorted` order NaN differently), which is why `has_nan` exists.
"""

from __future__ import annotations

import numpy as np

# A padded matrix this much larger than the data means one group dwarfs the rest: sort by key instead.
_MAX_PAD = 8


class Groups:
    """Contiguous groups of a flat array: group i is elements [starts[i], starts[i] + counts[i])."""

    __slots__ = ("counts", "starts", "row", "col", "n", "width")

    def __init__(self, counts: np.ndarray) -> None:
        self.counts = counts.astype(np.int64, copy=False)
        self.n = len(counts)
        self.starts = np.zeros(self.n, dtype=np.int64)
        if self.n > 1:
            np.cumsum(self.counts[:-1], out=self.starts[1:])
        total = int(self.counts.sum())
        self.row = np.repeat(np.arange(self.n, dtype=np.int64), self.counts)  # each element's group
        self.col = np.arange(total, dtype=np.int64) - self.starts[self.row]  # its index within the group
        self.width = int(self.counts.max()) if self.n else 0

    def count(self, mask: np.ndarray) -> np.ndarray:
        """How many elements of each group `mask` selects."""
        return np.bincount(self.row[mask], minlength=self.n)

    def any(self, mask: np.ndarray) -> np.ndarray:
        """Whether `mask` selects any element of each group."""
        return self.count(mask) > 0

    def first(self, values: np.ndarray) -> np.ndarray:
        """Each group's first element (groups must be non-empty where the result is used)."""
        return values[np.minimum(self.starts, max(len(values) - 1, 0))] if len(values) else np.zeros(self.n)

    def last(self, values: np.ndarray) -> np.ndarray:
        """Each group's last element (groups must be non-empty where the result is used)."""
        return values[np.maximum(self.starts + self.counts - 1, 0)] if len(values) else np.zeros(self.n)

    def median(self, values: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(median of the selected elements of each group, how many were selected); median is undefined
        (garbage) where the count is 0. Values must not be NaN."""
        k = self.count(mask)
        if self.n == 0 or self.width == 0:
            return np.zeros(self.n), k
        if self.n * self.width <= _MAX_PAD * len(values) + 1024:
            # Unselected cells sort last as +inf; a selected +inf ties with them, which changes nothing.
            m = np.full((self.n, self.width), np.inf)
            m[self.row[mask], self.col[mask]] = values[mask]
            m.sort(axis=1, kind="stable")  # stable: ±0.0 keep their input order, as in `sorted`
            idx = k // 2
            hi = m[np.arange(self.n), np.minimum(idx, self.width - 1)]
            lo = m[np.arange(self.n), np.maximum(idx - 1, 0)]
        else:
            order = np.lexsort((values, ~mask, self.row))  # per group: selected first, ascending, stable
            s = values[order]
            idx = self.starts + k // 2
            top = max(len(s) - 1, 0)
            hi = s[np.minimum(idx, top)]
            lo = s[np.clip(idx - 1, 0, top)]
        return np.where(k % 2 == 1, hi, 0.5 * (lo + hi)), k


def has_nan(*arrays: np.ndarray) -> bool:
    """Whether any array holds a NaN (the inputs the vectorised path leaves to the reference code)."""
    return any(bool(np.isnan(a).any()) for a in arrays if a.size)
