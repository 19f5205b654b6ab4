"""remediation: in rules.yaml (bad input is one line), its state file, and `gpumond remediation`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpumond.cli import main
from gpumond.config import ConfigError
from gpumond.config.rules import load_rules_config
from gpumond.rules.remediation.plan import Breaker, Record, State
from gpumond.rules.remediation.requests import read_requests
from gpumond.rules.remediation.state import FILE_NAME, StateFile


def _load(tmp_path: Path, body: str):
    path = tmp_path / "rules.yaml"
    path.write_text("allow_unauthenticated: true\n" + body)
    return load_rules_config(path, env={})


def test_defaults_are_dry_run_without_a_backend(tmp_path: Path) -> None:
    cfg = _load(tmp_path, "").remediation
    assert (cfg.mode, cfg.backend, cfg.hold_down_s) == ("dry_run", "none", 900.0)


@pytest.mark.parametrize(("body", "message"), [
    ("remediation: {mode: enforce}", "mode enforce needs a backend (slurm or kubernetes)"),
    ("remediation: {mode: drain}", "remediation.mode"),
    ("remediation: {conditions: [gpu_lost, io_starved_job]}", "remediation.conditions"),
    ("remediation: {conditions: [gpu_lost, gpu_lost]}", "a condition is listed twice"),
    ("remediation: {guard: {max_pool_fraction: 0}}", "remediation.guard.max_pool_fraction"),
    ("remediation: {guard: {max_nodes: 0}}", "remediation.guard.max_nodes"),
    ("remediation: {audit_log: relative.jsonl}", "must be an absolute path"),
    ("remediation: {backend: lsf}", "remediation.backend"),
])
def test_bad_remediation_config_is_one_line(tmp_path: Path, body: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, body)
    text = str(err.value)
    assert message in text and "\n" not in text, text


STATE = State(records={"n1": Record("n1", "gpu", "gpumond: GPU 3 lost", ("gpu_lost",), 10.0, False, "drained",
                                    True, 20.0)},
              drains=(10.0,), breaker=Breaker(30.0, "n2: over max_nodes"), straggler_since={"n3": 5.0},
              undone=("n4",), noted=("n2",))


def test_state_round_trips(tmp_path: Path) -> None:
    f = StateFile(tmp_path / FILE_NAME)
    f.save(STATE)
    assert f.load() == STATE
    assert StateFile(tmp_path / FILE_NAME).read().problems == ()


@pytest.mark.parametrize(("body", "problem"), [
    (b"\xff\xfe{not utf-8", "not UTF-8 text"),
    (b"[" * 200_000, "nested too deeply"),
    (b'{"records": {}}', "version None"),
    (b"[1, 2]", "a JSON list, not an object"),
    (b"{" + b"x" * 10, "not JSON"),
], ids=["not-utf8", "deep", "no-version", "list", "not-json"])
def test_an_unusable_file_is_set_aside_numbered_and_the_service_starts_empty(tmp_path: Path, body: bytes,
                                                                             problem: str) -> None:
    path = tmp_path / FILE_NAME
    path.write_bytes(b"an older corrupt file")
    path.rename(tmp_path / f"{FILE_NAME}.corrupt.1")  # kept from an earlier start: never overwritten
    path.write_bytes(body)
    loaded = StateFile(path).read()
    assert loaded.state == State() and problem in loaded.problems[0], loaded.problems
    assert not path.exists()
    assert (tmp_path / f"{FILE_NAME}.corrupt.1").read_bytes() == b"an older corrupt file"
    assert (tmp_path / f"{FILE_NAME}.corrupt.2").read_bytes() == body


def _doc(**fields: object) -> dict[str, object]:
    doc = json.loads(Path(_saved()).read_text())
    doc.update(fields)
    return doc


def _saved() -> str:
    import tempfile
    path = Path(tempfile.mkdtemp()) / FILE_NAME
    StateFile(path).save(STATE)
    return str(path)


@pytest.mark.parametrize(("change", "problem"), [
    ({"since": "2026-11-28T19:57:50Z"}, "records['n1'].since: Input should be a valid number"),
    ({"since": float("nan")}, "finite number"),
    ({"dry_run": "no"}, "records['n1'].dry_run"),
    ({"phase": "gone"}, "records['n1'].phase"),
    ({"node": "n7"}, "filed under 'n1'"),
    ({"surprise": 1}, "Extra inputs"),
])
def test_a_wrong_typed_record_is_left_out_the_rest_used_and_the_file_kept(tmp_path: Path, change: dict[str, object],
                                                                          problem: str) -> None:
    doc = _doc()
    good = dict(doc["records"]["n1"], node="n5")
    doc["records"] = {"n1": {**doc["records"]["n1"], **change}, "n5": good}
    path = tmp_path / FILE_NAME
    path.write_text(json.dumps(doc))
    loaded = StateFile(path).read()
    assert list(loaded.state.records) == ["n5"], loaded.state.records  # the good record kept, the bad left out
    assert loaded.state.drains == STATE.drains and loaded.state.breaker == STATE.breaker
    assert len(loaded.problems) == 1 and problem in loaded.problems[0], loaded.problems
    assert json.loads((tmp_path / f"{FILE_NAME}.rejected.1").read_text()) == json.loads(json.dumps(doc))


def test_a_damaged_breaker_record_keeps_the_breaker_open(tmp_path: Path) -> None:
    path = tmp_path / FILE_NAME
    path.write_text(json.dumps(_doc(breaker={"opened_at": "yesterday", "why": 3})))
    loaded = StateFile(path, clock=lambda: 99.0).read()
    assert loaded.state.breaker is not None and loaded.state.breaker.opened_at == 99.0
    assert "unreadable" in loaded.state.breaker.why and loaded.problems


def test_list_is_read_only_on_a_damaged_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / FILE_NAME
    path.write_bytes(b"\xff" * 10)
    assert main(["remediation", "list", "--state-dir", str(tmp_path)]) == 0
    assert "not UTF-8 text" in capsys.readouterr().err
    assert path.read_bytes() == b"\xff" * 10 and sorted(p.name for p in tmp_path.iterdir()) == [FILE_NAME]
    doc = _doc()
    doc["records"]["n1"]["since"] = "soon"
    path.write_text(json.dumps(doc))
    assert main(["remediation", "list", "--state-dir", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert "records['n1'].since" in err and "n1" not in out.split("CIRCUIT")[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == [FILE_NAME]


def test_cli_lists_undoes_and_resets(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = State(records={"n1": Record("n1", "gpu", "gpumond: GPU 3 lost (XID 79)", ("gpu_lost",), 10.0, False,
                                        "drained")}, breaker=Breaker(30.0, "n2: over guard.max_nodes 1"))
    StateFile(tmp_path / FILE_NAME).save(state)
    assert main(["remediation", "list", "--state-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "n1" in out and "gpumond: GPU 3 lost (XID 79)" in out and "CIRCUIT BREAKER OPEN" in out
    assert main(["remediation", "undo", "n9", "--state-dir", str(tmp_path)]) == 1
    assert "holds no drain on n9" in capsys.readouterr().err
    assert main(["remediation", "undo", "n1", "--state-dir", str(tmp_path)]) == 0
    assert main(["remediation", "reset-breaker", "--state-dir", str(tmp_path)]) == 0
    requests, problems = read_requests(tmp_path)
    assert requests.undo == ("n1",) and requests.reset_breaker and problems == []
    assert main(["remediation", "list", "--state-dir", str(tmp_path / "missing")]) == 2
    assert "is not a directory" in capsys.readouterr().err


def test_an_unreadable_request_is_reported_and_dropped(tmp_path: Path) -> None:
    folder = tmp_path / "remediation-requests"
    folder.mkdir()
    (folder / "undo-x.json").write_text("{not json")
    requests, problems = read_requests(tmp_path)
    assert requests.undo == () and len(problems) == 1 and "unreadable request" in problems[0]


def test_a_non_finite_number_outside_a_record_is_left_out_not_carried_into_every_save(tmp_path: Path) -> None:
    path = tmp_path / FILE_NAME
    path.write_text(json.dumps(_doc(drains=[float("inf")])))  # json writes it as Infinity, and reads it back
    assert "Infinity" in path.read_text()
    f = StateFile(path)
    loaded = f.read()
    assert loaded.state.drains == () and "drains" in loaded.problems[0]
    f.save(loaded.state)  # the next save writes valid JSON (a NaN or Infinity would make every save raise)
    assert f.read().problems == ()
