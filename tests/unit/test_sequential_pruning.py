"""sequential.judge takes its suffix sums only over the columns whose gain can pass, and its row medians without
numpy's per-row loop (less CPU at fleet scale): on random step matrices (NaN rows, ranks missing their oldest or
newest steps, planted slow or starved ranks, groups narrower and wider than numpy's 600-column nanmedian switch) it
finds exactly what the unpruned judge (sequential_reference.py) finds, evidence value for value."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from gpumond.rules.detectors.config import DetectorConfig
from gpumond.rules.detectors.sequential import (compute_test, corroborated_compute_test, judge, row_nanmedian,
                                                wait_test)
from tests.unit.sequential_reference import judge as reference

CFG = DetectorConfig()
TESTS = {"compute": compute_test, "corroborated": corroborated_compute_test, "wait": wait_test}


def _case(rng: np.random.Generator, kind: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[int]]:
    rows = int(rng.integers(1, 40))
    n = int(rng.integers(600, 700)) if rng.random() < 0.25 else int(rng.integers(1, 40))
    step_s = float(rng.uniform(0.3, 6.0))
    if kind == "wait":
        level = float(rng.choice([0.02, 0.3]))  # a healthy job, or one whose ranks all wait (busy_ref)
        x = np.clip(level * np.exp(0.5 * rng.standard_normal((rows, n))), 0.0, 1.0)
    else:
        x = 0.8 * np.exp(float(rng.uniform(0.005, 0.1)) * rng.standard_normal((rows, n)))
    for c in rng.choice(n, size=min(n, int(rng.integers(0, 4))), replace=False):  # slow / starved ranks
        onset = int(rng.integers(0, rows))
        if kind == "wait":
            x[onset:, c] = np.minimum(x[onset:, c] + float(rng.uniform(0.05, 0.6)), 1.0)
        else:
            x[onset:, c] *= float(rng.uniform(1.02, 3.0))
    x[rng.random((rows, n)) < float(rng.choice([0.0, 0.02, 0.3]))] = np.nan  # untimed steps
    for c in np.flatnonzero(rng.random(n) < 0.2):  # ranks that joined late, or have not pushed the newest yet
        x[:int(rng.integers(0, rows + 1)), c] = np.nan
    for c in np.flatnonzero(rng.random(n) < 0.2):
        x[rows - int(rng.integers(0, 3)):, c] = np.nan
    x[rng.random(rows) < 0.05] = np.nan  # steps no rank pushed
    ends = step_s * np.arange(1, rows + 1) + rng.uniform(0.0, 0.2, rows)
    ranks = [int(r) for r in rng.permutation(10 * n)[:n]]
    return x, ends - step_s, ends, ranks


@pytest.mark.parametrize("kind", list(TESTS))
def test_the_pruned_judge_finds_what_the_unpruned_one_finds(kind):
    rng = np.random.default_rng(25)
    found = 0
    for i in range(100):
        x, starts, ends, ranks = _case(rng, kind)
        # A lower bar half the time, so that many ranks pass and the pruned columns are told apart correctly.
        cfg = CFG if i % 2 else replace(CFG, seq_h=1.0, seq_min_steps=2, seq_transient_s=1.0, seq_short_s=1.0)
        test = TESTS[kind](cfg)
        want = reference(x.copy(), starts, ends, ranks, cfg, test)
        assert judge(x.copy(), starts, ends, ranks, cfg, test) == want, i
        only = set(ranks[::3])
        assert judge(x.copy(), starts, ends, ranks, cfg, test, only=only) == \
            {r: ev for r, ev in want.items() if r in only}, i
        found += len(want)
    assert found >= 20  # the comparison covers ranks that pass, not only empty results


def test_row_nanmedian_is_numpys_value_for_value():
    rng = np.random.default_rng(3)
    for n in (1, 2, 7, 64, 599, 600, 1000):
        a = rng.standard_normal((9, n))
        a[2, :] = np.nan  # an all-NaN row
        a[3, ::2] = np.nan
        a[5, 0] = np.nan
        a[6] = np.round(a[6])  # ties, and zeros of both signs
        with np.errstate(all="ignore"), pytest.warns(RuntimeWarning):
            want = np.nanmedian(a, axis=1)
        with np.errstate(all="ignore"), pytest.warns(RuntimeWarning):
            got = row_nanmedian(a)
        np.testing.assert_array_equal(got, want)
        assert row_nanmedian(a[[0, 1, 4]]).tolist() == np.nanmedian(a[[0, 1, 4]], axis=1).tolist()
