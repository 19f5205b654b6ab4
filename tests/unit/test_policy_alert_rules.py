"""Agent alert rules on literal view sequences, run through the AlertTracker for durations."""

from __future__ import annotations

import pytest

from gpumond.agent.policy.alert_rules import (
    LOST_FOR_S,
    AgentAlertState,
    agent_conditions,
)
from gpumond.agent.policy.view import (
    GPU_IDLE,
    HW_POWER_BRAKE_SLOWDOWN,
    HW_SLOWDOWN,
    HW_THERMAL_SLOWDOWN,
    SW_POWER_CAP,
    SW_THERMAL_SLOWDOWN,
    GpuView,
)
from gpumond.config import PolicyAlertsConfig
from tests.unit.policy_alert_rig import CFG, Agent, gpu, names


@pytest.mark.parametrize(
    ("mask", "alertname", "severity"),
    [
        (HW_THERMAL_SLOWDOWN | HW_SLOWDOWN, "GpuHwThermalSlowdown", "critical"),
        (HW_POWER_BRAKE_SLOWDOWN | HW_SLOWDOWN, "GpuHwPowerBrakeSlowdown", "critical"),
        (HW_SLOWDOWN, "GpuHwSlowdown", "critical"),
        (SW_THERMAL_SLOWDOWN | SW_POWER_CAP, "GpuSwThermalSlowdown", "warning"),
    ],
)
def test_throttles_fire_after_throttle_after_s(mask: int, alertname: str, severity: str) -> None:
    agent = Agent()
    assert agent.every_second(0, 60, [gpu(clocks_event_mask=mask)]) == []  # t = 59: pending
    (alert,) = agent.at(60.0, [gpu(clocks_event_mask=mask)])
    assert (alert.alertname, alert.severity, alert.starts_at) == (alertname, severity, 60.0)
    assert dict(alert.labels) == {"alertname": alertname, "severity": severity, "node": "node-a",
                                  "gpu": "0", "uuid": "GPU-0"}
    assert "temperature 80 °C (slowdown at 89 °C)" in alert.annotation("description")


def test_a_throttle_that_stops_resets_the_clock() -> None:
    agent = Agent()
    agent.every_second(0, 50, [gpu(clocks_event_mask=SW_THERMAL_SLOWDOWN)])
    agent.at(50.0, [gpu()])
    assert agent.every_second(51, 110, [gpu(clocks_event_mask=SW_THERMAL_SLOWDOWN)]) == []
    assert names(agent.at(111.0, [gpu(clocks_event_mask=SW_THERMAL_SLOWDOWN)])) == ["GpuSwThermalSlowdown"]


def test_throttle_after_is_configurable() -> None:
    agent = Agent(PolicyAlertsConfig(throttle_after_s=0))
    assert names(agent.at(0.0, [gpu(clocks_event_mask=HW_THERMAL_SLOWDOWN | HW_SLOWDOWN)])) == ["GpuHwThermalSlowdown"]


def test_power_cap_and_idle_are_not_alerts() -> None:
    agent = Agent(PolicyAlertsConfig(throttle_after_s=0))
    assert agent.every_second(0, 100, [gpu(clocks_event_mask=SW_POWER_CAP | GPU_IDLE)]) == []


def test_values_are_annotations_never_labels() -> None:
    agent = Agent(PolicyAlertsConfig(throttle_after_s=0))
    first = agent.at(0.0, [gpu(temperature_c=90.0, clocks_event_mask=HW_THERMAL_SLOWDOWN)])[0]
    second = agent.at(1.0, [gpu(temperature_c=91.0, clocks_event_mask=HW_THERMAL_SLOWDOWN)])[0]
    assert first.fingerprint == second.fingerprint
    assert "91 °C" in second.annotation("description")


