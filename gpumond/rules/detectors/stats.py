"""Robust statistics for peer comparison: median / MAD z-scores with floors, and group-size-aware thresholds."""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

import numpy as np

# 0.6745 = Φ⁻¹(0.75): makes MAD a consistent estimator of σ under Gaussian noise (Iglewicz & Hoaglin).
MAD_TO_SIGMA = 1.4826


def median(xs: Sequence[float]) -> float:
    """Median of a non-empty sequence."""
    s = sorted(xs)
    n = len(s)
    mid = n // 2
    return s[mid] if n % 2 else 0.5 * (s[mid - 1] + s[mid])


def median_without(ordered: Sequence[float], x: float) -> float | None:
    """Median of the sorted `ordered` less one occurrence of `x` (which it holds), in O(log n); None when nothing
    is left. A rank's peers' median without sorting them again for each rank."""
    n = len(ordered) - 1
    if n < 1:
        return None
    i = bisect.bisect_left(ordered, x)

    def kth(k: int) -> float:  # the k-th smallest of what is left
        return ordered[k if k < i else k + 1]

    mid = n // 2
    return kth(mid) if n % 2 else 0.5 * (kth(mid - 1) + kth(mid))


def mad(xs: Sequence[float], center: float | None = None) -> float:
    """Median absolute deviation (unscaled)."""
    c = median(xs) if center is None else center
    return median([abs(x - c) for x in xs])


def robust_z(xs: Sequence[float], floor: float) -> tuple[list[float], float, float]:
    """Modified z-scores (x − median) / (1.4826 · MAD), with MAD floored so quantised or quiet signals
    (a clock that only takes 15 MHz steps, a utilization pinned at 100 %) cannot produce huge z from tiny
    differences. Returns (z-scores, median, the scale used)."""
    m = median(xs)
    scale = max(MAD_TO_SIGMA * mad(xs, m), floor)
    return [(x - m) / scale for x in xs], m, scale


def threshold_for(n: int, base: float = 3.5, tail: float = 1e-4) -> float:
    """A z threshold that rises with group size so the chance of a false flag per group stays near `tail`.

    Under Gaussian noise the largest of n z-scores grows like sqrt(2 ln n); a fixed 3.5 flags about
    n × 2.3e-4 ranks per evaluation (≈ 2 at 8,192). We use the Gaussian quantile for a per-rank tail of
    tail / n (Bonferroni), never below `base`.
    """
    if n <= 1:
        return math.inf
    p = tail / n
    # Inverse survival function of the standard normal via the Acklam/erfc-free approximation:
    # for small p, z ≈ sqrt(-2 ln p − ln(-2 ln p) − ln 2π) is accurate to ~1 % in the range we use.
    t = -2.0 * math.log(p)
    z = math.sqrt(max(t - math.log(t) - math.log(2 * math.pi), 0.0))
    return max(base, z)


def row_nanmedian(a: np.ndarray) -> np.ndarray:
    """np.nanmedian(a, axis=1), value for value: np.median on the rows without a NaN (one partition for all of
    them, where numpy's nanmedian of wide rows loops over them in Python), nanmedian on the others only."""
    full = ~np.isnan(a).any(axis=1)
    if full.all():
        return np.median(a, axis=1)
    out = np.nanmedian(a, axis=1) if not full.any() else np.empty(a.shape[0])
    if full.any():
        out[full] = np.median(a[full], axis=1)
        out[~full] = np.nanmedian(a[~full], axis=1)
    return out
