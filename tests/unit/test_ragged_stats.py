"""ragged.column_median and column_trimmed_mean_and_median against their plain definitions (stats.median and
features.trimmed_mean over each column's selected cells), on generated matrices: columns of nearly equal counts
(the order statistics are selected, not sorted) and of very different ones (sorted), ties, ±0.0 and ±inf."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gpumond.rules.detectors.features import trimmed_mean
from gpumond.rules.detectors.ragged import _FEW_ORDERS, column_median, column_trimmed_mean_and_median
from gpumond.rules.detectors.stats import median

# Cell values: continuous, or few distinct ones (ties), with ±0.0 and ±inf among them.
_SPECIAL = np.array([0.0, -0.0, 1.0, np.inf, -np.inf])


@st.composite
def matrices(draw):
    """Rows wider than numpy's partition sorts outright (~16): there only the asked positions are in order."""
    width = draw(st.sampled_from([0, 1, 2, 5, 17, 40, 120, 161]))
    n = draw(st.integers(0, 9))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = rng.normal(scale=1e3, size=(width, n))
    if draw(st.booleans()):
        x = np.round(x / 500.0)  # ties
    special = rng.random((width, n)) < draw(st.sampled_from([0.0, 0.05, 0.3]))
    x[special] = rng.choice(_SPECIAL, size=int(special.sum()))
    if draw(st.booleans()):  # nearly equal counts a column: a few order statistics in all
        base = draw(st.integers(0, width))
        counts = np.clip(base - rng.integers(0, 3, n), 0, width)
        mask = np.arange(width)[:, None] >= (width - counts)[None, :]
    else:  # any cells selected
        mask = rng.random((width, n)) < draw(st.sampled_from([0.2, 0.7, 1.0]))
    return x, mask


def _equal(got: float, want: float) -> bool:
    # repr: the sign of a zero counts (0.0 == -0.0 would hide it); inf − inf in a mean of two is NaN both ways.
    return repr(float(got)) == repr(want) or (np.isnan(got) and np.isnan(want))


@settings(max_examples=300, deadline=None)
@given(matrices())
def test_column_median_is_stats_median_of_each_columns_selected_cells(xm):
    x, mask = xm
    with np.errstate(invalid="ignore"):
        got, k = column_median(x, mask)
    for j in range(x.shape[1]):
        cells = x[:, j][mask[:, j]].tolist()
        assert k[j] == len(cells)
        if cells:
            assert _equal(got[j], median(cells)), (j, cells)


@settings(max_examples=200, deadline=None)
@given(matrices(), st.sampled_from([0.0, 0.1, 0.25]))
def test_trimmed_mean_and_median_from_one_sort_are_their_definitions(xm, trim):
    x, mask = xm
    with np.errstate(invalid="ignore"):  # inf − inf: NaN, as the reference's sum gives
        mean, med, k = column_trimmed_mean_and_median(x, mask, trim)
    for j in range(x.shape[1]):
        cells = x[:, j][mask[:, j]].tolist()
        assert k[j] == len(cells)
        if cells:
            assert _equal(med[j], median(cells)), (j, cells)
            if len(cells) > 2 * int(trim * len(cells)):
                assert _equal(mean[j], trimmed_mean(cells, trim)), (j, cells)


def test_many_different_counts_are_sorted_and_still_exact():
    """More distinct order statistics than column_median selects: the sorted path, same definition."""
    rng = np.random.default_rng(3)
    width, n = 64, 2 * _FEW_ORDERS + 5
    x = rng.normal(size=(width, n))
    mask = np.arange(width)[:, None] >= (width - np.arange(1, n + 1) * 3)[None, :]
    got, _ = column_median(x, mask)
    assert got.tolist() == [median(x[:, j][mask[:, j]].tolist()) for j in range(n)]
