"""The remediation lifecycle and its guard (gpumond.rules.remediation.plan / faults), as pure functions."""

from __future__ import annotations

import pytest

from gpumond.config.remediation import RemediationConfig
from gpumond.rules.remediation.faults import NodeFault, agent_faults, by_node, reason_of, straggler_faults
from gpumond.rules.remediation.plan import NodeStatus, State, confirm, plan
from gpumond.rules.types import AgentAlert, Finding

ENFORCE = RemediationConfig(mode="enforce", backend="slurm", hold_down_s=60,
                            guard={"max_nodes": 2, "max_pool_fraction": 0.5, "max_drains_per_hour": 3})


def _status(*nodes: str, drained: dict[str, str] | None = None, pool: str = "gpu") -> dict[str, NodeStatus]:
    drained = drained or {}
    return {n: NodeStatus(n, pool, n in drained, drained.get(n, "").startswith("gpumond: "), drained.get(n, ""))
            for n in nodes}


def _lost(node: str, gpu: str = "3") -> tuple[NodeFault, ...]:
    return (NodeFault(node, "gpu_lost", f"GPU {gpu} lost (XID 79)", True, "GpuXidCritical"),)


def _run(state, faults, status, now, cfg=ENFORCE, **kw):
    kw.setdefault("heard", set(status))  # every agent answered, unless a test says otherwise
    state, actions = plan(state, faults, status, cfg, now, **kw)
    for a in actions:  # the backend succeeded
        state = confirm(state, a)
    return state, [(a.kind, a.node) for a in actions]


def test_agent_alerts_become_node_faults_and_a_starved_or_throttled_gpu_does_not() -> None:
    alerts = [AgentAlert("n1", {"alertname": "GpuLost", "gpu": "3", "severity": "critical"}),
              AgentAlert("n1", {"alertname": "GpuXidCritical", "gpu": "3", "xid": "79", "severity": "critical"}),
              AgentAlert("n2", {"alertname": "GpuXidCritical", "gpu": "0", "xid": "48", "severity": "critical"}),
              AgentAlert("n3", {"alertname": "GpuXidCritical", "gpu": "0", "xid": "31", "severity": "info"}),
              AgentAlert("n4", {"alertname": "GpuRowRemapFailed", "gpu": "1", "severity": "critical"}),
              AgentAlert("n5", {"alertname": "GpuSwThermalSlowdown", "gpu": "1", "severity": "warning"})]
    got = by_node(agent_faults(alerts), ("gpu_lost", "xid_critical", "row_remap_failed"))
    assert sorted(got) == ["n1", "n2", "n4"]
    assert reason_of(got["n1"]) == "gpumond: GPU 3 lost (XID 79)"
    assert [f.condition for f in got["n2"]] == ["xid_critical"]
    assert by_node(agent_faults(alerts), ("row_remap_failed",)).keys() == {"n4"}


def test_a_straggler_node_counts_only_once_it_persisted() -> None:
    f = [Finding("straggler_node", "job-1", "n1", None, None, 5.0, 0.0, "firing"),
         Finding("io_starved_job", "job-2", "n2", None, None, 5.0, 0.0, "firing")]
    faults, since = straggler_faults(f, {}, 100.0, 300.0)
    assert faults == [] and since == {"n1": 100.0}
    faults, since = straggler_faults(f, since, 400.0, 300.0)
    assert [x.node for x in faults] == ["n1"] and since == {"n1": 100.0}
    assert straggler_faults([], since, 401.0, 300.0) == ([], {})


