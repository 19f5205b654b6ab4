"""The remediation component: restart safety, dry run, audit and metrics (backend: a recording stand-in; the
real Slurm and Kubernetes backends are exercised in tests/integration/test_remediation_*.py)."""

from __future__ import annotations

import json
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
    actions = second.step([])
    assert [(a.kind, a.node, a.retry) for a in actions] == [("drain", "n1", True)]
    assert second.state.records["n1"].phase == "drained" and len(second.state.drains) == 1
    third = Remediator.build(ENFORCE, tmp_path, sched, clock=lambda: now[0])
    third.observe(_batch(2.0, "n1"))
    assert third.step([]) == []  # not repeated
    assert sched.calls == [("drain", "n1"), ("drain", "n1")]


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
    assert series[("gpumond_remediation_breaker_open", ())] == 1.0


def test_unreadable_alerts_keep_the_last_word(tmp_path: Path) -> None:
    sched, now = Scheduler(["n1", "n2", "n3"]), [0.0]
    rem = Remediator.build(ENFORCE.model_copy(update={"hold_down_s": 0}), tmp_path, sched, clock=lambda: now[0])
    rem.observe(_batch(0.0, "n1"))
    rem.step([])
    now[0] = 100.0
    unknown = _batch(100.0)
    rem.observe(TelemetryBatch(t=100.0, gpus=unknown.gpus, alerts_known=False))  # the alerts query failed
    assert rem.step([]) == [] and "n1" in rem.state.records
