"""AlertTracker with k-of-n persistence (the rules service's findings) and restore after a restart.

The agent's defaults (k = n = clear = 1, `for_s` waits) are pinned here too: both daemons share this
lifecycle, and the findings' persistence must not leak into the agent's alerts.
"""

from __future__ import annotations

import pytest

from gpumond.alerts.lifecycle import KEEP_RESOLVED_S, AlertTracker, Persistence
from gpumond.alerts.model import Alert, Condition

P = Persistence(k=2, n=3, clear=3)


def cond(rank: int = 3, *, immediate: bool = False, payload: object = None, for_s: float = 0.0,
         score: str = "1") -> Condition:
    return Condition.of({"alertname": "TrainingStraggler", "severity": "warning", "job": "j1", "rank": rank},
                        {"score": score}, for_s, immediate=immediate, payload=payload)


def run(pattern: str, tracker: AlertTracker | None = None, start: float = 0.0, step: float = 10.0,
        **kw: object) -> tuple[AlertTracker, list[list[tuple[str | None, str | None]]]]:
    """Feed one update per character: 'x' = the condition is true, '.' = it is not."""
    tracker = tracker if tracker is not None else AlertTracker(persistence=P)
    log = []
    for i, ch in enumerate(pattern):
        tracker, changes = tracker.update([cond(**kw)] if ch == "x" else [], start + i * step)  # type: ignore[arg-type]
        log.append([(t.old, t.new) for t in changes])
    return tracker, log


def fired(log: list[list[tuple[str | None, str | None]]]) -> list[int]:
    return [i for i, changes in enumerate(log) if any(new == "firing" for _, new in changes)]


# ----- k of n --------------------------------------------------------------------------------------
def test_a_blip_never_fires_and_is_forgotten_once_out_of_the_window() -> None:
    tracker, log = run("x.....")
    assert fired(log) == []
    assert log[0] == [(None, "pending")]
    assert log[1] == [] and log[2] == []  # still within the last n updates: kept pending
    assert log[3] == [("pending", None)]  # out of the window: it never existed as an alert
    assert tracker.alerts == ()


def test_two_hits_further_apart_than_n_never_fire() -> None:
    _, log = run("x..x..x..x")
    assert fired(log) == []


def test_k_of_n_fires_even_when_not_consecutive() -> None:
    tracker, log = run("x.x")
    assert log == [[(None, "pending")], [], [("pending", "firing")]]
    (alert,) = tracker.firing
    assert alert.starts_at == 20.0  # starts when it fired
    (entry,) = tracker.entries
    assert entry.active_since == 0.0  # first seen at the blip


def test_k_consecutive_fires_on_the_kth_update() -> None:
    _, log = run("xx")
    assert fired(log) == [1]


def test_immediate_fires_at_once() -> None:
    tracker, log = run("x", immediate=True)
    assert log == [[(None, "firing")]]
    assert tracker.firing[0].starts_at == 0.0


def test_immediate_ignores_for_s_too() -> None:
    _, log = run("x", immediate=True, for_s=3600.0)
    assert log == [[(None, "firing")]]


def test_k_of_n_and_for_s_both_hold() -> None:
    _, log = run("xxxx", for_s=25.0)  # k reached at 10 s, for_s at 30 s
    assert fired(log) == [3]


# ----- clear --------------------------------------------------------------------------------------
def test_firing_resolves_only_after_clear_quiet_updates() -> None:
    tracker, log = run("xx...")
    assert fired(log) == [1]
    assert log[2] == [] and log[3] == []
    assert log[4] == [("firing", "resolved")]
    (alert,) = tracker.resolved
    assert (alert.starts_at, alert.ends_at) == (10.0, 40.0)


def test_a_return_resets_the_quiet_count() -> None:
    tracker, log = run("xx..x..")
    assert all(new != "resolved" for changes in log for _, new in changes)
    assert len(tracker.firing) == 1 and tracker.firing[0].starts_at == 10.0
    tracker, changes = tracker.update([], 70.0)
    assert [(t.old, t.new) for t in changes] == [("firing", "resolved")]


def test_a_condition_returning_after_resolve_is_a_new_alert() -> None:
    tracker, log = run("xx...xx")
    assert log[5] == [("resolved", "pending")]
    assert log[6] == [("pending", "firing")]
    (alert,) = tracker.firing
    assert alert.starts_at == 60.0  # a new start, not the old 10.0
    (entry,) = tracker.entries
    assert entry.active_since == 50.0


def test_persistence_must_be_sane() -> None:
    for k, n, clear in ((0, 1, 1), (3, 2, 1), (1, 1, 0)):
        with pytest.raises(ValueError):
            Persistence(k, n, clear)


