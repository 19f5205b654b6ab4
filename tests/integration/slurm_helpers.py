"""A real Slurm cluster on 127.0.0.1: munged with its own socket, slurmctld, and one slurmd per node name.

    with SlurmCluster(tmp_path, ["node-a", "node-b"]) as slurm:
        slurm.scontrol("update", "NodeName=node-a", "State=DRAIN", "Reason=maintenance")
        slurm.node("node-a")  # {"state": "drained", "reason": "maintenance", "partition": "gpu"}

Needs root (slurmd runs jobs as any user) and Debian's slurmctld, slurmd, slurm-client and munge; every port is
a free one, every file is under the work directory, and the daemons are stopped by pid at exit.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from tests.integration.alert_helpers import RulesDaemon
from tests.integration.helpers import AgentProcess, free_port, http_get, wait_until, write_yaml

BINARIES = ("munged", "slurmctld", "slurmd", "scontrol", "sinfo")
MUNGE_KEY = Path("/etc/munge/munge.key")


def require_slurm() -> None:
    """FAIL (never skip) when Slurm cannot run here: CI installs it (scripts/test.sh)."""
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if missing:
        pytest.fail(f"Slurm is not installed ({', '.join(missing)} not on PATH); run `bash scripts/test.sh` or "
                    f"`apt-get install slurmctld slurmd slurm-client munge`", pytrace=False)
    if os.geteuid() != 0:
        pytest.fail("the Slurm tests run slurmctld and slurmd, which need root", pytrace=False)
    if not MUNGE_KEY.exists():
        pytest.fail(f"{MUNGE_KEY} is missing (the munge package creates it)", pytrace=False)


class SlurmCluster:
    """slurmctld + slurmd for `nodes` in one partition `gpu`, all NodeHostname=localhost."""

    def __init__(self, workdir: Path, nodes: Sequence[str], partition: str = "gpu") -> None:
        require_slurm()
        self.dir = Path(workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.nodes = list(nodes)
        self.partition = partition
        self.conf = self.dir / "slurm.conf"
        self.socket = self.dir / "munge.sock"
        self._pidfiles: list[Path] = []
        d = self.dir
        self.conf.write_text("\n".join([
            "ClusterName=gpumondtest", "SlurmctldHost=localhost",
            f"SlurmctldPort={free_port()}", f"SlurmdPort={free_port()}",
            "SlurmUser=root", "SlurmdUser=root", "AuthType=auth/munge", f"AuthInfo=socket={self.socket}",
            f"StateSaveLocation={d / 'state'}", f"SlurmdSpoolDir={d / 'spool-%n'}",
            f"SlurmctldPidFile={d / 'slurmctld.pid'}", f"SlurmdPidFile={d / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={d / 'slurmctld.log'}", f"SlurmdLogFile={d / 'slurmd-%n.log'}",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "MpiDefault=none",
            "SchedulerType=sched/builtin", "SelectType=select/linear", "ReturnToService=2",
            # One slurmd per node name on one host: each needs its own port.
            *(f"NodeName={n} NodeHostname=localhost Port={free_port()} CPUs=1 State=UNKNOWN" for n in self.nodes),
            f"PartitionName={partition} Nodes={','.join(self.nodes)} Default=YES State=UP", ""]))
        (d / "state").mkdir(exist_ok=True)

    @property
    def env(self) -> dict[str, str]:
        """The environment that points Slurm's commands (and gpumond's backend) at this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def start(self) -> SlurmCluster:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        d = self.dir
        self._daemon(["munged", "-f", f"--socket={self.socket}", f"--log-file={d / 'munged.log'}",
                      f"--pid-file={d / 'munged.pid'}", f"--seed-file={d / 'munged.seed'}", "--num-threads=4"],
                     d / "munged.pid")
        self._daemon(["slurmctld", "-f", str(self.conf)], d / "slurmctld.pid")
        for node in self.nodes:
            self._daemon(["slurmd", "-f", str(self.conf), "-N", node], d / f"slurmd-{node}.pid")

        def all_idle() -> bool:
            return all(self.node(n)["state"].startswith("idle") for n in self.nodes)

        wait_until(all_idle, timeout=30, what="slurm nodes idle", describe=self.describe)

    def _daemon(self, argv: list[str], pidfile: Path) -> None:
        self._pidfiles.append(pidfile)
        done = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=30, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{argv[0]} failed to start: {done.stderr.strip()}\n{self.describe()}")
        wait_until(pidfile.exists, timeout=10, what=f"{argv[0]} pid file {pidfile.name}")

    def stop(self) -> None:
        """SIGTERM every daemon this cluster started (by pid) at once, then wait for all: their shutdowns overlap;
        SIGKILL whichever is still there after 10 s."""
        pids = []
        for pidfile in reversed(self._pidfiles):
            try:
                pid = int(pidfile.read_text().strip())
                os.kill(pid, signal.SIGTERM)
            except (OSError, ValueError):
                continue
            pids.append(pid)
        deadline = time.monotonic() + 10
        for pid in pids:
            while time.monotonic() < deadline:
                try:
                    os.kill(pid, 0)
                except OSError:
                    break
                time.sleep(0.1)
            else:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)

    def __enter__(self) -> SlurmCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def scontrol(self, *args: str) -> str:
        done = subprocess.run(["scontrol", *args], env=self.env, capture_output=True, text=True, timeout=30,
                              check=False)
        assert done.returncode == 0, f"scontrol {' '.join(args)}: {done.stderr.strip()}"
        return done.stdout

    def node(self, name: str) -> dict[str, str]:
        """The node's long state (idle, drained, draining, …), reason ("" when none) and partition."""
        done = subprocess.run(["sinfo", "-N", "-h", "-n", name, "-o", "%T|%P|%E"], env=self.env,
                              capture_output=True, text=True, timeout=30, check=False)
        line = done.stdout.strip().splitlines()[0] if done.stdout.strip() else "unknown||"
        state, partition, reason = line.split("|", 2)
        return {"state": state, "partition": partition.rstrip("*"), "reason": "" if reason == "none" else reason}

    def describe(self) -> str:
        tail = []
        for log in sorted(self.dir.glob("*.log")):
            text = log.read_text(errors="replace")[-1500:]
            tail.append(f"--- {log.name}\n{text}")
        return "\n".join(tail)


