"""Held events (XIDs, ECC and NVLink rises) outlive an agent restart: their alerts end after event_hold_s, not
with the process (gpumond/agent/policy/event_file.py)."""

from __future__ import annotations

import json
from pathlib import Path

from gpumond.agent.policy.alert_rules import AgentAlertState, agent_conditions
from gpumond.agent.policy.event_file import FILE_NAME, EventFile, HeldEvents
from gpumond.config import PolicyAlertsConfig
from tests.unit.policy_alert_rig import gpu

HOLD = PolicyAlertsConfig(event_hold_s=600)
WALL0 = 1_764_000_000.0


def _xid_alerts(state: AgentAlertState, now: float, wall: float, xids=()) -> tuple[AgentAlertState, list[str]]:
    state, conditions = agent_conditions([gpu(0), gpu(1)], state, list(xids), "node-a", HOLD, now, wall=wall)
    return state, [dict(c.labels)["xid"] for c in conditions if dict(c.labels)["alertname"] == "GpuXidCritical"]


def test_an_xid_held_before_a_restart_is_held_after_it_for_what_is_left(tmp_path: Path) -> None:
    path = tmp_path / FILE_NAME
    # First run: monotonic clock 1000 at Unix WALL0; XID 48 on GPU 1 at +5 s.
    before = EventFile(path)
    state = before.load(1000.0, WALL0, HOLD.event_hold_s).into(AgentAlertState())
    assert state == AgentAlertState()  # nothing held yet
    state, xids = _xid_alerts(state, 1005.0, WALL0 + 5, [(1, 48)])
    before.save(HeldEvents.of(state))
    assert xids == ["48"]
    # Restarted at +15 s with a clock that starts over (a new process on the simulator; a reboot on real GPUs).
    after = EventFile(path)
    state = after.load(3.0, WALL0 + 15, HOLD.event_hold_s).into(AgentAlertState())
    (code, record), = state.xid_events
    assert (code, record.gpu, record.count, record.last_at) == (48, 1, 1, 3.0 - 10.0)
    for t in (20.0, 300.0, 604.0):  # until 600 s after the event (Unix WALL0 + 605)
        state, xids = _xid_alerts(state, 3.0 + (t - 15), WALL0 + t)
        assert xids == ["48"], t
    state, xids = _xid_alerts(state, 3.0 + (606 - 15), WALL0 + 606)
    assert xids == []


def test_only_what_is_within_its_hold_comes_back_and_a_bad_record_is_left_out(tmp_path: Path) -> None:
    path = tmp_path / FILE_NAME
    f = EventFile(path)
    state, _ = _xid_alerts(AgentAlertState(), 0.0, WALL0, [(0, 79)])
    state, _ = _xid_alerts(state, 500.0, WALL0 + 500, [(1, 48)])
    f.save(HeldEvents.of(state))
    doc = json.loads(path.read_text())
    doc["events"]["xid:13:GPU-0"] = {"kind": "xid", "key": 13, "gpu": 0, "uuid": "GPU-0", "count": "many",
                                     "first_wall": WALL0, "last_wall": WALL0}
    path.write_text(json.dumps(doc))
    held = EventFile(path).load(0.0, WALL0 + 700, HOLD.event_hold_s)  # XID 79's hold is over; 48's is not
    assert [code for code, _ in held.xid] == [48]
    assert (tmp_path / f"{FILE_NAME}.rejected.1").exists()


def test_an_unusable_file_starts_empty_and_is_set_aside(tmp_path: Path) -> None:
    path = tmp_path / FILE_NAME
    path.write_bytes(b"\xff" + b"[" * 50_000)
    assert EventFile(path).load(0.0, WALL0, 600) == HeldEvents()
    assert (tmp_path / f"{FILE_NAME}.corrupt.1").exists() and not path.exists()


def test_an_event_from_the_future_is_held_from_now_and_one_far_ahead_is_left_out(tmp_path: Path) -> None:
    path = tmp_path / FILE_NAME
    f = EventFile(path)
    state, _ = _xid_alerts(AgentAlertState(), 0.0, WALL0 + 60, [(1, 48)])  # the clock was a minute ahead
    state, _ = _xid_alerts(state, 0.0, WALL0 + 10 * 86_400, [(0, 79)])  # ten days ahead: no real event
    f.save(HeldEvents.of(state))
    again = EventFile(path)
    held = again.load(0.0, WALL0, HOLD.event_hold_s)
    assert [(code, r.last_wall) for code, r in held.xid] == [(48, WALL0)]  # held from now, saved as now
    again.save(held)
    assert [code for code, _ in EventFile(path).load(0.0, WALL0 + 599, HOLD.event_hold_s).xid] == [48]
    assert EventFile(path).load(0.0, WALL0 + 601, HOLD.event_hold_s).xid == ()
