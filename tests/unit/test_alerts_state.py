"""AlertStateFile: the crash-safe record of firing alerts and open notices (alerts-state.json)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from gpumond.alerts.model import Alert, pairs
from gpumond.alerts.state import FILE_NAME, VERSION, AlertStateFile


def alert(name: str = "GpuLost", gpu: int = 0, starts_at: float = 1_700_000_000.5, state: str = "firing",
          **annotations: str) -> Alert:
    ends = starts_at + 60.0 if state == "resolved" else None
    return Alert(pairs({"alertname": name, "severity": "critical", "node": "n1", "gpu": gpu}),
                 pairs(annotations or {"summary": "GPU lost", "runbook_url": "https://rb/GpuLost.md"}),
                 starts_at, ends, state)  # type: ignore[arg-type]


def by_fp(alerts) -> dict[str, Alert]:
    return {a.fingerprint: a for a in alerts}


def test_round_trip(tmp_path: Path) -> None:
    path = tmp_path / FILE_NAME
    s = AlertStateFile(path)
    a0, a1 = alert(gpu=0), alert(gpu=1, starts_at=1_700_000_123.25, summary="GPU 1 lost", evidence='{"x":1}')
    s.save_firing([a0, a1, alert(gpu=2, state="pending"), alert(gpu=3, state="resolved")])
    assert by_fp(s.firing) == by_fp([a0, a1])  # only firing alerts are recorded

    again = AlertStateFile(path)
    assert by_fp(again.firing) == by_fp([a0, a1])  # labels, annotations and start to the bit
    data = json.loads(path.read_text())
    assert data["version"] == VERSION and set(data["firing"]) == {a0.fingerprint, a1.fingerprint}


def test_sink_books_round_trip_and_are_separate(tmp_path: Path) -> None:
    path = tmp_path / FILE_NAME
    s = AlertStateFile(path)
    a = alert()
    s.book("slack").save({a.fingerprint: a})
    s.save_firing([a])
    again = AlertStateFile(path)
    assert again.book("slack").load() == {a.fingerprint: a}
    assert again.book("pagerduty").load() == {}
    assert by_fp(again.firing) == {a.fingerprint: a}


def test_book_load_is_a_copy(tmp_path: Path) -> None:
    s = AlertStateFile(tmp_path / FILE_NAME)
    book = s.book("pagerduty")
    loaded = book.load()
    loaded["x"] = alert()
    assert book.load() == {}


def test_missing_file_is_an_empty_state(tmp_path: Path) -> None:
    s = AlertStateFile(tmp_path / "sub" / FILE_NAME)
    assert s.firing == () and s.book("slack").load() == {}
    assert not (tmp_path / "sub").exists()  # reading creates nothing


def test_memory_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    s = AlertStateFile(None)
    a = alert()
    s.save_firing([a])
    s.book("slack").save({a.fingerprint: a})
    assert by_fp(s.firing) == {a.fingerprint: a}
    assert s.book("slack").load() == {a.fingerprint: a}
    assert os.listdir(tmp_path) == []  # nothing written anywhere
    assert AlertStateFile(None).firing == ()  # and nothing survives the process


@pytest.mark.parametrize("content", [
    "{not json",
    json.dumps({"version": VERSION + 1, "firing": {}, "sinks": {}}),
    json.dumps([1, 2]),
    "[" * 100_000,  # nesting that would raise RecursionError in the parser
    json.dumps({"firing": {}}),
], ids=["not-json", "version", "list", "deep", "no-version"])
def test_an_unusable_file_is_set_aside_with_an_error(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                     content: str) -> None:
    path = tmp_path / FILE_NAME
    path.write_text(content)
    with caplog.at_level(logging.ERROR):
        s = AlertStateFile(path)
    assert s.firing == () and s.book("slack").load() == {}
    aside = tmp_path / f"{FILE_NAME}.corrupt.1"
    assert not path.exists() and aside.read_text() == content  # kept for a person to look at
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "set aside" in errors[0].getMessage()
    assert errors[0].moved_to == str(aside)  # type: ignore[attr-defined]
    # The daemon carries on: the next save writes a fresh, readable file.
    s.save_firing([alert()])
    assert len(AlertStateFile(path).firing) == 1


GOOD = {"labels": {"alertname": "A", "severity": "critical"}, "annotations": {}, "starts_at": 1}


@pytest.mark.parametrize("bad", [
    {"labels": {}},
    {"labels": {"alertname": "B", "severity": "critical"}, "annotations": {}, "starts_at": "2026-11-28T19:57:50Z"},
    {"labels": {"alertname": "B", "severity": "critical"}, "annotations": {}, "starts_at": float("nan")},
    {"labels": {"alertname": "B", "severity": 3}, "annotations": {}, "starts_at": 1},
    [1, 2],
], ids=["no-labels", "date-string", "nan", "int-label", "list"])
def test_a_bad_record_is_left_out_the_rest_kept_and_the_file_copied(tmp_path: Path, bad: object,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / FILE_NAME
    content = json.dumps({"version": VERSION, "firing": {"a": GOOD, "b": bad}, "sinks": {"slack": {"b": bad}}})
    path.write_text(content)
    with caplog.at_level(logging.ERROR):
        s = AlertStateFile(path)
    assert [a.alertname for a in s.firing] == ["A"] and s.book("slack").load() == {}
    assert (tmp_path / f"{FILE_NAME}.rejected.1").read_text() == content
    (error,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "left out" in error.getMessage() and "firing['b']" in error.errors  # type: ignore[attr-defined]


def test_a_record_filed_under_another_key_is_filed_under_its_fingerprint(tmp_path: Path) -> None:
    # A key that does not match the labels' fingerprint once made a sink resolve, every second, forever.
    path = tmp_path / FILE_NAME
    a = alert()
    path.write_text(json.dumps({"version": VERSION, "firing": {"wrong": {
        "labels": dict(a.labels), "annotations": dict(a.annotations), "starts_at": a.starts_at}},
        "sinks": {"pagerduty": {"wrong": {"labels": dict(a.labels), "annotations": {}, "starts_at": 5}}}}))
    s = AlertStateFile(path)
    assert by_fp(s.firing) == {a.fingerprint: a}
    assert list(s.book("pagerduty").load()) == [a.fingerprint]


def test_save_firing_writes_only_when_the_set_changes(tmp_path: Path) -> None:
    path = tmp_path / FILE_NAME
    s = AlertStateFile(path)
    s.save_firing([])
    assert not path.exists()  # nothing firing, nothing changed: no write at all

    a0, a1 = alert(gpu=0), alert(gpu=1)
    s.save_firing([a0])
    assert path.exists()
    marker = "written by the test, not by AlertStateFile"
    path.write_text(marker)  # any write by save_firing would replace this

    s.save_firing([a0])
    s.save_firing([alert(gpu=0, summary="new wording")])  # same identity, new annotations: not a change
    s.save_firing([a0, alert(gpu=2, state="pending")])  # pending alerts are not recorded
    assert path.read_text() == marker

    s.save_firing([a0, a1])  # the set changed: written
    assert set(json.loads(path.read_text())["firing"]) == {a0.fingerprint, a1.fingerprint}
    path.write_text(marker)
    s.save_firing([a1])  # one resolved: written
    assert set(json.loads(path.read_text())["firing"]) == {a1.fingerprint}
    path.write_text(marker)
    s.save_firing([])
    assert json.loads(path.read_text())["firing"] == {}


def test_write_is_atomic_and_leaves_no_temporary_files(tmp_path: Path) -> None:
    s = AlertStateFile(tmp_path / FILE_NAME)
    for gpu in range(5):
        s.save_firing([alert(gpu=g) for g in range(gpu + 1)])
    assert os.listdir(tmp_path) == [FILE_NAME]


def _errors(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno == logging.ERROR and r.name == "gpumond.alerts"]


def test_unwritable_directory_logs_and_does_not_raise(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # The state directory is replaced by a plain file after start: writes fail whoever we run as (even root).
    state_dir = tmp_path / "state"
    s = AlertStateFile(state_dir / FILE_NAME)
    state_dir.write_text("not a directory")
    a = alert()
    with caplog.at_level(logging.ERROR, logger="gpumond.alerts"):
        s.save_firing([a])
        s.book("slack").save({a.fingerprint: a})
    assert len(_errors(caplog)) == 1  # said once, not on every update
    assert all("cannot write" in r.getMessage() for r in _errors(caplog))
    assert by_fp(s.firing) == {a.fingerprint: a}  # alerting goes on from memory
    assert s.book("slack").load() == {a.fingerprint: a}
    # The disk recovers: the next update writes, though the firing set did not change.
    state_dir.unlink()
    s.save_firing([a])
    assert by_fp(AlertStateFile(state_dir / FILE_NAME).firing) == {a.fingerprint: a}


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes read-only directories")
def test_read_only_directory_logs_and_does_not_raise(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    s = AlertStateFile(state_dir / FILE_NAME)
    state_dir.chmod(0o500)
    try:
        with caplog.at_level(logging.ERROR, logger="gpumond.alerts"):
            s.save_firing([alert()])
    finally:
        state_dir.chmod(0o700)
    assert len(_errors(caplog)) == 1
    assert os.listdir(state_dir) == []
