"""remediation: in rules.yaml (bad input is one line), its state file, and `gpumond remediation`."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpumond.cli import main
from gpumond.config import ConfigError
from gpumond.config.rules import load_rules_config
from gpumond.rules.remediation.plan import Breaker, Record, State
from gpumond.rules.remediation.requests import read_requests
from gpumond.rules.remediation.state import FILE_NAME, StateFile, dumps, loads


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


def test_state_round_trips_and_a_corrupt_file_is_set_aside(tmp_path: Path) -> None:
    state = State(records={"n1": Record("n1", "gpu", "gpumond: GPU 3 lost", ("gpu_lost",), 10.0, False, "drained",
                                        True, 20.0)},
                  drains=(10.0,), breaker=Breaker(30.0, "n2: over max_nodes"), straggler_since={"n3": 5.0},
                  undone=("n4",), noted=("n2",))
    assert loads(dumps(state)) == state
    f = StateFile(tmp_path / FILE_NAME)
    f.save(state)
    assert f.load() == state
    (tmp_path / FILE_NAME).write_text('{"version": 1, "records": {"n1": {"node": "n1"}}}')
    assert f.load() == State()
    assert (tmp_path / "remediation-state.corrupt").exists()


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
