"""A job's rank windows read for one evaluation, from either source: the windows' StepColumns (arrays the store
keeps on ingest) or, when some window has none, their StepRecord objects (one attribute lookup per field per step).
What the whole window says per rank (its first and latest step end, whether an end is NaN, how many steps are
recent) is read from one flat concatenation of every held end; the fields of the recent steps are read into
padded matrices (layout of ragged.to_matrix). Both sources give the same values wherever a cell holds a recent
step; the detectors mask the rest. `read_steps` reads a job once per evaluation for every detector that needs
its steps."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from operator import attrgetter
from typing import Protocol

import numpy as np

from gpumond.rules.detectors.ragged import gather, held, newest_first, to_matrix
from gpumond.rules.types import RankWindow, StepColumns, StepRecord

_END = attrgetter("end")
_READ = attrgetter("end", "duration_s", "data_wait_s", "step")
_STEPS = attrgetter("steps")
_COLS = attrgetter("columns")
_COMM = attrgetter("comm_wait_s")
_PAD = StepRecord(-1, math.nan, math.nan, math.nan)  # fills the matrix where a rank has fewer steps; masked


class StepMatrices(Protocol):
    """counts: steps held per rank. flat_ends: every held step's end, rank after rank, each rank's oldest first
    (rank j's are flat_ends[stops[j] − counts[j]:stops[j]]). ends(width): the (width, n) step ends. tail(k,
    depth): (ends, durations, data waits, step numbers as floats, comm waits with NaN for none), each
    (depth, n), holding at least each rank's newest k[r] steps at the bottom."""

    counts: np.ndarray
    stops: np.ndarray
    flat_ends: np.ndarray

    def ends(self, width: int) -> np.ndarray: ...

    def tail(self, k: np.ndarray, depth: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        ...


def step_matrices(windows: Sequence[RankWindow]) -> StepMatrices:
    """From the columns when every window carries them, else from the step objects."""
    cols = list(map(_COLS, windows))
    if cols and None not in cols:
        return _FromColumns(cols)  # type: ignore[arg-type]
    return _FromObjects(windows)


@dataclass(frozen=True, slots=True)
class RecentSteps:
    """A job's rank windows read once per evaluation, for every detector that reads its steps (rank_batch's
    features, sequential.step_shares): per rank, what the whole window says (its first and latest step end),
    and the fields of the rows (layout of ragged.to_matrix) that hold the steps that ended since `since` — as
    usual each rank's newest steps only (the bottom rows: a fifth of a 300 s window), else the whole window."""

    counts: np.ndarray  # (n,) steps held per rank
    first_end: np.ndarray  # (n,) the end of each rank's oldest held step (as stored), NaN where it holds none
    last_end: np.ndarray  # (n,) the latest end of each rank's held steps, -inf where it holds none
    ends_nan: bool  # whether a held step's end is NaN (first_end / last_end then mean what numpy makes of it)
    recent: np.ndarray  # (depth, n): the cells read that hold a step that ended since `since`
    k: np.ndarray  # (n,) how many each rank has
    # (depth, n) each, as StepMatrices.tail: meaningful only where `recent` (outside it a cell is padding or an
    # older step, whichever the source reads more cheaply; every detector masks by `recent`).
    ends: np.ndarray
    durations: np.ndarray
    waits: np.ndarray
    numbers: np.ndarray
    comm: np.ndarray


def read_steps(windows: Sequence[RankWindow], since: float) -> RecentSteps | None:
    """The job's steps read for this evaluation (None when no rank holds any).

    Why the whole window is read flat: every held step's end is looked at (the latest, the oldest, whether
    the recent ones are each rank's newest), but nothing else of the older four fifths of a window is; a
    (width, n) matrix of all of them cost a padded copy of every end held and several passes over it, which
    grew with the window (at 32,768 ranks × 600 steps, 160 MB a pass)."""
    m = step_matrices(windows)
    counts, stops, flat = m.counts, m.stops, m.flat_ends
    n = len(counts)
    if n == 0 or not counts.any():
        return None
    nonempty = counts > 0
    firsts = stops[nonempty] - counts[nonempty]  # strictly increasing: segments over the non-empty ranks
    first_end = np.full(n, math.nan)
    first_end[nonempty] = flat[firsts]
    last_end = np.full(n, -math.inf)
    last_end[nonempty] = np.maximum.reduceat(flat, firsts)
    is_recent = flat >= since  # NaN: not recent
    k = np.zeros(n, np.int64)
    k[nonempty] = np.add.reduceat(is_recent, firsts, dtype=np.int64)
    if _newest_of_each(is_recent, stops[nonempty]):
        depth = int(k.max())
        recent, read = held(k, depth), k
    else:  # some rank has a recent step before an older one: the whole window, cell by cell
        depth = int(counts.max())
        recent = held(counts, depth) & (m.ends(depth) >= since)
        k, read = recent.sum(axis=0), counts
    ends, durations, waits, numbers, comm = m.tail(read, depth)
    # np.maximum propagates NaN: a rank's latest end is NaN when any of its ends is (no second pass over them).
    out = RecentSteps(counts, first_end, last_end, bool(np.isnan(last_end).any()), recent, k, ends, durations,
                      waits, numbers, comm)
    for a in (counts, first_end, last_end, recent, k, ends, durations, waits, numbers, comm):
        a.flags.writeable = False  # read by several detectors: none may write into what the others read
    return out


def _newest_of_each(is_recent: np.ndarray, stops: np.ndarray) -> bool:
    """Whether in each segment (ending just before `stops`) the selected elements are its last ones: no selected
    element is followed by an unselected one of the same segment. Every segment must hold an element (`stops`
    strictly increasing from above 0: the non-empty ranks'), so that stops − 1 is each one's last."""
    falls = is_recent[:-1] & ~is_recent[1:]
    falls[stops[:-1] - 1] = False  # the last of a segment followed by the next one's first
    return not bool(falls.any())


class _FromColumns:
    """The ends of every held step in one concatenation (read_steps reads them all, flat), the other fields only
    for the newest steps `tail` is asked for. Why not all four fields at once: the copy is per step held, and at
    32,768 ranks holding ~430 steps each (a full 300 s window at 1.4 steps/s) concatenating every field and the
    step numbers copied ~560 MB per evaluation (0.9 s) to read the fifth of them that is recent; slicing each
    window's newest steps first costs one view per rank (~1 µs), which a window of a few dozen steps does not
    repay but one of hundreds does."""

    def __init__(self, cols: list[StepColumns]) -> None:
        self.counts = np.fromiter(map(len, cols), np.int64, len(cols))
        self.stops = np.cumsum(self.counts)
        self._cols = cols
        self.flat_ends = np.concatenate([c.values[0] for c in cols]) if cols else np.zeros(0)

    def ends(self, width: int) -> np.ndarray:
        return gather(self.flat_ends, self.stops, self.counts, width, math.nan)

    def tail(self, k: np.ndarray, depth: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        # each rank's newest `depth` (as gather takes them), sliced before they are concatenated
        taken = np.minimum(self.counts, depth)
        cols = self._cols
        if not cols:
            values, steps = np.zeros((4, 0)), np.zeros(0, np.int64)
        elif bool((taken == self.counts).all()):  # the whole window: no slice saves anything
            values = np.concatenate([c.values for c in cols], axis=1)
            steps = np.concatenate([c.step for c in cols])
        else:
            starts = (self.counts - taken).tolist()
            values = np.concatenate([c.values[:, i:] for c, i in zip(cols, starts)], axis=1)
            steps = np.concatenate([c.step[i:] for c, i in zip(cols, starts)])
        stops = np.cumsum(taken)
        x = gather(values, stops, taken, depth, math.nan)
        numbers = gather(steps, stops, taken, depth, -1)
        # As floats, like the object path reads them: rank_batch refuses numbers past 2**53.
        return x[0], x[1], x[2], numbers.astype(float), x[3]


class _FromObjects:
    def __init__(self, windows: Sequence[RankWindow]) -> None:
        self._steps = list(map(_STEPS, windows))
        self.counts = np.fromiter(map(len, self._steps), np.int64, len(self._steps))
        self.stops = np.cumsum(self.counts)
        self.flat_ends = np.fromiter(map(_END, chain.from_iterable(self._steps)), float, int(self.counts.sum()))

    def ends(self, width: int) -> np.ndarray:
        n = len(self._steps)
        return to_matrix(np.fromiter(map(_END, newest_first(self._steps, _PAD)), float, width * n), width, n)

    def tail(self, k: np.ndarray, depth: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        n = len(self._steps)
        # Only the newest k[r] of each rank are read (a fifth of a 300 s window, as usual).
        tails = [s[len(s) - j:] for s, j in zip(self._steps, k.tolist(), strict=True)]
        fields = chain.from_iterable(map(_READ, newest_first(tails, _PAD)))
        x = to_matrix(np.fromiter(fields, float, 4 * depth * n).reshape(-1, 4), depth, n)
        # comm_wait_s is optional: a list conversion turns None into NaN (np.fromiter cannot).
        comm = to_matrix(np.array(list(map(_COMM, newest_first(tails, _PAD))), dtype=float), depth, n)
        return x[..., 0], x[..., 1], x[..., 2], x[..., 3], comm
