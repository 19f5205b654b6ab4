"""Runs the demo: agents on simulated GPUs (subprocesses), the rules service, a synchronous training job."""

from __future__ import annotations

import json
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

from gpumond.demo.job import ClockFactors, SimulatedJob
from gpumond.demo.plan import GPUS_PER_NODE, JOB, DemoPlan

Say = Callable[[str], None]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str, timeout: float = 2.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - loopback only
        return r.read()


class _Agent:
    def __init__(self, plan: DemoPlan, i: int, workdir: Path, speed: float) -> None:
        self.name = plan.node_name(i)
        self.port = _free_port()
        d = workdir / self.name
        d.mkdir(parents=True)
        (d / "scenario.yaml").write_text(yaml.safe_dump(plan.scenario(i)))
        (d / "agent.yaml").write_text(yaml.safe_dump({
            "state_dir": str(d / "state"), "sampling": {"fast_interval_s": 1, "slow_interval_s": 5}}))
        self.log = open(d / "agent.log", "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpumond.cli", "agent", "--sim", str(GPUS_PER_NODE), "--node-name", self.name,
             "--listen", f"127.0.0.1:{self.port}", "--config", str(d / "agent.yaml"),
             "--sim-scenario", str(d / "scenario.yaml"), "--sim-speed", str(speed)],
            stdout=self.log, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}"

    def wait_ready(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"agent {self.name} exited ({self.proc.returncode}); see {self.log.name}")
            try:
                _get(self.url + "/healthz", 1.0)
                return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"agent {self.name} not ready in time; see {self.log.name}")

    def metrics(self) -> dict[str, list]:
        fams = text_string_to_metric_families(_get(self.url + "/metrics").decode())
        return {f.name: f.samples for f in fams}

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self.log.close()


class _Watcher:
    """Polls agents for clocks (feeding the job), power limits and alerts; prints what changes."""

    def __init__(self, agents: list[_Agent], factors: ClockFactors, say: Say) -> None:
        self.agents = agents
        self.factors = factors
        self.say = say
        self.limits: dict[tuple[str, str], float] = {}
        self.alerts: set[tuple[str, ...]] = set()

    def poll(self) -> None:
        for a in self.agents:
            try:
                m = a.metrics()
            except OSError:
                continue
            clocks = {s.labels["gpu"]: s.value for s in m.get("gpumond_gpu_sm_clock_hertz", [])}
            maxes = {s.labels["gpu"]: s.value for s in m.get("gpumond_gpu_sm_clock_max_hertz", [])}
            for gpu, hz in clocks.items():
                if hz > 0 and gpu in maxes:
                    self.factors.set(a.name, int(gpu), max(1.0, maxes[gpu] / hz))
            for s in m.get("gpumond_gpu_power_limit_watts", []):
                key = (a.name, s.labels["gpu"])
                old = self.limits.get(key)
                if old is None:
                    self.limits[key] = s.value
                elif abs(s.value - old) >= 25:
                    self.limits[key] = s.value
                    self.say(f"agent  {a.name} GPU {key[1]}: power limit {old:.0f} W → {s.value:.0f} W "
                             f"(thermal capping, temperature {self._temp(m, key[1])})")
            for s in m.get("gpumond_alert_active", []):
                ident = (a.name, s.labels.get("alertname", ""), s.labels.get("gpu", ""), s.labels.get("xid", ""))
                if ident not in self.alerts:
                    self.alerts.add(ident)
                    xid = f" XID {ident[3]}" if ident[3] else ""
                    self.say(f"ALERT  {s.labels.get('severity', '')} {ident[1]}{xid} on {a.name} GPU {ident[2]}")

    @staticmethod
    def _temp(m: dict[str, list], gpu: str) -> str:
        for s in m.get("gpumond_gpu_temperature_celsius", []):
            if s.labels.get("gpu") == gpu:
                return f"{s.value:.0f} °C"
        return "?"


