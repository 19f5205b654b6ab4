"""An agent restart keeps its held events: an XID alert held for event_hold_s does not resolve when the process
that saw the XID is replaced (an upgrade, a crash under systemd's Restart=), only when its hold is over."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.integration.helpers import AgentProcess, samples, wait_until, write_yaml

pytestmark = pytest.mark.integration

GRACE_S = 2.0  # restart_grace_s: what held alerts across a restart before (and only that long)


def _xid48_active(agent: AgentProcess) -> bool:
    return any(s.labels.get("alertname") == "GpuXidCritical" and s.labels.get("xid") == "48"
               for s in samples(agent.metrics(), "gpumond_alert_active"))


def test_an_xid_alert_outlives_an_agent_restart_for_its_hold(tmp_path: Path) -> None:
    state = tmp_path / "state"
    config = write_yaml(tmp_path / "agent.yaml", {
        "state_dir": str(state), "sampling": {"fast_interval_s": 0.5, "slow_interval_s": 1},
        "policy": {"alerts": {"event_hold_s": 600}}, "alerting": {"restart_grace_s": GRACE_S}})
    xid = write_yaml(tmp_path / "xid.yaml", {"faults": [{"gpu": 1, "kind": "xid", "code": 48, "at_s": 1}]})
    quiet = write_yaml(tmp_path / "quiet.yaml", {"faults": []})  # the second run sees no XID of its own
    with AgentProcess(["--sim", "2", "--sim-scenario", xid, "--config", config, "--node-name", "n1"],
                      tmp_path / "first") as first:
        wait_until(lambda: _xid48_active(first), timeout=30, what="XID 48 alert on the first agent")
    with AgentProcess(["--sim", "2", "--sim-scenario", quiet, "--config", config, "--node-name", "n1"],
                      tmp_path / "second") as second:
        assert _xid48_active(second)
        time.sleep(GRACE_S + 3)  # past the restart grace: only the restored hold keeps it now
        assert _xid48_active(second), second.describe()
