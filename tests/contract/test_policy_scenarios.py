"""The policy engine through the real pynvml over the simulated NVML: scenario by scenario, audit checked."""

import json
import logging

import pynvml
import pytest

from gpumond.agent.policy.view import build_views
from tests.contract.policy_rig import HOT, make


def test_degraded_cooling_is_held_just_under_target_without_hw_slowdown(tmp_path, rigs):
    r = make(rigs, tmp_path, scenario=HOT).run(600)
    hot, ok = r.sim.gpus
    target = 89 - 5  # simulated H100: slowdown 89 °C, default margin 5 °C
    assert hot.power_limit_w < 700 and ok.power_limit_w == 700
    hw_before = hot.violation_ns[0x40]
    temps = [r.run(1).sim.gpus[0].temperature_c for _ in range(600)]
    assert max(temps) <= target + 1
    assert hot.violation_ns[0x40] == hw_before == 0
    assert r.value("gpumond_policy_power_limit_target_watts", gpu="0") == pytest.approx(hot.power_limit_w, abs=1)
    entries = r.audit()
    assert entries and all(e["action"] == "set_limit" and e["gpu"] == 0 for e in entries)
    for e in entries:  # every line is complete: before/after, reason, agent time
        assert e["after_w"] < e["before_w"] or "raising" in e["reason"] or "giving back" in e["reason"] \
            or e["after_w"] > e["before_w"]
        assert e["reason"] and e["agent_time"] > 0 and e["uuid"] == hot.uuid


def test_hot_inlet_caps_every_gpu_then_limits_climb_back(tmp_path, rigs):
    scenario = {"faults": [{"kind": "inlet", "gpu": "all", "delta_c": 20, "at_s": 60, "duration_s": 900}]}
    r = make(rigs, tmp_path, scenario=scenario).run(900)
    assert all(g.power_limit_w < 700 for g in r.sim.gpus)
    r.run(1800)
    assert all(g.power_limit_w == 700 for g in r.sim.gpus)


def test_gpu_lost_while_capped_is_left_alone_and_its_peer_still_controlled(tmp_path, rigs):
    scenario = {"faults": [{"gpu": g, "kind": "cooling", "factor": 1.6, "at_s": 0} for g in (0, 1)]}
    r = make(rigs, tmp_path, scenario=scenario).run(300)
    assert all(g.power_limit_w < 700 for g in r.sim.gpus)
    r.sim.inject({"kind": "lost", "gpu": 0})
    before = len(r.audit())
    r.run(300)
    assert all(e["gpu"] == 1 for e in r.audit()[before:])
    r.engine.stop()
    last = r.audit()[-2:]
    assert {(e["action"], e["gpu"]) for e in last} == {("restore_failed", 0), ("restore", 1)}
    state = json.loads((tmp_path / "state.json").read_text())["gpus"]
    lost = state[r.sim.gpus[0].uuid]
    assert lost["original_w"] == 700 and lost["last_set_w"] < 700  # kept for the next start


def test_no_permission_falls_back_to_dry_run_with_one_warning(tmp_path, rigs, caplog):
    caplog.set_level(logging.WARNING, logger="gpumond.policy")
    r = make(rigs, tmp_path, scenario=HOT, allow_set=False).run(600)
    assert r.sim.gpus[0].power_limit_w == 700
    warnings = [x for x in caplog.records if "falls back to dry_run" in x.getMessage()]
    assert len(warnings) == 1
    assert r.value("gpumond_policy_dry_run_fallback", gpu="0") == 1.0
    assert r.value("gpumond_policy_dry_run_fallback", gpu="1") == 0.0
    actions = [e["action"] for e in r.audit()]
    assert actions[0] == "no_permission" and set(actions[1:]) <= {"dry_run"} and len(actions) >= 2


def test_persistent_limit_applied_and_drift_reapplied(tmp_path, rigs):
    policy = {"power_limit": {"per_gpu": {"0": 500, "1": "80%"}}, "thermal": {"enabled": False}}
    r = make(rigs, tmp_path, policy=policy).run(2)
    assert [g.power_limit_w for g in r.sim.gpus] == [500, 560]
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    pynvml.nvmlDeviceSetPowerManagementLimit(h, 650_000)  # someone else's nvidia-smi -pl
    r.run(2)
    assert r.sim.gpus[0].power_limit_w == 500
    reapply = [e for e in r.audit() if e["action"] == "reapply"]
    assert len(reapply) == 1 and reapply[0]["before_w"] == 650 and "drifted" in reapply[0]["reason"]
    assert r.value("gpumond_policy_actions_total", action="reapply") == 1


def test_dry_run_logs_and_counts_but_never_sets(tmp_path, rigs):
    r = make(rigs, tmp_path, scenario=HOT, policy={"mode": "dry_run"}).run(600)
    assert r.sim.gpus[0].power_limit_w == 700
    assert r.value("gpumond_policy_actions_total", action="dry_run") >= 1
    assert {e["action"] for e in r.audit()} == {"dry_run"}


def test_limit_outside_the_gpu_constraints_is_a_clear_start_error(tmp_path, rigs):
    r = make(rigs, tmp_path, policy={"power_limit": {"per_gpu": {"1": 900}}})
    problems = r.engine.check(build_views(r.session.read("fast"), r.slow))
    assert len(problems) == 1 and "900" in problems[0] and "700" in problems[0] and 'per_gpu["1"]' in problems[0]


