"""The remediation component: restart safety, dry run, audit and metrics (backend: a recording stand-in; the
real Slurm and Kubernetes backends are exercised in tests/integration/test_remediation_*.py)."""

from __future__ import annotations

import json
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from gpumond.config.remediation import RemediationConfig
from gpumond.rules.remediation.backends import BackendError
from gpumond.rules.remediation.plan import NodeStatus
from gpumond.rules.remediation.remediator import Remediator
from gpumond.rules.types import AgentAlert, GpuSample, TelemetryBatch

ENFORCE = RemediationConfig(mode="enforce", backend="slurm", hold_down_s=10,
                            guard={"max_nodes": 1, "max_pool_fraction": 1.0, "max_drains_per_hour": 5})
XID79 = {"alertname": "GpuXidCritical", "severity": "critical", "gpu": "3", "xid": "79"}


class Crash(Exception):
    """The process dies in the middle of a backend call."""


class Scheduler:
    name = "slurm"

    def __init__(self, nodes: list[str]) -> None:
        self.state = {n: NodeStatus(n, "gpu", False, False) for n in nodes}
        self.calls: list[tuple[str, str]] = []
        self.crash_on_drain = False

    def nodes(self) -> dict[str, NodeStatus]:
        return dict(self.state)

    def drain(self, node: str, reason: str, fatal: bool) -> None:
        self.calls.append(("drain", node))
        self.state[node] = NodeStatus(node, "gpu", True, True, reason)
        if self.crash_on_drain:
            raise Crash

    def resume(self, node: str) -> None:
        self.calls.append(("resume", node))
        self.state[node] = NodeStatus(node, "gpu", False, False)


def _batch(t: float, *alerting: str, lost: tuple[str, ...] = ()) -> TelemetryBatch:
    gpus = tuple(GpuSample(f"GPU-{n}", n, "3", t, n not in lost) for n in ("n1", "n2", "n3"))
    return TelemetryBatch(t=t, gpus=gpus, alerts=tuple(AgentAlert(n, XID79) for n in alerting))


def _audit(path: Path) -> list[dict[str, object]]:
    return [json.loads(x) for x in (path / "remediation-audit.jsonl").read_text().splitlines()]


def test_a_restart_neither_repeats_nor_forgets_a_drain(tmp_path: Path) -> None:
    sched, now = Scheduler(["n1", "n2", "n3"]), [0.0]
    sched.crash_on_drain = True
    first = Remediator.build(ENFORCE, tmp_path, sched, clock=lambda: now[0])
    first.observe(_batch(0.0, "n1"))
    with pytest.raises(Crash):
        first.step([])  # dies after scontrol drained, before it recorded the outcome
    sched.crash_on_drain = False
    second = Remediator.build(ENFORCE, tmp_path, sched, clock=lambda: now[0])
    assert second.state.records["n1"].phase == "draining"  # not forgotten
    second.observe(_batch(1.0, "n1"))
    assert second.step([]) == []  # the scheduler shows it drained by gpumond: confirmed, not called again
    assert second.state.records["n1"].phase == "drained" and len(second.state.drains) == 1
    third = Remediator.build(ENFORCE, tmp_path, sched, clock=lambda: now[0])
    third.observe(_batch(2.0, "n1"))
    assert third.step([]) == []  # not repeated
    assert sched.calls == [("drain", "n1")]
    sched.state["n1"] = NodeStatus("n1", "gpu", False, False)  # crashed before scontrol: the drain is re-driven
    fourth = Remediator.build(ENFORCE, tmp_path, sched, clock=lambda: now[0])
    fourth._file.save(replace(fourth.state, records={"n1": replace(fourth.state.records["n1"], phase="draining")}))
    fourth = Remediator.build(ENFORCE, tmp_path, sched, clock=lambda: now[0])
    fourth.observe(_batch(3.0, "n1"))
    assert [(a.kind, a.node, a.retry) for a in fourth.step([])] == [("drain", "n1", True)]


