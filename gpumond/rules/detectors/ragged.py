"""Many short sequences (a job's rank windows or GPU windows) read into one padded matrix, and medians of
every column at once with the exact arithmetic of stats.median.

Layout: a (width, n) matrix, one column per sequence, oldest element at the top, aligned so that every
column's newest element sits in the last row; cells above a shorter sequence are padding (`held` False).

Why read newest-first across sequences: ingest (and the benchmark's simulator) allocates step records
and samples in time order, so taking every sequence's newest element, then every second newest, … walks
memory nearly in allocation order. Reading one sequence after another jumps between allocations; at
32,768 GPUs that costs about twice as much in cache and TLB misses, which is most of an evaluation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from itertools import chain, zip_longest
from typing import TypeVar

import numpy as np

T = TypeVar("T")
# Padding up to this many times the data: beyond that one sequence dwarfs the rest and callers use the
# reference code rather than a mostly empty matrix.
MAX_PAD = 8
# column_median selects up to this many distinct order statistics (np.partition) rather than sorting.
_FEW_ORDERS = 8


def newest_first(seqs: Sequence[Sequence[T]], pad: T) -> Iterator[T]:
    """Every sequence's last element, then every second-to-last, … (`pad` where a sequence ran out)."""
    return chain.from_iterable(zip_longest(*map(reversed, seqs), fillvalue=pad))


def to_matrix(flat: np.ndarray, width: int, n: int) -> np.ndarray:
    """The (width, n) matrix, oldest on top, of values read in `newest_first` order (any trailing axes kept)."""
    return flat.reshape(width, n, *flat.shape[1:])[::-1]


def held(counts: np.ndarray, width: int) -> np.ndarray:
    """Which cells of a (width, n) matrix hold an element, for sequences of these lengths."""
    return np.arange(width)[:, None] >= (width - counts)[None, :]


def too_ragged(counts: np.ndarray, width: int) -> bool:
    """Whether the padded matrix would be mostly padding."""
    return width * len(counts) > MAX_PAD * int(counts.sum()) + 4096


