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
from gpumond.agent.policy.audit import AuditLog
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
_ALERT_LABELS = ("alertname", "severity", "node", "gpu", "uuid", "xid")


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


class PolicyEngine:
    """Owns per-GPU policy state; `cycle()` each fast sample, `stop()` on shutdown."""

    def __init__(self, cfg: PolicyConfig, actuator: Actuator, *, node: str, state_file: StateFile,
                 audit: AuditLog, clock: Callable[[], float], alerts: AlertPipeline | None = None,
                 wall: Callable[[], float] = time.time) -> None:
        self.cfg = cfg
        self._act = actuator
        self._node = node
        self._state_file = state_file
        self._audit = audit
        self._clock = clock
        self._wall = wall  # Unix time, for what people read: `clock` is monotonic on real GPUs
        self._lock = threading.Lock()
        self._records: dict[str, LimitRecord] = state_file.load()
        self._restarted_with = set(self._records)  # GPUs a previous run may have left capped
        self._gpus: dict[str, _Gpu] = {}
        self._targets: dict[tuple[int, str], float] = {}
        self._actions: Counter[str] = Counter()
        self._xid_seen: dict[tuple[int, int], int] = {}
        self._alert_state = AgentAlertState()
        # Sinks deliver on their own threads: the cycle hands them alerts and never waits on the network.
        self._pipeline = alerts if alerts is not None else log_only()
        self._index: dict[str, int] = {}

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
                self._audit.write("dry_run", gpu=v.index, uuid=v.uuid, before_w=current, would_set_w=wanted,
                                  reason=reason, agent_time=round(now, 3))
                log.info("dry run: would set power limit", extra={"gpu": v.index, "from_w": current,
                                                                  "to_w": wanted, "reason": reason})
            return
        self._set(v, g, record, current, wanted, action, reason, now)

    def _set(self, v: GpuView, g: _Gpu, record: LimitRecord, current: float, wanted: float, action: str,
             reason: str, now: float) -> None:
        try:
            back = self._act.set_power_limit(v.index, wanted)
        except SetFailed as e:
            if e.kind == "no_permission":
                g.fallback_dry_run = True
                self._count("no_permission")
                self._audit.write("no_permission", gpu=v.index, uuid=v.uuid, before_w=current, would_set_w=wanted,
                                  reason=reason, agent_time=round(now, 3))
                log.warning("no permission to set power limits: this GPU falls back to dry_run",
                            extra={"gpu": v.index, "uuid": v.uuid,
                                   "hint": "run the agent with CAP_SYS_ADMIN (see deploy/systemd)"})
            else:
                self._count("set_failed")
                self._audit.write("set_failed", gpu=v.index, uuid=v.uuid, before_w=current, wanted_w=wanted,
                                  error=str(e), agent_time=round(now, 3))
                log.warning("power limit not applied", extra={"gpu": v.index, "error": str(e)})
            return
        self._records[v.uuid] = LimitRecord(record.original_w, back)
        self._state_file.save(self._records)
        self._count(action)
        self._audit.write(action, gpu=v.index, uuid=v.uuid, before_w=current, after_w=back, reason=reason,
                          agent_time=round(now, 3))
        level = logging.WARNING if action == "reapply" else logging.INFO
        log.log(level, "power limit set", extra={"gpu": v.index, "from_w": current, "to_w": back, "reason": reason})

    def _remember_original(self, v: GpuView, current: float) -> LimitRecord:
        """The limit before gpumond touched the GPU, kept across restarts (never the capped value)."""
        record = self._records.get(v.uuid)
        if record is None:
            record = LimitRecord(current, None)
            self._records[v.uuid] = record
            self._state_file.save(self._records)
        elif v.uuid in self._restarted_with:
            self._restarted_with.discard(v.uuid)
            if record.last_set_w is not None:
                left = abs(current - record.last_set_w) < _TOLERANCE_W
                self._audit.write("resume" if left else "found_changed", gpu=v.index, uuid=v.uuid,
                                  original_w=record.original_w, last_set_w=record.last_set_w, current_w=current,
                                  reason="agent restarted; a live controller owns this GPU again")
        return record

    # ----- shutdown ----------------------------------------------------------------------------
    def stop(self) -> None:
        """On SIGTERM: put back the limits found at start (if configured and enforcing)."""
        with self._lock:
            if not self.cfg.restore_on_exit or self.cfg.mode != "enforce":
                return
            for uuid, record in list(self._records.items()):
                if record.last_set_w is None or self._gpus.get(uuid, _Gpu()).fallback_dry_run:
                    continue
                index = self._index.get(uuid)
                if index is not None:
                    self._restore(index, uuid, record, "agent stopping (restore_on_exit)")

    def _restore(self, index: int, uuid: str, record: LimitRecord, reason: str) -> None:
        try:
            back = self._act.set_power_limit(index, record.original_w)
        except SetFailed as e:
            self._count("restore_failed")
            self._audit.write("restore_failed", gpu=index, uuid=uuid, wanted_w=record.original_w, error=str(e),
                              reason=reason)
            log.error("could not restore power limit; the state file keeps the original, and the next start "
                      "restores it", extra={"gpu": index, "uuid": uuid, "error": str(e)})
            if not record.restore_pending:
                self._records[uuid] = LimitRecord(record.original_w, record.last_set_w, restore_pending=True)
                self._state_file.save(self._records)
            return
        self._audit.write("restore", gpu=index, uuid=uuid, before_w=record.last_set_w, after_w=back, reason=reason)
        self._count("restore")
        self._records[uuid] = LimitRecord(record.original_w, None)
        self._state_file.save(self._records)

    # ----- alerts and metrics ------------------------------------------------------------------
    def _alerts(self, views: Sequence[GpuView], xid_counts: Mapping[tuple[int, int], int], now: float) -> None:
        new_xids: list[tuple[int, int]] = []
        for key, n in xid_counts.items():
            new_xids.extend([key] * max(0, n - self._xid_seen.get(key, 0)))
        self._xid_seen = dict(xid_counts)
        at_floor = {u for u, g in self._gpus.items() if g.thermal.at_floor}
        self._alert_state, conditions = agent_conditions(views, self._alert_state, new_xids, self._node,
                                                          self.cfg.alerts, now, at_floor=at_floor,
                                                          wall=self._wall())
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
