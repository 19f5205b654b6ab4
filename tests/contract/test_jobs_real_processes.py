"""Job attribution and host evidence through real psutil, on real child processes of this test."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from gpumond.agent.host import HostEvidence
from gpumond.agent.jobs import JobAttributor
from gpumond.wire.identity import JOB_ENV_VARS

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads /proc/PID/environ and /proc/PID/cgroup"
)

SLEEPER = "import time; time.sleep(30)"
# Starts a grandchild without any job variable, reports its pid, then waits.
WRAPPER = f"""
import os, subprocess, sys, time
env = {{k: v for k, v in os.environ.items() if k not in {JOB_ENV_VARS!r}}}
child = subprocess.Popen([sys.executable, "-c", {SLEEPER!r}], env=env)
print(child.pid, flush=True)
time.sleep(30)
"""
WAIT_S = 10


def clean_env(**extra: str) -> dict[str, str]:
    """This test's environment without any job variable the CI runner may carry."""
    env = {k: v for k, v in os.environ.items() if k not in JOB_ENV_VARS}
    env.update(extra)
    return env


@pytest.fixture
def spawn() -> Iterator:
    """Start children in their own process groups; kill each whole group afterwards."""
    children: list[subprocess.Popen] = []

    def start(code: str, env: dict[str, str], **kwargs: object) -> subprocess.Popen:
        child = subprocess.Popen(
            [sys.executable, "-c", code], env=env, start_new_session=True, **kwargs
        )
        children.append(child)
        wait_exec(child.pid)
        return child

    yield start
    for child in children:
        try:
            os.killpg(child.pid, signal.SIGKILL)  # also takes grandchildren
        except ProcessLookupError:
            pass
        child.wait(timeout=WAIT_S)
        if child.stdout is not None:
            child.stdout.close()


def wait_exec(pid: int) -> None:
    """Until the child has exec'd: before that, /proc/PID/environ still shows the parent's environment."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        try:
            if b"-c" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"):
                return
        except OSError:
            return  # already gone; the test itself deals with that
        time.sleep(0.005)
    raise AssertionError(f"child {pid} did not exec within {WAIT_S} s")


def read_line(child: subprocess.Popen) -> str:
    """One line from a child's stdout, failing the test rather than hanging."""
    ready, _, _ = select.select([child.stdout], [], [], WAIT_S)
    assert ready, "child did not report in time"
    return child.stdout.readline().strip()


def test_child_with_slurm_job_id_is_attributed(spawn) -> None:
    child = spawn(SLEEPER, clean_env(SLURM_JOB_ID="424242"))
    attributor = JobAttributor()
    assert attributor.jobs_for([child.pid]) == ("424242",)
    assert attributor.jobs_for([child.pid]) == ("424242",)
    assert attributor.stats.hits == 1


def test_grandchild_inherits_job_from_wrapper(spawn) -> None:
    wrapper = spawn(WRAPPER, clean_env(SLURM_JOB_ID="424242"), stdout=subprocess.PIPE, text=True)
    grandchild = int(read_line(wrapper))
    assert "SLURM_JOB_ID" not in psutil.Process(grandchild).environ()
    assert psutil.Process(grandchild).ppid() == wrapper.pid
    assert JobAttributor().jobs_for([grandchild]) == ("424242",)


def test_process_without_job_contributes_nothing(spawn) -> None:
    child = spawn(SLEEPER, clean_env())
    # Pods off: the CI runner itself may live in a Kubernetes pod.
    attributor = JobAttributor(kubernetes_pods=False)
    assert attributor.jobs_for([child.pid]) == ()
    assert attributor.stats.denied == attributor.stats.vanished == 0


def test_process_that_already_exited_is_tolerated(spawn) -> None:
    child = spawn("pass", clean_env(SLURM_JOB_ID="424242"))
    child.wait(timeout=WAIT_S)
    attributor = JobAttributor()
    assert attributor.jobs_for([child.pid]) == ()
    assert attributor.stats.vanished == 1


def test_process_that_exits_during_lookup_is_tolerated(spawn) -> None:
    doomed = spawn(SLEEPER, clean_env(SLURM_JOB_ID="424242"))
    survivor = spawn(SLEEPER, clean_env(SLURM_JOB_ID="777"))

    def process_then_exit(pid: int) -> psutil.Process:
        # NVML listed the pid, psutil found it, and then it exited before we read it.
        process = psutil.Process(pid)
        if pid == doomed.pid:
            doomed.kill()
            doomed.wait(timeout=WAIT_S)
        return process

    attributor = JobAttributor(process_factory=process_then_exit)
    assert attributor.jobs_for([doomed.pid, survivor.pid]) == ("777",)
    assert attributor.stats.vanished == 1


def test_host_evidence_with_real_psutil() -> None:
    host = HostEvidence()
    first = host.read()
    sum(range(2_000_000))  # let a few clock ticks pass
    second = host.read()
    for reading in (first, second):
        assert reading.cpu_utilization_ratio is not None
        assert 0.0 <= reading.cpu_utilization_ratio <= 1.0
        assert reading.cpu_iowait_ratio is not None  # Linux has iowait
        assert 0.0 <= reading.cpu_iowait_ratio <= 1.0
        assert 0 < reading.memory_used_bytes <= psutil.virtual_memory().total
        assert reading.disk_read_bytes_total is None or reading.disk_read_bytes_total >= 0
    if first.disk_read_bytes_total is not None and second.disk_read_bytes_total is not None:
        assert second.disk_read_bytes_total >= first.disk_read_bytes_total
