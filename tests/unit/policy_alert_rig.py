"""Agent alert rules run the way the agent runs them: literal GPU views, the rules, and an AlertTracker on an
explicit clock (shared by the alert-rule tests)."""

from __future__ import annotations

from collections.abc import Sequence

from gpumond.agent.policy.alert_rules import AgentAlertState, agent_conditions
from gpumond.agent.policy.view import GpuView
from gpumond.alerts.lifecycle import AlertTracker
from gpumond.alerts.model import Alert
from gpumond.config import PolicyAlertsConfig

CFG = PolicyAlertsConfig()  # throttle after 60 s, floor after 300 s


def gpu(index: int = 0, **kw) -> GpuView:
    values = dict(index=index, uuid=f"GPU-{index}", name="NVIDIA H100 80GB HBM3", up=True, temperature_c=80.0,
                  power_w=650.0, enforced_limit_w=700.0, slowdown_c=89.0, clocks_event_mask=0,
                  ecc_uncorrected_volatile=0.0, ecc_uncorrected_aggregate=0.0, remap_pending=False,
                  remap_failed=False)
    values.update(kw)
    return GpuView(**values)


class Agent:
    """Rules + tracker on an explicit clock, the way the agent runs them every sample."""

    def __init__(self, cfg: PolicyAlertsConfig = CFG) -> None:
        self.cfg, self.rules, self.tracker, self.t = cfg, AgentAlertState(), AlertTracker(), 0.0

    def at(self, t: float, views: Sequence[GpuView], xids: Sequence[tuple[int, int]] = (),
           at_floor: frozenset[str] = frozenset()) -> list[Alert]:
        self.t = t
        self.rules, conditions = agent_conditions(views, self.rules, xids, "node-a", self.cfg, t, at_floor=at_floor)
        self.tracker, _ = self.tracker.update(conditions, t)
        return list(self.tracker.firing)

    def every_second(self, start: float, end: float, views: Sequence[GpuView], **kw) -> list[Alert]:
        firing: list[Alert] = []
        for t in range(int(start), int(end)):
            firing = self.at(float(t), views, **kw)
        return firing


def names(alerts: Sequence[Alert]) -> list[str]:
    return sorted(a.alertname for a in alerts)
