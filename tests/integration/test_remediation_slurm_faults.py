"""Fleet remediation under the faults an operator's fleet throws at it, against a real Slurm on 127.0.0.1:
a person's resume, a restart of the rules service while an agent is silent, state lost or damaged, a scheduler
command that hangs, and the health check of a node whose drain the guard refuses.

Each case held a defect once: a person's resume reverted in ~10 ms; a restart returned a node whose agent was
silent; a damaged state file crashed the service; a drain that was failing was paged as done while the telemetry
poll waited on scontrol; a gpumond drain with no record held capacity silently; the health check printed
"healthy" for a node with a lost GPU.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.scripted_receiver import ScriptedReceiver
from tests.integration.helpers import AgentProcess, http_get, parse_metrics, samples, value, wait_until
from tests.integration.slurm_helpers import (
    HOLD_DOWN_S,
    SlurmCluster,
    agent_args,
    audit,
    health_check,
    rules_daemon,
    rules_metrics,
    running,
)

pytestmark = pytest.mark.integration

NODES = ["node-a", "node-b", "node-c"]
OURS = "gpumond: GPU 1 lost (XID 79)"
PD_KEY = "0123456789abcdef0123456789abcdef"
GUARD = {"max_nodes": 3, "max_pool_fraction": 1.0, "max_drains_per_hour": 10}


def _drained(slurm: SlurmCluster, node: str) -> bool:
    return slurm.node(node)["state"].startswith("drain")


def _actions(work: Path, node: str) -> list[str]:
    return [str(e["action"]) for e in audit(work) if e["node"] == node]


def test_a_resume_a_silent_agent_across_a_restart_and_lost_or_damaged_state(fresh_slurm: SlurmCluster,
                                                                           tmp_path: Path) -> None:
    slurm, work = fresh_slurm, tmp_path
    lost = {"node-a": [], "node-b": [{"gpu": 1, "kind": "lost", "at_s": 1.0}],
            "node-c": [{"gpu": 0, "kind": "lost", "at_s": 1.0}]}  # lost for good
    agents = {n: AgentProcess(["--sim", "2", "--node-name", n, *agent_args(work / n, lost[n], 300)], work / n)
              for n in NODES}
    rules = rules_daemon(work, agents, slurm, GUARD)
    with running(rules, agents):
        wait_until(lambda: _drained(slurm, "node-b") and _drained(slurm, "node-c"), timeout=30,
                   what="node-b and node-c drained", describe=rules.describe)
        # A person returns node-b while its GPU is still lost: released, and left alone.
        slurm.scontrol("update", "NodeName=node-b", "State=RESUME")
        wait_until(lambda: "release" in _actions(work, "node-b"), timeout=10, what="node-b released")
        time.sleep(3)  # six remediation steps
        assert slurm.node("node-b")["state"] == "idle", "a person's resume was reverted"
        assert _actions(work, "node-b") == ["drain", "release"]
        # node-c's agent stops; the service is restarted (an upgrade) with state damaged in the meantime, and a
        # gpumond drain it has no record of (its state was lost) on node-a, whose GPUs are healthy.
        agents["node-c"].stop()
        rules.stop()
        state = work / "rules-state"
        doc = json.loads((state / "remediation-state.json").read_text())
        doc["records"]["node-z"] = {**doc["records"]["node-c"], "node": "node-z", "since": "2026-11-28T19:57:50Z"}
        (state / "remediation-state.json").write_text(json.dumps(doc))
        (state / "alerts-state.json").write_bytes(b"[" * 100_000)
        slurm.scontrol("update", "NodeName=node-a", "State=DRAIN", f"Reason={OURS}")
        rules.proc = None  # the same daemon, configuration and state directory, started again
        rules.start()
        restarted = time.monotonic()
        assert http_get(f"{rules.url}/healthz")[0] == 200
        # node-a: adopted, heard clear for the hold-down, returned.
        wait_until(lambda: slurm.node("node-a")["state"] == "idle", timeout=HOLD_DOWN_S + 20,
                   what="node-a adopted and returned", describe=rules.describe)
        assert _actions(work, "node-a") == ["adopt", "resume"]
        assert time.monotonic() - restarted >= HOLD_DOWN_S
        time.sleep(2)  # node-c had as long: its agent is silent, so it is not clear, so it stays
        assert _drained(slurm, "node-c") and _actions(work, "node-c") == ["drain"]
        assert slurm.node("node-b")["state"] == "idle" and _actions(work, "node-b") == ["drain", "release"]
        assert (state / "remediation-state.json.rejected.1").exists()
        assert (state / "alerts-state.json.corrupt.1").exists()
        metrics = parse_metrics(rules_metrics(rules))
        assert value(metrics, "gpumond_rules_evaluation_failing") == 0.0
        assert [s.labels["node"] for s in samples(metrics, "gpumond_remediation_node_drained")] == ["node-c"]


def test_a_hanging_scontrol_is_paged_never_reported_as_a_drain_and_never_stalls_telemetry(
        fresh_slurm: SlurmCluster, tmp_path: Path) -> None:
    slurm, work = fresh_slurm, tmp_path
    hang = work / "hang"
    hang.touch()
    wrapper = work / "scontrol"  # scontrol that hangs (a wedged slurmctld) while the flag file exists
    wrapper.write_text(f"#!/bin/sh\nif [ -e {hang} ]; then exec sleep 60; fi\nexec scontrol \"$@\"\n")
    wrapper.chmod(0o755)
    agents = {"node-a": AgentProcess(["--sim", "2", "--node-name", "node-a",
                                      *agent_args(work / "a", [{"gpu": 1, "kind": "lost", "at_s": 1.0}], 300)],
                                     work / "a")}
    with ScriptedReceiver() as receiver:
        rules = rules_daemon(work, agents, slurm, GUARD,
                             alerting={"pagerduty": {"routing_key": PD_KEY, "url": receiver.pagerduty_url}},
                             remediation={"slurm": {"scontrol": str(wrapper), "timeout_s": 1},
                                          "backend_down_after_s": 2})

        def paged(alertname: str, action: str = "trigger") -> list[object]:
            return [r for r in receiver.received("pagerduty") if r.json().get("event_action") == action
                    and alertname in json.dumps(r.json())]

        with running(rules, agents):
            receiver.wait_for(lambda r: "GpumondRemediationBackendDown" in json.dumps(r.json()), timeout=30)
            (page,) = paged("GpumondRemediationBackendDown")
            assert page.json()["payload"]["severity"] == "critical"  # type: ignore[attr-defined]
            assert not paged("GpumondNodeDrained"), "a drain that had not happened was paged as done"
            assert slurm.node("node-a")["state"] == "idle"
            metrics = parse_metrics(rules_metrics(rules))
            assert value(metrics, "gpumond_remediation_node_pending", node="node-a", action="drain") == 1.0
            assert samples(metrics, "gpumond_remediation_node_drained") == []
            assert value(metrics, "gpumond_remediation_backend_up", backend="slurm") == 0.0
            # Telemetry goes on while scontrol hangs: the last successful fetch keeps moving.
            first = value(metrics, "gpumond_rules_telemetry_last_success_timestamp_seconds", source="scrape")
            time.sleep(2.5)
            later = value(parse_metrics(rules_metrics(rules)), "gpumond_rules_telemetry_last_success_timestamp_seconds",
                          source="scrape")
            assert later - first >= 1.5, (first, later)
            hang.unlink()  # slurmctld answers again
            wait_until(lambda: _drained(slurm, "node-a"), timeout=15, what="node-a drained once scontrol answers",
                       describe=rules.describe)
            receiver.wait_for(lambda r: "GpumondNodeDrained" in json.dumps(r.json()), timeout=15)
            dedup = page.json()["dedup_key"]  # type: ignore[attr-defined]
            receiver.wait_for(lambda r: r.json().get("event_action") == "resolve" and r.json()["dedup_key"] == dedup,
                              timeout=15)


def test_the_health_check_says_what_it_sees_whatever_the_guard_decides(fresh_slurm: SlurmCluster, tmp_path: Path) -> None:
    slurm = fresh_slurm
    for node in ("node-a", "node-c"):  # two nodes already drained by gpumond
        slurm.scontrol("update", f"NodeName={node}", "State=DRAIN", f"Reason={OURS}")
    agent = AgentProcess(["--sim", "4", "--node-name", "node-b",
                          *agent_args(tmp_path / "agent", [{"gpu": 3, "kind": "lost", "at_s": 1.0}], 300)],
                         tmp_path / "agent")
    with agent:
        wait_until(lambda: any(s.labels.get("alertname") == "GpuXidCritical"
                               for s in samples(agent.metrics(), "gpumond_alert_active")),
                   timeout=30, what="XID 79 alert on the agent")
        for run in ("first", "second"):
            rc, out = health_check(slurm, agent, "node-b", tmp_path, "--mode", "enforce")
            assert rc == 1 and "node-b: FAULTY: GPU 3 lost (XID 79)" in out, (run, out)
            assert "healthy" not in out, (run, out)
        assert "circuit breaker open" in out and "guard.max_nodes 2" in out, out
        assert slurm.node("node-b")["state"] == "idle"
        # The health check's breaker is reached with the same command, pointed at its state directory.
        hc_state = tmp_path / "hc" / "health-check"
        done = subprocess.run([sys.executable, "-m", "gpumond.cli", "remediation", "reset-breaker", "--state-dir",
                               str(hc_state)], capture_output=True, text=True, timeout=30)
        assert done.returncode == 0 and "the health check closes the circuit breaker at its next run" in done.stdout