def test_held_while_a_gpu_reads_lost_then_hold_down_then_resume(tmp_path: Path) -> None:
    sched, now = Scheduler(["n1", "n2", "n3"]), [0.0]
    rem = Remediator.build(ENFORCE, tmp_path, sched, clock=lambda: now[0])
    rem.observe(_batch(0.0, "n1", lost=("n1",)))
    rem.step([])
    for t in (5.0, 20.0, 40.0):  # the XID alert expired, the GPU still reads lost
        now[0] = t
        rem.observe(_batch(t, lost=("n1",)))
        assert rem.step([]) == []
    now[0] = 50.0
    rem.observe(_batch(50.0))  # back
    assert rem.step([]) == []
    now[0] = 60.0
    rem.observe(_batch(60.0))
    assert [(a.kind, a.node) for a in rem.step([])] == [("resume", "n1")]
    assert sched.calls == [("drain", "n1"), ("resume", "n1")]


def test_an_unreachable_agent_neither_drains_nor_returns_its_node(tmp_path: Path) -> None:
    sched, now = Scheduler(["n1", "n2", "n3"]), [0.0]
    rem = Remediator.build(ENFORCE, tmp_path, sched, clock=lambda: now[0])
    rem.observe(_batch(0.0, "n1"))
    rem.step([])
    now[0] = 100.0
    rem.observe(TelemetryBatch(t=100.0, absent_nodes=frozenset({"n1"})))
    assert rem.step([]) == [] and "n1" in rem.state.records


def test_dry_run_calls_no_backend_and_says_would(tmp_path: Path) -> None:
    sched = Scheduler(["n1", "n2", "n3"])
    rem = Remediator.build(RemediationConfig(backend="slurm"), tmp_path, sched, clock=lambda: 0.0)
    rem.observe(_batch(0.0, "n1"))
    rem.step([])
    assert sched.calls == []
    (entry,) = _audit(tmp_path)
    assert entry["action"] == "would_drain" and entry["node"] == "n1" and entry["mode"] == "dry_run"
    assert entry["why"] == "gpumond: GPU 3 lost (XID 79)" and entry["result"] == "ok"
    (cond,) = rem.conditions()
    assert dict(cond.annotations)["action"] == "would_drain"
    assert "would be drained (dry run)" in dict(cond.annotations)["summary"]


def test_a_failing_backend_call_is_audited_and_retried(tmp_path: Path) -> None:
    sched, now = Scheduler(["n1", "n2", "n3"]), [0.0]

    def refuse(node: str, reason: str, fatal: bool) -> None:
        raise BackendError("slurm: scontrol update NodeName=n1 failed (exit 1): Invalid node state")

    sched.drain = refuse  # type: ignore[method-assign]
    rem = Remediator.build(ENFORCE, tmp_path, sched, clock=lambda: now[0])
    rem.observe(_batch(0.0, "n1"))
    rem.step([])
    assert rem.state.records["n1"].phase == "draining"
    assert _audit(tmp_path)[0]["result"].startswith("error: slurm: scontrol update")
    series = {(s.name, s.labels): s.value for s in rem.series()}
    assert series[("gpumond_remediation_actions_total", (("action", "drain"), ("result", "error")))] == 1.0


def test_the_guard_refusal_is_audited_exported_and_pages(tmp_path: Path) -> None:
    sched = Scheduler(["n1", "n2", "n3"])
    rem = Remediator.build(ENFORCE, tmp_path, sched, clock=lambda: 0.0)
    rem.observe(_batch(0.0, "n1", "n2"))
    rem.step([])
    assert sched.calls == [("drain", "n1")]
    refused = [e for e in _audit(tmp_path) if e["action"] == "refuse"]
    assert [e["node"] for e in refused] == ["n2"] and "guard.max_nodes 1" in str(refused[0]["why"])
    names = [dict(c.labels)["alertname"] for c in rem.conditions()]
    assert names == ["GpumondNodeDrained", "GpumondRemediationHalted"]
    series = {(s.name, s.labels): s.value for s in rem.series()}
    assert series[("gpumond_remediation_breaker_open", (("dry_run", "false"),))] == 1.0
    halted = rem.conditions()[-1]
    assert dict(halted.labels) == {"alertname": "GpumondRemediationHalted", "severity": "critical",
                                   "dry_run": "false"}


