"""gpumond.state.jsonfile: every way a state file can be bad, on the one mechanism all of them are read through."""

from __future__ import annotations

import errno
import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict

from gpumond.state.jsonfile import JsonStateFile, Number, Text


class _Rec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: Text
    at: Number


def _parse(key: str, raw: Any) -> _Rec:
    return _Rec.model_validate(raw)


def _file(path: Path, **kw: Any) -> JsonStateFile:
    return JsonStateFile(path, what="test state", version=2, sections=("items",), consequence="it starts empty",
                         **kw)


@pytest.mark.parametrize(("body", "why"), [
    (os.urandom(64) + b"\xff", "not UTF-8"),
    (b"", "not JSON"),
    (b'{"version": 2, "items": []}', "items: a JSON list, not an object"),
    (b'{"version": 3, "items": {}}', "version 3, this gpumond reads version 2"),
    (b'"just a string"', "a JSON str, not an object"),
    (b"[" * 50_000, "nested too deeply"),
], ids=["random-bytes", "empty", "wrong-shape", "future-version", "not-an-object", "deep"])
def test_an_unusable_file_is_moved_to_the_first_free_numbered_name(tmp_path: Path, body: bytes, why: str,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "s.json"
    (tmp_path / "s.json.corrupt.1").write_bytes(b"older")
    path.write_bytes(body)
    with caplog.at_level(logging.ERROR):
        doc = _file(path).read()
    assert doc.body == {} and not doc.trusted and why in doc.problems[0], doc.problems
    assert (tmp_path / "s.json.corrupt.1").read_bytes() == b"older"
    assert (tmp_path / "s.json.corrupt.2").read_bytes() == body and not path.exists()
    (record,) = caplog.records
    assert record.getMessage() == "test state file unusable; set aside: it starts empty"


def test_a_file_over_the_size_limit_is_not_parsed(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"version": 2, "items": {}, "pad": "x" * 2000}))
    doc = _file(path, max_bytes=1000).read()
    assert "larger than 1000 bytes" in doc.problems[0] and (tmp_path / "s.json.corrupt.1").exists()


def test_bad_records_are_left_out_and_the_file_copied_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "s.json"
    body = {"version": 2, "items": {"a": {"name": "a", "at": 1}, "b": {"name": "b", "at": "noon"},
                                     "c": {"name": "c", "at": float("inf")}, "d": [1]}}
    path.write_text(json.dumps(body))
    f = _file(path)
    doc = f.read()
    items, problems = f.records(doc, "items", _parse)
    assert list(items) == ["a"] and len(problems) == 3
    with caplog.at_level(logging.ERROR):
        f.reject(problems)
    assert path.exists() and json.loads((tmp_path / "s.json.rejected.1").read_text()) == json.loads(json.dumps(body))
    assert "invalid record(s) left out" in caplog.records[0].getMessage()


def test_a_failed_move_is_said_and_the_daemon_still_starts(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "s.json"
    path.write_bytes(b"\x00garbage")

    def refuse(src: object, dst: object) -> None:
        raise OSError(errno.EROFS, "Read-only file system")

    with caplog.at_level(logging.ERROR):
        doc = _file(path, move=refuse).read()
    assert doc.body == {} and doc.problems
    messages = [r.getMessage() for r in caplog.records]
    assert "cannot keep the test state file for a post-mortem" in messages
    assert messages[-1] == "test state file unusable: it starts empty"  # not "set aside": it was not


def test_an_unreadable_file_is_not_trusted_and_set_aside_never_overwritten_unread(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.mkdir()  # reading a directory fails as an unreadable file does
    doc = _file(path).read()
    assert not doc.trusted and "cannot be read" in doc.problems[0]
    assert not path.exists() and (tmp_path / "s.json.corrupt.1").is_dir()


def test_read_only_reports_and_moves_nothing(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_bytes(b"\xff")
    f = _file(path, read_only=True)
    assert f.read().problems and path.read_bytes() == b"\xff" and list(tmp_path.iterdir()) == [path]
    with pytest.raises(PermissionError):
        f.write({"items": {}})


def test_an_unwritable_directory_raises_on_write_for_the_caller_to_decide(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(OSError):
        _file(blocker / "s.json").write({"items": {}})


def test_write_round_trips_with_its_version_and_refuses_nan(tmp_path: Path) -> None:
    f = _file(tmp_path / "s.json")
    f.write({"items": {"a": {"name": "a", "at": 1.5}}})
    doc = f.read()
    assert doc.trusted and f.records(doc, "items", _parse)[0]["a"].at == 1.5
    with pytest.raises(ValueError):
        f.write({"items": {"a": {"name": "a", "at": float("nan")}}})
    assert f.read().trusted  # the old file is left as it was


def test_no_path_keeps_nothing(tmp_path: Path) -> None:
    f = _file(None)  # type: ignore[arg-type]
    f.write({"items": {}})
    assert f.read().body == {} and list(tmp_path.iterdir()) == []
