import errno
import json
import os

import pytest

from gpumond.state.audit import AuditLog
from gpumond.agent.policy.state_file import LimitRecord, Loaded, StateFile


def test_state_file_round_trips_and_is_replaced_atomically(tmp_path):
    f = StateFile(tmp_path / "policy-state.json")
    assert f.load() == Loaded({}, trusted=True)
    f.save({"GPU-a": LimitRecord(700.0, 550.0), "GPU-b": LimitRecord(300.0)})
    assert f.load() == Loaded({"GPU-a": LimitRecord(700.0, 550.0), "GPU-b": LimitRecord(300.0, None)})
    f.save({"GPU-a": LimitRecord(700.0, 600.0)})
    assert f.load().records == {"GPU-a": LimitRecord(700.0, 600.0)}
    assert [p.name for p in tmp_path.iterdir()] == ["policy-state.json"]  # no temp files left behind


def test_a_corrupt_state_file_is_set_aside_and_reported(tmp_path, caplog):
    path = tmp_path / "policy-state.json"
    path.write_text("{not json")
    assert StateFile(path).load() == Loaded({}, trusted=False)
    assert (tmp_path / "policy-state.json.corrupt.1").read_text() == "{not json"
    assert "set aside" in caplog.text


def test_a_wrong_version_is_not_trusted(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"version": 99, "gpus": {}}))
    assert StateFile(path).load() == Loaded({}, trusted=False)


def test_every_corrupt_copy_is_kept(tmp_path):
    path = tmp_path / "policy-state.json"
    for body in (b"first", b"\x00" * 10, b"\xff\xfe random"):
        path.write_bytes(body)
        assert StateFile(path).load().trusted is False
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == {
        "policy-state.json.corrupt.1": b"first", "policy-state.json.corrupt.2": b"\x00" * 10,
        "policy-state.json.corrupt.3": b"\xff\xfe random"}


@pytest.mark.parametrize("record", [
    {"original_w": float("nan")}, {"original_w": -5}, {"original_w": "700"}, {"original_w": True},
    {"original_w": 10**400}, {"original_w": 700, "last_set_w": float("inf")}, {"original_w": 700, "last_set_w": 0},
    {"original_w": 700, "restore_pending": "yes"}, [700], None,
])
def test_a_bad_record_is_dropped_and_the_load_is_not_trusted(tmp_path, record):
    path = tmp_path / "policy-state.json"
    good = {"original_w": 650.0, "last_set_w": None, "restore_pending": False}
    path.write_text(json.dumps({"version": 1, "gpus": {"GPU-bad": record, "GPU-good": good}}))
    assert StateFile(path).load() == Loaded({"GPU-good": LimitRecord(650.0)}, trusted=False)
    assert (tmp_path / "policy-state.json.rejected.1").exists()


def test_a_failed_write_raises_and_leaves_the_old_file(tmp_path):
    path = tmp_path / "policy-state.json"
    StateFile(path).save({"GPU-a": LimitRecord(700.0)})

    def full_disk(p, text):
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError):
        StateFile(path, write=full_disk).save({"GPU-a": LimitRecord(700.0, 300.0)})
    assert StateFile(path).load().records == {"GPU-a": LimitRecord(700.0)}


def test_an_audit_write_on_a_full_disk_raises_and_buffers_nothing(tmp_path):
    log = AuditLog(tmp_path / "audit.jsonl", opener=lambda p: os.open("/dev/full", os.O_WRONLY))
    with pytest.raises(OSError) as e:
        log.write("set_limit", gpu=0)
    assert e.value.errno == errno.ENOSPC
    log.close()


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
