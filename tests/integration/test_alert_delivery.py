"""Alerts from both daemons, end to end: real Alertmanager replicas (a gossip cluster on 127.0.0.1) forward
to a local webhook receiver; PagerDuty across a SIGKILL of the rules service."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from gpumond.demo.receiver import Record
from tests.scripted_receiver import ScriptedReceiver
from tests.integration.alert_helpers import RulesProcess, alertmanager_cluster
from gpumond.alerts.state import AlertStateFile
from tests.integration.helpers import AgentProcess, wait_until, write_yaml

pytestmark = pytest.mark.integration

PD_KEY = "R0UT1NGKEY0123456789abcdefABCDEF"


def notifications(receiver: ScriptedReceiver, alertname: str, status: str) -> list[Record]:
    return [r for r in receiver.received("alertmanager", accepted=True)
            if r.json()["status"] == status and r.json()["commonLabels"].get("alertname") == alertname]


def log(receiver: ScriptedReceiver) -> str:
    return " | ".join(f'{r.received_at.time()} {r.json()["externalURL"]} {r.json()["status"]} '
                      f'{[(a["status"], a["startsAt"], a["endsAt"]) for a in r.json()["alerts"]]}'
                      for r in receiver.received("alertmanager"))


def once_per_replica(records: list[Record]) -> bool:
    """At least one notification, and no replica notified twice.

    Whether the second replica stays silent is Alertmanager's gossip (its notification log); on this
    loopback cluster both replicas often notify, each once. What gpumond controls, and what this checks,
    is that re-sending the alert every second to both never makes a replica notify again.
    """
    senders = [r.json()["externalURL"] for r in records]
    return bool(senders) and len(senders) == len(set(senders))


def test_findings_reach_alertmanager_once_and_resolve(receiver: ScriptedReceiver, tmp_path: Path) -> None:
    ams = alertmanager_cluster(tmp_path, receiver.alertmanager_url)
    rules = RulesProcess(tmp_path / "rules", {"alertmanager": {"urls": [am.url for am in ams],
                                                               "resend_interval_s": 1},
                                              "cluster": "test-fleet"}, state_dir=tmp_path / "state").start()
    try:
        rules.push_job("starved", ranks=2, steps=12, data_wait_s=0.3)
        (fired,) = receiver.wait_for(lambda r: r.json()["status"] == "firing", kind="alertmanager", timeout=30)
        body = fired.json()
        assert body["groupLabels"] == {"alertname": "TrainingIoStarvedJob", "job": "starved"}
        (alert,) = body["alerts"]
        assert alert["labels"] == {"alertname": "TrainingIoStarvedJob", "severity": "warning", "job": "starved",
                                   "cluster": "test-fleet"}
        assert alert["annotations"]["runbook_url"].endswith("/docs/runbooks/TrainingIoStarvedJob.md")
        assert alert["annotations"]["summary"] == "job starved: job starved by its data pipeline"
        assert '"median_data_wait_frac":0.6' in alert["annotations"]["evidence"]
        assert alert["generatorURL"] == f"{rules.url}/api/v1/findings?job=starved"
        assert all(any(a["labels"]["alertname"] == "TrainingIoStarvedJob" for a in am.alerts()) for am in ams)
        time.sleep(5)  # ~5 resends to each of two replicas: still one notification
        assert once_per_replica(notifications(receiver, "TrainingIoStarvedJob", "firing")), log(receiver)

        rules.push_job("starved", ranks=2, steps=60, data_wait_s=0.0, first_step=100)  # the loader recovered
        receiver.wait_for(lambda r: r.json()["status"] == "resolved", kind="alertmanager", timeout=30)
        time.sleep(3)
        assert once_per_replica(notifications(receiver, "TrainingIoStarvedJob", "firing")), log(receiver)
        # Both replicas heard the resolve from gpumond (an alert whose endsAt has passed is no longer active).
        for am in ams:
            assert not [a for a in am.alerts() if a["labels"]["alertname"] == "TrainingIoStarvedJob"], log(receiver)
        assert [a["state"] for a in rules.alerts()] == ["resolved"]
    finally:
        rules.stop()
        for am in ams:
            am.stop()


def test_agent_alerts_reach_alertmanager_and_expire_through_the_lease_when_it_dies(
        receiver: ScriptedReceiver, tmp_path: Path) -> None:
    ams = alertmanager_cluster(tmp_path, receiver.alertmanager_url)
    scenario = write_yaml(tmp_path / "scenario.yaml", {"faults": [{"gpu": 1, "kind": "lost", "at_s": 1}]})
    config = write_yaml(tmp_path / "agent.yaml", {
        "state_dir": str(tmp_path / "agent-state"), "sampling": {"slow_interval_s": 2},
        "alerting": {"alertmanager": {"urls": [am.url for am in ams], "resend_interval_s": 1}}})
    agent = AgentProcess(["--sim", "2", "--sim-scenario", scenario, "--sim-speed", "5", "--config", config,
                          "--node-name", "gpu-node-07"], tmp_path / "agent").start()
    try:
        (fired,) = receiver.wait_for(lambda r: r.json()["status"] == "firing"
                                     and r.json()["commonLabels"]["alertname"] == "GpuLost", kind="alertmanager",
                                     timeout=30)
        (alert,) = fired.json()["alerts"]
        assert {k: alert["labels"][k] for k in ("alertname", "severity", "node", "gpu")} == \
            {"alertname": "GpuLost", "severity": "critical", "node": "gpu-node-07", "gpu": "1"}
        assert alert["generatorURL"] == "http://127.0.0.1:%d/metrics" % agent.port
        assert alert["annotations"]["runbook_url"].endswith("/docs/runbooks/GpuLost.md")
        lease_start = time.monotonic()
        agent.stop(sig=signal.SIGKILL)  # no goodbye: only the lease can end the alert
        receiver.wait_for(lambda r: r.json()["status"] == "resolved" and r.json()["commonLabels"]["alertname"] == "GpuLost",
                          kind="alertmanager", timeout=30)
        took = time.monotonic() - lease_start
        assert took < 4 * 1 + 2 + 5  # the lease (4 × 1 s), Alertmanager's group interval, slack for the machine
        assert once_per_replica(notifications(receiver, "GpuLost", "firing"))
    finally:
        if agent.running:
            agent.stop()
        for am in ams:
            am.stop()


def test_a_killed_rules_service_pages_once_and_resolves_once(receiver: ScriptedReceiver, tmp_path: Path) -> None:
    alerting = {"pagerduty": {"routing_key": PD_KEY, "url": receiver.pagerduty_url}, "restart_grace_s": 2}
    state = tmp_path / "state"

    def pd(action: str) -> list[dict]:
        return [r.json() for r in receiver.received("pagerduty", accepted=True) if r.json()["event_action"] == action]

    rules = RulesProcess(tmp_path / "run1", alerting, state_dir=state).start()
    rules.push_job("starved", ranks=2, steps=12, data_wait_s=0.3)
    receiver.wait_for(kind="pagerduty", timeout=30)
    # The sink books the incident right after PagerDuty's 202; a crash in between would re-send the trigger
    # with the same dedup_key, which PagerDuty folds into the open incident. Kill after the booking.
    wait_until(lambda: AlertStateFile(state / "alerts-state.json").book("pagerduty").load(), timeout=10,
               what="the incident booked in the state file")
    rules.stop(sig=signal.SIGKILL)

    # Restarted while the job is still starved: the incident is the same one, no second page.
    rules = RulesProcess(tmp_path / "run2", alerting, state_dir=state).start()
    rules.push_job("starved", ranks=2, steps=12, data_wait_s=0.3)
    time.sleep(5)
    assert [a["state"] for a in rules.alerts()] == ["firing"]
    rules.stop(sig=signal.SIGKILL)
    assert len(pd("trigger")) == 1 and pd("resolve") == []

    # Restarted with the condition gone: the incident it had opened is resolved, once.
    rules = RulesProcess(tmp_path / "run3", alerting, state_dir=state).start()
    try:
        receiver.wait_for(lambda r: r.json()["event_action"] == "resolve", kind="pagerduty", timeout=30)
        time.sleep(2)
        (trigger,) = pd("trigger")
        (resolve,) = pd("resolve")
        assert resolve["dedup_key"] == trigger["dedup_key"]
        assert trigger["payload"]["summary"] == "[WARNING] job starved: job starved by its data pipeline"
    finally:
        rules.stop()