# ----- what the remediation tests against this cluster share -------------------------------------------------
HOLD_DOWN_S = 4.0
PERSON_REASON = "replacing PSU (alice)"


def all_idle(slurm: SlurmCluster) -> SlurmCluster:
    """Every node back to idle (each test starts there)."""
    for node in slurm.nodes:
        if slurm.node(node)["state"] != "idle":
            slurm.scontrol("update", f"NodeName={node}", "State=RESUME")
    wait_until(lambda: all(slurm.node(n)["state"] == "idle" for n in slurm.nodes), timeout=20, what="nodes idle")
    return slurm


def agent_args(work: Path, faults: list[dict[str, object]], event_hold_s: float = 5) -> list[str | Path]:
    """An agent's flags: this scenario, 1 s sampling, short event hold, its own state directory."""
    scenario = write_yaml(work / "scenario.yaml", {"faults": faults})
    # XID 79's alert stays event_hold_s after the event; short here so the node can return within the test.
    config = write_yaml(work / "agent.yaml", {"sampling": {"fast_interval_s": 1, "slow_interval_s": 1},
                                               "policy": {"alerts": {"event_hold_s": event_hold_s}},
                                               "state_dir": str(work / "state")})
    return ["--sim-scenario", scenario, "--config", config]


def rules_daemon(work: Path, agents: Mapping[str, AgentProcess], slurm: SlurmCluster, guard: dict[str, object],
                 alerting: dict[str, object] | None = None,
                 remediation: dict[str, object] | None = None) -> RulesDaemon:
    """`gpumond rules` scraping `agents`, remediating in enforce mode through this cluster."""
    rules = RulesDaemon(work / "rules", {
        "allow_unauthenticated": True, "evaluation_interval_s": 0.5, "state_dir": str(work / "rules-state"),
        "telemetry": {"scrape": {"targets": [a.address for a in agents.values()], "interval_s": 1,
                                 "timeout_s": 1}},
        "remediation": {"mode": "enforce", "backend": "slurm", "interval_s": 0.5, "hold_down_s": HOLD_DOWN_S,
                        "guard": guard, **(remediation or {})},
        "findings": {"resolve_after_s": 2},  # alerts resolve within the test, not 30 s later
        "alerting": alerting or {}, "log": {"format": "json"}})
    rules.env = {**(rules.env or {}), "SLURM_CONF": str(slurm.conf)}  # how scontrol and sinfo find this cluster
    return rules


@contextlib.contextmanager
def running(rules: RulesDaemon, agents: Mapping[str, AgentProcess]) -> Iterator[None]:
    """The rules service first (it knows the agents' ports already: the faults are timed from each agent's start),
    then the agents; every one stopped after."""
    rules.start()
    try:
        for a in agents.values():
            a.spawn()
        for a in agents.values():
            a.wait_ready()
        yield
    finally:
        for a in agents.values():
            if a.proc is not None and a.running:
                a.stop()
        if rules.running:
            rules.stop()


def audit(work: Path) -> list[dict[str, object]]:
    """The rules service's remediation audit log, parsed."""
    path = work / "rules-state" / "remediation-audit.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def rules_metrics(rules: RulesDaemon) -> str:
    return http_get(f"{rules.url}/metrics")[2].decode()


def health_check(slurm: SlurmCluster, agent: AgentProcess, node: str, work: Path, *mode: str) -> tuple[int, str]:
    """One `gpumond health-check` run for `node` against `agent`; its exit status and output."""
    done = subprocess.run([sys.executable, "-m", "gpumond.cli", "health-check", "--agent", agent.base_url,
                           "--node", node, "--state-dir", str(work / "hc"), "--hold-down-s", "0", *mode],
                          capture_output=True, text=True, timeout=60, env=slurm.env)
    return done.returncode, done.stdout + done.stderr
