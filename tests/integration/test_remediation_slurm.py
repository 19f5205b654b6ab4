"""Fleet remediation against a real Slurm controller (slurmctld + slurmd on 127.0.0.1).

Real agents on simulated GPUs, a real `gpumond rules` scraping them with `remediation.mode: enforce` and the
Slurm backend, a real slurmctld whose node states the test reads with sinfo. Stated bounds:
  - a node whose GPU falls off the bus is DRAIN in slurmctld within DRAIN_WITHIN_S of the agent first
    exporting the GPU as lost (scrape 1 s + evaluation 0.5 s + remediation step 0.5 s + scontrol; measured
    figures in benchmarks/RESULTS.md, "Fleet remediation");
  - it is resumed once the GPU is back, the agent's XID 79 alert expired (event_hold_s) and the hold-down passed;
  - a node a person drained is never resumed, nor its reason overwritten;
  - the blast-radius guard refuses the drain over guard.max_nodes, opens the circuit breaker and pages.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.scripted_receiver import ScriptedReceiver
from tests.integration.helpers import (
    AgentProcess,
    http_get,
    parse_metrics,
    samples,
    value,
    wait_until,
)
from tests.integration.slurm_helpers import (
    HOLD_DOWN_S,
    PERSON_REASON,
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
DRAIN_WITHIN_S = 10.0
LOST_AT_S = 4.0  # simulated = wall seconds after the agent starts
LOST_FOR_S = 8.0
PD_KEY = "0123456789abcdef0123456789abcdef"


def test_lost_gpu_drains_the_node_and_it_returns_after_hold_down(fresh_slurm: SlurmCluster, tmp_path: Path) -> None:
    slurm = fresh_slurm
    slurm.scontrol("update", "NodeName=node-c", "State=DRAIN", f"Reason={PERSON_REASON}")
    lost = {"gpu": 1, "kind": "lost", "at_s": LOST_AT_S, "duration_s": LOST_FOR_S}
    per_node = {"node-a": [lost], "node-b": [], "node-c": [{"gpu": 0, "kind": "lost", "at_s": LOST_AT_S}]}
    work = tmp_path
    # Each node has its own scenario, so the agents are built one by one.
    agents = {n: AgentProcess(["--sim", "2", "--node-name", n, *agent_args(work / n, per_node[n])], work / n)
              for n in NODES}
    rules = rules_daemon(work, agents, slurm, {"max_nodes": 2, "max_pool_fraction": 1.0, "max_drains_per_hour": 10})
    with running(rules, agents):
        # The fault: node-a's agent exports GPU 1 as lost (polled every 0.1 s; sampling is every 1 s).
        def gpu_lost() -> bool:
            return value(agents["node-a"].metrics(), "gpumond_gpu_up", gpu="1") == 0.0

        wait_until(gpu_lost, timeout=30, what="node-a GPU 1 lost", interval=0.1)
        fault_seen = time.monotonic()
        wait_until(lambda: slurm.node("node-a")["state"].startswith("drain"), timeout=DRAIN_WITHIN_S,
                   what="node-a drained in slurmctld", interval=0.1, describe=rules.describe)
        to_drain = time.monotonic() - fault_seen
        node_a = slurm.node("node-a")
        assert node_a["reason"].startswith("gpumond: GPU 1 lost"), node_a
        print(f"\nfault to drain: {to_drain:.2f} s (agent exports GPU lost → DRAIN in slurmctld)")

        # The operator's view: what gpumond drained and why.
        listing = subprocess.run([sys.executable, "-m", "gpumond.cli", "remediation", "list", "--state-dir",
                                  str(work / "rules-state")], capture_output=True, text=True, timeout=30)
        assert listing.returncode == 0, listing.stderr
        assert "node-a" in listing.stdout and "GPU 1 lost" in listing.stdout, listing.stdout
        metrics = parse_metrics(rules_metrics(rules))
        drained = samples(metrics, "gpumond_remediation_node_drained")
        assert [s.labels["node"] for s in drained] == ["node-a"], drained
        def drained_alerts() -> list[dict[str, object]]:  # raised at the next evaluation after the drain
            return [a for a in json.loads(http_get(f"{rules.url}/api/v1/alerts")[2])["alerts"]
                    if a["labels"]["alertname"] == "GpumondNodeDrained"]

        alerts = wait_until(drained_alerts, timeout=10, what="GpumondNodeDrained raised")
        assert "drained by gpumond: GPU 1 lost" in alerts[0]["annotations"]["summary"], alerts

        # Recovery: the GPU is back at LOST_AT_S + LOST_FOR_S (its XID 79 alert expired 5 s after the event:
        # the node stays drained while the GPU reads lost); then the hold-down.
        wait_until(lambda: not gpu_lost(), timeout=LOST_FOR_S + 10, what="node-a GPU 1 back", interval=0.1)
        back = time.monotonic()
        assert slurm.node("node-a")["state"].startswith("drain"), "resumed while the GPU was still lost"
        wait_until(lambda: slurm.node("node-a")["state"] == "idle", timeout=HOLD_DOWN_S + 15,
                   what="node-a resumed", interval=0.1, describe=rules.describe)
        resumed = time.monotonic()
        print(f"GPU back to resume: {resumed - back:.1f} s (hold-down {HOLD_DOWN_S:g} s)")
        assert resumed - back >= HOLD_DOWN_S - 0.2, "resumed before the hold-down passed"
        entries = audit(work)
        kinds = [(e["action"], e["node"]) for e in entries]
        assert ("drain", "node-a") in kinds and ("resume", "node-a") in kinds, kinds
        assert all(e["result"] == "ok" for e in entries if e["node"] == "node-a"), entries

        # node-c lost a GPU too, but a person drained it first: gpumond reports and never touches it.
        assert ("skip", "node-c") in kinds, kinds
        assert not any(k in (("drain", "node-c"), ("resume", "node-c")) for k in kinds), kinds
        time.sleep(HOLD_DOWN_S)
        assert slurm.node("node-c") == {"state": "drained", "partition": "gpu", "reason": PERSON_REASON}
        assert slurm.node("node-b")["state"] == "idle"


def test_guard_refuses_the_drain_over_its_limit_and_pages(fresh_slurm: SlurmCluster, tmp_path: Path) -> None:
    slurm = fresh_slurm
    lost = [{"gpu": 0, "kind": "lost", "at_s": 2.0}]
    agents = {n: AgentProcess(["--sim", "2", "--node-name", n, *agent_args(tmp_path / n, lost)], tmp_path / n)
              for n in ("node-a", "node-b")}
    with ScriptedReceiver() as receiver:
        rules = rules_daemon(tmp_path, agents, slurm, {"max_nodes": 1, "max_pool_fraction": 1.0, "max_drains_per_hour": 10},
                       alerting={"pagerduty": {"routing_key": PD_KEY, "url": receiver.pagerduty_url}})
        with running(rules, agents):
            page = receiver.wait_for(
                lambda r: r.kind == "pagerduty" and "GpumondRemediationHalted" in json.dumps(r.json()),
                timeout=30)
            assert page
            # Whichever node's fault was seen first is drained; the second would exceed max_nodes 1.
            (drained,) = [e["node"] for e in audit(tmp_path) if e["action"] == "drain"]
            (refused,) = [e for e in audit(tmp_path) if e["action"] == "refuse"]
            assert {drained, refused["node"]} == {"node-a", "node-b"}
            assert slurm.node(drained)["state"].startswith("drain")
            assert slurm.node(refused["node"])["state"] == "idle", "the guard let the second drain through"
            assert "guard.max_nodes 1" in str(refused["why"])
            print(f"\nguard refused {refused['node']}: {refused['why']}")
            metrics = parse_metrics(rules_metrics(rules))
            assert value(metrics, "gpumond_remediation_breaker_open") == 1.0

            # The operator's two levers, through the CLI against the running service. Undo: the drained node
            # returns now and is left alone while its GPU is still lost; reset-breaker: the refused node drains.
            def cli(*args: str) -> str:
                done = subprocess.run([sys.executable, "-m", "gpumond.cli", "remediation", *args, "--state-dir",
                                       str(tmp_path / "rules-state")], capture_output=True, text=True, timeout=30)
                assert done.returncode == 0, done.stderr
                return done.stdout

            assert "returns " + drained + " to service" in cli("undo", drained)
            wait_until(lambda: slurm.node(drained)["state"] == "idle", timeout=15, what="undone node resumed")
            assert "closes the circuit breaker" in cli("reset-breaker")
            wait_until(lambda: slurm.node(refused["node"])["state"].startswith("drain"), timeout=15,
                       what="the refused node drained once the breaker was reset", describe=rules.describe)
            time.sleep(2)  # four steps: the undone node, GPU still lost, is not drained again
            assert slurm.node(drained)["state"] == "idle"
            assert [e["action"] for e in audit(tmp_path) if e["node"] == drained] == ["drain", "undo"]
            assert value(parse_metrics(rules_metrics(rules)), "gpumond_remediation_breaker_open") == 0.0


def test_health_check_program_drains_its_own_node_dry_run_first(fresh_slurm: SlurmCluster, tmp_path: Path) -> None:
    slurm = fresh_slurm
    slurm.scontrol("update", "NodeName=node-c", "State=DRAIN", f"Reason={PERSON_REASON}")
    agent = AgentProcess(["--sim", "2", "--node-name", "node-b",
                          *agent_args(tmp_path / "agent", [{"gpu": 0, "kind": "lost", "at_s": 1.0}], 300)],
                         tmp_path / "agent")
    with agent:
        wait_until(lambda: any(s.labels.get("alertname") == "GpuXidCritical"
                               for s in samples(agent.metrics(), "gpumond_alert_active")),
                   timeout=30, what="XID 79 alert on the agent")
        rc, out = health_check(slurm, agent, "node-b", tmp_path)  # dry run: the default
        assert rc == 0 and "node-b: would drain: gpumond: GPU 0 lost (XID 79)" in out, out
        assert slurm.node("node-b")["state"] == "idle"
        rc, out = health_check(slurm, agent, "node-b", tmp_path, "--mode", "enforce")
        assert rc == 0 and "node-b: drain: gpumond: GPU 0 lost (XID 79)" in out, out
        assert slurm.node("node-b")["state"].startswith("drain")
        assert slurm.node("node-b")["reason"] == "gpumond: GPU 0 lost (XID 79)"
        # The same agent read as node-c, which a person drained: left alone, and said so.
        rc, out = health_check(slurm, agent, "node-c", tmp_path / "c", "--mode", "enforce")
        assert rc == 1 and "drained by someone else" in out, out
        assert slurm.node("node-c")["reason"] == PERSON_REASON
