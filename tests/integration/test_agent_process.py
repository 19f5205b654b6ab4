"""The agent as a process: clean SIGTERM, one-line errors with the right exit codes, JSON logs."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest

from tests.integration.helpers import LOOPBACK, AgentProcess, wait_until, write_yaml

pytestmark = pytest.mark.integration

STOP_WITHIN_S = 10.0


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def _not_log_lines(text: str) -> list[str]:
    """stderr lines that are not structured (logfmt) log records."""
    return [line for line in _lines(text) if not line.startswith("ts=")]


def test_sigterm_stops_cleanly_with_exit_code_0(start_agent) -> None:
    agent: AgentProcess = start_agent("--sim", "4")
    assert agent.get("/metrics")[0] == 200
    t0 = time.monotonic()
    rc = agent.stop(timeout=STOP_WITHIN_S)
    took = time.monotonic() - t0
    assert rc == 0, f"exit code {rc} after SIGTERM (-9: not stopped within {STOP_WITHIN_S:g}s)\n{agent.describe()}"
    assert took < STOP_WITHIN_S
    log = agent.stderr()
    assert "agent stopped" in log, agent.describe()
    assert "Traceback" not in log, agent.describe()
    assert 'msg="agent stopped"' in _lines(log)[-1], "'agent stopped' should be the last word"


@pytest.mark.parametrize(("config", "field"), [
    ({"sampling": {"fast_interval_s": -1}}, "sampling.fast_interval_s"),
    ({"lsiten": "127.0.0.1:9480"}, "lsiten"),
    ({"sampling": {"slow_interval_s": "30"}}, "sampling.slow_interval_s"),
], ids=["negative-interval", "unknown-key", "string-number"])
def test_bad_config_exits_2_with_one_line_naming_the_field(tmp_path: Path, config: dict, field: str) -> None:
    path = write_yaml(tmp_path / "agent.yaml", config)
    agent = AgentProcess.run(["--sim", "2", "--config", path], tmp_path / "agent")
    assert agent.returncode == 2, agent.describe()
    lines = _lines(agent.stderr())
    assert len(lines) == 1, f"expected one stderr line, got {len(lines)}:\n{agent.describe()}"
    assert field in lines[0] and "agent.yaml" in lines[0], lines[0]
    assert agent.stdout() == ""


def test_port_in_use_exits_1_with_one_line_naming_the_address(tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"  # where a --sim run without state_dir makes its own state directory
    tmp.mkdir()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind((LOOPBACK, 0))
        holder.listen()  # a listening socket: SO_REUSEADDR cannot share it
        port = holder.getsockname()[1]
        agent = AgentProcess.run(["--sim", "2"], tmp_path / "agent", port=port, env={**os.environ, "TMPDIR": str(tmp)})
    assert list(tmp.iterdir()) == [], "a failed start left its gpumond-sim-* state directory behind"
    assert agent.returncode == 1, agent.describe()
    err = agent.stderr()
    assert "Traceback" not in err, agent.describe()
    errors = _not_log_lines(err)
    assert len(errors) == 1, f"expected one error line, got {len(errors)}:\n{agent.describe()}"
    assert f"{LOOPBACK}:{port}" in errors[0], errors[0]
    assert agent.stdout() == ""


def test_the_first_scrape_has_the_connection_cap_and_the_log_names_the_alert_sinks(tmp_path: Path,
                                                                                  start_agent) -> None:
    # Slow tiers: the first scrape serves the sample taken in start(), before the HTTP server existed.
    am = f"http://{LOOPBACK}:{_closed_port()}"
    config = write_yaml(tmp_path / "agent.yaml", {
        "sampling": {"fast_interval_s": 60, "slow_interval_s": 60}, "http": {"max_connections": 100},
        "alerting": {"alertmanager": {"urls": [am]}}})
    agent: AgentProcess = start_agent("--sim", "2", "--config", config)
    fams = agent.metrics()
    assert fams["gpumond_http_connections_limit"].samples[0].value == 100
    starting = next(line for line in _lines(agent.stderr()) if 'msg="agent starting"' in line)
    assert "policy=dry_run" in starting, starting  # the default: no power limit is changed
    start = next(line for line in _lines(agent.stderr()) if 'msg="alert sinks on"' in line)
    assert f'sinks="log, alertmanager({am.removeprefix("http://")})"' in start, start


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def test_missing_scenario_file_exits_2_with_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-scenario.yaml"
    agent = AgentProcess.run(["--sim", "2", "--sim-scenario", missing], tmp_path / "agent")
    assert agent.returncode == 2, agent.describe()
    lines = _lines(agent.stderr())
    assert len(lines) == 1, f"expected one stderr line, got {len(lines)}:\n{agent.describe()}"
    assert "--sim-scenario" in lines[0] and missing.name in lines[0], lines[0]
    assert agent.stdout() == ""


def test_json_log_format_every_stderr_line_is_json(tmp_path: Path, start_agent) -> None:
    # Faults make the agent log warnings and errors with extra fields, not just start and stop.
    scenario = write_yaml(tmp_path / "scenario.yaml", {"faults": [
        {"gpu": 0, "kind": "xid", "code": 31, "at_s": 20},
        {"gpu": 1, "kind": "lost", "at_s": 20},
        {"gpu": 2, "kind": "nvml_error", "function": "nvmlDeviceGetPowerManagementDefaultLimit",
         "error": "no_permission", "at_s": 0},
    ]})
    agent: AgentProcess = start_agent("--sim", "3", "--sim-scenario", scenario, "--sim-speed", "20",
                                      "--log-format", "json", "--log-level", "debug")
    wait_until(lambda: "gpu lost" in agent.stderr() and '"xid": 31' in agent.stderr(), timeout=30,
               what="the agent to log the XID 31 and the lost GPU", describe=agent.describe)
    assert agent.stop(timeout=STOP_WITHIN_S) == 0, agent.describe()

    records = []
    for n, line in enumerate(agent.stderr().splitlines(), 1):
        try:
            record = json.loads(line)
        except ValueError:
            pytest.fail(f"stderr line {n} is not JSON: {line!r}\n{agent.describe()}", pytrace=False)
        assert isinstance(record, dict), line
        assert {"ts", "level", "logger", "msg"} <= record.keys(), line
        records.append(record)
    msgs = [r["msg"] for r in records]
    assert "agent starting" in msgs and "gpu lost" in msgs and msgs[-1] == "agent stopped", msgs
    lost = next(r for r in records if r["msg"] == "gpu lost")
    assert lost["level"] == "error" and lost["gpu"] == 1, lost
