"""The remediation lifecycle and its blast-radius guard: (state, faults, scheduler view, config, now) in,
(new state, actions) out. Pure; the remediator carries the actions out.

A node gpumond drains has a Record. Its phase is `draining` from the moment the drain is decided until the
scheduler confirmed it, `drained` after, `resuming` once the hold-down passed. A restart re-drives a `draining`
or `resuming` record (both backend calls are idempotent), so it neither repeats nor forgets an action.

Missing data never counts as clear: a held node returns to service only after its agent has been heard, with
every condition clear, for the whole hold-down; an agent that is silent (stopped, partitioned, or not yet heard
since this process started) stops the clock. A node a person resumed or re-drained while gpumond held it is
released and left alone until its faults have been seen to clear.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from gpumond.config.remediation import RemediationConfig
from gpumond.rules.remediation.faults import NodeFault, reason_of

HOUR_S = 3600.0
Phase = Literal["draining", "drained", "resuming"]
ActionKind = Literal["drain", "resume", "refuse", "skip", "release", "adopt", "undo", "breaker_reset"]


@dataclass(frozen=True, slots=True)
class NodeStatus:
    """What the scheduler says about a node."""

    node: str
    pool: str  # Slurm partition or Kubernetes node pool ("" when the backend has none)
    drained: bool  # no new work: DRAIN / DOWN in Slurm, cordoned in Kubernetes, whoever did it
    ours: bool  # the reason (annotation) is gpumond's
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Record:
    """A node gpumond took out of service (or, with dry_run, would have)."""

    node: str
    pool: str
    reason: str
    conditions: tuple[str, ...]
    since: float  # when gpumond decided to drain it
    dry_run: bool
    phase: Phase = "draining"
    fatal: bool = False
    clear_since: float | None = None  # when its last condition cleared (None while any holds)


@dataclass(frozen=True, slots=True)
class Breaker:
    """The circuit breaker: open, every action stops until an operator resets it."""

    opened_at: float
    why: str
    dry_run: bool = False  # opened by a refusal that dry run only imagined


@dataclass(frozen=True, slots=True)
class State:
    """Everything remediation remembers across evaluations and restarts."""

    records: Mapping[str, Record] = field(default_factory=dict)
    drains: tuple[float, ...] = ()  # when each drain of the last hour was decided (the rate limit)
    breaker: Breaker | None = None
    straggler_since: Mapping[str, float] = field(default_factory=dict)
    # Nodes an operator returned (`gpumond remediation undo`, or a person's resume or re-drain of a node gpumond
    # held): left alone until their agent is heard with every fault clear.
    undone: tuple[str, ...] = ()
    # Faulted nodes already reported as not ours to act on (person-drained, refused): reported once.
    noted: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Action:
    """One thing remediation does (or, dry_run, would do) or declines to do, with why."""

    kind: ActionKind
    node: str
    why: str
    pool: str = ""
    conditions: tuple[str, ...] = ()
    dry_run: bool = False
    fatal: bool = False
    retry: bool = False  # re-driving an action a restart interrupted


def guard_refusal(node: str, pool: str, records: Mapping[str, Record], drains: tuple[float, ...],
                  pool_sizes: Mapping[str, int], cfg: RemediationConfig,
                  elsewhere: Mapping[str, str] | None = None) -> str | None:
    """Why draining `node` now would exceed the blast radius, or None when it may go ahead. `elsewhere` are
    nodes (→ pool) the scheduler shows drained by gpumond that this state does not hold (the health-check
    on each node, another service): they count against the limits too."""
    g = cfg.guard
    pools = [r.pool for r in records.values()] + [p for n, p in (elsewhere or {}).items() if n not in records]
    count = len(pools) + 1
    if count > g.max_nodes:
        return f"would make {count} nodes drained by gpumond, over guard.max_nodes {g.max_nodes}"
    in_pool = sum(1 for p in pools if p == pool) + 1
    size = max(pool_sizes.get(pool, 0), 1)
    # At least one node of any pool may go: a fraction of a small pool would otherwise forbid every drain.
    allowed = max(1, int(g.max_pool_fraction * size))
    if in_pool > allowed:
        return (f"would make {in_pool} of {size} nodes of pool {pool or '(all)'} drained by gpumond, over "
                f"guard.max_pool_fraction {g.max_pool_fraction:g} ({allowed} node(s))")
    if len(drains) + 1 > g.max_drains_per_hour:
        return f"would be drain {len(drains) + 1} in the last hour, over guard.max_drains_per_hour {g.max_drains_per_hour}"
    return None


def plan(state: State, faults: Mapping[str, tuple[NodeFault, ...]], status: Mapping[str, NodeStatus],
         cfg: RemediationConfig, now: float, *, heard: Collection[str], undo: tuple[str, ...] = (),
         reset_breaker: bool = False, scope: Collection[str] | None = None) -> tuple[State, list[Action]]:
    """One remediation step. `faults` are the confirmed faults by node, `status` the scheduler's view of every
    node it knows, `heard` the nodes whose agents answered in the latest telemetry (the others' faults are their
    last word, and their "clear" is unknown); `undo` and `reset_breaker` are operator requests; `scope` is set by the
    health check, which acts on its own node only and adopts no drain of another's. Returns the new state and the
    actions, in the order they must be carried out."""
    dry = cfg.mode != "enforce"
    actions: list[Action] = []
    records = dict(state.records)
    drains = tuple(t for t in state.drains if now - t < HOUR_S)
    breaker = state.breaker
    undone = set(state.undone)
    noted = set(state.noted) & set(faults)  # a node whose faults cleared may be reported again next time

    if breaker is not None and breaker.dry_run and not dry:
        breaker = None  # switched to enforce: a refusal dry run only imagined stops nothing real
    if reset_breaker and breaker is not None:
        actions.append(Action("breaker_reset", "", f"operator reset the circuit breaker (open since: {breaker.why})",
                              dry_run=breaker.dry_run))
        breaker = None
        noted.clear()

    undoing: set[str] = set()
    for node in undo:
        rec = records.get(node)
        if rec is None:
            actions.append(Action("skip", node, "undo: gpumond holds no drain on this node"))
            continue
        # Held as `resuming` until the scheduler confirms: a failed call is retried (and pages), never dropped.
        records[node] = replace(rec, phase="resuming")
        undone.add(node)
        undoing.add(node)
        actions.append(Action("undo", node, f"operator undid the drain ({rec.reason})", rec.pool, rec.conditions,
                              dry_run=rec.dry_run))
    # An undone or released node is fair game again once its agent was heard with every fault clear: a restart
    # or a silent agent (no faults known) must not make a person's decision look expired.
    undone = {n for n in undone if n in faults or n not in heard}

    # ----- nodes gpumond holds ------------------------------------------------------------------------
    for node, rec in sorted(records.items()):
        if node in undoing:
            continue  # its return is this step's undo
        if rec.dry_run != dry:
            if rec.dry_run:  # switched to enforce: what dry run would have done was never done
                del records[node]
            continue  # switched to dry run: a real drain stays as it is, untouched, until enforce again
        st = status.get(node)
        if not dry and rec.phase == "drained" and (st is None or not st.drained or not st.ours):
            del records[node]
            if st is not None:  # a person's decision: not overridden until the faults are seen to clear
                undone.add(node)
            who = ("left the scheduler" if st is None else
                   "was resumed or re-drained by someone else; left alone until its faults clear")
            actions.append(Action("release", node, f"{who}; gpumond no longer holds it", rec.pool, rec.conditions))
            continue
        present = faults.get(node, ())
        if rec.phase == "draining":
            if not dry and st is not None and st.drained and st.ours:
                # The scheduler shows the drain done (a call that timed out took effect): confirmed, not repeated.
                records[node] = replace(rec, phase="drained")
                continue
            actions.append(Action("drain", node, rec.reason, rec.pool, rec.conditions, dry, rec.fatal, retry=True))
            continue
        if rec.phase == "resuming":
            actions.append(Action("resume", node, "return to service (interrupted)", rec.pool, rec.conditions,
                                  dry, retry=True))
            continue
        if present:
            records[node] = replace(rec, conditions=tuple(sorted({f.condition for f in present})), clear_since=None)
            continue
        if node not in heard:  # a silent agent: clear is unknown, so the hold-down waits for it to be heard
            records[node] = replace(rec, clear_since=None)
            continue
        clear_since = rec.clear_since if rec.clear_since is not None else now
        records[node] = rec = replace(rec, clear_since=clear_since)
        if now - clear_since >= cfg.hold_down_s and breaker is None:
            records[node] = replace(rec, phase="resuming")
            actions.append(Action("resume", node, f"clear for {now - clear_since:.0f} s (hold-down "
                                  f"{cfg.hold_down_s:g} s) after: {rec.reason}", rec.pool, rec.conditions, dry))

    # ----- faulted nodes gpumond does not hold ------------------------------------------------------
    pool_sizes: dict[str, int] = {}
    for st in status.values():
        pool_sizes[st.pool] = pool_sizes.get(st.pool, 0) + 1
    elsewhere = {n: st.pool for n, st in status.items() if st.drained and st.ours and n not in faults}
    for node, node_faults in sorted(faults.items()):
        if node in records or node in undone:
            continue
        st = status.get(node)
        conditions = tuple(sorted({f.condition for f in node_faults}))
        reason = reason_of(node_faults)
        fatal = any(f.fatal for f in node_faults)
        if st is None:
            if node not in noted:
                noted.add(node)
                actions.append(Action("skip", node, f"not a node the scheduler knows ({reason})", "", conditions, dry))
            continue
        if st.drained and st.ours:  # drained by gpumond elsewhere (health-check, a previous state file)
            records[node] = Record(node, st.pool, st.reason or reason, conditions, now, dry, "drained", fatal)
            actions.append(Action("adopt", node, f"already drained by gpumond: {st.reason}", st.pool, conditions, dry))
            continue
        if st.drained:
            if node not in noted:
                noted.add(node)
                actions.append(Action("skip", node, f"drained by someone else ({st.reason or 'no reason'}); "
                                      f"gpumond leaves it alone: {reason}", st.pool, conditions, dry))
            continue
        if breaker is not None:
            if node not in noted:
                noted.add(node)
                actions.append(Action("refuse", node, f"circuit breaker open ({breaker.why}): {reason}", st.pool,
                                      conditions, dry))
            continue
        why = guard_refusal(node, st.pool, records, drains, pool_sizes, cfg, elsewhere)
        if why is not None:
            breaker = Breaker(now, f"{node}: {why}", dry)
            noted.add(node)
            actions.append(Action("refuse", node, f"{why}; circuit breaker opened, every action stopped: {reason}",
                                  st.pool, conditions, dry))
            continue
        records[node] = Record(node, st.pool, reason, conditions, now, dry, "draining", fatal)
        drains += (now,)
        actions.append(Action("drain", node, reason, st.pool, conditions, dry, fatal))

    # ----- drained by gpumond, with no record and no fault (state lost, or the health check's) -------------
    # Never hold capacity silently: adopt it; it returns once its agent is heard clear for the hold-down. The
    # fleet's service does this; the health check (`scope`) cannot see every condition the service drains for
    # (a straggler node), and dry run does not hold the scheduler's real drains (its "return" changes nothing,
    # so the node would be adopted again at every step).
    for node, st in sorted(status.items()) if scope is None and not dry else ():
        if st.drained and st.ours and node not in records and node not in faults and node not in undone:
            records[node] = Record(node, st.pool, st.reason, (), now, dry, "drained")
            actions.append(Action("adopt", node, f"drained by gpumond with no record here ({st.reason}); returns "
                                  f"to service once its agent is heard clear for the hold-down", st.pool, (), dry))

    return State(records=records, drains=drains, breaker=breaker, straggler_since=state.straggler_since,
                 undone=tuple(sorted(undone)), noted=tuple(sorted(noted))), actions


def confirm(state: State, action: Action) -> State:
    """The state once `action` succeeded: a drain becomes `drained`, a resume forgets the node."""
    records = dict(state.records)
    rec = records.get(action.node)
    if rec is None:
        return state
    if action.kind == "drain":
        records[action.node] = replace(rec, phase="drained")
    elif action.kind in ("resume", "undo"):
        del records[action.node]
    return replace(state, records=records)