# ----- restore after a restart ----------------------------------------------------------------------
def _restored(hold_until: float = 200.0) -> tuple[AlertTracker, Alert]:
    c = cond()
    recorded = Alert(c.labels, c.annotations, 100.0)
    return AlertTracker(persistence=P).restore([recorded], hold_until=hold_until), recorded


def test_restore_seeds_firing_alerts_that_keep_their_start_and_identity() -> None:
    tracker, recorded = _restored()
    (alert,) = tracker.firing
    assert alert == recorded and alert.starts_at == 100.0
    # Still true after the restart: no transition (sinks are not told again), same start.
    tracker, changes = tracker.update([cond()], 150.0)
    assert changes == ()
    assert tracker.firing[0].starts_at == 100.0


def test_restore_ignores_alerts_that_were_not_firing() -> None:
    c = cond()
    tracker = AlertTracker(persistence=P).restore(
        [Alert(c.labels, c.annotations, 1.0, state="pending"), Alert(c.labels, c.annotations, 1.0, 2.0, "resolved")],
        hold_until=10.0)
    assert tracker.alerts == ()


def test_restore_does_not_replace_an_alert_already_tracked() -> None:
    tracker, _ = run("xx")
    c = cond()
    tracker = tracker.restore([Alert(c.labels, c.annotations, 1.0)], hold_until=999.0)
    assert tracker.firing[0].starts_at == 10.0


def test_restored_alert_does_not_resolve_before_hold_until() -> None:
    tracker, _ = _restored(hold_until=200.0)
    for now in (110.0, 120.0, 130.0, 140.0, 199.9):  # far more than `clear` quiet updates
        tracker, changes = tracker.update([], now)
        assert changes == (), now
    assert len(tracker.firing) == 1
    tracker, changes = tracker.update([], 200.0)
    assert [(t.old, t.new) for t in changes] == [("firing", "resolved")]
    assert (tracker.resolved[0].starts_at, tracker.resolved[0].ends_at) == (100.0, 200.0)


def test_restored_alert_resolves_after_clear_quiet_updates_once_the_hold_is_over() -> None:
    tracker, _ = _restored(hold_until=200.0)
    log = []
    for now in (200.0, 210.0, 220.0):
        tracker, changes = tracker.update([], now)
        log.append([(t.old, t.new) for t in changes])
    assert log == [[], [], [("firing", "resolved")]]


def test_restored_alert_that_comes_back_after_resolving_is_new() -> None:
    tracker, _ = _restored(hold_until=0.0)
    for now in (110.0, 120.0, 130.0):
        tracker, _ = tracker.update([], now)
    assert len(tracker.resolved) == 1
    tracker, changes = tracker.update([cond(immediate=True)], 140.0)
    assert [(t.old, t.new) for t in changes] == [("resolved", "firing")]
    assert tracker.firing[0].starts_at == 140.0


# ----- the agent's defaults -------------------------------------------------------------------------
def test_agent_defaults_are_one_of_one_and_clear_at_once() -> None:
    tracker = AlertTracker()
    assert tracker.persistence == Persistence(k=1, n=1, clear=1)
    assert tracker.keep_resolved_s == KEEP_RESOLVED_S == 900.0


def test_agent_defaults_wait_for_s_and_resolve_on_the_first_absence() -> None:
    tracker, log = run("xxxxx.", tracker=AlertTracker(), step=20.0, for_s=60.0)
    assert log[0] == [(None, "pending")]
    assert fired(log) == [3]  # at 60 s
    assert log[5] == [("firing", "resolved")]


def test_agent_defaults_forget_a_pending_alert_at_once() -> None:
    _, log = run("x.", tracker=AlertTracker(), for_s=60.0)
    assert log[1] == [("pending", None)]


# ----- payload --------------------------------------------------------------------------------------
def test_payload_is_carried_to_entries_and_follows_the_latest_condition() -> None:
    tracker = AlertTracker(persistence=P)
    tracker, _ = tracker.update([cond(payload="first")], 0.0)
    assert [e.payload for e in tracker.entries] == ["first"]
    tracker, _ = tracker.update([cond(payload={"score": 2})], 10.0)
    (entry,) = tracker.entries
    assert entry.payload == {"score": 2} and entry.alert.state == "firing" and entry.active_since == 0.0
    tracker, _ = tracker.update([], 20.0)  # absent: the last payload stays with the alert
    assert tracker.entries[0].payload == {"score": 2}


def test_payload_does_not_change_identity() -> None:
    assert cond(payload=1).fingerprint == cond(payload=2).fingerprint
    tracker, _ = AlertTracker(persistence=P).update([cond(payload=1)], 0.0)
    tracker, changes = tracker.update([cond(payload=2)], 10.0)
    assert [(t.old, t.new) for t in changes] == [("pending", "firing")]


def test_restored_entries_have_no_payload() -> None:
    tracker, _ = _restored()
    assert [e.payload for e in tracker.entries] == [None]