def test_drain_then_hold_down_then_resume() -> None:
    status = _status("n1", "n2", "n3", "n4")
    state, acts = _run(State(), {"n1": _lost("n1")}, status, 0.0)
    assert acts == [("drain", "n1")] and state.records["n1"].phase == "drained"
    status = _status("n1", "n2", "n3", "n4", drained={"n1": "gpumond: GPU 3 lost (XID 79)"})
    state, acts = _run(state, {"n1": _lost("n1")}, status, 10.0)
    assert acts == []
    state, acts = _run(state, {}, status, 20.0)  # clear from 20 s
    assert acts == [] and state.records["n1"].clear_since == 20.0
    state, acts = _run(state, {"n1": _lost("n1")}, status, 50.0)  # back: the hold-down starts over
    assert acts == [] and state.records["n1"].clear_since is None
    state, acts = _run(state, {}, status, 60.0)
    state, acts = _run(state, {}, status, 119.0)
    assert acts == []
    state, acts = _run(state, {}, status, 120.0)
    assert acts == [("resume", "n1")] and state.records == {}


def test_a_node_a_person_drained_is_never_drained_over_nor_resumed() -> None:
    status = _status("n1", "n2", drained={"n1": "replacing PSU (alice)"})
    state, acts = _run(State(), {"n1": _lost("n1")}, status, 0.0)
    assert acts == [("skip", "n1")] and state.records == {}
    state, acts = _run(state, {"n1": _lost("n1")}, status, 10.0)
    assert acts == []  # reported once
    state, acts = _run(state, {}, status, 1000.0)
    assert acts == []


def test_a_person_who_resumes_or_redrains_a_node_takes_it_over() -> None:
    status = _status("n1", "n2", "n3", "n4")
    state, _ = _run(State(), {"n1": _lost("n1")}, status, 0.0)
    state, acts = _run(state, {"n1": _lost("n1")}, _status("n1", "n2", "n3", "n4", drained={"n1": "mine (bob)"}), 5.0)
    assert acts == [("release", "n1")] and state.records == {} and state.undone == ("n1",)
    state, acts = _run(state, {}, _status("n1", "n2", "n3", "n4", drained={"n1": "mine (bob)"}), 500.0)
    assert acts == []


def test_a_person_who_resumes_a_faulty_node_is_not_overridden_until_the_fault_is_seen_to_clear() -> None:
    status = _status("n1", "n2", "n3", "n4")
    drained = _status("n1", "n2", "n3", "n4", drained={"n1": "gpumond: GPU 3 lost (XID 79)"})
    state, _ = _run(State(), {"n1": _lost("n1")}, status, 0.0)
    state, acts = _run(state, {"n1": _lost("n1")}, status, 5.0)  # scontrol update NodeName=n1 State=RESUME
    assert acts == [("release", "n1")]
    for t in (5.5, 10.0, 3000.0):  # the GPU is still lost: no re-drain, none counted against the guard
        state, acts = _run(state, {"n1": _lost("n1")}, status, t)
        assert acts == [] and state.drains == (0.0,)
    state, acts = _run(state, {}, status, 3700.0, heard={"n2"})  # n1's agent silent: not seen clear
    state, acts = _run(state, {"n1": _lost("n1")}, status, 3710.0)
    assert acts == [] and state.undone == ("n1",)
    state, acts = _run(state, {}, status, 3720.0)  # heard clear: the person's decision has run its course
    assert state.undone == ()
    state, acts = _run(state, {"n1": _lost("n1")}, status, 3730.0)  # a new fault is drained again
    assert acts == [("drain", "n1")]
    state, acts = _run(state, {"n1": _lost("n1")}, drained, 3731.0)
    assert acts == [] and state.records["n1"].phase == "drained"


def test_missing_data_never_counts_as_clear() -> None:
    status = _status("n1", "n2", "n3", "n4")
    drained = _status("n1", "n2", "n3", "n4", drained={"n1": "gpumond: GPU 3 lost (XID 79)"})
    state, _ = _run(State(), {"n1": _lost("n1")}, status, 0.0)
    # A restart: no agent heard yet, so no fault is known, and none of that counts as clear.
    for t in (10.0, 100.0, 1000.0):
        state, acts = _run(state, {}, drained, t, heard=set())
        assert acts == [] and state.records["n1"].clear_since is None
    # Heard clear from 1010 s; silent again at 1040 s: the hold-down starts over when it is heard again.
    state, _ = _run(state, {}, drained, 1010.0)
    state, _ = _run(state, {}, drained, 1040.0, heard={"n2", "n3"})
    assert state.records["n1"].clear_since is None
    state, acts = _run(state, {}, drained, 1050.0)
    state, acts = _run(state, {}, drained, 1109.0)
    assert acts == []
    state, acts = _run(state, {}, drained, 1110.0)
    assert acts == [("resume", "n1")]


