"""The policy engine: runs every fast cycle, decides each GPU's power limit, acts safely, raises alerts.

Pure decisions live in limits.py, thermal.py and alert_rules.py; this class owns what must persist
between cycles (controller states, originals, what it set) and every side effect: the NVML setter with
read-back, the crash-safe state file, the audit log, and the mode (enforce / dry_run / off).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from gpumond.agent.policy.alert_rules import AgentAlertState, agent_conditions
from gpumond.agent.policy.event_file import EventFile, HeldEvents
from gpumond.agent.policy.lease import Leases, leased_limit
from gpumond.agent.policy.limits import resolve_persistent_limit
from gpumond.agent.policy.state_file import LimitRecord, StateFile
from gpumond.agent.policy.thermal import ThermalState, thermal_step, thermal_target
from gpumond.agent.policy.view import GpuView
from gpumond.alerts.model import Alert
from gpumond.alerts.pipeline import AlertPipeline, log_only
from gpumond.config import PolicyConfig
from gpumond.nvml.session import SetFailed  # the one error type actuation raises
from gpumond.types import Series

log = logging.getLogger("gpumond.policy")

_TOLERANCE_W = 1.0  # NVML reports whole watts (mW granularity varies by board): closer than this is equal
_ALERT_LABELS = ("alertname", "severity", "node", "gpu", "uuid", "xid", "link")  # link: one NVLink alert per link


class Actuator(Protocol):
    """The NVML side of actuation (NvmlSession implements it)."""

    def set_power_limit(self, index: int, watts: float) -> float: ...


@dataclass(slots=True)
class _Gpu:
    thermal: ThermalState = field(default_factory=ThermalState)
    fallback_dry_run: bool = False  # NoPermission seen: this GPU only logs what it would do
    last_dry_run_w: float | None = None
    said: set[str] = field(default_factory=set)
    pending_tried: bool = False  # this run tried the restore a previous stop left pending
    lease_w: float | None = None  # the power-slack lease's limit in effect (or, dry run, that would be)


class PolicyEngine:
    """Owns per-GPU policy state; `cycle()` each fast sample, `stop()` on shutdown."""

    def __init__(self, cfg: PolicyConfig, actuator: Actuator, *, node: str, state_file: StateFile,
                 audit: AuditLog, clock: Callable[[], float], alerts: AlertPipeline | None = None,
                 wall: Callable[[], float] = time.time, events: EventFile | None = None,
                 leases: Callable[[], Leases] | None = None) -> None:
        self.cfg = cfg
        self._act = actuator
        self._node = node
        self._state_file = state_file
        self._audit = audit
        self._clock = clock
        self._wall = wall  # Unix time, for what people read: `clock` is monotonic on real GPUs
        self._lock = threading.Lock()
        loaded = state_file.load()
        self._records: dict[str, LimitRecord] = loaded.records
        # A corrupt state file may have lost records: a GPU without one takes its original from what is
        # known for sure (NVML's default limit), never from its current limit, which a dead run may have capped.
        self._state_trusted = loaded.trusted
        self._restarted_with = set(self._records)  # GPUs a previous run may have left capped
        self._checked: set[str] = set()  # records validated against their GPU's constraints
        # Record writes that are failing now ("state" / "audit" → error) and the GPUs whose change was withheld
        # because of them: while any, no limit is changed and GpumondPolicyNotRecorded fires.
        self._write_errors: dict[str, str] = {}
        self._withheld: dict[str, int] = {}
        self._gpus: dict[str, _Gpu] = {}
        self._targets: dict[tuple[int, str], float] = {}
        self._actions: Counter[str] = Counter()
        self._xid_seen: dict[tuple[int, int], int] = {}
        self._alert_state = AgentAlertState()
        # Events (XIDs, ECC and NVLink rises) held for event_hold_s outlive a restart: their alerts must not end early.
        self._events = events
        if events is not None:
            self._alert_state = events.load(clock(), wall(), cfg.alerts.event_hold_s).into(self._alert_state)
        # Sinks deliver on their own threads: the cycle hands them alerts and never waits on the network.
        self._pipeline = alerts if alerts is not None else log_only()
        self._index: dict[str, int] = {}
        # The power-slack leases the agent holds (lease_client.LeasePuller.leases), None without a rules_url.
        self._leases = leases
        self._limits: dict[str, float] = {}  # each GPU's limit as last read or set: what a lease steps down from
        self._book: Leases | None = None  # the leases as this cycle read them

    # ----- start-up checks ---------------------------------------------------------------------
    def check(self, views: Sequence[GpuView]) -> list[str]:
        """Problems that make the configured policy impossible on these GPUs (e.g. a limit above max)."""
        if self.cfg.mode == "off":
            return []
        return [r.error for v in views if v.up and (r := resolve_persistent_limit(v, self.cfg.power_limit)).error]

    # ----- the cycle ---------------------------------------------------------------------------
    def cycle(self, views: Sequence[GpuView], xid_counts: Mapping[tuple[int, int], int]) -> list[Series]:
        """Decide and act for every GPU, evaluate alerts, and return the policy's series."""
        with self._lock:
            now = self._clock()
            # Read once a cycle: with no lease held, each GPU's lease check is one dict lookup.
            self._book = self._leases() if self._leases is not None and self.cfg.power_slack.mode != "off" else None
            for v in views:
                self._index[v.uuid] = v.index
                if v.up:
                    self._one(v, now)
                else:  # a GPU that cannot be read has no target this run could be pursuing
                    self._targets.pop((v.index, v.uuid), None)
            self._alerts(views, xid_counts, now)
            return self._series(views)

    def _one(self, v: GpuView, now: float) -> None:
        g = self._gpus.setdefault(v.uuid, _Gpu())
        current = v.requested_limit_w if v.requested_limit_w is not None else v.enforced_limit_w
        if current is None or v.limit_min_w is None or v.limit_max_w is None:
            return  # limits or constraints not read yet (slow tier): nothing safe to decide
        self._limits[v.uuid] = current
        record = self._remember_original(v, current)
        if record.restore_pending and not g.pending_tried:
            # The previous run was stopped (restore_on_exit) while this GPU was lost: finish that stop first,
            # in any mode; an enforcing controller then starts from the original limit.
            g.pending_tried = True
            self._targets.pop((v.index, v.uuid), None)
            self._restore(v.index, v.uuid, record, "restore left pending: the GPU was not readable when the "
                                                   "previous run stopped")
            return
        if record.last_set_w is not None and self.cfg.mode != "enforce":
            # A previous run capped this GPU and this run will not control it: undo our own change, in any
            # mode, so no GPU stays capped by a controller that no longer runs.
            self._restore(v.index, v.uuid, record, "policy not enforcing now: undoing the previous run's limit")
            return
        if self.cfg.mode == "off":
            # Off claims no target: gpumond_policy_power_limit_target_watts would say 500 W is wanted while
            # nothing pursues it and the GPU runs at its own limit.
            self._targets.pop((v.index, v.uuid), None)
            return
        persistent = resolve_persistent_limit(v, self.cfg.power_limit)
        if persistent.error:
            self._say(g, "limit_error", logging.ERROR, "persistent limit not applicable",
                      v, error=persistent.error)
        ceiling = persistent.watts if persistent.watts is not None else record.original_w
        wanted: float | None = persistent.watts
        reason = f"persistent limit ({persistent.source})" if persistent.source else ""
        if self.cfg.thermal.enabled:
            g.thermal, decision = thermal_step(g.thermal, v, self.cfg.thermal, ceiling, now)
            wanted, reason = decision.limit_w, decision.reason
        leased = self._lease(v, g, wanted if wanted is not None else ceiling, now)
        if leased is not None:
            wanted, reason = leased
        if wanted is None and record.last_set_w is not None:
            wanted, reason = record.original_w, "policy no longer limits this GPU: restoring the original limit"
        if wanted is None:
            self._targets.pop((v.index, v.uuid), None)
            return
        self._targets[(v.index, v.uuid)] = wanted
        if abs(current - wanted) < _TOLERANCE_W:
            return
        drifted = record.last_set_w is not None and abs(current - record.last_set_w) >= _TOLERANCE_W
        action = "reapply" if drifted else "set_limit"
        if drifted:
            reason = f"enforced limit drifted to {current:g} W (driver reload, GPU reset or nvidia-smi -pl); {reason}"
        if self.cfg.mode == "dry_run" or g.fallback_dry_run:
            if g.last_dry_run_w is None or abs(g.last_dry_run_w - wanted) >= _TOLERANCE_W:
                g.last_dry_run_w = wanted
                self._count("dry_run")
                self._audit_write("dry_run", gpu=v.index, uuid=v.uuid, before_w=current, would_set_w=wanted,
                                  reason=reason, agent_time=round(now, 3))
                log.info("dry run: would set power limit", extra={"gpu": v.index, "from_w": current,
                                                                  "to_w": wanted, "reason": reason})
            return
        self._set(v, g, record, current, wanted, action, reason, now)

    def lease_bases(self) -> dict[str, float]:
        """What a power-slack lease steps down from, by uuid: each GPU's limit as last read or set, or, where
        nothing is set (any dry run), the lease that would be in effect. Never a lease not yet taken up: two
        answers between two cycles must not add up to two steps at once."""
        dry = self.cfg.mode == "dry_run" or self.cfg.power_slack.mode == "dry_run"
        with self._lock:
            out = dict(self._limits)
            for uuid, limit in out.items():
                g = self._gpus.get(uuid)
                if g is not None and g.lease_w is not None and (dry or g.fallback_dry_run):
                    out[uuid] = min(limit, g.lease_w)
            return out

    def _lease(self, v: GpuView, g: _Gpu, base: float, now: float) -> tuple[float, str] | None:
        """The GPU's power-slack lease as (limit, reason) when it applies: it lowers `base` (what the policy
        wants otherwise, so thermal capping and the persistent limit win), never below the floor. In dry run
        it is logged, audited and exported once per change, and nothing is returned: nothing is set."""
        if self._book is None or (g.lease_w is None and v.uuid not in self._book.held):
            return None
        slack = self.cfg.power_slack
        lease = self._book.limit(v.uuid, now)
        floor = max(v.limit_min_w or 0.0, slack.floor_w or 0.0)
        limit = leased_limit(base, lease, floor)
        previous, g.lease_w = g.lease_w, limit
        if limit is None or lease is None:
            if previous is not None:
                self._audit_write("lease_end", gpu=v.index, uuid=v.uuid, lease_w=previous, back_to_w=base,
                                  dry_run=slack.mode == "dry_run", agent_time=round(now, 3))
            return None
        reason = f"power slack lease for job {lease.job} (offered by the rules service; runs out unless renewed)"
        if slack.mode == "dry_run":
            if previous is None or abs(previous - limit) >= _TOLERANCE_W:
                self._count("lease_dry_run")
                self._audit_write("lease_dry_run", gpu=v.index, uuid=v.uuid, base_w=base, would_set_w=limit,
                                  job=lease.job, reason=reason, agent_time=round(now, 3))
                log.info("dry run: would lease a lower power limit", extra={
                    "gpu": v.index, "uuid": v.uuid, "from_w": base, "to_w": limit, "job": lease.job})
            return None
        return limit, reason

    def _set(self, v: GpuView, g: _Gpu, record: LimitRecord, current: float, wanted: float, action: str,
             reason: str, now: float) -> None:
        # No set without a durable record first: the state file says what this GPU is about to be set to
        # (and keeps its original), so a crash or a later dry_run/off start can always undo it. If that
        # cannot be written, the limit stays as it is and the operator is paged.
        self._records[v.uuid] = LimitRecord(record.original_w, wanted, record.restore_pending)
        if not self._save("set"):
            self._records[v.uuid] = record
            self._withheld[v.uuid] = v.index
            self._count("not_recorded")
            self._say(g, "not_recorded", logging.ERROR, "power limit not changed: its record cannot be written "
                      "to state_dir (GpumondPolicyNotRecorded)", v, from_w=current, wanted_w=wanted,
                      error=self._write_errors.get("state", ""), hint="free space in, or fix the permissions "
                      "of, the agent's state_dir")
            return
        g.said.discard("not_recorded")
        self._withheld.pop(v.uuid, None)
        try:
            back = self._act.set_power_limit(v.index, wanted)
        except SetFailed as e:
            self._records[v.uuid] = record  # nothing changed: the record says so again (best effort)
            self._save("set failed")
            if e.kind == "no_permission":
                g.fallback_dry_run = True
                self._count("no_permission")
                self._audit_write("no_permission", gpu=v.index, uuid=v.uuid, before_w=current, would_set_w=wanted,
                                  reason=reason, agent_time=round(now, 3))
                log.warning("no permission to set power limits: this GPU falls back to dry_run",
                            extra={"gpu": v.index, "uuid": v.uuid,
                                   "hint": "run the agent with CAP_SYS_ADMIN (see deploy/systemd)"})
            else:
                self._count("set_failed")
                self._audit_write("set_failed", gpu=v.index, uuid=v.uuid, before_w=current, wanted_w=wanted,
                                  error=str(e), agent_time=round(now, 3))
                log.warning("power limit not applied", extra={"gpu": v.index, "error": str(e)})
            return
        self._records[v.uuid] = LimitRecord(record.original_w, back, record.restore_pending)
        self._limits[v.uuid] = back  # what the GPU has now, before the next cycle reads it
        self._save("set")  # the record written before the set already says ~back; this makes it exact
        self._count(action)
        self._audit_write(action, gpu=v.index, uuid=v.uuid, before_w=current, after_w=back, reason=reason,
                          agent_time=round(now, 3))
        level = logging.WARNING if action == "reapply" else logging.INFO
        log.log(level, "power limit set", extra={"gpu": v.index, "from_w": current, "to_w": back, "reason": reason})

    def _remember_original(self, v: GpuView, current: float) -> LimitRecord:
        """The limit before gpumond touched the GPU, kept across restarts (never the capped value)."""
        record = self._records.get(v.uuid)
        if record is None:
            if self._state_trusted:
                record = LimitRecord(current, None)
            else:
                original, source = self._known_original(v)
                # current may be a cap a dead run left: keep it as "last set" so that a run that does not
                # enforce puts the known original back.
                last = None if abs(current - original) < _TOLERANCE_W else current
                record = LimitRecord(original, last)
                log.warning("no trusted policy record for this GPU: original limit taken from what is known for "
                            "sure, not from its current limit", extra={"gpu": v.index, "uuid": v.uuid,
                                                                        "original_w": original, "source": source,
                                                                        "current_w": current})
            self._records[v.uuid] = record
            self._checked.add(v.uuid)
            self._save("original")
        elif v.uuid not in self._checked:
            self._checked.add(v.uuid)
            record = self._validated(v, record, current)
        if v.uuid in self._restarted_with:
            self._restarted_with.discard(v.uuid)
            if record.last_set_w is not None:
                left = abs(current - record.last_set_w) < _TOLERANCE_W
                self._audit_write("resume" if left else "found_changed", gpu=v.index, uuid=v.uuid,
                                  original_w=record.original_w, last_set_w=record.last_set_w, current_w=current,
                                  reason="agent restarted; a live controller owns this GPU again")
        return record

    def _known_original(self, v: GpuView) -> tuple[float, str]:
        """A GPU's original limit when no trusted record says it: NVML's default limit, else the operator's
        configured persistent limit, else the board maximum (uncapped: never leave a GPU capped on a guess)."""
        assert v.limit_min_w is not None and v.limit_max_w is not None  # _one checks before calling
        if v.limit_default_w is not None and v.limit_min_w - _TOLERANCE_W <= v.limit_default_w <= v.limit_max_w \
                + _TOLERANCE_W:
            return v.limit_default_w, "NVML default limit"
        configured = resolve_persistent_limit(v, self.cfg.power_limit)
        if configured.watts is not None:
            return configured.watts, configured.source
        return v.limit_max_w, "NVML maximum limit (no default reported, none configured)"

    def _validated(self, v: GpuView, record: LimitRecord, current: float) -> LimitRecord:
        """A record from the file checked against this GPU's constraints; a value outside them is replaced."""
        assert v.limit_min_w is not None and v.limit_max_w is not None

        def fits(w: float) -> bool:
            return v.limit_min_w - _TOLERANCE_W <= w <= v.limit_max_w + _TOLERANCE_W  # type: ignore[operator]

        original, last = record.original_w, record.last_set_w
        problems = []
        if not fits(original):
            original, source = self._known_original(v)
            problems.append(f"original_w {record.original_w:g} W replaced by {original:g} W ({source})")
            if last is None and abs(current - original) >= _TOLERANCE_W:
                # The record is untrusted, so current may be a cap a dead run left (as in _remember_original):
                # keep it as "last set" so that the known original is put back.
                last = current
        if last is not None and not fits(last):
            last = current
            problems.append(f"last_set_w {record.last_set_w:g} W replaced by the current {current:g} W")
        if not problems:
            return record
        fixed = LimitRecord(original, last, record.restore_pending)
        self._records[v.uuid] = fixed
        log.error("policy record outside this GPU's constraints: " + "; ".join(problems),
                  extra={"gpu": v.index, "uuid": v.uuid, "min_w": v.limit_min_w, "max_w": v.limit_max_w})
        self._save("validate")
        return fixed

    # ----- durable records ---------------------------------------------------------------------
    def _save(self, why: str) -> bool:
        """Write the state file; on failure say so (once per outage) and return False. Never raises."""
        try:
            self._state_file.save(self._records)
        except OSError as e:
            self._write_failed("state", str(self._state_file.path), e, why)
            return False
        self._write_ok("state")
        return True

    def _audit_write(self, action: str, **fields: object) -> bool:
        """Append an audit entry; on failure the entry goes to the log instead, and the failure is paged."""
        try:
            self._audit.write(action, **fields)
        except OSError as e:
            self._write_failed("audit", str(self._audit.path), e, action)
            log.error("audit entry not written (kept here instead)", extra={"action": action, **fields})
            return False
        self._write_ok("audit")
        return True

    def _write_failed(self, kind: str, path: str, e: OSError, why: str) -> None:
        error = f"{e.strerror or e} ({path})"
        if kind not in self._write_errors:
            log.error(f"policy {kind} file cannot be written: no power limit is changed until it can be",
                      extra={"path": path, "error": error, "while": why})
        self._write_errors[kind] = error

    def _write_ok(self, kind: str) -> None:
        if self._write_errors.pop(kind, None) is not None:
            log.warning(f"policy {kind} file writable again", extra={"path": str(self._state_file.path.parent)})
            if not self._write_errors:
                self._withheld.clear()

    # ----- shutdown ----------------------------------------------------------------------------
    def stop(self) -> None:
        """On SIGTERM: put back the limits found at start (if configured and enforcing).

        The hardware comes first: every GPU is restored even when a record cannot be written, and the last
        line says what could not be recorded."""
        with self._lock:
            if not self.cfg.restore_on_exit or self.cfg.mode != "enforce":
                return
            errors_before = dict(self._write_errors)
            self._write_errors.clear()
            for uuid, record in list(self._records.items()):
                if record.last_set_w is None or self._gpus.get(uuid, _Gpu()).fallback_dry_run:
                    continue
                index = self._index.get(uuid)
                if index is None:
                    continue
                try:
                    self._restore(index, uuid, record, "agent stopping (restore_on_exit)")
                except Exception:  # one GPU's surprise must not leave the others capped
                    log.exception("restore failed unexpectedly", extra={"gpu": index, "uuid": uuid})
            if self._write_errors:
                log.error("agent stopping: power limits restored, but not recorded in state_dir",
                          extra={"errors": "; ".join(f"{k}: {v}" for k, v in sorted(self._write_errors.items())),
                                 "hint": "the next start finds the GPUs at their original limits and corrects "
                                         "the stale record itself"})
            else:
                self._write_errors.update(errors_before)

    def _restore(self, index: int, uuid: str, record: LimitRecord, reason: str) -> None:
        try:
            back = self._act.set_power_limit(index, record.original_w)
        except SetFailed as e:
            self._count("restore_failed")
            log.error("could not restore power limit; the state file keeps the original, and the next start "
                      "restores it", extra={"gpu": index, "uuid": uuid, "error": str(e)})
            self._audit_write("restore_failed", gpu=index, uuid=uuid, wanted_w=record.original_w, error=str(e),
                              reason=reason)
            if not record.restore_pending:
                self._records[uuid] = LimitRecord(record.original_w, record.last_set_w, restore_pending=True)
                self._save("restore failed")
            return
        log.info("power limit restored", extra={"gpu": index, "uuid": uuid, "from_w": record.last_set_w,
                                                "to_w": back, "reason": reason})
        self._count("restore")
        self._records[uuid] = LimitRecord(record.original_w, None)
        self._audit_write("restore", gpu=index, uuid=uuid, before_w=record.last_set_w, after_w=back, reason=reason)
        self._save("restore")

    # ----- alerts and metrics ------------------------------------------------------------------
    def _alerts(self, views: Sequence[GpuView], xid_counts: Mapping[tuple[int, int], int], now: float) -> None:
        new_xids: list[tuple[int, int]] = []
        for key, n in xid_counts.items():
            new_xids.extend([key] * max(0, n - self._xid_seen.get(key, 0)))
        self._xid_seen = dict(xid_counts)
        at_floor = {u for u, g in self._gpus.items() if g.thermal.at_floor}
        not_recorded = None
        if self._write_errors:
            not_recorded = "Now: " + "; ".join(f"{k} file: {e}" for k, e in sorted(self._write_errors.items()))
            if self._withheld:
                not_recorded += "; change withheld on GPU " + ", ".join(str(i) for i in sorted(self._withheld.values()))
            not_recorded += "."
        self._alert_state, conditions = agent_conditions(views, self._alert_state, new_xids, self._node,
                                                          self.cfg.alerts, now, at_floor=at_floor,
                                                          wall=self._wall(), not_recorded=not_recorded)
        if self._events is not None:
            self._events.save(HeldEvents.of(self._alert_state))
        self._pipeline.update(conditions, now)

    def alerts(self) -> tuple[Alert, ...]:
        """Alerts held now: pending, firing and recently resolved (wall-clock times)."""
        return self._pipeline.alerts()

    def _series(self, views: Sequence[GpuView]) -> list[Series]:
        out = [Series("gpumond_policy_power_limit_target_watts", (("gpu", str(i)), ("uuid", u)), w)
               for (i, u), w in sorted(self._targets.items())]
        if self.cfg.mode != "off":  # the temperature the thermal controller holds each GPU under
            out += [Series("gpumond_policy_temperature_target_celsius", (("gpu", str(v.index)), ("uuid", v.uuid)),
                           thermal_target(v, self.cfg.thermal)) for v in views if v.up]
        out += [Series("gpumond_policy_actions_total", (("action", a),), float(n))
                for a, n in sorted(self._actions.items())]
        out.append(Series("gpumond_policy_mode", (("mode", self.cfg.mode),), 1.0))
        dry = "true" if self.cfg.power_slack.mode != "enforce" or self.cfg.mode != "enforce" else "false"
        out += [Series("gpumond_policy_power_slack_lease_watts", (("gpu", str(v.index)), ("uuid", v.uuid),
                                                                  ("dry_run", dry)), g.lease_w)
                for v in views if (g := self._gpus.get(v.uuid)) is not None and g.lease_w is not None]
        out += [Series("gpumond_policy_record_failing", (("file", f),), 1.0 if f in self._write_errors else 0.0)
                for f in ("audit", "state")]
        for v in views:
            if v.uuid in self._gpus:
                out.append(Series("gpumond_policy_dry_run_fallback", (("gpu", str(v.index)), ("uuid", v.uuid)),
                                  1.0 if self._gpus[v.uuid].fallback_dry_run else 0.0))
        out += self._pipeline.active_series(_ALERT_LABELS)
        out += self._pipeline.series()
        return out

    def _count(self, action: str) -> None:
        self._actions[action] += 1

    def _say(self, g: _Gpu, key: str, level: int, msg: str, v: GpuView, **fields: object) -> None:
        if key not in g.said:
            g.said.add(key)
            log.log(level, msg, extra={"gpu": v.index, "uuid": v.uuid, **fields})
