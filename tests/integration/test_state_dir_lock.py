"""One live daemon per state directory, --state-dir on both daemons, and the rules example running as shipped.

A second agent or rules service started on a state directory that a live one holds is refused with one line
(exit 2) before it reads or writes any state; a killed holder leaves no stale lock.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

from tests.integration.helpers import (LOOPBACK, REPO_ROOT, AgentProcess, ManagedProcess, free_port, http_get,
                                       wait_until)

pytestmark = pytest.mark.integration

EXAMPLE = REPO_ROOT / "deploy" / "examples" / "rules.yaml"


def _rules(workdir: Path, *args: str | Path) -> tuple[ManagedProcess, str]:
    port = free_port()
    proc = ManagedProcess([sys.executable, "-m", "gpumond.cli", "rules", "--config", str(EXAMPLE),
                           "--listen", f"{LOOPBACK}:{port}", *map(str, args)], workdir)
    return proc, f"http://{LOOPBACK}:{port}"


def _healthy(proc: ManagedProcess, url: str) -> None:
    def up() -> bool:
        assert proc.running, proc.describe()
        return http_get(f"{url}/healthz", timeout=1.0)[0] == 200

    wait_until(up, timeout=30, what=f"{url}/healthz", describe=proc.describe)


def _refused_line(proc: ManagedProcess) -> str:
    assert proc.wait_exit(30) == 2, proc.describe()
    lines = [line for line in proc.stderr().splitlines() if line.strip() and not line.startswith("ts=")]
    assert len(lines) == 1, proc.describe()
    return lines[0]


def test_the_rules_example_runs_and_a_second_service_on_its_state_dir_is_refused(tmp_path: Path) -> None:
    # Only the port (tests run side by side) and the state directory (a test must not touch
    # /var/lib/gpumond-rules) differ from `gpumond rules --config deploy/examples/rules.yaml`.
    state = tmp_path / "state"
    first, url = _rules(tmp_path / "first", "--state-dir", state)
    with first:
        first.spawn()
        _healthy(first, url)
        assert (state / "gpumond.lock").is_file()
        second, _ = _rules(tmp_path / "second", "--state-dir", state)
        second.spawn()
        line = _refused_line(second)
        assert line.startswith(f"gpumond: state_dir {state} is in use by another live gpumond rules (pid "), line
        assert "--state-dir" in line, line
        assert first.running, first.describe()  # the holder is untouched
        assert first.stop() == 0, first.describe()
    # Killed without a word: the kernel dropped the lock with the process, so a new service starts.
    third, url = _rules(tmp_path / "third", "--state-dir", state)
    with third:
        third.spawn()
        _healthy(third, url)
        assert third.stop(sig=signal.SIGKILL) != 0
    fourth, url = _rules(tmp_path / "fourth", "--state-dir", state)
    with fourth:
        fourth.spawn()
        _healthy(fourth, url)


def test_a_second_agent_on_a_live_agents_state_dir_is_refused(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with AgentProcess(["--sim", "2", "--state-dir", state], tmp_path / "first") as first:
        assert (state / "gpumond.lock").is_file()
        second = AgentProcess.run(["--sim", "2", "--state-dir", state], tmp_path / "second")
        line = _refused_line(second)
        assert line.startswith(f"gpumond: state_dir {state} is in use by another live gpumond agent (pid "), line
        assert first.running, first.describe()