def test_restart_after_a_crash_keeps_the_true_original_and_resumes(tmp_path, rigs):
    r = make(rigs, tmp_path, scenario=HOT).run(600)
    capped = r.sim.gpus[0].power_limit_w
    assert capped < 700
    # SIGKILL: no stop(); a new agent process starts on the same (still capped) GPUs and state dir
    r2 = make(rigs, tmp_path, sim=r.sim, clock=r.clock)
    r2.run(5)
    state = json.loads((tmp_path / "state.json").read_text())["gpus"][r.sim.gpus[0].uuid]
    assert state["original_w"] == 700  # not the capped value
    assert any(e["action"] == "resume" for e in r2.audit())
    r.sim.inject({"kind": "cooling", "gpu": 0, "factor": 0.6})  # cooling fixed: the live controller gives back
    r2.run(1800)
    assert r.sim.gpus[0].power_limit_w == 700


def test_restart_with_policy_off_restores_what_the_dead_run_capped(tmp_path, rigs):
    r = make(rigs, tmp_path, scenario=HOT).run(600)
    assert r.sim.gpus[0].power_limit_w < 700
    r2 = make(rigs, tmp_path, sim=r.sim, clock=r.clock, policy={"mode": "off"})
    r2.run(2)
    assert r.sim.gpus[0].power_limit_w == 700
    restore = [e for e in r2.audit() if e["action"] == "restore"]
    assert len(restore) == 1 and restore[0]["after_w"] == 700


def test_sigterm_path_restores_originals(tmp_path, rigs):
    r = make(rigs, tmp_path, scenario=HOT).run(600)
    assert r.sim.gpus[0].power_limit_w < 700
    r.engine.stop()
    assert r.sim.gpus[0].power_limit_w == 700
    assert r.audit()[-1]["action"] == "restore"


def test_alerts_raised_for_xid_ecc_and_lost_gpu(tmp_path, rigs):
    scenario = {"faults": [{"gpu": 1, "kind": "ecc_uncorrected", "count": 2, "at_s": 100}]}
    r = make(rigs, tmp_path, scenario=scenario, policy={"thermal": {"enabled": False}}).run(40)
    r.run(100, xids={(0, 48): 1})
    names = {(dict(s.labels)["alertname"], dict(s.labels)["gpu"]) for s in r.series if s.name == "gpumond_alert_active"}
    assert ("GpuXidCritical", "0") in names
    assert ("GpuEccUncorrectedIncreasing", "1") in names and ("GpuRowRemapPending", "1") in names
    r.sim.inject({"kind": "lost", "gpu": 0})
    r.run(30, xids={(0, 48): 1, (0, 79): 1})
    names = {(dict(s.labels)["alertname"], dict(s.labels)["gpu"], dict(s.labels)["xid"])
             for s in r.series if s.name == "gpumond_alert_active"}
    assert ("GpuLost", "0", "") in names and ("GpuXidCritical", "0", "79") in names


def test_policy_off_claims_no_target(tmp_path, rigs):
    policy = {"mode": "off", "power_limit": {"per_gpu": {"0": 500}}}
    r = make(rigs, tmp_path, scenario=HOT, policy=policy).run(120)
    assert r.sim.gpus[0].power_limit_w == 700  # nothing acts in off…
    assert r.value("gpumond_policy_power_limit_target_watts", gpu="0") is None  # …so nothing claims a target
    assert r.value("gpumond_policy_power_limit_target_watts") is None
    assert r.value("gpumond_policy_mode", mode="off") == 1.0


def test_a_lost_gpu_has_no_target(tmp_path, rigs):
    r = make(rigs, tmp_path, policy={"power_limit": {"per_gpu": {"0": 500}}}).run(2)
    assert r.value("gpumond_policy_power_limit_target_watts", gpu="0") == 500
    r.sim.inject({"kind": "lost", "gpu": 0})
    r.run(2)
    assert r.value("gpumond_policy_power_limit_target_watts", gpu="0") is None


def test_a_gpu_lost_when_the_agent_stops_is_restored_at_the_next_start(tmp_path, rigs):
    r = make(rigs, tmp_path, scenario=HOT).run(600)
    assert r.sim.gpus[0].power_limit_w < 700
    r.sim.inject({"kind": "lost", "gpu": 0, "duration_s": 60})
    r.run(2)
    r.engine.stop()  # SIGTERM with restore_on_exit: GPU 0 cannot be restored now
    assert r.audit()[-1]["action"] == "restore_failed"
    assert json.loads((tmp_path / "state.json").read_text())["gpus"][r.sim.gpus[0].uuid]["restore_pending"]
    r.session.close()
    r.clock.advance(120)  # the GPU is back (reset by an operator) before the agent starts again
    seen = len(r.audit())
    r2 = make(rigs, tmp_path, sim=r.sim, clock=r.clock)  # the same config: enforce, thermal capping
    r2.run(1)
    first = [e for e in r2.audit()[seen:] if e["gpu"] == 0][:2]
    assert [e["action"] for e in first] == ["resume", "restore"], first
    assert first[1]["after_w"] == 700 and "previous run stopped" in first[1]["reason"]
    record = json.loads((tmp_path / "state.json").read_text())["gpus"][r.sim.gpus[0].uuid]
    assert record == {"original_w": 700.0, "last_set_w": None, "restore_pending": False}