def run_demo(plan: DemoPlan, *, duration_s: float, speed: float, say: Say = print, keep: bool = False) -> int:
    """Run the whole demo for `duration_s` wall seconds (or until SIGINT/SIGTERM); returns an exit status."""
    import uvicorn

    from gpumond.config.rules import RulesConfig
    from gpumond.findings_cli import table
    from gpumond.rules.detectors.config import DetectorConfig
    from gpumond.rules.service import RulesService

    workdir = Path(tempfile.mkdtemp(prefix="gpumond-demo-"))
    t0 = time.monotonic()

    def stamp(text: str) -> None:
        say(f"[{time.monotonic() - t0:6.1f}s] {text}")

    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    agents: list[_Agent] = []
    job: SimulatedJob | None = None
    server = service = None
    try:
        stamp(f"starting {plan.nodes} agents × {GPUS_PER_NODE} simulated GPUs (logs in {workdir})")
        agents = [_Agent(plan, i, workdir, speed) for i in range(plan.nodes)]
        for a in agents:
            a.wait_ready(time.monotonic() + 60)
        ranks: list[tuple[str, int, str]] = []
        for a in agents:
            info = sorted(a.metrics()["gpumond_gpu_info"], key=lambda s: int(s.labels["gpu"]))
            ranks += [(a.name, int(s.labels["gpu"]), s.labels["uuid"]) for s in info]
        token = secrets.token_hex(16)
        rules_port = _free_port()
        cfg = RulesConfig.model_validate({
            "listen": f"127.0.0.1:{rules_port}", "tokens": [token], "evaluation_interval_s": 2, "window_s": 120,
            "telemetry": {"scrape": {"targets": [f"127.0.0.1:{a.port}" for a in agents], "interval_s": 2}}})
        # A demo wants answers in tens of seconds: a 30 s feature window instead of 60.
        service = RulesService(cfg, detectors=DetectorConfig(recent_s=30.0))
        server = uvicorn.Server(uvicorn.Config(service.app, host="127.0.0.1", port=rules_port, lifespan="off",
                                               access_log=False, log_config=None))
        threading.Thread(target=server.run, name="demo-rules-http", daemon=True).start()
        service.start()
        stamp(f"rules service on http://127.0.0.1:{rules_port}  (try: gpumond findings --url "
              f"http://127.0.0.1:{rules_port})")
        starved_rank = plan.rank_of(plan.starved_node, plan.starved_gpu)
        starve_at = t0 + plan.starved_at_s / speed
        wait_s = plan.step_s * plan.starved_wait_frac / (1 - plan.starved_wait_frac)

        def data_wait(rank: int) -> float:
            return wait_s if rank == starved_rank and time.monotonic() >= starve_at else 0.0

        factors = ClockFactors()
        watcher = _Watcher(agents, factors, stamp)
        watcher.poll()
        job = SimulatedJob(job=JOB, ranks=ranks, endpoint=f"http://127.0.0.1:{rules_port}", token=token,
                           step_s=plan.step_s, clock_factors=factors, data_wait=data_wait)
        job.start()
        stamp(f"training job {JOB}: {len(ranks)} ranks in lockstep, pushing through gpumond.job")
        stamp(f"planted: {plan.node_name(plan.hot_node)} GPU {plan.hot_gpu} loses cooling at "
              f"{plan.hot_at_s / speed:.0f}s; rank {starved_rank} data loader starves at "
              f"{plan.starved_at_s / speed:.0f}s; {plan.node_name(plan.xid_node)} GPU {plan.xid_gpu} XID 48 at "
              f"{plan.xid_at_s / speed:.0f}s")
        shown: dict[tuple, str] = {}
        end = t0 + duration_s
        while not stop.is_set() and time.monotonic() < end:
            watcher.poll()
            current = {}
            for f in service.evaluator.findings():
                key = (f.kind, f.job, f.node, f.rank, f.gpu_uuid)
                current[key] = f.state
                if shown.get(key) != f.state:
                    where = " ".join(x for x in (f.node and f"node={f.node}",
                                                 f.rank is not None and f"rank={f.rank}") if x)
                    stamp(f"FINDING {f.state.upper():7s} {f.kind} job={f.job} {where} score={f.score:g} "
                          f"{json.dumps(dict(f.evidence), default=str)[:160]}")
            for key in set(shown) - set(current):
                stamp(f"FINDING resolved {key[0]} rank={key[3]}")
            shown = current
            stop.wait(1.0)
        say("")
        say(table([{"kind": f.kind, "state": f.state, "job": f.job, "node": f.node, "rank": f.rank,
                    "gpu_uuid": f.gpu_uuid, "score": f.score, "since": f.since, "evidence": f.evidence}
                   for f in service.evaluator.findings()]))
        return 0
    finally:
        if job is not None:
            job.stop()
        if service is not None:
            service.stop()
        if server is not None:
            server.should_exit = True
        for a in agents:
            a.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
