"""AlertTracker: pending → firing after for_s, resolve with ends_at, bounded memory of resolves."""

from __future__ import annotations

import pytest

from gpumond.alerts.lifecycle import AlertTracker
from gpumond.alerts.model import Condition


def cond(name: str = "GpuHwSlowdown", for_s: float = 60.0, temp: float = 90.0, gpu: int = 0) -> Condition:
    return Condition.of({"alertname": name, "severity": "critical", "node": "n1", "gpu": gpu},
                        {"description": f"temperature {temp:g} °C"}, for_s)


def run(steps: list[tuple[float, list[Condition]]], tracker: AlertTracker | None = None):
    tracker = tracker or AlertTracker()
    log = []
    for now, conditions in steps:
        tracker, changes = tracker.update(conditions, now)
        log.append([(c.alert.alertname, c.old, c.new) for c in changes])
    return tracker, log


def test_pending_then_firing_after_for_s() -> None:
    tracker, log = run([(0.0, [cond()]), (30.0, [cond()]), (59.9, [cond()]), (60.0, [cond()])])
    assert log == [[("GpuHwSlowdown", None, "pending")], [], [], [("GpuHwSlowdown", "pending", "firing")]]
    (alert,) = tracker.firing
    assert alert.starts_at == 60.0 and alert.ends_at is None


def test_zero_for_fires_at_once() -> None:
    tracker, log = run([(5.0, [cond(for_s=0)])])
    assert log == [[("GpuHwSlowdown", None, "firing")]]
    assert tracker.firing[0].starts_at == 5.0


def test_pending_that_goes_away_is_forgotten() -> None:
    tracker, log = run([(0.0, [cond()]), (30.0, []), (40.0, [cond()]), (99.0, [cond()]), (100.0, [cond()])])
    assert log[1] == [("GpuHwSlowdown", "pending", None)]
    assert log[2] == [("GpuHwSlowdown", None, "pending")]  # the clock restarts at 40
    assert log[3] == [] and log[4] == [("GpuHwSlowdown", "pending", "firing")]
    assert tracker.firing[0].starts_at == 100.0


def test_pending_alerts_are_visible() -> None:
    tracker, _ = run([(10.0, [cond()])])
    (alert,) = tracker.pending
    assert alert.state == "pending" and alert.starts_at == 10.0


def test_resolve_sets_ends_at_and_is_kept_for_a_bounded_time() -> None:
    tracker, log = run([(0.0, [cond(for_s=0)]), (20.0, [])], AlertTracker(keep_resolved_s=100.0))
    assert log[1] == [("GpuHwSlowdown", "firing", "resolved")]
    (alert,) = tracker.resolved
    assert (alert.starts_at, alert.ends_at) == (0.0, 20.0)
    tracker, changes = tracker.update([], 119.0)
    assert len(tracker.resolved) == 1 and changes == ()
    tracker, changes = tracker.update([], 120.0)
    assert tracker.alerts == () and changes == ()


def test_return_after_resolve_is_a_new_alert() -> None:
    tracker, log = run([(0.0, [cond(for_s=10)]), (10.0, [cond(for_s=10)]), (20.0, []),
                        (30.0, [cond(for_s=10)]), (40.0, [cond(for_s=10)])])
    assert log[3] == [("GpuHwSlowdown", "resolved", "pending")]
    assert log[4] == [("GpuHwSlowdown", "pending", "firing")]
    assert tracker.firing[0].starts_at == 40.0


def test_annotations_follow_the_latest_values() -> None:
    tracker, _ = run([(0.0, [cond(for_s=0, temp=90)]), (5.0, [cond(for_s=0, temp=91.5)])])
    assert tracker.firing[0].annotation("description") == "temperature 91.5 °C"


def test_alerts_are_independent_by_labels() -> None:
    tracker, _ = run([(0.0, [cond(gpu=0, for_s=0), cond(gpu=1)]), (5.0, [cond(gpu=1)])])
    states = {a.label("gpu"): a.state for a in tracker.alerts}
    assert states == {"0": "resolved", "1": "pending"}


def test_duplicate_identities_are_a_bug() -> None:
    with pytest.raises(ValueError, match="share the labels"):
        AlertTracker().update([cond(temp=1), cond(temp=2)], 0.0)


def test_tracker_is_immutable() -> None:
    tracker = AlertTracker()
    tracker.update([cond(for_s=0)], 0.0)
    assert tracker.alerts == ()
