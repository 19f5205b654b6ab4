"""Fleet remediation against a real Slurm controller (slurmctld + slurmd on 127.0.0.1).

Real agents on simulated GPUs, a real `gpumond rules` scraping them with `remediation.mode: enforce` and the
Slurm backend, a real slurmctld whose node states the test reads with sinfo. Stated bounds:
  - a node whose GPU falls off the bus is DRAIN in slurmctld within DRAIN_WITHIN_S of the agent first
    exporting the GPU as lost (scrape 1 s + evaluation 0.5 s + remediation step 0.5 s + scontrol; measured
    figures in the issue note);
  - it is resumed once the GPU is back, the agent's XID 79 alert expired (event_hold_s) and the hold-down passed;
  - a node a person drained is never resumed, nor its reason overwritten;
  - the blast-radius guard refuses the drain over guard.max_nodes, opens the circuit breaker and pages.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpumond.demo.receiver import Receiver
from tests.integration.alert_helpers import RulesDaemon
from tests.integration.helpers import (
    AgentProcess,
    http_get,
    parse_metrics,
    samples,
    value,
    wait_until,
    write_yaml,
)
from tests.integration.slurm_helpers import SlurmCluster

pytestmark = pytest.mark.integration

NODES = ["node-a", "node-b", "node-c"]
DRAIN_WITHIN_S = 10.0
HOLD_DOWN_S = 4.0
LOST_AT_S = 4.0  # simulated = wall seconds after the agent starts
LOST_FOR_S = 8.0
PERSON_REASON = "replacing PSU (alice)"
PD_KEY = "0123456789abcdef0123456789abcdef"


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    with SlurmCluster(tmp_path_factory.mktemp("slurm"), NODES) as cluster:
        yield cluster


@pytest.fixture
def fresh(slurm: SlurmCluster) -> SlurmCluster:
    for node in NODES:  # every test starts from idle nodes
        if slurm.node(node)["state"] != "idle":
            slurm.scontrol("update", f"NodeName={node}", "State=RESUME")
    wait_until(lambda: all(slurm.node(n)["state"] == "idle" for n in NODES), timeout=20, what="nodes idle")
    return slurm


def _agent_args(work: Path, faults: list[dict[str, object]], event_hold_s: float = 5) -> list[str | Path]:
    scenario = write_yaml(work / "scenario.yaml", {"faults": faults})
    # XID 79's alert stays event_hold_s after the event; short here so the node can return within the test.
    config = write_yaml(work / "agent.yaml", {"sampling": {"fast_interval_s": 1, "slow_interval_s": 1},
                                               "policy": {"alerts": {"event_hold_s": event_hold_s}},
                                               "state_dir": str(work / "state")})
    return ["--sim-scenario", scenario, "--config", config]


def _rules(work: Path, agents: dict[str, AgentProcess], slurm: SlurmCluster, guard: dict[str, object],
           alerting: dict[str, object] | None = None) -> RulesDaemon:
    rules = RulesDaemon(work / "rules", {
        "allow_unauthenticated": True, "evaluation_interval_s": 0.5, "state_dir": str(work / "rules-state"),
        "telemetry": {"scrape": {"targets": [a.address for a in agents.values()], "interval_s": 1,
                                 "timeout_s": 1}},
        "remediation": {"mode": "enforce", "backend": "slurm", "interval_s": 0.5, "hold_down_s": HOLD_DOWN_S,
                        "guard": guard},
        "alerting": alerting or {}, "log": {"format": "json"}})
    rules.env = {**(rules.env or {}), "SLURM_CONF": str(slurm.conf)}  # how scontrol and sinfo find this cluster
    return rules


@contextlib.contextmanager
def _running(rules: RulesDaemon, agents: dict[str, AgentProcess]) -> Iterator[None]:
    """The rules service first (it knows the agents' ports already: the faults are timed from each agent's start),
    then the agents; every one stopped after."""
    rules.start()
    try:
        for a in agents.values():
            a.spawn()
        for a in agents.values():
            a.wait_ready()
        yield
    finally:
        for a in agents.values():
            if a.proc is not None:
                a.stop()
        rules.stop()


def _audit(work: Path) -> list[dict[str, object]]:
    path = work / "rules-state" / "remediation-audit.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def test_lost_gpu_drains_the_node_and_it_returns_after_hold_down(fresh: SlurmCluster, tmp_path: Path) -> None:
    slurm = fresh
    slurm.scontrol("update", "NodeName=node-c", "State=DRAIN", f"Reason={PERSON_REASON}")
    lost = {"gpu": 1, "kind": "lost", "at_s": LOST_AT_S, "duration_s": LOST_FOR_S}
    per_node = {"node-a": [lost], "node-b": [], "node-c": [{"gpu": 0, "kind": "lost", "at_s": LOST_AT_S}]}
    work = tmp_path
    # Each node has its own scenario, so the agents are built one by one.
    agents = {n: AgentProcess(["--sim", "2", "--node-name", n, *_agent_args(work / n, per_node[n])], work / n)
              for n in NODES}
    rules = _rules(work, agents, slurm, {"max_nodes": 2, "max_pool_fraction": 1.0, "max_drains_per_hour": 10})
    with _running(rules, agents):
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
        alerts = [a for a in json.loads(http_get(f"{rules.url}/api/v1/alerts")[2])["alerts"]
                  if a["labels"]["alertname"] == "GpumondNodeDrained"]
        assert alerts and "drained by gpumond: GPU 1 lost" in alerts[0]["annotations"]["summary"], alerts

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
        audit = _audit(work)
        kinds = [(e["action"], e["node"]) for e in audit]
        assert ("drain", "node-a") in kinds and ("resume", "node-a") in kinds, kinds
        assert all(e["result"] == "ok" for e in audit if e["node"] == "node-a"), audit

        # node-c lost a GPU too, but a person drained it first: gpumond reports and never touches it.
        assert ("skip", "node-c") in kinds, kinds
        assert not any(k in (("drain", "node-c"), ("resume", "node-c")) for k in kinds), kinds
        time.sleep(HOLD_DOWN_S)
        assert slurm.node("node-c") == {"state": "drained", "partition": "gpu", "reason": PERSON_REASON}
        assert slurm.node("node-b")["state"] == "idle"


def test_guard_refuses_the_drain_over_its_limit_and_pages(fresh: SlurmCluster, tmp_path: Path) -> None:
    slurm = fresh
    lost = [{"gpu": 0, "kind": "lost", "at_s": 2.0}]
    agents = {n: AgentProcess(["--sim", "2", "--node-name", n, *_agent_args(tmp_path / n, lost)], tmp_path / n)
              for n in ("node-a", "node-b")}
    with Receiver() as receiver:
        rules = _rules(tmp_path, agents, slurm, {"max_nodes": 1, "max_pool_fraction": 1.0, "max_drains_per_hour": 10},
                       alerting={"pagerduty": {"routing_key": PD_KEY, "url": receiver.pagerduty_url}})
        with _running(rules, agents):
            page = receiver.wait_for(
                lambda r: r.kind == "pagerduty" and "GpumondRemediationHalted" in json.dumps(r.json()),
                timeout=30)
            assert page
            # Whichever node's fault was seen first is drained; the second would exceed max_nodes 1.
            (drained,) = [e["node"] for e in _audit(tmp_path) if e["action"] == "drain"]
            (refused,) = [e for e in _audit(tmp_path) if e["action"] == "refuse"]
            assert {drained, refused["node"]} == {"node-a", "node-b"}
            assert slurm.node(drained)["state"].startswith("drain")
            assert slurm.node(refused["node"])["state"] == "idle", "the guard let the second drain through"
            assert "guard.max_nodes 1" in str(refused["why"])
            print(f"\nguard refused {refused['node']}: {refused['why']}")
            metrics = parse_metrics(rules_metrics(rules))
            assert value(metrics, "gpumond_remediation_breaker_open") == 1.0


def rules_metrics(rules: RulesDaemon) -> str:
    return http_get(f"{rules.url}/metrics")[2].decode()


def _health_check(slurm: SlurmCluster, agent: AgentProcess, node: str, work: Path, *mode: str) -> tuple[int, str]:
    done = subprocess.run([sys.executable, "-m", "gpumond.cli", "health-check", "--agent", agent.base_url,
                           "--node", node, "--state-dir", str(work / "hc"), "--hold-down-s", "0", *mode],
                          capture_output=True, text=True, timeout=60, env=slurm.env)
    return done.returncode, done.stdout + done.stderr


def test_health_check_program_drains_its_own_node_dry_run_first(fresh: SlurmCluster, tmp_path: Path) -> None:
    slurm = fresh
    slurm.scontrol("update", "NodeName=node-c", "State=DRAIN", f"Reason={PERSON_REASON}")
    agent = AgentProcess(["--sim", "2", "--node-name", "node-b",
                          *_agent_args(tmp_path / "agent", [{"gpu": 0, "kind": "lost", "at_s": 1.0}], 300)],
                         tmp_path / "agent")
    with agent:
        wait_until(lambda: any(s.labels.get("alertname") == "GpuXidCritical"
                               for s in samples(agent.metrics(), "gpumond_alert_active")),
                   timeout=30, what="XID 79 alert on the agent")
        rc, out = _health_check(slurm, agent, "node-b", tmp_path)  # dry run: the default
        assert rc == 0 and "node-b: would drain: gpumond: GPU 0 lost (XID 79)" in out, out
        assert slurm.node("node-b")["state"] == "idle"
        rc, out = _health_check(slurm, agent, "node-b", tmp_path, "--mode", "enforce")
        assert rc == 0 and "node-b: drain: gpumond: GPU 0 lost (XID 79)" in out, out
        assert slurm.node("node-b")["state"].startswith("drain")
        assert slurm.node("node-b")["reason"] == "gpumond: GPU 0 lost (XID 79)"
        # The same agent read as node-c, which a person drained: left alone, and said so.
        rc, out = _health_check(slurm, agent, "node-c", tmp_path / "c", "--mode", "enforce")
        assert rc == 1 and "drained by someone else" in out, out
        assert slurm.node("node-c")["reason"] == PERSON_REASON
