"""ragged.gather and the step matrices read from columns: the same cells as their plain definitions, on
generated sequences (the fast index arithmetic must not move a step into another rank's column or row)."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gpumond.rules.columns import step_columns
from gpumond.rules.detectors.ragged import gather, held
from gpumond.rules.detectors.step_matrix import _FromColumns, _FromObjects
from gpumond.rules.types import StepRecord


def cell_by_cell(flat: np.ndarray, stops: np.ndarray, counts: np.ndarray, width: int, pad: float) -> np.ndarray:
    """The definition: cell (i, j) holds sequence j's element width − 1 − i from its newest, else `pad`."""
    lead = flat.shape[:-1]
    out = np.full((*lead, width, len(counts)), pad, dtype=np.result_type(flat, pad))
    for j, (stop, count) in enumerate(zip(stops.tolist(), counts.tolist(), strict=True)):
        for back in range(min(count, width)):
            out[..., width - 1 - back, j] = flat[..., stop - 1 - back]
    return out


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 9), max_size=12), st.integers(0, 12), st.sampled_from([(), (1,), (3,)]),
       st.sampled_from(["nan", "int"]), st.booleans())
def test_gather_matches_the_cell_by_cell_definition(counts, width, lead, kind, gaps):
    counts = np.array(counts, dtype=np.int64)
    # Sequences stored back to back, or (gaps) with unread elements before each: stops are not the counts' sums.
    before = np.arange(len(counts), dtype=np.int64) + 1 if gaps else np.zeros(len(counts), dtype=np.int64)
    stops = np.cumsum(counts + before)
    total = int(stops[-1]) if len(stops) else 0
    if kind == "int":
        flat, pad = np.arange(np.prod(lead, dtype=int) * total, dtype=np.int64).reshape(*lead, total), -1
    else:
        flat, pad = np.random.default_rng(total).random((*lead, total)), math.nan
    got = gather(flat, stops, counts, width, pad)
    want = cell_by_cell(flat, stops, counts, width, pad)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert np.array_equal(got, want, equal_nan=True)


step = st.builds(StepRecord, st.integers(0, 50), st.floats(0, 100), st.floats(0.001, 5), st.floats(0, 1), st.none(),
                 st.one_of(st.none(), st.floats(0, 1)))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(step, max_size=10), min_size=1, max_size=6), st.integers(0, 12))
def test_step_matrices_from_columns_match_those_from_objects(windows, depth):
    objects = _FromObjects([_Window(tuple(w)) for w in windows])
    columns = _FromColumns([step_columns(tuple(w)) for w in windows])
    assert np.array_equal(objects.counts, columns.counts) and np.array_equal(objects.stops, columns.stops)
    assert np.array_equal(objects.flat_ends, columns.flat_ends, equal_nan=True)
    width = int(objects.counts.max())
    mask = held(objects.counts, width)
    assert np.array_equal(objects.ends(width)[mask], columns.ends(width)[mask])
    k = np.minimum(objects.counts, depth)
    depth = int(k.max())  # as the callers ask: as deep as the deepest tail read
    inside = held(k, depth)
    for a, b in zip(objects.tail(k, depth), columns.tail(k, depth), strict=True):
        assert np.array_equal(a[inside], b[inside], equal_nan=True)


class _Window:
    """What _FromObjects reads of a RankWindow: its steps."""

    def __init__(self, steps: tuple[StepRecord, ...]) -> None:
        self.steps = steps