def column_median(values: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(median of the selected cells of each column, how many were selected); the median is meaningless
    where the count is 0. The selected values must not be NaN (numpy and `sorted` order NaN differently)."""
    k = mask.sum(axis=0)
    width, n = values.shape
    if width == 0 or n == 0:
        return np.zeros(n), k
    m = _rows(values, mask)
    idx = k // 2
    at_hi, at_lo = np.minimum(idx, width - 1), np.maximum(idx - 1, 0)
    _order(m, np.union1d(at_hi, at_lo))
    return _middle(m, k, at_hi, at_lo), k


def _order(m: np.ndarray, wanted: np.ndarray) -> int:
    """Put each row's order statistics at the positions `wanted` where a stable sort puts them; how many rows
    were selected rather than sorted.

    Only the middle one or two of each column are read, and columns hold nearly the same count (a job's ranks
    step together): selecting those few order statistics (np.partition) is a linear pass per row, where a sort is
    ~log2(width) of them. The values there are the sorted ones; which of equal values lands there differs, which
    only a -0.0 beside a 0.0 could tell apart: a row holding a -0.0 is sorted (stable, as `sorted` orders it)."""
    if len(wanted) > _FEW_ORDERS:
        _sort_rows(m)
        return 0
    return _unsigned_rows(m, lambda rows: rows.partition(wanted, axis=1))


def _rows(values: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Each column's cells as a row of a fresh C-contiguous (n, width) array, unselected ones +inf (they sort last;
    a selected +inf ties with them, which changes nothing). Transposed before `where`, not after: a matrix read
    from the store is rank-major in memory (`gather` writes it so), and its rows then come out in memory order,
    where a transposed copy of a (width, n) result jumps across it; for a matrix laid out the other way, the
    same work as before."""
    return np.ascontiguousarray(np.where(mask.T, values.T, np.inf))


def _sort_rows(m: np.ndarray) -> None:
    """Sort each row in place as a stable sort does. Equal values are identical but for -0.0 beside 0.0, so only
    rows holding a -0.0 need the stable sort (as `sorted` orders them); the others take numpy's default, a SIMD
    sort where the CPU has one, several times faster than the stable one on rows of tens of steps."""
    _unsigned_rows(m, lambda rows: rows.sort(axis=1))


def _unsigned_rows(m: np.ndarray, order: Callable[[np.ndarray], None]) -> int:
    """`order` (in place) on the rows of `m` without a -0.0, a stable sort on those with one; how many rows
    `order` took."""
    signed = (np.signbit(m) & (m == 0.0)).any(axis=1)
    if not signed.any():
        order(m)
        return len(m)
    sorted_rows, other_rows = np.flatnonzero(signed), np.flatnonzero(~signed)
    part = m[sorted_rows]
    part.sort(axis=1, kind="stable")
    m[sorted_rows] = part
    part = m[other_rows]
    order(part)
    m[other_rows] = part
    return len(other_rows)


def _middle(m: np.ndarray, k: np.ndarray, at_hi: np.ndarray, at_lo: np.ndarray) -> np.ndarray:
    """stats.median's arithmetic on each row of `m` (its order statistics at at_hi / at_lo in place)."""
    rows = np.arange(len(m))
    hi, lo = m[rows, at_hi], m[rows, at_lo]
    return np.where(k % 2 == 1, hi, 0.5 * (lo + hi))


def first_row(mask: np.ndarray) -> np.ndarray:
    """Each column's first selected row (0 where none is)."""
    return np.argmax(mask, axis=0)


def last_row(mask: np.ndarray) -> np.ndarray:
    """Each column's last selected row (width − 1 where none is)."""
    return mask.shape[0] - 1 - np.argmax(mask[::-1], axis=0)


def has_nan(*arrays: np.ndarray) -> bool:
    """Whether any array holds a NaN (inputs the vectorised path leaves to the reference code)."""
    return any(bool(np.isnan(a).any()) for a in arrays if a.size)


def trim_counts(k: np.ndarray, trim: float) -> np.ndarray:
    """features.trim_count for each count in `k` (k ≥ 0): floor(trim · k), at least one where trim > 0 and k ≥ 3."""
    g = (trim * k).astype(np.int64)  # floor, as int() in the reference
    return np.where((k >= 3) & (g < 1), 1, g) if trim > 0 else g


def column_trimmed_mean_and_median(values: np.ndarray, mask: np.ndarray,
                                   trim: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mean of each column's selected cells without the trim_counts(k, trim) smallest and largest, column_median of
    them, k): the same arithmetic as features.trimmed_mean and stats.median; the kept values summed smallest
    first (a cumulative sum is sequential, numpy's plain sum is pairwise and would differ in the last bit). From
    one sort: the trimmed mean needs every selected cell in order, and the median is then two reads of it.
    Meaningless where k is 0."""
    k = mask.sum(axis=0)
    width, n = values.shape
    if width == 0 or n == 0:
        return np.zeros(n), np.zeros(n), k
    m = _rows(values, mask)
    _sort_rows(m)
    g = trim_counts(k, trim)
    pos = np.arange(width)[None, :]
    kept = (pos >= g[:, None]) & (pos < (k - g)[:, None])
    # + 0.0: the reference's sum starts from 0.0, so it is never -0.0 (a cumulative sum of -0.0 alone is).
    total = np.cumsum(np.where(kept, m, 0.0), axis=1)[:, -1] + 0.0
    idx = k // 2
    median = _middle(m, k, np.minimum(idx, width - 1), np.maximum(idx - 1, 0))
    with np.errstate(all="ignore"):
        return total / np.maximum(k - 2 * g, 1), median, k


def gather(flat: np.ndarray, stops: np.ndarray, counts: np.ndarray, width: int, pad: float) -> np.ndarray:
    """The (…, width, n) matrix, layout as `to_matrix`, of sequences stored one after another along the last
    axis of `flat` (sequence j ends just before stops[j] and holds counts[j] elements; only its newest
    `width` are taken). Cells above a shorter sequence hold `pad`. Pure index arithmetic: no Python loop.

    Why this way: the taken elements are read in memory order (each sequence's newest run is contiguous) and
    written one sequence after another into an (…, n, width) block returned transposed, so both sides stream.
    Indexing the matrix cell by cell instead reads one element of every sequence per row, jumping across the
    whole job's steps: at 32,768 ranks × 150 steps that was 4× slower and most of reading a window."""
    n = len(counts)
    lead = flat.shape[:-1]
    out = np.full((*lead, n * width), pad, dtype=np.result_type(flat, pad))
    if n == 0 or width == 0:
        return np.swapaxes(out.reshape(*lead, n, width), -1, -2)
    taken = np.minimum(counts, width)
    through = np.cumsum(taken)  # taken elements of sequences 0..j
    i = np.arange(int(through[-1]))
    # The k-th taken element of sequence j: flat[stops[j] − taken[j] + k] → block cell (j, width − taken[j] + k).
    dst = i + np.repeat(np.arange(1, n + 1) * width - through, taken)
    if len(i) == flat.shape[-1] and np.array_equal(through, stops):
        out[..., dst] = flat  # every element is taken, in order (a window read whole)
    else:
        out[..., dst] = flat[..., i + np.repeat(stops - through, taken)]
    return np.swapaxes(out.reshape(*lead, n, width), -1, -2)