def test_a_gpumond_drain_with_no_record_is_adopted_and_returned_after_the_hold_down() -> None:
    drained = _status("n1", "n2", "n3", "n4", drained={"n2": "gpumond: GPU 1 lost (XID 79)"})
    state, acts = _run(State(), {}, drained, 0.0)  # the state file was lost; the fault has cleared
    assert acts == [("adopt", "n2")] and state.records["n2"].reason == "gpumond: GPU 1 lost (XID 79)"
    state, acts = _run(state, {}, drained, 30.0)
    state, acts = _run(state, {}, drained, 90.0)
    assert acts == [("resume", "n2")] and state.records == {}
    # The health check acts on its own node only: another node's drain is not its to adopt.
    state, acts = _run(State(), {}, drained, 0.0, scope={"n1"})
    assert acts == [] and state.records == {}


def test_a_drain_the_scheduler_shows_done_is_confirmed_without_a_second_call() -> None:
    state, _ = plan(State(), {"n1": _lost("n1")}, _status("n1", "n2"), ENFORCE, 0.0, heard={"n1", "n2"})
    assert state.records["n1"].phase == "draining"  # the call timed out, but slurmctld took it
    state, actions = plan(state, {"n1": _lost("n1")}, _status("n1", "n2", drained={"n1": "gpumond: x"}), ENFORCE,
                          5.0, heard={"n1", "n2"})
    assert actions == [] and state.records["n1"].phase == "drained"


def test_a_breaker_dry_run_opened_is_marked_and_dropped_by_enforce() -> None:
    dry = RemediationConfig(hold_down_s=10, guard={"max_nodes": 1, "max_pool_fraction": 1.0})
    state, acts = _run(State(), {"n1": _lost("n1"), "n2": _lost("n2")}, _status("n1", "n2"), 0.0, dry)
    assert acts == [("drain", "n1"), ("refuse", "n2")] and state.breaker is not None and state.breaker.dry_run
    enforce = ENFORCE.model_copy(update={"guard": dry.guard})
    state, acts = _run(state, {"n1": _lost("n1"), "n2": _lost("n2")}, _status("n1", "n2"), 10.0, enforce)
    # What dry run imagined is gone (its drain and its breaker); enforce decides for itself, and its own refusal
    # opens a real breaker.
    assert acts == [("drain", "n1"), ("refuse", "n2")]
    assert state.breaker is not None and not state.breaker.dry_run and state.breaker.opened_at == 10.0


@pytest.mark.parametrize(("guard", "why"), [
    ({"max_nodes": 1, "max_pool_fraction": 1.0, "max_drains_per_hour": 10}, "guard.max_nodes 1"),
    ({"max_nodes": 10, "max_pool_fraction": 0.25, "max_drains_per_hour": 10}, "guard.max_pool_fraction 0.25"),
    ({"max_nodes": 10, "max_pool_fraction": 1.0, "max_drains_per_hour": 1}, "guard.max_drains_per_hour 1"),
])
def test_the_guard_refuses_the_drain_over_its_limit_and_opens_the_breaker(guard, why) -> None:
    cfg = ENFORCE.model_copy(update={"guard": ENFORCE.guard.model_copy(update=guard)})
    status = _status("n1", "n2", "n3", "n4")
    state, acts = _run(State(), {"n1": _lost("n1"), "n2": _lost("n2")}, status, 0.0, cfg)
    assert acts == [("drain", "n1"), ("refuse", "n2")]
    assert state.breaker is not None and why in state.breaker.why
    # open: nothing else happens, not even the resume of n1 after its hold-down, until an operator resets it
    state, acts = _run(state, {"n3": _lost("n3")}, _status("n1", "n2", "n3", "n4", drained={"n1": "gpumond: x"}),
                       500.0, cfg)
    assert acts == [("refuse", "n3")] and set(state.records) == {"n1"}
    state, acts = _run(state, {}, _status("n1", "n2", "n3", "n4", drained={"n1": "gpumond: x"}), 600.0, cfg,
                       reset_breaker=True)
    assert acts == [("breaker_reset", ""), ("resume", "n1")] and state.breaker is None


