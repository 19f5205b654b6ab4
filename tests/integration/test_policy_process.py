"""The policy in a real agent process: it caps a hot GPU, SIGTERM restores, SIGKILL + restart keeps the original."""

import json
import signal

import pytest

from tests.integration import helpers

pytestmark = pytest.mark.integration


def _setup(tmp_path):
    state = tmp_path / "state"
    cfg = helpers.write_yaml(tmp_path / "agent.yaml", {
        "state_dir": str(state), "node_name": "policy-node", "policy": {"mode": "enforce"},
        "sampling": {"fast_interval_s": 1, "slow_interval_s": 5},
    })
    scenario = helpers.write_yaml(tmp_path / "hot.yaml", {
        "faults": [{"gpu": 1, "kind": "cooling", "factor": 1.7, "at_s": 0}]})
    return state, ["--sim", "2", "--sim-speed", "20", "--config", cfg, "--sim-scenario", scenario]


def _capped(fams):
    v = helpers.value(fams, "gpumond_gpu_power_limit_watts", gpu="1")
    return v is not None and v < 700


def test_sigterm_restores_the_original_limit_and_audits_it(tmp_path, start_agent):
    state, args = _setup(tmp_path)
    agent = start_agent(*args)
    fams = agent.wait_for_metrics(_capped, timeout=30, what="GPU 1 capped by the thermal policy")
    assert helpers.value(fams, "gpumond_gpu_power_limit_watts", gpu="0") == 700
    assert helpers.value(fams, "gpumond_policy_actions_total", action="set_limit") >= 1
    assert agent.stop() == 0
    lines = [json.loads(x) for x in (state / "policy-audit.jsonl").read_text().splitlines()]
    assert lines[0]["action"] == "set_limit" and lines[0]["before_w"] == 700 and lines[0]["gpu"] == 1
    assert lines[-1]["action"] == "restore" and lines[-1]["after_w"] == 700
    recorded = json.loads((state / "policy-state.json").read_text())["gpus"]
    assert all(r["original_w"] == 700 and r["last_set_w"] is None for r in recorded.values())


def test_sigkill_then_restart_keeps_the_true_original(tmp_path, start_agent):
    state, args = _setup(tmp_path)
    first = start_agent(*args, name="first")
    first.wait_for_metrics(_capped, timeout=30, what="GPU 1 capped by the thermal policy")
    first.stop(sig=signal.SIGKILL)
    recorded = json.loads((state / "policy-state.json").read_text())["gpus"]
    capped = [r for r in recorded.values() if r["last_set_w"] is not None]
    assert len(capped) == 1 and capped[0]["original_w"] == 700 and capped[0]["last_set_w"] < 700
    # The simulated driver starts fresh in a new process (as after a driver reload): the new agent sees
    # 700 W, keeps the recorded original, notes the change, and its live controller caps the hot GPU again.
    second = start_agent(*args, name="second")
    second.wait_for_metrics(_capped, timeout=30, what="GPU 1 capped again by the restarted agent")
    assert second.stop() == 0
    lines = [json.loads(x) for x in (state / "policy-audit.jsonl").read_text().splitlines()]
    assert any(e["action"] == "found_changed" for e in lines)
    assert lines[-1]["action"] == "restore" and lines[-1]["after_w"] == 700