def test_unreadable_alerts_keep_the_last_word(tmp_path: Path) -> None:
    sched, now = Scheduler(["n1", "n2", "n3"]), [0.0]
    rem = Remediator.build(ENFORCE.model_copy(update={"hold_down_s": 0}), tmp_path, sched, clock=lambda: now[0])
    rem.observe(_batch(0.0, "n1"))
    rem.step([])
    now[0] = 100.0
    unknown = _batch(100.0)
    rem.observe(TelemetryBatch(t=100.0, gpus=unknown.gpus, alerts_known=False))  # the alerts query failed
    assert rem.step([]) == [] and "n1" in rem.state.records


def test_a_restart_never_returns_a_node_whose_agent_is_silent(tmp_path: Path) -> None:
    sched, now = Scheduler(["n1", "n2", "n3"]), [0.0]
    first = Remediator.build(ENFORCE, tmp_path, sched, clock=lambda: now[0])
    first.observe(_batch(0.0, "n1", lost=("n1",)))
    first.step([])
    assert sched.state["n1"].drained
    # The service restarts; n1's agent has stopped (absent from every batch), the others answer.
    second = Remediator.build(ENFORCE, tmp_path, sched, clock=lambda: now[0])
    for t in (10.0, 30.0, 300.0):
        now[0] = t
        second.observe(TelemetryBatch(t=t, gpus=_batch(t).gpus[1:], absent_nodes=frozenset({"n1"})))
        assert second.step([]) == [] and second.state.records["n1"].clear_since is None
    assert sched.state["n1"].drained and sched.calls == [("drain", "n1")]
    for t in (310.0, 320.0):  # the agent is back and reads every GPU: the hold-down runs from 310 s
        now[0] = t
        second.observe(_batch(t))
        acts = second.step([])
    assert [(a.kind, a.node) for a in acts] == [("resume", "n1")]


class Hanging(Scheduler):
    """scontrol hangs (a wrapper that sleeps): each drain blocks until released, then times out."""

    def __init__(self, nodes: list[str]) -> None:
        super().__init__(nodes)
        self.entered = threading.Event()
        self.release = threading.Event()

    def drain(self, node: str, reason: str, fatal: bool) -> None:
        self.calls.append(("drain", node))
        self.entered.set()
        self.release.wait(10)
        raise BackendError("slurm: scontrol update NodeName=n1 timed out after 10 s (is slurmctld up?)")


def test_a_hanging_scheduler_never_stalls_telemetry_and_a_failing_drain_is_not_reported_done(tmp_path: Path) -> None:
    sched, now = Hanging(["n1", "n2", "n3"]), [0.0]
    rem = Remediator.build(ENFORCE.model_copy(update={"backend_down_after_s": 20.0}), tmp_path, sched,
                           clock=lambda: now[0])
    rem.observe(_batch(0.0, "n1"))
    step = threading.Thread(target=rem.step, args=([],))
    step.start()
    try:
        assert sched.entered.wait(5)
        # The step is stuck in scontrol: telemetry and the evaluation's reads go on at once.
        done = threading.Event()
        threading.Thread(target=lambda: (rem.observe(_batch(1.0, "n1")), rem.conditions(), rem.series(),
                                         done.set()), daemon=True).start()
        assert done.wait(2), "observe/conditions/series waited on the scheduler call"
    finally:
        sched.release.set()
        step.join(10)
    names = [dict(c.labels)["alertname"] for c in rem.conditions()]
    assert names == []  # decided, not done: no "drained" page
    series = {(s.name, s.labels): s.value for s in rem.series()}
    assert not any(name == "gpumond_remediation_node_drained" for name, _ in series)
    assert series[("gpumond_remediation_node_pending", (("node", "n1"), ("action", "drain")))] == 1.0
    assert series[("gpumond_remediation_backend_up", (("backend", "slurm"),))] == 0.0
    now[0] = 25.0  # still failing after backend_down_after_s: it pages
    sched.release.set()
    rem.step([])
    (down,) = rem.conditions()
    assert dict(down.labels) == {"alertname": "GpumondRemediationBackendDown", "severity": "critical",
                                 "backend": "slurm", "dry_run": "false"}
    assert "n1" in dict(down.annotations)["summary"] and "timed out" in dict(down.annotations)["description"]
    # The scheduler answers again: the drain is done, reported, and the backend alert ends.
    sched.drain = Scheduler.drain.__get__(sched)  # type: ignore[method-assign]
    now[0] = 30.0
    rem.step([])
    assert [dict(c.labels)["alertname"] for c in rem.conditions()] == ["GpumondNodeDrained"]
    assert {(s.name, s.labels): s.value for s in rem.series()}[("gpumond_remediation_backend_up",
                                                                  (("backend", "slurm"),))] == 1.0


