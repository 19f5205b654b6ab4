"""Persistence as wall time: a finding fires once flagged for `min_s` seconds and resolves
after `clear_s` quiet seconds, whatever the evaluation interval; the rules config's `findings:` sets both."""

from __future__ import annotations

import pytest

from gpumond.alerts.lifecycle import AlertTracker, Persistence
from gpumond.alerts.model import Alert, Condition
from gpumond.config.errors import ConfigError
from gpumond.config.load import load_config
from gpumond.config.rules import RulesConfig
from gpumond.rules.findings import FINDINGS_PERSISTENCE, findings_persistence

P = Persistence(k=2, n=3, clear=3, min_s=10.0, clear_s=30.0)


def cond() -> Condition:
    return Condition.of({"alertname": "TrainingStraggler", "severity": "warning", "job": "j1", "rank": 3})


def run(times: list[float], present: list[bool], p: Persistence = P) -> tuple[AlertTracker, dict[str, float]]:
    """Feed updates at `times`; returns the tracker and when it first fired / resolved."""
    tracker = AlertTracker(persistence=p)
    when: dict[str, float] = {}
    for t, on in zip(times, present, strict=True):
        tracker, changes = tracker.update([cond()] if on else [], t)
        for c in changes:
            if c.new in ("firing", "resolved"):
                when.setdefault(c.new, t)
    return tracker, when


def test_at_a_one_second_interval_two_of_three_is_not_enough_it_needs_the_minimum_duration() -> None:
    times = [float(i) for i in range(15)]
    _, when = run(times, [True] * 15)
    assert when == {"firing": 10.0}  # without min_s: the second update, one second after the first
    _, when = run(times, [True] * 15, Persistence(k=2, n=3, clear=3))
    assert when == {"firing": 1.0}


def test_a_blip_shorter_than_the_minimum_duration_never_fires() -> None:
    times = [float(i) for i in range(30)]
    _, when = run(times, [i < 8 for i in range(30)])  # flagged 8 s, then gone
    assert when == {}


def test_at_the_default_interval_the_second_evaluation_fires_despite_scheduling_jitter() -> None:
    _, when = run([0.0, 9.996, 20.0], [True, True, True])
    assert when == {"firing": 9.996}


def test_a_firing_finding_resolves_after_the_quiet_wall_time_not_after_three_fast_evaluations() -> None:
    times = [float(i) for i in range(60)]
    _, when = run(times, [i <= 12 for i in range(60)])  # last seen at 12 s
    assert when == {"firing": 10.0, "resolved": 42.0}
    _, when = run([0.0, 10.0, 20.0, 30.0, 40.0], [True, True, False, False, False])  # 10 s interval: as before
    assert when == {"firing": 10.0, "resolved": 40.0}


def test_restored_alerts_still_resolve_after_their_hold() -> None:
    restored = AlertTracker(persistence=P).restore(
        [Alert(cond().labels, (), 0.0, None, "firing")], hold_until=5.0)
    tracker = restored
    for t in (6.0, 7.0, 8.0):
        tracker, changes = tracker.update([], t)
    assert [c.new for c in changes] == ["resolved"]


def test_persistence_refuses_negative_durations() -> None:
    with pytest.raises(ValueError, match="must not be negative"):
        Persistence(k=2, n=3, clear=3, min_s=-1.0)


def test_the_rules_config_sets_the_findings_durations(tmp_path) -> None:  # noqa: ANN001
    assert RulesConfig.default().findings.min_duration_s == 20.0
    assert RulesConfig.default().findings.resolve_after_s == 30.0
    assert FINDINGS_PERSISTENCE == findings_persistence(20.0, 30.0)
    path = tmp_path / "rules.yaml"
    path.write_text("allow_unauthenticated: true\nfindings: {min_duration_s: 30, resolve_after_s: 60}\n")
    cfg = load_config(path, RulesConfig)
    assert (cfg.findings.min_duration_s, cfg.findings.resolve_after_s) == (30.0, 60.0)
    path.write_text("allow_unauthenticated: true\nfindings: {min_duration_s: -5}\n")
    with pytest.raises(ConfigError, match="findings.min_duration_s"):
        load_config(path, RulesConfig)


def test_the_service_runs_its_findings_with_the_configured_durations(tmp_path) -> None:  # noqa: ANN001
    from gpumond.rules.service import RulesService

    cfg = RulesConfig.model_validate({"allow_unauthenticated": True, "state_dir": str(tmp_path),
                                      "findings": {"min_duration_s": 45, "resolve_after_s": 90}})
    service = RulesService(cfg)
    assert service.alerts.persistence == findings_persistence(45.0, 90.0)
