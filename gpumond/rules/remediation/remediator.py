"""The remediation component of the rules service: one step per interval turns confirmed node faults into
drains and returns to service (plan.py decides), carries them out through the backend, and records each
action and refusal in the audit log, in /metrics and in the alerts it raises.

Scheduler calls (sinfo, scontrol, the Kubernetes API) can hang for their whole timeout: they are made by the
step alone, never while holding what the telemetry poll and the evaluation need (`observe`, `conditions` and
`series` only read a snapshot), so a stuck scheduler never delays telemetry or findings."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from gpumond.alerts.model import Condition, rfc3339
from gpumond.state.audit import AuditLog
from gpumond.config.remediation import RemediationConfig
from gpumond.rules.remediation.backends import Backend, BackendError, NotOurs
from gpumond.rules.remediation.faults import NodeFault, agent_faults, by_node, straggler_faults, unreadable_gpus
from gpumond.rules.remediation.plan import Action, NodeStatus, State, confirm, plan
from gpumond.rules.remediation.requests import read_requests
from gpumond.rules.remediation.state import FILE_NAME, Loaded, StateFile
from gpumond.rules.types import AgentAlert, Finding, TelemetryBatch
from gpumond.types import Series

log = logging.getLogger("gpumond.rules.remediation")

AUDIT_FILE = "remediation-audit.jsonl"
# With nothing to decide, the scheduler's nodes are still read this often: a drain of gpumond's that no record
# holds (the state was lost or set aside, the health check drained it) is adopted, never held silently.
IDLE_READ_S = 60.0
DEFAULT_HEARD_FOR_S = 30.0  # an agent's last answer counts this long (the service: three telemetry intervals)

REMEDIATION_METRICS = {
    "gpumond_remediation_mode": ("gauge", "1 for the configured remediation mode (off, dry_run, enforce)."),
    "gpumond_remediation_node_drained": ("gauge", "1 per node gpumond drained, as the scheduler confirmed "
                                                  "(dry_run=\"true\": would have drained); `conditions` says why."),
    "gpumond_remediation_node_pending": ("gauge", "1 per node whose decided drain or return (`action`) the "
                                                  "scheduler has not confirmed yet: it is retried every step."),
    "gpumond_remediation_actions_total": ("counter", "Remediation actions and refusals by action and result."),
    "gpumond_remediation_breaker_open": ("gauge", "1 while the blast-radius circuit breaker has stopped every "
                                                  "remediation action."),
    "gpumond_remediation_backend_up": ("gauge", "1 when the last read of the scheduler's nodes, and every drain "
                                                "or return since, succeeded."),
}


class Remediator:
    """Owns the remediation state; `observe` takes each telemetry batch, `step` runs one remediation step.
    Both are safe to call from any thread."""

    def __init__(self, cfg: RemediationConfig, *, backend: Backend | None, state_dir: Path | None,
                 audit: AuditLog | None = None, clock: Callable[[], float] = time.time,
                 scope: Collection[str] | None = None, heard_for_s: float = DEFAULT_HEARD_FOR_S) -> None:
        self.cfg = cfg
        self.backend = backend
        self.state_dir = state_dir
        self.scope = scope  # the nodes this remediator acts on (the health check: its own); None: all
        self._file = StateFile(state_dir / FILE_NAME if state_dir is not None else None, clock=clock,
                               dry_run=cfg.mode != "enforce")
        self._audit = audit
        self._clock = clock
        self._lock = threading.Lock()  # the telemetry inputs; never held across a scheduler call
        self._step_lock = threading.Lock()  # one step at a time
        loaded = self._file.read()
        self.state: State = loaded.state  # replaced whole, never mutated: readers need no lock
        self.load_problems = loaded.problems
        if loaded.problems and state_dir is not None:
            self._file.save(self.state)  # what was set aside is kept once, not copied again at every start
        self._alerts: dict[str, tuple[AgentAlert, ...]] = {}  # node → what its agent has firing
        self._down: dict[str, tuple[str, ...]] = {}  # node → indices of the GPUs its agent cannot read now
        self._seen: set[str] = set()  # nodes telemetry has shown (the fleet, when there is no backend)
        # Nodes whose agents answered in the latest telemetry. Empty at start: until an agent is heard in this
        # process, its node's faults are unknown, and unknown is never clear.
        self._heard: frozenset[str] = frozenset()
        self._heard_at = float("-inf")
        self.heard_for_s = heard_for_s  # how long the latest answer counts as hearing its agents
        self._read_at = float("-inf")  # when the scheduler's nodes were last read
        self.faults: Mapping[str, tuple[NodeFault, ...]] = {}  # the last step's confirmed faults, by node
        self.results: dict[int, str] = {}  # the last step's outcome of each action, by id(action): "ok", "error: …"
        self.counts: dict[tuple[str, str], int] = {}
        self._asked = False  # whether the scheduler was asked yet (backend_up is exported once it was)
        # What waits on the scheduler: "" for reading it, else the node whose decided action failed → (since,
        # the last error). Cleared by a success; raises GpumondRemediationBackendDown after backend_down_after_s.
        self._failing: dict[str, tuple[float, str]] = {}

    @classmethod
    def build(cls, cfg: RemediationConfig, state_dir: Path | None, backend: Backend | None,
              clock: Callable[[], float] = time.time, telemetry_interval_s: float | None = None) -> Remediator:
        """The component as the service runs it: audit log at `audit_log` or in the state directory; an answer
        from the agents counts for three telemetry intervals."""
        path = cfg.audit_log or (state_dir / AUDIT_FILE if state_dir is not None else None)
        if cfg.mode == "off":
            path = None  # nothing to audit; leave no file behind
        heard_for_s = max(3 * telemetry_interval_s, cfg.interval_s) if telemetry_interval_s else DEFAULT_HEARD_FOR_S
        return cls(cfg, backend=backend, state_dir=state_dir, audit=AuditLog(path) if path else None, clock=clock,
                   heard_for_s=heard_for_s)

    # ----- inputs -----------------------------------------------------------------------------------------
    def observe(self, batch: TelemetryBatch) -> None:
        """Take what each reachable agent has firing; an unreachable agent's last word stands (a node is
        neither drained nor returned on missing data), and so does everyone's when the alerts were unreadable."""
        answered: dict[str, list[AgentAlert]] = {g.node: [] for g in batch.gpus}
        down: dict[str, list[str]] = {}
        for g in batch.gpus:
            if not g.up and g.parent_uuid is None:
                down.setdefault(g.node, []).append(g.gpu)
        for h in batch.hosts:
            answered.setdefault(h.node, [])
        for a in batch.alerts:
            answered.setdefault(a.node, []).append(a)
        with self._lock:
            self._seen |= set(answered)
            if not batch.alerts_known:
                return  # the last answer stands, and ages (heard_for_s): unknown never counts as clear for long
            heard = frozenset(n for n in answered if n not in batch.absent_nodes)
            for node in heard:
                self._alerts[node] = tuple(answered[node])
                self._down[node] = tuple(down.get(node, ()))
            self._heard, self._heard_at = heard, self._clock()

    # ----- the step -------------------------------------------------------------------------------------
    def step(self, findings: Sequence[Finding]) -> list[Action]:
        """One remediation step; returns what was done (or would be, dry run) and refused."""
        if self.cfg.mode == "off":
            return []
        with self._step_lock:
            with self._lock:
                alerts = [a for node_alerts in self._alerts.values() for a in node_alerts]
                down, heard, seen = dict(self._down), self._heard, frozenset(self._seen)
                heard_at = self._heard_at
            now = self._clock()
            if now - heard_at > self.heard_for_s:
                heard = frozenset()  # no answer for a while (the source fails, the alerts query fails): unknown
            faults = agent_faults(alerts)
            faults += unreadable_gpus(down, self.state.records, faults)
            stragglers, since = straggler_faults(findings, self.state.straggler_since, now, self.cfg.straggler_for_s)
            wanted = by_node(faults + stragglers, self.cfg.conditions)
            self.faults = wanted
            requests, problems = (read_requests(self.state_dir) if self.state_dir is not None
                                  else (None, []))
            for p in problems:
                log.warning(p)
            idle = not wanted and not self.state.records and not (requests and requests.files)
            if idle and now - self._read_at < IDLE_READ_S:
                # Nothing to decide: the scheduler is asked only every IDLE_READ_S (a node list every step adds up
                # on a big cluster), for drains of gpumond's that no record holds (state lost, the health check's).
                # Nothing waits on it; a person's decision runs out once the node is heard clear.
                # No decision waits on the scheduler now; a failed read of it still counts until one succeeds.
                self._failing = {k: v for k, v in self._failing.items() if not k}
                self._save(replace(self.state, straggler_since=since, noted=(),
                                   undone=tuple(n for n in self.state.undone if n not in heard)))
                return []
            status = self._status(now, seen)
            if status is None:
                return []  # never act blind: the scheduler could not be read
            state, actions = plan(replace(self.state, straggler_since=since), wanted, status, self.cfg, now,
                                  heard=heard, undo=requests.undo if requests else (),
                                  reset_breaker=requests.reset_breaker if requests else False, scope=self.scope)
            self._save(state)  # decided before done: a crash now re-drives the decision, never forgets it
            self.results = {}
            for action in actions:
                self._carry_out(action, now)
            for node in list(self._failing):
                rec = self.state.records.get(node)
                if node and (rec is None or rec.phase not in ("draining", "resuming")):
                    # Nothing of this node waits on the scheduler any more (confirmed, released, forgotten).
                    del self._failing[node]
            for path in requests.files if requests else ():
                path.unlink(missing_ok=True)
            return actions

    def _status(self, now: float, seen: frozenset[str]) -> Mapping[str, NodeStatus] | None:
        if self.backend is None:
            return {n: NodeStatus(node=n, pool="", drained=False, ours=False) for n in seen}
        self._asked = True
        try:
            nodes = self.backend.nodes()
        except BackendError as e:
            if not self._failing:
                log.error("cannot read the scheduler's nodes; remediation paused", extra={"error": str(e)})
            self._failed("", now, str(e))
            return None
        self._failing.pop("", None)
        self._read_at = now
        return nodes

    def _failed(self, key: str, now: float, error: str) -> None:
        since = self._failing.get(key, (now, ""))[0]
        self._failing[key] = (since, error)

    def _save(self, state: State) -> None:
        if state != self.state:
            self._file.save(state)
            self.state = state

    def _carry_out(self, action: Action, now: float) -> None:
        result = "ok"
        real = not action.dry_run and self.backend is not None
        try:
            if action.kind == "drain" and real:
                self.backend.drain(action.node, action.why, action.fatal)  # type: ignore[union-attr]
            elif action.kind in ("resume", "undo") and real:
                self.backend.resume(action.node)  # type: ignore[union-attr]
        except NotOurs as e:
            result = f"not_ours: {e}"
            records = {n: r for n, r in self.state.records.items() if n != action.node}
            self._save(replace(self.state, records=records))
        except BackendError as e:
            result = f"error: {e}"  # the record stays as decided: the next step tries again
            self._failed(action.node, now, str(e))
        else:
            if action.kind in ("drain", "resume", "undo"):
                self._save(confirm(self.state, action))
            if real:
                self._failing.pop(action.node, None)
        self.results[id(action)] = result
        self._record(action, result)

    def _record(self, action: Action, result: str) -> None:
        name = ("would_" + action.kind) if action.dry_run and action.kind in ("drain", "resume", "undo") else action.kind
        short = result.split(":", 1)[0]
        self.counts[(name, short)] = self.counts.get((name, short), 0) + 1
        fields = {"node": action.node, "pool": action.pool, "conditions": list(action.conditions),
                  "why": action.why, "mode": self.cfg.mode, "backend": self.backend.name if self.backend else "none",
                  "result": result}
        if action.retry:
            fields["retry"] = True
        if self._audit is not None:
            self._audit.write(name, **fields)
        level = logging.WARNING if action.kind == "refuse" or short == "error" else logging.INFO
        log.log(level, f"remediation {name} {action.node}".rstrip(), extra={k: v for k, v in fields.items()
                                                                            if k != "node"} | {"target": action.node})

    # ----- outputs ----------------------------------------------------------------------------------------
    def conditions(self) -> list[Condition]:
        """Alert conditions: one GpumondNodeDrained per node the scheduler confirmed drained (or dry run would
        have), GpumondRemediationHalted while the circuit breaker is open, GpumondRemediationBackendDown while a
        decided action has waited on the scheduler for backend_down_after_s. What dry run only imagined is marked
        dry_run="true" and has `dry_run_severity` (warning by default): it never pages as if it had happened."""
        state, cfg = self.state, self.cfg
        out = []
        for node, r in sorted(state.records.items()):
            if r.phase == "draining" and not r.dry_run:
                continue  # decided, not done: reported as pending, and as BackendDown when it keeps failing
            done = "would be drained (dry run)" if r.dry_run else "drained"
            out.append(Condition.of(
                {"alertname": "GpumondNodeDrained", "severity": "warning", "node": node,
                 "dry_run": _flag(r.dry_run)},
                {"summary": f"node {node} {done} by gpumond: {r.reason.removeprefix('gpumond: ')}",
                 "description": (f"gpumond {'would have drained' if r.dry_run else 'drained'} {node} (pool "
                                 f"{r.pool or '(all)'}) at {rfc3339(r.since)} for {', '.join(r.conditions) or 'a fault'}"
                                 f"; it returns to service {cfg.hold_down_s:g} s after its agent is heard with every "
                                 f"condition clear. Undo: gpumond remediation undo {node}"),
                 "action": "would_drain" if r.dry_run else "drain", "conditions": ",".join(r.conditions),
                 "mode": cfg.mode},
                immediate=True))
        if state.breaker is not None:
            b = state.breaker
            imagined = (" (dry run: nothing was drained or refused for real; in enforce mode no node would be "
                        "drained or returned") if b.dry_run else " (no node is drained or returned"
            out.append(Condition.of(
                {"alertname": "GpumondRemediationHalted", "severity": cfg.dry_run_severity if b.dry_run else "critical",
                 "dry_run": _flag(b.dry_run)},
                {"summary": f"gpumond remediation {'would stop' if b.dry_run else 'stopped'}"
                            f"{' (dry run)' if b.dry_run else ''}: {b.why}",
                 "description": (f"The blast-radius guard refused a drain at {rfc3339(b.opened_at)} and opened the "
                                 f"circuit breaker{imagined} until an operator runs gpumond remediation "
                                 f"reset-breaker)."),
                 "action": "refuse", "mode": cfg.mode},
                immediate=True))
        now = self._clock()
        waiting = {k: v for k, v in self._failing.copy().items() if now - v[0] >= cfg.backend_down_after_s}
        if waiting:
            dry = cfg.mode != "enforce"
            since = min(v[0] for v in waiting.values())
            nodes = sorted(k for k in waiting if k)
            what = (f"the {'drain or return' if len(nodes) == 1 else 'drains or returns'} decided for "
                    f"{', '.join(nodes)} {'have' if len(nodes) > 1 else 'has'} not been carried out"
                    if nodes else "gpumond cannot read the scheduler's nodes, so no node is drained or returned")
            last = waiting[max(waiting, key=lambda k: waiting[k][0])][1]
            backend = self.backend.name if self.backend else "none"
            out.append(Condition.of(
                {"alertname": "GpumondRemediationBackendDown",
                 "severity": cfg.dry_run_severity if dry else "critical", "backend": backend, "dry_run": _flag(dry)},
                {"summary": f"gpumond remediation cannot reach {backend}{' (dry run)' if dry else ''}: {what}",
                 "description": (f"Since {rfc3339(since)} every call to the {backend} backend failed; it is retried "
                                 f"every {cfg.interval_s:g} s. Last error: {last}"),
                 "mode": cfg.mode},
                immediate=True))
        return out

    def series(self) -> list[Series]:
        """The component's /metrics."""
        out = [Series("gpumond_remediation_mode", (("mode", m),), 1.0 if m == self.cfg.mode else 0.0)
               for m in ("off", "dry_run", "enforce")]
        for node, r in sorted(self.state.records.items()):
            if r.dry_run or r.phase != "draining":
                out.append(Series("gpumond_remediation_node_drained", (
                    ("node", node), ("pool", r.pool), ("conditions", ",".join(r.conditions)),
                    ("dry_run", _flag(r.dry_run))), 1.0))
            if not r.dry_run and r.phase in ("draining", "resuming"):
                out.append(Series("gpumond_remediation_node_pending", (
                    ("node", node), ("action", "drain" if r.phase == "draining" else "resume")), 1.0))
        out += [Series("gpumond_remediation_actions_total", (("action", a), ("result", res)), float(n))
                for (a, res), n in sorted(self.counts.items())]
        breaker = self.state.breaker
        out.append(Series("gpumond_remediation_breaker_open",
                          (("dry_run", _flag(breaker.dry_run if breaker else self.cfg.mode != "enforce")),),
                          1.0 if breaker else 0.0))
        if self.backend is not None and self._asked:
            out.append(Series("gpumond_remediation_backend_up", (("backend", self.backend.name),),
                              0.0 if self._failing else 1.0))
        return out

    def close(self) -> None:
        if self._audit is not None:
            self._audit.close()


def records_of(state_dir: Path) -> Loaded:
    """The state a service keeps in `state_dir`, read-only (for `gpumond remediation list`): a damaged file is
    reported, never moved; the service sets it aside at its next start."""
    return StateFile(state_dir / FILE_NAME, read_only=True).read()


def _flag(value: bool) -> str:
    return "true" if value else "false"


def iter_audit(path: Path) -> Iterable[str]:
    """The audit log's lines (for the CLI); an absent log is empty."""
    if not os.path.exists(path):
        return []
    return path.read_text(encoding="utf-8").splitlines()