def test_ecc_increase_fires_and_holds_then_resolves() -> None:
    agent = Agent()
    agent.at(0.0, [gpu(ecc_uncorrected_volatile=2.0, ecc_uncorrected_aggregate=5.0)])  # baseline, no alert
    assert agent.at(1.0, [gpu(ecc_uncorrected_volatile=2.0, ecc_uncorrected_aggregate=5.0)]) == []
    (alert,) = agent.at(2.0, [gpu(ecc_uncorrected_volatile=3.0, ecc_uncorrected_aggregate=6.0)])
    assert (alert.alertname, alert.severity) == ("GpuEccUncorrectedIncreasing", "critical")
    assert "1 new error(s)" in alert.annotation("description")
    assert "volatile 3, aggregate 6" in alert.annotation("description")
    steady = [gpu(ecc_uncorrected_volatile=3.0, ecc_uncorrected_aggregate=6.0)]
    assert names(agent.at(2.0 + PolicyAlertsConfig().event_hold_s - 1, steady)) == ["GpuEccUncorrectedIncreasing"]
    assert agent.at(2.0 + PolicyAlertsConfig().event_hold_s, steady) == []
    assert names(agent.tracker.resolved) == ["GpuEccUncorrectedIncreasing"]


def test_ecc_counter_reset_is_not_an_increase() -> None:
    agent = Agent()
    agent.at(0.0, [gpu(ecc_uncorrected_volatile=7.0, ecc_uncorrected_aggregate=9.0)])
    # Driver reload: the volatile counter starts again from 0, the aggregate one is unchanged.
    assert agent.at(1.0, [gpu(ecc_uncorrected_volatile=0.0, ecc_uncorrected_aggregate=9.0)]) == []
    # A later rise from the new baseline is one.
    assert names(agent.at(2.0, [gpu(ecc_uncorrected_volatile=1.0, ecc_uncorrected_aggregate=9.0)])) == \
        ["GpuEccUncorrectedIncreasing"]


def test_ecc_missing_reading_keeps_the_baseline() -> None:
    agent = Agent()
    agent.at(0.0, [gpu(ecc_uncorrected_volatile=1.0, ecc_uncorrected_aggregate=1.0)])
    agent.at(1.0, [gpu(ecc_uncorrected_volatile=None, ecc_uncorrected_aggregate=None)])
    assert agent.at(2.0, [gpu(ecc_uncorrected_volatile=1.0, ecc_uncorrected_aggregate=1.0)]) == []


def test_row_remap_pending_and_failed() -> None:
    agent = Agent()
    firing = agent.at(0.0, [gpu(remap_pending=True), gpu(1, remap_failed=True)])
    assert {(a.alertname, a.severity, a.label("gpu")) for a in firing} == {
        ("GpuRowRemapPending", "warning", "0"), ("GpuRowRemapFailed", "critical", "1")}
    assert agent.at(1.0, [gpu(), gpu(1)]) == []


def test_xid_alert_holds_for_the_documented_time_and_extends() -> None:
    agent = Agent()
    (alert,) = agent.at(0.0, [gpu(3)], xids=[(3, 79)])
    assert dict(alert.labels) == {"alertname": "GpuXidCritical", "severity": "critical", "node": "node-a",
                                  "gpu": "3", "uuid": "GPU-3", "xid": "79"}
    assert "fallen off the bus" in alert.annotation("description")
    assert names(agent.at(600.0, [gpu(3)], xids=[(3, 79)])) == ["GpuXidCritical"]  # again: hold extends
    assert "2 time(s)" in agent.tracker.firing[0].annotation("description")
    assert names(agent.at(600.0 + PolicyAlertsConfig().event_hold_s - 1, [gpu(3)])) == ["GpuXidCritical"]
    assert agent.at(600.0 + PolicyAlertsConfig().event_hold_s, [gpu(3)]) == []


def test_xid_severity_comes_from_the_table_and_each_code_is_its_own_alert() -> None:
    agent = Agent()
    firing = agent.at(0.0, [gpu()], xids=[(0, 13), (0, 48), (0, 94), (0, 999)])
    got = {(a.label("xid"), a.severity) for a in firing}
    assert got == {("13", "info"), ("48", "critical"), ("94", "warning"), ("999", "warning")}
    unknown = next(a for a in firing if a.label("xid") == "999")
    assert "unknown XID, see nvidia-smi -q and dmesg" in unknown.annotation("description")


def test_xid_on_a_gpu_missing_from_the_views_still_alerts() -> None:
    (alert,) = Agent().at(0.0, [gpu(0)], xids=[(5, 79)])
    assert (alert.label("gpu"), alert.label("uuid")) == ("5", "unknown")