def test_a_dry_run_refusal_is_marked_and_does_not_page_critical(tmp_path: Path) -> None:
    sched = Scheduler(["n1", "n2", "n3"])
    dry = RemediationConfig(backend="slurm", guard={"max_nodes": 1, "max_pool_fraction": 1.0})
    rem = Remediator.build(dry, tmp_path, sched, clock=lambda: 0.0)
    rem.observe(_batch(0.0, "n1", "n2"))
    rem.step([])
    halted = rem.conditions()[-1]
    labels, ann = dict(halted.labels), dict(halted.annotations)
    assert labels == {"alertname": "GpumondRemediationHalted", "severity": "warning", "dry_run": "true"}
    assert "(dry run)" in ann["summary"] and "nothing was drained or refused for real" in ann["description"]
    asked = Remediator.build(dry.model_copy(update={"dry_run_severity": "critical"}), tmp_path, sched,
                             clock=lambda: 0.0)
    assert dict(asked.conditions()[-1].labels)["severity"] == "critical"  # the operator asked for pages


def _quiet(t: float) -> TelemetryBatch:
    return _batch(t)


def test_a_person_s_decision_runs_out_once_heard_clear_even_when_the_fleet_is_quiet(tmp_path: Path) -> None:
    sched, now = Scheduler(["n1", "n2", "n3"]), [0.0]
    rem = Remediator.build(ENFORCE, tmp_path, sched, clock=lambda: now[0])
    rem.observe(_batch(0.0, "n1"))
    rem.step([])
    from gpumond.rules.remediation.requests import write_undo
    write_undo(tmp_path, "n1", "alice")
    now[0] = 5.0
    rem.observe(_batch(5.0, "n1"))
    assert [(a.kind, a.node) for a in rem.step([])] == [("undo", "n1")]
    for t in (10.0, 20.0, 30.0):  # the fault cleared; nothing else is going on anywhere
        now[0] = t
        rem.observe(_quiet(t))
        rem.step([])
    assert rem.state.undone == ()
    now[0] = 100.0
    rem.observe(_batch(100.0, "n1"))  # a new fault: drained as any other
    assert [(a.kind, a.node) for a in rem.step([])] == [("drain", "n1")]


def test_an_orphan_gpumond_drain_is_adopted_while_nothing_else_happens(tmp_path: Path) -> None:
    sched, now = Scheduler(["n1", "n2", "n3"]), [0.0]
    sched.state["n2"] = NodeStatus("n2", "gpu", True, True, "gpumond: GPU 0 lost (XID 79)")  # state was lost
    rem = Remediator.build(ENFORCE, tmp_path, sched, clock=lambda: now[0])
    rem.observe(_quiet(0.0))
    assert [(a.kind, a.node) for a in rem.step([])] == [("adopt", "n2")]
    for t in (5.0, 16.0):  # heard clear from 5 s, hold-down 10 s
        now[0] = t
        rem.observe(_quiet(t))
        acts = rem.step([])
    assert [(a.kind, a.node) for a in acts] == [("resume", "n2")] and not sched.state["n2"].drained


