"""Persistence.look_s: the findings' windowed checks judged every 5 s count one look per 10 s.

A median over the last minute moves slowly; evaluated every 5 s, noise hovering at its threshold is seen,
not seen, seen, … and without looks that added up to 2 of 3 over 20 s (a false straggler in a fault-free
benchmark control). One look sees a finding only if every evaluation in it did.
"""

from __future__ import annotations

import random
from dataclasses import replace

from gpumond.alerts.lifecycle import AlertTracker, Persistence
from gpumond.alerts.model import Condition
from gpumond.rules.findings import FINDINGS_PERSISTENCE, findings_persistence

AT_10S = replace(FINDINGS_PERSISTENCE, min_s=10.0, look_s=0.0)  # what the checks were validated with


def cond(*, immediate: bool = False) -> Condition:
    return Condition.of({"alertname": "TrainingStraggler", "severity": "warning", "job": "j1", "rank": 3},
                        {"score": "1"}, immediate=immediate)


def fired_at(seen: list[bool], step: float, p: Persistence, immediate: bool = False) -> list[int]:
    """Indices of the updates (one every `step` s) at which the condition started firing."""
    tracker, out = AlertTracker(persistence=p), []
    for i, s in enumerate(seen):
        tracker, changes = tracker.update([cond(immediate=immediate)] if s else [], i * step)
        out += [i for t in changes if t.new == "firing"]
    return out


def test_the_look_is_half_the_minimum_duration() -> None:
    assert FINDINGS_PERSISTENCE.look_s == 10.0  # the cadence the windowed checks were validated at
    # An operator's shorter minimum keeps its meaning: every 0.5 s evaluation its own look, firing at 1 s.
    fast = findings_persistence(min_duration_s=1.0)
    assert fast.look_s == 0.5
    assert fired_at([True, False, True, True], 0.5, fast) == [2]


def test_seen_every_other_5s_evaluation_does_not_fire() -> None:
    flicker = [True, False] * 6 + [True]
    assert fired_at(flicker, 5.0, FINDINGS_PERSISTENCE) == []
    # Without looks the same evaluations fire at 20 s: the false finding of the uneven-stages control.
    assert fired_at(flicker, 5.0, replace(FINDINGS_PERSISTENCE, look_s=0.0)) == [4]


def test_a_finding_that_holds_fires_as_soon_as_before() -> None:
    assert fired_at([True] * 8, 5.0, FINDINGS_PERSISTENCE) == [4]  # 20 s, min_duration_s
    assert fired_at([True] * 8, 5.0, replace(FINDINGS_PERSISTENCE, look_s=0.0)) == [4]
    assert fired_at([False, True, True, True, True, True], 5.0, FINDINGS_PERSISTENCE) == [5]


def test_one_miss_inside_a_look_keeps_a_pending_finding() -> None:
    # Seen, missed, then held: the look is no hit, but the finding stays pending from its first sighting.
    assert fired_at([True, False, True, True, True, True], 5.0, FINDINGS_PERSISTENCE) == [4]


def test_immediate_findings_fire_at_once_whatever_the_look() -> None:
    assert fired_at([True], 5.0, FINDINGS_PERSISTENCE, immediate=True) == [0]


def test_at_10s_one_evaluation_is_one_look() -> None:
    flicker = [True, False, True, False, True]
    assert fired_at(flicker, 10.0, FINDINGS_PERSISTENCE) == fired_at(flicker, 10.0, AT_10S) == [2]


def _median_statistic(rng: random.Random, n: int, window: int = 12) -> list[float]:
    """A windowed statistic sampled every 5 s: the median of the last minute of 5 s readings."""
    raw = [rng.gauss(0.0, 1.0) for _ in range(n + window)]
    return [sorted(raw[i:i + window])[window // 2] for i in range(n)]


def test_a_noisy_median_judged_every_5s_fires_only_where_a_10s_look_would() -> None:
    rng = random.Random(20)
    at_5s = without_looks = 0
    for _ in range(300):
        stat = _median_statistic(rng, 60)
        seen = [x > 0.9 for x in stat]  # a threshold the noise hovers around now and then
        fires = bool(fired_at(seen, 5.0, FINDINGS_PERSISTENCE))
        at_10s = any(fired_at(seen[phase::2], 10.0, AT_10S) for phase in (0, 1))
        assert not fires or at_10s, seen
        at_5s += fires
        without_looks += bool(fired_at(seen, 5.0, replace(FINDINGS_PERSISTENCE, look_s=0.0)))
    assert without_looks > at_5s  # the looks are what keeps the 5 s evaluation to the 10 s rate
