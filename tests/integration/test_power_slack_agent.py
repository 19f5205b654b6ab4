"""Power-slack leases in a real agent process (simulated GPUs), asking a local server for its offers: the lease
is applied under its guard; when the offers cannot be read the limit returns within one lease; an agent
restarted holds none (tests/contract/test_policy_leases.py); in dry run (the default) no limit changes."""

from __future__ import annotations

import json

import pytest

from gpumond.nvml.sim.gpu import gpu_uuid
from tests.integration import helpers
from tests.unit.test_read_cli import JSON, serving

pytestmark = pytest.mark.integration

NODE = "slack-node"


def _config(tmp_path, url: str, mode: str = "enforce") -> list:
    cfg = helpers.write_yaml(tmp_path / f"agent-{mode}.yaml", {
        "state_dir": str(tmp_path / "state"), "node_name": NODE,
        "policy": {"mode": "enforce", "thermal": {"enabled": False},
                   "power_slack": {"mode": mode, "rules_url": url, "interval_s": 1, "lease_s": 5,
                                   "max_step_w": 100}},
        "sampling": {"fast_interval_s": 1, "slow_interval_s": 5}})
    return ["--sim", "2", "--sim-speed", "10", "--config", cfg]


def _limit(fams, gpu: str) -> float | None:
    return helpers.value(fams, "gpumond_gpu_power_limit_watts", gpu=gpu)


def test_a_lease_is_applied_stepwise_and_returns_when_offers_cannot_be_read(tmp_path, start_agent) -> None:
    offers = {"offers": [{"gpu_uuid": gpu_uuid(NODE, 0), "limit_w": 550, "job": "llama"}]}
    routes = {"/api/v1/power/offers": (200, JSON, json.dumps(offers).encode())}
    with serving(routes) as (url, seen):
        agent = start_agent(*_config(tmp_path, url))
        fams = agent.wait_for_metrics(lambda f: _limit(f, "0") == 550, timeout=30, what="GPU 0 leased to 550 W")
        assert _limit(fams, "1") == 700
        assert f"/api/v1/power/offers?node={NODE}" in seen
        routes["/api/v1/power/offers"] = (503, JSON, b'{"error": "down"}')
        agent.wait_for_metrics(lambda f: _limit(f, "0") == 700, timeout=30,
                               what="GPU 0 back to 700 W once its lease ran out")
        assert agent.stop() == 0
    audit = [json.loads(x) for x in (tmp_path / "state" / "policy-audit.jsonl").read_text().splitlines()]
    lowered = [e["after_w"] for e in audit if e["action"] == "set_limit" and e["after_w"] < 700]
    assert lowered == [600, 550]  # the guard: 100 W per answer
    assert "lease_end" in [e["action"] for e in audit]


def test_in_dry_run_no_limit_changes(tmp_path, start_agent) -> None:
    offers = {"offers": [{"gpu_uuid": gpu_uuid(NODE, 0), "limit_w": 450, "job": "llama"}]}
    with serving({"/api/v1/power/offers": (200, JSON, json.dumps(offers).encode())}) as (url, _):
        agent = start_agent(*_config(tmp_path, url, mode="dry_run"))
        fams = agent.wait_for_metrics(
            lambda f: helpers.value(f, "gpumond_policy_power_slack_lease_watts", gpu="0") == 450, timeout=30,
            what="the dry-run lease exported")
        assert helpers.value(fams, "gpumond_policy_power_slack_lease_watts", gpu="0", dry_run="true") == 450
        assert _limit(fams, "0") == 700 and _limit(fams, "1") == 700
        assert agent.stop() == 0
    audit = [json.loads(x) for x in (tmp_path / "state" / "policy-audit.jsonl").read_text().splitlines()]
    assert not [e for e in audit if e["action"] in ("set_limit", "reapply")]


def test_an_unreadable_token_file_is_one_line_at_start(tmp_path) -> None:
    cfg = helpers.write_yaml(tmp_path / "agent.yaml", {
        "state_dir": str(tmp_path / "state"), "node_name": NODE,
        "policy": {"power_slack": {"rules_url": "http://127.0.0.1:9/",
                                   "authorization": {"credentials_file": str(tmp_path / "missing-token")}}}})
    agent = helpers.AgentProcess.run(["--sim", "1", "--config", cfg], tmp_path / "agent")
    errors = [x for x in agent.stderr().splitlines() if x.startswith("gpumond:")]  # the logs before it aside
    assert agent.returncode == 2 and len(errors) == 1 and "Traceback" not in agent.stderr(), agent.describe()
    assert "policy.power_slack.authorization.credentials_file" in errors[0] and "missing-token" in errors[0]