def test_gpu_lost_after_a_short_grace() -> None:
    agent = Agent()
    lost = [GpuView(index=2, uuid="GPU-2", name="NVIDIA H100 80GB HBM3", up=False)]
    assert agent.at(0.0, lost) == []
    assert agent.at(LOST_FOR_S - 1, lost) == []
    (alert,) = agent.at(LOST_FOR_S, lost)
    assert (alert.alertname, alert.severity, alert.label("gpu")) == ("GpuLost", "critical", "2")
    assert agent.at(LOST_FOR_S + 1, [gpu(2)]) == []


def test_power_cap_at_floor_after_floor_after_s() -> None:
    agent = Agent()
    pinned = frozenset({"GPU-1"})
    assert agent.every_second(0, 300, [gpu(0), gpu(1)], at_floor=pinned) == []
    (alert,) = agent.at(300.0, [gpu(0), gpu(1)], at_floor=pinned)
    assert (alert.alertname, alert.severity, alert.label("uuid")) == ("GpuPowerCapAtFloor", "warning", "GPU-1")


def test_rules_are_pure() -> None:
    state = AgentAlertState()
    views = [gpu(ecc_uncorrected_volatile=1.0)]
    a = agent_conditions(views, state, [(0, 48)], "n", CFG, 5.0)
    b = agent_conditions(views, state, [(0, 48)], "n", CFG, 5.0)
    assert a == b and state == AgentAlertState()


def test_alerts_say_what_runs_on_the_gpu_in_an_annotation_not_a_label() -> None:
    on = ("job llama-70b (pod ml/trainer-0, container main)",
          "job k8s-pod/ml/infer-a (pod ml/infer-a, container srv) on MIG 3g.40gb MIG-6c1d2b3f-4a5e-4f60-9bac-1d2e3f4a5b6c")
    agent = Agent()
    (xid,) = agent.at(1.0, [gpu(0, workload=on)], xids=[(0, 48)])
    assert xid.alertname == "GpuXidCritical" and xid.annotation("workload") == "; ".join(on)
    assert xid.label("pod") is None and xid.label("workload") is None
    lost_agent = Agent()
    lost_agent.at(0.0, [gpu(1, up=False, workload=on[:1])])
    (lost,) = lost_agent.at(LOST_FOR_S + 1, [gpu(1, up=False, workload=on[:1])])
    assert lost.annotation("workload") == on[0]
    (quiet,) = Agent().at(1.0, [gpu(2)], xids=[(2, 48)])
    assert quiet.annotation("workload") is None  # nothing known to run there: no empty annotation


def test_event_times_in_messages_are_wall_clock_even_when_the_daemon_clock_is_monotonic() -> None:
    # On real GPUs the agent's clock is monotonic (seconds since boot): 30.3 s printed as Unix time read
    # "1970-01-01T00:00:30.299Z" in a Slack message. The message carries the wall time of the same instant.
    wall = 1_763_760_000.0  # 2025-11-21T21:20:00Z
    cfg = CFG
    state, conds = agent_conditions([gpu(0)], AgentAlertState(), [(0, 48)], "n", cfg, 30.299, wall=wall)
    state, conds = agent_conditions([gpu(0)], state, [(0, 48)], "n", cfg, 40.299, wall=wall + 10)
    (xid,) = [c for c in conds if dict(c.labels)["alertname"] == "GpuXidCritical"]
    text = dict(xid.annotations)["description"]
    assert "from 2025-11-21T21:20:00" in text and "to 2025-11-21T21:20:10" in text and "1970" not in text, text
    state, conds = agent_conditions([gpu(0, ecc_uncorrected_volatile=1.0)], state, [], "n", cfg, 50.0, wall=wall + 20)
    (ecc,) = [c for c in conds if dict(c.labels)["alertname"] == "GpuEccUncorrectedIncreasing"]
    assert "at 2025-11-21T21:20:20" in dict(ecc.annotations)["description"]
    # The hold is still timed on the daemon's clock.
    _, conds = agent_conditions([gpu(0)], state, [], "n", cfg, 40.299 + cfg.event_hold_s, wall=1e10)
    assert [dict(c.labels)["alertname"] for c in conds] == ["GpuEccUncorrectedIncreasing"]
