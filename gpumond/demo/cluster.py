"""The demo's processes: one agent subprocess per simulated node, and the rules service in this process."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from gpumond.demo.plan import GPUS_PER_NODE, DemoPlan


class StartError(RuntimeError):
    """A part of the demo did not start; the message is one line naming it and where its log is."""


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str, timeout: float = 2.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - loopback only
        return r.read()


class AgentProcess:
    """`gpumond agent --sim 8` for one node, on a free loopback port, logging to its own directory."""

    def __init__(self, plan: DemoPlan, i: int, workdir: Path, speed: float,
                 alerting: dict[str, Any] | None = None) -> None:
        self.name = plan.node_name(i)
        self.port = free_port()
        self.dir = workdir / self.name
        self.dir.mkdir(parents=True)
        (self.dir / "scenario.yaml").write_text(yaml.safe_dump(plan.scenario(i, speed)))
        config = plan.agent_config(self.dir / "state")
        if alerting:
            config["alerting"] = alerting  # the node pages on its own hardware faults
        (self.dir / "agent.yaml").write_text(yaml.safe_dump(config))
        self.log = open(self.dir / "agent.log", "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpumond.cli", "agent", "--sim", str(GPUS_PER_NODE), "--node-name", self.name,
             "--listen", f"127.0.0.1:{self.port}", "--config", str(self.dir / "agent.yaml"),
             "--sim-scenario", str(self.dir / "scenario.yaml"), "--sim-speed", str(speed)],
            stdout=self.log, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}"

    def wait_ready(self, deadline: float) -> None:
        """Until /healthz answers; raises with the log's path if the agent exits or `deadline` passes."""
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise StartError(f"agent {self.name} exited with status {self.proc.returncode}; see {self.log.name}")
            try:
                _get(self.url + "/healthz", 1.0)
                return
            except OSError:
                time.sleep(0.2)
        raise StartError(f"agent {self.name} did not answer on {self.url}/healthz in time; see {self.log.name}")

    def metrics(self) -> dict[str, list[Any]]:
        """The agent's /metrics as family name → samples."""
        fams = text_string_to_metric_families(_get(self.url + "/metrics").decode())
        return {f.name: f.samples for f in fams}

    def stop(self) -> None:
        """SIGTERM (the agent restores the power limits it changed), then kill if it hangs."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self.log.close()


class RulesProcess:
    """The rules service, in this process (so the demo reads its findings directly), on a loopback port."""

    def __init__(self, agents: list[AgentProcess], token: str, workdir: Path,
                 alerting: dict[str, Any] | None = None, detectors: Any = None) -> None:
        """`detectors`: a DetectorConfig instead of the demo's (a test that needs a shorter learning time)."""
        import uvicorn

        from gpumond.config.alerting import resolve_alerting
        from gpumond.config.rules import RulesConfig
        from gpumond.rules.detectors.config import DetectorConfig
        from gpumond.rules.service import RulesService

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # Its own state_dir: alert state restored from another run (the default /var/lib/gpumond-rules) would
        # replay that run's findings into this story.
        cfg = RulesConfig.model_validate({
            "listen": f"127.0.0.1:{self.port}", "tokens": [token], "evaluation_interval_s": 2, "window_s": 120,
            # Answers within the story: findings fire and resolve as "2 of 3 / 3 quiet" did at 2 s (the
            # demo's job has no transients to tell apart).
            "findings": {"min_duration_s": 2, "resolve_after_s": 6},
            "state_dir": str(workdir / "rules"),
            "telemetry": {"scrape": {"targets": [f"127.0.0.1:{a.port}" for a in agents], "interval_s": 2}},
            "alerting": alerting or {},
            # Fleet remediation as installed (dry run, no scheduler), every 2 s and with a 10 s hold-down so the
            # story shows the whole lifecycle: would drain, then would return once the XID has cleared.
            "remediation": {"mode": "dry_run", "interval_s": 2, "hold_down_s": 10}})
        cfg = cfg.model_copy(update={"alerting": resolve_alerting(cfg.alerting, "demo rules config", {})})
        # A demo wants answers in tens of seconds: a 30 s feature window instead of 60, and a 20 s long look
        # at compute shares (10 evaluations, from 8 s on) instead of 5 minutes, so a healed straggler clears
        # within the story.
        self.service = RulesService(cfg, detectors=detectors or DetectorConfig(recent_s=30.0, share_long_s=20.0,
                                                                               share_long_min_s=8.0))
        self._server = uvicorn.Server(uvicorn.Config(self.service.app, host="127.0.0.1", port=self.port,
                                                     lifespan="off", access_log=False, log_config=None))
        self._thread = threading.Thread(target=self._server.run, name="demo-rules-http", daemon=True)
        self._thread.start()
        self.service.start()

    def wait_ready(self, deadline: float) -> None:
        """Until its HTTP API answers (the push endpoint the job needs); raises StartError after `deadline`."""
        while time.monotonic() < deadline:
            if not self._thread.is_alive():
                raise StartError(f"the rules service's HTTP server on {self.url} stopped (port taken?)")
            try:
                _get(self.url + "/healthz", 1.0)
                return
            except OSError:
                time.sleep(0.2)
        raise StartError(f"the rules service did not answer on {self.url}/healthz in time")

    def stop(self) -> None:
        self.service.stop()
        self._server.should_exit = True
