"""NVLink alert rules on literal views: a link seen active going down, and a rising replay rate."""

from __future__ import annotations

from gpumond.agent.policy.alert_rules import NVLINK_DOWN_FOR_S
from tests.unit.policy_alert_rig import Agent, gpu, names

UP = ((0, True), (1, True))


def test_a_link_seen_active_that_goes_down_alerts_after_its_hold_and_resolves_when_back() -> None:
    agent = Agent()
    agent.at(0.0, [gpu(nvlink_up=UP)])
    down = [gpu(nvlink_up=((0, True), (1, False)))]
    assert agent.every_second(1, 1 + NVLINK_DOWN_FOR_S, down) == []  # a retrain is not a fault
    (alert,) = agent.at(1 + NVLINK_DOWN_FOR_S, down)
    assert (alert.alertname, alert.severity, dict(alert.labels)["link"]) == ("GpuNvLinkDown", "critical", "1")
    assert agent.at(20.0, [gpu(nvlink_up=UP)]) == []


def test_a_link_never_seen_active_does_not_alert() -> None:
    agent = Agent()
    assert agent.every_second(0, 60, [gpu(nvlink_up=((0, True), (1, False)))]) == []


def test_replays_rising_at_the_rate_alert_per_link_and_slow_ones_do_not() -> None:
    agent = Agent()
    agent.at(0.0, [gpu(nvlink_replays=((0, 5.0), (1, 5.0)))])  # counts found at start: a baseline only
    agent.every_second(1, 30, [gpu(nvlink_replays=((0, 5.0), (1, 5.0)))])  # the slow tier has not read again
    firing = agent.at(30.0, [gpu(nvlink_replays=((0, 6.0), (1, 60005.0)))])  # link 0: 1 in 30 s; link 1: 2000/s
    assert [(a.alertname, dict(a.labels)["link"]) for a in firing] == [("GpuNvLinkErrorsIncreasing", "1")]
    assert "60000 replays" in firing[0].annotation("description")
    # Held like an ECC increase while the counter stands still between slow reads, then resolved.
    assert names(agent.at(100.0, [gpu(nvlink_replays=((0, 6.0), (1, 60005.0)))])) == ["GpuNvLinkErrorsIncreasing"]
    assert agent.at(30.0 + agent.cfg.event_hold_s + 1, [gpu(nvlink_replays=((0, 6.0), (1, 60005.0)))]) == []


def test_a_counter_that_drops_is_a_new_baseline_not_a_rise() -> None:
    agent = Agent()
    agent.at(0.0, [gpu(nvlink_replays=((0, 90000.0),))])
    assert agent.at(30.0, [gpu(nvlink_replays=((0, 10.0),))]) == []  # reset: counters restart
    assert names(agent.at(60.0, [gpu(nvlink_replays=((0, 30010.0),))])) == ["GpuNvLinkErrorsIncreasing"]
