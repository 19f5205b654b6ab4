"""A real agent (--sim 2, enforcing 80 % caps) whose state_dir is a small tmpfs: filled, or remounted read-only,
then stopped with a real SIGTERM or SIGHUP. Root writes through chmod, so the disk itself is made to fail.

Needs CAP_SYS_ADMIN to mount the tmpfs (the test environment runs as root); skipped, saying so, without it.
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration import helpers

pytestmark = pytest.mark.integration


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "state"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs for state_dir (needs CAP_SYS_ADMIN): {done.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(mnt: Path) -> None:
    """Fill the file system: every later write or new file fails with ENOSPC."""
    subprocess.run(["dd", "if=/dev/zero", f"of={mnt / 'filler'}", "bs=4k"], capture_output=True, check=False)
    with pytest.raises(OSError):
        (mnt / "probe").write_bytes(b"x" * 8192)


def _start(tmp_path: Path, state: Path, start_agent, thermal=False, scenario=None):
    cfg = helpers.write_yaml(tmp_path / "agent.yaml", {
        "state_dir": str(state), "node_name": "disk-node",
        "sampling": {"fast_interval_s": 1, "slow_interval_s": 5},
        "policy": {"mode": "enforce", "power_limit": {"default_w": "80%"}, "thermal": {"enabled": thermal}},
    })
    args = ["--sim", "2", "--sim-speed", "20", "--config", cfg, "--log-format", "json"]
    if scenario:
        args += ["--sim-scenario", helpers.write_yaml(tmp_path / "scenario.yaml", scenario)]
    agent = start_agent(*args)
    agent.wait_for_metrics(lambda f: helpers.value(f, "gpumond_gpu_power_limit_watts", gpu="0") == 560
                           and helpers.value(f, "gpumond_gpu_power_limit_watts", gpu="1") == 560,
                           timeout=30, what="both GPUs capped at 80 % (560 W)")
    return agent


def _log(agent) -> list[dict]:
    out = []
    for line in agent.stderr_path.read_text().splitlines() + agent.stdout_path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_stop_on_a_full_state_dir_restores_every_gpu_and_says_what_was_not_recorded(tmp_path, small_disk,
                                                                                     start_agent, sig):
    agent = _start(tmp_path, small_disk, start_agent)
    fill(small_disk)
    assert agent.stop(sig=sig) == 0
    lines = _log(agent)
    restored = sorted(x["gpu"] for x in lines if x["msg"] == "power limit restored" and x["to_w"] == 700)
    assert restored == [0, 1], lines[-10:]
    assert any(x["msg"].startswith("agent stopping: power limits restored, but not recorded") for x in lines)
    assert not any("Traceback" in json.dumps(x) for x in lines)
    assert lines[-1]["msg"] == "agent stopped"


def test_sighup_stops_like_sigterm_and_restores(tmp_path, start_agent):
    state = tmp_path / "state"
    agent = _start(tmp_path, state, start_agent)
    assert agent.stop(sig=signal.SIGHUP) == 0
    lines = _log(agent)
    assert any(x["msg"] == "stopping" and x["signal"] == "SIGHUP" for x in lines)
    audit = [json.loads(x) for x in (state / "policy-audit.jsonl").read_text().splitlines()]
    assert sorted(e["gpu"] for e in audit if e["action"] == "restore" and e["after_w"] == 700) == [0, 1]


@pytest.fixture
def immutable(tmp_path: Path) -> Iterator[list[Path]]:
    """Paths given `chattr +i` (which binds root too) during the test; made mutable again afterwards."""
    paths: list[Path] = []
    yield paths
    for p in reversed(paths):
        subprocess.run(["chattr", "-i", str(p)], check=False)


def make_immutable(paths: list[Path], state: Path) -> None:
    for p in [*sorted(state.iterdir()), state]:
        done = subprocess.run(["chattr", "+i", str(p)], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            pytest.skip(f"chattr +i not supported here: {done.stderr.strip()}")
        paths.append(p)
    with pytest.raises(OSError):
        (state / "probe").write_text("x")


def test_an_immutable_state_dir_withholds_changes_pages_and_still_restores(tmp_path, start_agent, immutable):
    # GPU 1's cooling fails 400 simulated seconds (20 s) in, after the state_dir has become unwritable
    state = tmp_path / "state"
    hot = {"faults": [{"gpu": 1, "kind": "cooling", "factor": 2.2, "at_s": 400}]}
    agent = _start(tmp_path, state, start_agent, thermal=True, scenario=hot)
    make_immutable(immutable, state)
    fams = agent.wait_for_metrics(
        lambda f: (helpers.value(f, "gpumond_policy_actions_total", action="not_recorded") or 0) >= 1,
        timeout=60, what="the thermal controller's cut withheld for want of a record")
    assert helpers.value(fams, "gpumond_gpu_power_limit_watts", gpu="1") == 560  # nothing unrecorded was set
    assert helpers.value(fams, "gpumond_alert_active", alertname="GpumondPolicyNotRecorded") == 1
    assert agent.stop() == 0
    lines = _log(agent)
    assert sorted(x["gpu"] for x in lines if x["msg"] == "power limit restored" and x["to_w"] == 700) == [0, 1]
    assert not any(x["msg"] == "power limit set" and x["gpu"] == 1 and x["to_w"] < 560 for x in lines)