def test_the_rate_limit_counts_drains_of_the_last_hour_only() -> None:
    cfg = ENFORCE.model_copy(update={"guard": ENFORCE.guard.model_copy(update={"max_drains_per_hour": 1,
                                                                                 "max_pool_fraction": 1.0})})
    status = _status("n1", "n2")
    state, _ = _run(State(), {"n1": _lost("n1")}, status, 0.0, cfg)
    state, acts = _run(state, {}, _status("n1", "n2", drained={"n1": "gpumond: x"}), 100.0, cfg)
    state, acts = _run(state, {}, _status("n1", "n2", drained={"n1": "gpumond: x"}), 200.0, cfg)
    assert acts == [("resume", "n1")]
    state, acts = _run(state, {"n2": _lost("n2")}, status, 3601.0, cfg)
    assert acts == [("drain", "n2")]


def test_an_interrupted_drain_is_driven_again_not_forgotten() -> None:
    state, actions = plan(State(), {"n1": _lost("n1")}, _status("n1", "n2", "n3", "n4"), ENFORCE, 0.0, heard={"n1"})
    assert state.records["n1"].phase == "draining"  # the process died before the backend answered
    state, actions = plan(state, {"n1": _lost("n1")}, _status("n1", "n2", "n3", "n4"), ENFORCE, 5.0, heard={"n1"})
    assert [(a.kind, a.retry) for a in actions] == [("drain", True)] and len(state.drains) == 1


def test_dry_run_plans_the_same_and_marks_it() -> None:
    cfg = RemediationConfig(hold_down_s=10)
    assert cfg.mode == "dry_run"
    state, actions = plan(State(), {"n1": _lost("n1")}, _status("n1"), cfg, 0.0, heard={"n1"})
    assert [(a.kind, a.dry_run) for a in actions] == [("drain", True)] and state.records["n1"].dry_run


def test_undo_returns_the_node_and_leaves_it_alone_until_its_faults_clear() -> None:
    status = _status("n1", "n2", "n3", "n4")
    state, _ = _run(State(), {"n1": _lost("n1")}, status, 0.0)
    drained = _status("n1", "n2", "n3", "n4", drained={"n1": "gpumond: x"})
    state, acts = _run(state, {"n1": _lost("n1")}, drained, 5.0, undo=("n1",))
    assert acts == [("undo", "n1")] and state.undone == ("n1",) and state.records == {}
    state, acts = _run(state, {"n1": _lost("n1")}, status, 10.0)
    assert acts == []
    state, acts = _run(state, {}, status, 20.0)
    assert state.undone == ()
    state, acts = _run(state, {"n1": _lost("n1")}, status, 30.0)
    assert acts == [("drain", "n1")]


def test_enforce_without_a_backend_is_a_config_error() -> None:
    with pytest.raises(ValueError, match="mode enforce needs a backend"):
        RemediationConfig(mode="enforce")


def test_nodes_drained_by_gpumond_elsewhere_count_against_the_guard() -> None:
    cfg = ENFORCE.model_copy(update={"guard": ENFORCE.guard.model_copy(update={"max_nodes": 1,
                                                                                 "max_pool_fraction": 1.0})})
    status = _status("n1", "n2", drained={"n2": "gpumond: GPU 0 lost"})  # the health-check of n2 drained it
    state, acts = _run(State(), {"n1": _lost("n1")}, status, 0.0, cfg)
    assert acts == [("refuse", "n1"), ("adopt", "n2")]  # adopted: it returns once its agent is heard clear
