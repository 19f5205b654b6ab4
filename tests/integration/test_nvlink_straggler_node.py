"""A node whose GPUs are slow and replay on NVLink: the rules service, scraping real agents over simulated GPUs,
reports a straggler-node finding that names NVLink as its likely cause (and the agent its own alert)."""

from __future__ import annotations

import json
import secrets
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from gpumond.demo.cluster import RulesProcess
from gpumond.demo.job import ClockFactors, SimulatedJob
from gpumond.rules.detectors.config import DetectorConfig
from tests.integration.helpers import AgentProcess, follow_clocks, samples, write_yaml

pytestmark = pytest.mark.integration

SPEED = 4.0
NODES = {"nv-node-a": 8, "nv-node-b": 4}  # node-b: every GPU of it in the job is slow
REPLAYING = (1, 2)  # node-b GPUs whose NVLink degrades
# The node goes bad once the job runs and its structure is learnt (a node slow from the job's first steps is
# taken for a heavier pipeline stage): the demo's detector settings with 6 s of learning instead of 60.
FAULT_AT_WALL_S = 16.0
DETECTORS = DetectorConfig(recent_s=20.0, share_long_s=20.0, share_long_min_s=8.0, structure_learn_s=6.0)
WAIT_S = 60.0


def _agent(work: Path, node: str, gpus: int) -> AgentProcess:
    faults = []
    if node == "nv-node-b":
        at = FAULT_AT_WALL_S * SPEED  # simulated seconds
        faults = [{"gpu": g, "kind": "slow", "factor": 0.75, "at_s": at} for g in range(gpus)]
        faults += [{"gpu": g, "kind": "nvlink_degraded", "link": 4, "rate": 500, "at_s": at} for g in REPLAYING]
    d = work / node
    scenario = write_yaml(d / "scenario.yaml", {"default_load": {"pattern": "constant", "utilization": 0.97},
                                                "faults": faults})
    config = write_yaml(d / "agent.yaml", {"state_dir": str(d / "state"),
                                           "sampling": {"fast_interval_s": 1, "slow_interval_s": 2}})
    return AgentProcess(["--sim", str(gpus), "--node-name", node, "--sim-scenario", scenario,
                         "--sim-speed", str(SPEED), "--config", config], d)


def _findings(url: str, token: str) -> list[dict]:
    req = urllib.request.Request(f"{url}/api/v1/findings?kind=straggler_node",
                                 headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        return json.loads(resp.read())["findings"]


def test_a_slow_node_replaying_on_nvlink_is_a_straggler_node_with_nvlink_as_its_cause(tmp_path: Path) -> None:
    agents = {node: _agent(tmp_path, node, gpus) for node, gpus in NODES.items()}
    stop = threading.Event()
    rules = job = None
    try:
        for a in agents.values():
            a.spawn()
        for a in agents.values():
            a.wait_ready()
        token = secrets.token_hex(16)
        rules = RulesProcess(list(agents.values()), token, tmp_path, detectors=DETECTORS)  # type: ignore[arg-type]
        rules.wait_ready(time.monotonic() + 30)
        uuids = {node: {s.labels["gpu"]: s.labels["uuid"] for s in samples(a.metrics(), "gpumond_gpu_info")}
                 for node, a in agents.items()}
        ranks = [(node, g, uuids[node][str(g)]) for node, gpus in NODES.items() for g in range(gpus)]
        factors = ClockFactors()

        follow_clocks(agents, factors, stop, "nv-clocks")
        job = SimulatedJob(job="nv-job", ranks=ranks, endpoint=rules.url, token=token, step_s=0.25,
                           clock_factors=factors, data_wait=lambda r: 0.0)
        job.start()
        deadline = time.monotonic() + WAIT_S
        found: list[dict] = []
        while time.monotonic() < deadline:
            found = [f for f in _findings(rules.url, token) if f["node"] == "nv-node-b"]
            if found and "likely_cause" in found[0]["evidence"]:
                break
            time.sleep(1.0)
        assert found, "no straggler_node finding for nv-node-b"
        evidence = found[0]["evidence"]
        assert evidence["likely_cause"] == "nvlink_errors", evidence
        assert set(evidence["nvlink_replays_per_s"]) == {uuids["nv-node-b"][str(g)] for g in REPLAYING}, evidence
        # The agent names the link in its own alert.
        alerts = [s.labels for s in samples(agents["nv-node-b"].metrics(), "gpumond_alert_active")
                  if s.labels.get("alertname") == "GpuNvLinkErrorsIncreasing"]
        assert {(a["gpu"], a["link"]) for a in alerts} == {(str(g), "4") for g in REPLAYING}, alerts
    finally:
        stop.set()
        if job is not None:
            job.stop()
        if rules is not None:
            rules.stop()
        for a in agents.values():
            if a.proc is not None:
                a.stop()
