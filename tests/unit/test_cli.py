import subprocess
import sys

import pytest

from gpumond.cli import main


def run(*args):
    return subprocess.run([sys.executable, "-m", "gpumond.cli", *args], capture_output=True, text=True,
                          timeout=60)


@pytest.mark.parametrize("args, fragment", [
    (["agent", "--sim", "0"], "--sim: must be from 1 to 1024, got 0"),
    (["agent", "--sim-speed", "fast"], "--sim-speed: must be a number, got 'fast'"),
    (["agent", "--listen", "nohost"], "--listen: must be HOST:PORT"),
    (["agent", "--bogus"], "unrecognized arguments: --bogus"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
])
def test_bad_flags_exit_2_with_one_line(args, fragment):
    p = run(*args)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert fragment in lines[0]


def test_bad_config_exits_2_with_one_line_naming_the_field(tmp_path):
    f = tmp_path / "agent.yaml"
    f.write_text("sampling:\n  fast_interval_s: -1\n")
    p = run("agent", "--config", str(f), "--sim", "1")
    assert p.returncode == 2
    assert p.stderr.count("\n") == 1 and "sampling.fast_interval_s" in p.stderr
    p = run("check-config", str(f))
    assert p.returncode == 2 and "sampling.fast_interval_s" in p.stderr


def test_check_config_accepts_a_good_file(tmp_path, capsys):
    f = tmp_path / "agent.yaml"
    f.write_text("listen: 127.0.0.1:9999\n")
    assert main(["check-config", str(f)]) == 0
    assert "ok" in capsys.readouterr().out


def test_bad_scenario_file_is_one_clear_line(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("faults:\n  - {gpu: 0, kind: coolng, at_s: 1}\n")
    p = run("agent", "--sim", "2", "--sim-scenario", str(f))
    assert p.returncode == 2 and p.stderr.count("\n") == 1
    assert "--sim-scenario" in p.stderr and "coolng" in p.stderr


def test_help_teaches_the_simulator():
    p = run("agent", "--help")
    assert p.returncode == 0 and "gpumond agent --sim 8" in p.stdout