def test_a_failed_undo_is_retried_and_paged_not_dropped(tmp_path: Path) -> None:
    sched, now = Scheduler(["n1", "n2", "n3"]), [0.0]
    rem = Remediator.build(ENFORCE.model_copy(update={"backend_down_after_s": 10.0}), tmp_path, sched,
                           clock=lambda: now[0])
    rem.observe(_batch(0.0, "n1"))
    rem.step([])

    def hang(node: str) -> None:
        raise BackendError("slurm: scontrol update NodeName=n1 timed out after 10 s (is slurmctld up?)")

    sched.resume = hang  # type: ignore[method-assign]
    from gpumond.rules.remediation.requests import write_undo
    write_undo(tmp_path, "n1", "alice")
    for t in (1.0, 5.0, 12.0):
        now[0] = t
        rem.observe(_batch(t, "n1"))
        rem.step([])
    assert rem.state.records["n1"].phase == "resuming" and sched.state["n1"].drained
    assert [dict(c.labels)["alertname"] for c in rem.conditions()][-1] == "GpumondRemediationBackendDown"
    sched.resume = Scheduler.resume.__get__(sched)  # type: ignore[method-assign]
    now[0] = 13.0
    rem.observe(_batch(13.0, "n1"))
    assert [(a.kind, a.retry) for a in rem.step([])] == [("resume", True)]
    assert not sched.state["n1"].drained and rem.state.records == {} and rem.state.undone == ("n1",)
    assert rem.conditions() == []


def test_a_drain_that_timed_out_but_took_effect_stops_paging_once_confirmed(tmp_path: Path) -> None:
    sched, now = Scheduler(["n1", "n2", "n3"]), [0.0]
    real_drain = sched.drain

    def took_effect_then_timed_out(node: str, reason: str, fatal: bool) -> None:
        real_drain(node, reason, fatal)
        raise BackendError("slurm: scontrol update NodeName=n1 timed out after 10 s (is slurmctld up?)")

    sched.drain = took_effect_then_timed_out  # type: ignore[method-assign]
    rem = Remediator.build(ENFORCE.model_copy(update={"backend_down_after_s": 0.0}), tmp_path, sched,
                           clock=lambda: now[0])
    rem.observe(_batch(0.0, "n1"))
    rem.step([])
    assert rem.state.records["n1"].phase == "draining"
    now[0] = 5.0
    rem.observe(_batch(5.0, "n1"))
    assert rem.step([]) == []  # confirmed from sinfo, not called again
    assert rem.state.records["n1"].phase == "drained"
    assert [dict(c.labels)["alertname"] for c in rem.conditions()] == ["GpumondNodeDrained"]
    series = {(s.name, s.labels): s.value for s in rem.series()}
    assert series[("gpumond_remediation_backend_up", (("backend", "slurm"),))] == 1.0


def test_an_answer_ages_a_failed_alerts_query_stands_for_a_while_only(tmp_path: Path) -> None:
    sched, now = Scheduler(["n1", "n2", "n3"]), [0.0]
    rem = Remediator.build(ENFORCE.model_copy(update={"hold_down_s": 60.0}), tmp_path, sched, clock=lambda: now[0],
                           telemetry_interval_s=5.0)
    rem.observe(_batch(0.0, "n1"))
    rem.step([])
    now[0] = 1.0
    rem.observe(_quiet(1.0))  # clear from 1 s
    rem.step([])
    assert rem.state.records["n1"].clear_since == 1.0
    unknown = _quiet(2.0)
    for t in (6.0, 14.0):  # the alerts query fails: the last answer stands for three intervals (15 s) ...
        now[0] = t
        rem.observe(TelemetryBatch(t=t, gpus=unknown.gpus, alerts_known=False))
        rem.step([])
    assert rem.state.records["n1"].clear_since == 1.0
    now[0] = 17.0  # ... and then no longer: unknown is not clear
    rem.step([])
    assert rem.state.records["n1"].clear_since is None and sched.state["n1"].drained
