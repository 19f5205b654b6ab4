import json
import os

from gpumond.agent.policy.audit import AuditLog
from gpumond.agent.policy.state_file import LimitRecord, StateFile


def test_state_file_round_trips_and_is_replaced_atomically(tmp_path):
    f = StateFile(tmp_path / "policy-state.json")
    assert f.load() == {}
    f.save({"GPU-a": LimitRecord(700.0, 550.0), "GPU-b": LimitRecord(300.0)})
    assert f.load() == {"GPU-a": LimitRecord(700.0, 550.0), "GPU-b": LimitRecord(300.0, None)}
    f.save({"GPU-a": LimitRecord(700.0, 600.0)})
    assert f.load() == {"GPU-a": LimitRecord(700.0, 600.0)}
    assert [p.name for p in tmp_path.iterdir()] == ["policy-state.json"]  # no temp files left behind


def test_a_corrupt_state_file_is_set_aside_and_reported(tmp_path, caplog):
    path = tmp_path / "policy-state.json"
    path.write_text("{not json")
    assert StateFile(path).load() == {}
    assert (tmp_path / "policy-state.corrupt").read_text() == "{not json"
    assert "unreadable" in caplog.text


def test_a_wrong_version_is_not_trusted(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"version": 99, "gpus": {}}))
    assert StateFile(path).load() == {}


def test_audit_log_appends_one_flushed_json_object_per_action(tmp_path):
    path = tmp_path / "audit.jsonl"
    log = AuditLog(path, wall=lambda: 1763800000.5)
    log.write("set_limit", gpu=0, uuid="GPU-a", before_w=700.0, after_w=650.0, reason="temp 86 > 84")
    # visible to another reader before close: flushed, not buffered
    lines = path.read_text().splitlines()
    assert json.loads(lines[0]) == {"ts": 1763800000.5, "action": "set_limit", "gpu": 0, "uuid": "GPU-a",
                                    "before_w": 700.0, "after_w": 650.0, "reason": "temp 86 > 84"}
    log.write("restore", gpu=0, uuid="GPU-a", before_w=650.0, after_w=700.0, reason="SIGTERM")
    log.close()
    again = AuditLog(path)
    again.write("resume", gpu=1)
    again.close()
    assert [json.loads(x)["action"] for x in path.read_text().splitlines()] == ["set_limit", "restore", "resume"]
    assert os.stat(path).st_size > 0
