"""Alert delivery: what reaches PagerDuty, Slack and Alertmanager, duplicates, latency, and sampling while a sink hangs.

Everything runs on 127.0.0.1, started by this script; every wait is bounded.

**Part 1, delivery and duplicates.** Real agent processes (`python -m gpumond.cli agent --sim 8
--sim-speed 5 --sim-scenario …`) with planted faults, repeated in rounds: a cooling fault on GPU 1
(factor 2: the GPU flaps in and out of software thermal slowdown), an XID 48 with an uncorrected
ECC error on GPU 2, GPU 3 falling off the bus (XID 79, then lost) and coming back. The thermal
controller is off (otherwise it caps power and the cooling fault raises nothing); `event_hold_s`
and `throttle_after_s` are short so alerts resolve within the run. A real rules service gets step
pushes from jobs whose data loader starves for a while and then recovers. Both daemons'
`alerting:` point at a local receiver (`gpumond.demo.receiver`: Slack webhook, PagerDuty Events
v2) and at a real `prometheus-alertmanager` whose webhook goes to the same receiver. Two agents
are SIGKILLed and restarted with the same state_dir: one while its GPU 3 is still off the bus,
one while only event alerts are open (the restarted simulator continues the node's story: faults
still in progress go on, ECC counters persist, XIDs already seen are not replayed).

Expected alerts are what the daemons say themselves: every alert (fingerprint + startsAt) that
their `GET /api/v1/alerts`, polled every 0.25 s, showed `firing` or `resolved`. For each sink the
receiver's records (accepted only) give triggers, resolves and duplicates: a second PagerDuty
trigger for a dedup_key that is open (triggered, not yet resolved); a second Slack firing message
naming the same alert while it is open in Slack; for Alertmanager a firing notification for an
alert instance it had already notified resolved (a re-page), or a group re-notified with nothing
changed. A resolve for an alert the daemon still showed firing is counted as spurious.

**Part 2, firing → notification.** Per delivered alert, receiver `received_at` minus the alert's
`startsAt` (the pipeline's wall-clock start of firing, fixed at its transition).

**Part 3, sampling and evaluation while a sink hangs.** Three agents at once (`--sim 8
--sim-speed 1`, `sampling.fast_interval_s: 0.2`, faults firing), differing only in `alerting:`
Slack + PagerDuty at a receiver where every request hangs (300 s, longer than the sinks' 10 s
timeout); the same at a healthy receiver; no sinks. Likewise three rules services
(`evaluation_interval_s: 0.5`, a starved job pushed to each). They run concurrently, so machine
noise hits all variants alike. The agent's exposition carries no cycle timestamp (the render
cache's `taken_at` is not exported) and polling /metrics fast enough to time 0.2 s cycles would
load the agent being measured, so each process of this part is started through a shim in this
script (`--shim FILE gpumond-args…`, the real `gpumond.cli.main`) that only wraps
`Sampler.fast_cycle`, `Evaluator.evaluate` and `AlertPipeline.update` to append their
perf_counter start/end to a file. /metrics is scraped every second for
`gpumond_collector_duration_seconds`, `gpumond_rules_evaluation_duration_seconds` and the sink
counters (to show the sinks really hung). Shutdown time (SIGTERM → exit) is reported too.

    python benchmarks/alert_delivery.py            # ~3.5 min
    python benchmarks/alert_delivery.py --quick    # ~1 min (smoke test; writes results/alert_delivery_quick.md)

Needs `prometheus-alertmanager` (Debian package) on PATH. `--keep` keeps the work directory: every
process's log and config, and `part1.json` with the alert instances and every record the receiver got.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import zlib
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _bench  # noqa: E402

HERE = Path(__file__).resolve()
ALERTMANAGER = "prometheus-alertmanager"
PD_KEY = "Bench0RoutingKey0123456789abcdef"  # any 32 alphanumerics
TOKEN = "bench-alert-token-0123456789"
POLL_S = 0.25
HTTP_TIMEOUT_S = 3.0
START_TIMEOUT_S = 40.0
STOP_TIMEOUT_S = 30.0


# ----- the shim (part 3): the real CLI with three methods timed ----------------------------------------
def shim(log_path: str, cli_args: list[str]) -> int:
    """Run `gpumond <cli_args>` in this process, appending `TAG start end` (perf_counter) per timed call."""
    import gpumond.cli as cli
    from gpumond.agent.sampler import Sampler
    from gpumond.alerts.pipeline import AlertPipeline
    from gpumond.rules.evaluator import Evaluator

    out = open(log_path, "a", buffering=1, encoding="ascii")  # noqa: SIM115 - lives as long as the process
    lock = threading.Lock()
    pc = time.perf_counter

    def wrap(cls: type, name: str, tag: str) -> None:
        orig = getattr(cls, name)

        def timed(self: object, *a: object, **kw: object) -> object:
            t0 = pc()
            try:
                return orig(self, *a, **kw)
            finally:
                t1 = pc()
                with lock:
                    out.write(f"{tag} {t0:.6f} {t1:.6f}\n")

        setattr(cls, name, timed)

    wrap(Sampler, "fast_cycle", "F")
    wrap(Evaluator, "evaluate", "E")
    wrap(AlertPipeline, "update", "U")
    return int(cli.main(cli_args) or 0)


# ----- configs ------------------------------------------------------------------------------------------
def write_yaml(path: Path, data: object) -> Path:
    import yaml

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def parse_ts(text: str | None) -> float | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def start_alertmanager(workdir: Path, webhook_url: str) -> tuple[_bench.Proc, str]:
    exe = shutil.which(ALERTMANAGER)
    assert exe is not None
    port = _bench.free_port()
    cfg = write_yaml(workdir / "alertmanager.yml", {
        "route": {"receiver": "hook", "group_by": ["alertname", "node", "job"], "group_wait": "1s",
                  "group_interval": "2s", "repeat_interval": "1h"},
        "receivers": [{"name": "hook", "webhook_configs": [{"url": webhook_url, "send_resolved": True}]}]})
    url = f"http://127.0.0.1:{port}"
    p = _bench.Proc("alertmanager", [exe, f"--config.file={cfg}", f"--storage.path={workdir / 'am-data'}",
                              f"--web.listen-address=127.0.0.1:{port}", f"--web.external-url={url}",
                              "--cluster.listen-address=", "--log.level=warn"], workdir / "alertmanager.log").start()
    p.wait_http(f"{url}/-/ready", START_TIMEOUT_S)
    return p, url


def agent_argv(cfg: Path, scenario: Path, speed: float, port: int, node: str, shim_log: Path | None) -> list[str]:
    args = ["agent", "--sim", "8", "--sim-speed", f"{speed:g}", "--sim-scenario", str(scenario), "--config", str(cfg),
            "--listen", f"127.0.0.1:{port}", "--node-name", node]
    if shim_log is not None:
        return [sys.executable, str(HERE), "--shim", str(shim_log), *args]
    return [sys.executable, "-m", "gpumond.cli", *args]


def rules_argv(cfg: Path, shim_log: Path | None) -> list[str]:
    if shim_log is not None:
        return [sys.executable, str(HERE), "--shim", str(shim_log), "rules", "--config", str(cfg)]
    return [sys.executable, "-m", "gpumond.cli", "rules", "--config", str(cfg)]


def rules_config(path: Path, port: int, state_dir: Path, alerting: dict[str, Any], interval_s: float) -> Path:
    return write_yaml(path, {"listen": f"127.0.0.1:{port}", "tokens": [TOKEN], "evaluation_interval_s": interval_s,
                             "state_dir": str(state_dir), "alerting": alerting, "log": {"format": "json"}})


# ----- the planted faults -----------------------------------------------------------------------------
@dataclass
class AgentPlan:
    """One agent of part 1: its node name, when its story starts (simulated s), rounds, restart."""

    node: str
    offset: float
    rounds: int
    lost_s: tuple[float, ...] = ()  # per round: how long GPU 3 stays lost (0: not lost that round)
    kill_at: float | None = None  # simulated seconds after start
    why: str = ""
    late_xid_at: float | None = None  # one more XID 48 (GPU 5) late in the run, simulated s


# Within a round (simulated seconds from its base): cooling from 5 for 120 s; XID 48 + ECC at 20; GPU 3 lost at 70.
ROUND_S = 200.0
COOLING_AT, COOLING_S, EVENTS_AT, LOST_AT, LOST_S = 5.0, 120.0, 20.0, 70.0, 60.0


def story(plan: AgentPlan) -> list[dict[str, Any]]:
    faults = []
    for r in range(plan.rounds):
        base = plan.offset + r * ROUND_S
        lost = plan.lost_s[r] if r < len(plan.lost_s) else LOST_S
        faults += [{"gpu": 1, "kind": "cooling", "at_s": base + COOLING_AT, "factor": 2.0, "duration_s": COOLING_S},
                   {"gpu": 2, "kind": "xid", "at_s": base + EVENTS_AT, "code": 48},
                   {"gpu": 2, "kind": "ecc_uncorrected", "at_s": base + EVENTS_AT, "count": 1}]
        if lost > 0:
            faults.append({"gpu": 3, "kind": "lost", "at_s": base + LOST_AT, "duration_s": lost})
    if plan.late_xid_at is not None:
        faults.append({"gpu": 5, "kind": "xid", "at_s": plan.late_xid_at, "code": 48})
    return faults


def continuation(faults: list[dict[str, Any]], now_s: float) -> list[dict[str, Any]]:
    """The same node's faults as seen by an agent restarted at simulated time `now_s`: the hardware carries on.

    Faults over are gone; one in progress starts at 0 for what is left of it; later ones move earlier by
    `now_s`; XIDs already raised are not raised again; uncorrected ECC errors already counted stay counted
    (the counters live on the GPU), so they are planted at 0 and the agent reads them as its baseline.
    """
    out = []
    for f in faults:
        at, dur = f["at_s"], f.get("duration_s")
        if at >= now_s:
            out.append({**f, "at_s": round(at - now_s, 3)})
        elif f["kind"] == "ecc_uncorrected":
            out.append({**f, "at_s": 0.0})
        elif dur is not None and at + dur > now_s:
            out.append({**f, "at_s": 0.0, "duration_s": round(at + dur - now_s, 3)})
    return out


def planted(plan: AgentPlan) -> list[tuple[int, str, float]]:
    """(round, alert family, simulated time) each round should raise: one line per fault family."""
    out = []
    for r in range(plan.rounds):
        base = plan.offset + r * ROUND_S
        out.append((r, "thermal slowdown (cooling, GPU 1)", base + COOLING_AT))
        out.append((r, "GpuXidCritical XID 48 (GPU 2)", base + EVENTS_AT))
        out.append((r, "GpuEccUncorrectedIncreasing (GPU 2)", base + EVENTS_AT))
        lost = plan.lost_s[r] if r < len(plan.lost_s) else LOST_S
        if lost > 0:
            out.append((r, "GpuXidCritical XID 79 (GPU 3)", base + LOST_AT))
            out.append((r, "GpuLost (GPU 3)", base + LOST_AT))
    if plan.late_xid_at is not None:
        out.append((plan.rounds - 1, "GpuXidCritical XID 48 (GPU 5)", plan.late_xid_at))
    return out


def family(labels: dict[str, str]) -> str | None:
    name, gpu = labels.get("alertname", ""), labels.get("gpu")
    if name in ("GpuSwThermalSlowdown", "GpuHwThermalSlowdown", "GpuHwSlowdown") and gpu == "1":
        return "thermal slowdown (cooling, GPU 1)"
    if name == "GpuXidCritical":
        return f"GpuXidCritical XID {labels.get('xid')} (GPU {gpu})"
    if name in ("GpuEccUncorrectedIncreasing", "GpuLost"):
        return f"{name} (GPU {gpu})"
    return None


# ----- what the daemons say (expected) --------------------------------------------------------------------
@dataclass
class Instance:
    """One alert instance as a daemon's API showed it: identity is (fingerprint, startsAt)."""

    fp: str
    start: float
    source: str
    labels: dict[str, str]
    annotations: dict[str, str]
    first_seen: float
    states: set[str] = field(default_factory=set)
    end: float | None = None

    @property
    def key(self) -> tuple[str, float]:
        return self.fp, round(self.start, 3)

    @property
    def kind(self) -> str:
        return "rules" if self.source == "rules" else "agent"


class AlertWatch:
    """Polls every daemon's GET /api/v1/alerts; keeps every instance that reached firing."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.instances: dict[tuple[str, float], Instance] = {}
        self.targets: dict[str, str] = {}
        self.last: dict[str, tuple[float, list[dict[str, Any]]]] = {}
        self.polls = 0
        self.failed_polls = 0
        self._ticker = _bench.Ticker(POLL_S, self.poll_once, "alert-watch")
        self.start, self.stop = self._ticker.start, self._ticker.stop

    def set_target(self, source: str, url: str) -> None:
        with self._lock:
            self.targets[source] = url

    def poll_once(self) -> None:
        with self._lock:
            targets = dict(self.targets)
        for source, url in targets.items():
            try:
                alerts = _bench.get_json(f"{url}/api/v1/alerts", timeout_s=2.0)["alerts"]
            except (OSError, ValueError, KeyError):
                self.failed_polls += 1
                continue
            now = time.time()
            self.polls += 1
            with self._lock:
                self.last[source] = (now, alerts)
                for a in alerts:
                    if a["state"] == "pending":
                        continue
                    start = parse_ts(a["startsAt"])
                    assert start is not None
                    key = (a["fingerprint"], round(start, 3))
                    inst = self.instances.get(key)
                    if inst is None:
                        inst = self.instances[key] = Instance(a["fingerprint"], start, source, dict(a["labels"]),
                                                              dict(a["annotations"]), now)
                    inst.states.add(a["state"])
                    if a["state"] == "resolved":
                        inst.end = parse_ts(a["endsAt"])

    def firing_now(self, source: str) -> list[dict[str, Any]]:
        with self._lock:
            _, alerts = self.last.get(source, (0.0, []))
        return [a for a in alerts if a["state"] == "firing"]


# ----- job pushes to the rules service ---------------------------------------------------------------------
class Pusher:
    """Pushes steps every second for each job to every rules URL; `starved(job, t)` says if its loader starves."""

    STEP_S = 0.5

    def __init__(self, urls: list[str], jobs: list[str], starved: Callable[[str, float], bool], ranks: int = 4,
                 period_s: float = 1.0) -> None:
        import httpx

        self.urls, self.jobs, self.starved, self.ranks, self.period_s = urls, jobs, starved, ranks, period_s
        self._client = httpx.Client(timeout=HTTP_TIMEOUT_S, trust_env=False)
        self._next_step = {j: 0 for j in jobs}
        self._last_end = {j: time.time() - 10 * self.STEP_S for j in jobs}
        self.t0 = time.time()
        self.failed = 0
        self.pushed = 0
        self._ticker = _bench.Ticker(period_s, self.push_once, "pusher")
        self.start = self._ticker.start

    def stop(self) -> None:
        self._ticker.stop()
        self._client.close()

    def push_once(self) -> None:
        now = time.time()
        for job in self.jobs:
            steps = []
            wait = 0.3 if self.starved(job, now - self.t0) else 0.0
            end = self._last_end[job]
            while end + self.STEP_S <= now:
                end += self.STEP_S
                steps.append({"step": self._next_step[job], "end": round(end, 3), "duration_s": self.STEP_S,
                              "data_wait_s": wait})
                self._next_step[job] += 1
            self._last_end[job] = end
            if not steps:
                continue
            for url in self.urls:
                for rank in range(self.ranks):
                    body = {"job": job, "rank": rank, "world_size": self.ranks, "node": "train-node-0",
                            "gpu_uuid": f"GPU-00000000-0000-0000-0000-{zlib.crc32(f'{job}/{rank}'.encode()):012x}",
                            "steps": steps}
                    try:
                        r = self._client.post(f"{url}/api/v1/push", json=body,
                                              headers={"Authorization": f"Bearer {TOKEN}"})
                        self.pushed += 1
                        self.failed += r.status_code != 202
                    except Exception:  # noqa: BLE001 - a daemon restarting; counted
                        self.failed += 1


# ----- part 1 ---------------------------------------------------------------------------------------------
@dataclass
class Part1Plan:
    speed: float
    agents: list[AgentPlan]
    starved: dict[str, list[tuple[float, float]]]  # job -> [(from, to)] wall seconds after start
    run_s: float  # wall seconds of the story (the drain comes after)


def part1_plan(quick: bool) -> Part1Plan:
    if quick:
        # One agent, killed once its event alerts are open, and one starved job: every path, in seconds.
        return Part1Plan(10.0, [
            AgentPlan("gpu-node-b", 0, 1, kill_at=EVENTS_AT + 20, late_xid_at=90,
                      why="event alerts open (XID 48, ECC, row remap), no GPU lost"),
        ], {"etl-a": [(1, 6)]}, 10.0)
    return Part1Plan(5.0, [
        AgentPlan("gpu-node-a", 0, 2, late_xid_at=400),
        AgentPlan("gpu-node-b", 40, 2, lost_s=(250.0, 0.0), kill_at=40 + LOST_AT + 45, late_xid_at=400,
                  why="GPU 3 off the bus (it stays lost ~200 simulated s after the restart)"),
        AgentPlan("gpu-node-c", 80, 2, kill_at=80 + ROUND_S + EVENTS_AT + 20, late_xid_at=400,
                  why="event alerts open (XID 48, ECC, row remap), no GPU lost"),
    ], {"etl-a": [(5, 25), (50, 65)], "etl-b": [(30, 45)], "etl-ok": []}, 92.0)


@dataclass
class Restart:
    node: str
    why: str
    killed_at: float
    restarted_at: float
    up_at: float
    sim_at_kill: float
    open_at_kill: list[dict[str, Any]]
    continuation: list[dict[str, Any]]


def run_part1(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from gpumond.demo.receiver import Receiver

    plan = part1_plan(args.quick)
    receiver = Receiver().start()
    procs: list[_bench.Proc] = []
    watch = AlertWatch()
    pusher: Pusher | None = None
    restarts: list[Restart] = []
    try:
        am, am_url = start_alertmanager(work / "am", receiver.alertmanager_url)
        procs.append(am)
        alerting = {"alertmanager": {"urls": [am_url], "resend_interval_s": 5},
                    "slack": {"webhook_url": receiver.slack_url},
                    "pagerduty": {"routing_key": PD_KEY, "url": receiver.pagerduty_url}}
        rport = _bench.free_port()
        rcfg = rules_config(work / "rules" / "rules.yaml", rport, work / "rules" / "state", alerting, 1.0)
        rules = _bench.Proc("rules", rules_argv(rcfg, None), work / "rules" / "rules.log").start()
        procs.append(rules)
        agents: dict[str, tuple[_bench.Proc, Path, int, list[dict[str, Any]]]] = {}
        for a in plan.agents:
            d = work / a.node
            faults = story(a)
            scen = write_yaml(d / "scenario.yaml", {"faults": faults})
            cfg = write_yaml(d / "agent.yaml", {
                "state_dir": str(d / "state"), "sampling": {"slow_interval_s": 5},
                "policy": {"thermal": {"enabled": False}, "alerts": {"event_hold_s": 40, "throttle_after_s": 10}},
                "alerting": {**alerting, "restart_grace_s": 30}, "log": {"format": "json"}})
            port = _bench.free_port()
            p = _bench.Proc(a.node, agent_argv(cfg, scen, plan.speed, port, a.node, None), d / "agent.log").start()
            procs.append(p)
            agents[a.node] = (p, cfg, port, faults)
        rurl = f"http://127.0.0.1:{rport}"
        rules.wait_http(f"{rurl}/healthz", START_TIMEOUT_S)
        watch.set_target("rules", rurl)
        sim_zero: dict[str, float] = {}
        for a in plan.agents:
            p, _, port, _ = agents[a.node]
            # The simulated clock starts just before the first sample, which /healthz needs: good to ~0.3 s.
            sim_zero[a.node] = p.wait_http(f"http://127.0.0.1:{port}/healthz", START_TIMEOUT_S)
            watch.set_target(a.node, f"http://127.0.0.1:{port}")
        t0 = time.time()
        starved = plan.starved
        pusher = Pusher([rurl], list(starved), lambda job, t: any(lo <= t < hi for lo, hi in starved[job]))
        pusher.start()
        watch.start()
        print(f"[part 1] {len(plan.agents)} agents, rules service, alertmanager up; story runs {plan.run_s:.0f} s",
              file=sys.stderr, flush=True)

        kills = sorted((sim_zero[a.node] + a.kill_at / plan.speed, a) for a in plan.agents if a.kill_at is not None)
        for when, a in kills:
            time.sleep(max(0.0, when - time.time()))
            p, cfg, port, faults = agents[a.node]
            watch.poll_once()
            open_now = watch.firing_now(a.node)
            killed = time.time()
            p.kill()
            sim_now = (killed - sim_zero[a.node]) * plan.speed
            time.sleep(1.0)
            # Restarted: its simulator starts at 0 again, so it is given the rest of the node's story.
            rest = continuation(faults, sim_now + 1.5 * plan.speed)  # + the second down and the interpreter start
            scen = write_yaml(work / a.node / "scenario-after-restart.yaml", {"faults": rest})
            p2 = _bench.Proc(a.node, agent_argv(cfg, scen, plan.speed, port, a.node, None),
                      work / a.node / "agent-after-restart.log").start()
            procs.append(p2)
            restarted = time.time()
            up = p2.wait_http(f"http://127.0.0.1:{port}/healthz", START_TIMEOUT_S)
            agents[a.node] = (p2, cfg, port, faults)
            restarts.append(Restart(a.node, a.why, killed, restarted, up, sim_now, open_now, rest))
            print(f"[part 1] {a.node} SIGKILLed at simulated {sim_now:.0f} s with {len(open_now)} alert(s) firing; "
                  f"restarted (up after {up - restarted:.1f} s)", file=sys.stderr, flush=True)
        time.sleep(max(0.0, t0 + plan.run_s - time.time()))
        pusher.stop()
        # Drain: until the receiver has been quiet for 4 s (at most 20 s), so resolves in flight arrive.
        quiet_s, deadline = (2.0, time.monotonic() + 6) if args.quick else (4.0, time.monotonic() + 20)
        seen = -1
        while time.monotonic() < deadline:
            n = len(receiver.received())
            if n == seen:
                break
            seen = n
            time.sleep(quiet_s)
        watch.poll_once()
        watch.stop()
        end = time.time()
        at_end = {}  # each agent's own view at the end: GPUs readable, XID watcher healthy
        for a in plan.agents:
            _, _, port, _ = agents[a.node]
            try:
                text = _bench.fetch(f"http://127.0.0.1:{port}/metrics", timeout_s=HTTP_TIMEOUT_S).decode()
            except OSError:
                continue
            at_end[a.node] = {"gpus_up": sum(1 for line in text.splitlines()
                                             if line.startswith("gpumond_gpu_up{") and float(line.rsplit(" ", 1)[1]) == 1),
                              "xid_ok": _metric(text, "gpumond_collector_success", collector="xid")}
        records = receiver.received()
        am_alerts = _bench.get_json(f"{am_url}/api/v2/alerts")
        (work / "part1.json").write_text(json.dumps({
            "instances": [vars(i) | {"states": sorted(i.states)} for i in watch.instances.values()],
            "records": [{"kind": r.kind, "t": r.received_at.timestamp(), "status": r.status, "json": r.json()}
                        for r in records],
            "restarts": [vars(r) for r in restarts]}, indent=1, default=str))
        return {"plan": plan, "t0": t0, "end": end, "records": records, "instances": dict(watch.instances),
                "restarts": restarts, "sim_zero": sim_zero, "pushes": (pusher.pushed, pusher.failed),
                "polls": (watch.polls, watch.failed_polls), "am_alerts": am_alerts, "at_end": at_end}
    finally:
        if pusher is not None:
            pusher.stop()
        watch.stop()
        for p in procs:
            p.terminate(15)
        receiver.stop()


# ----- part 1 analysis --------------------------------------------------------------------------------------
@dataclass
class SinkTally:
    expected: int = 0
    delivered: int = 0
    resolves_expected: int = 0
    resolves_delivered: int = 0
    duplicates: int = 0
    duplicates_after_restart: int = 0
    spurious_resolves: int = 0
    spurious_after_restart: int = 0
    unchanged_renotify: int = 0
    orphan_resolves: int = 0
    short_lived: int = 0
    folded: int = 0
    lost: int = 0
    rejected: int = 0
    unmatched: int = 0
    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    resolve_latencies: list[float] = field(default_factory=list)
    spurious: list[tuple[float, Instance]] = field(default_factory=list)
    dup_events: list[tuple[float, str]] = field(default_factory=list)  # (received_at, fingerprint)


def _slack_lookup(instances: list[Instance]) -> tuple[dict[str, str], dict[str, str]]:
    """Slack line text → fingerprint: firing lines `• *summary* (where)`, resolved `• summary (where)`."""
    from gpumond.alerts.model import Alert, pairs
    from gpumond.alerts.sinks.slack import where

    firing, resolved = {}, {}
    for i in instances:
        a = Alert(pairs(i.labels), pairs(i.annotations), i.start)
        summary = i.annotations.get("summary") or i.labels["alertname"]
        firing[f"• *{summary}* ({where(a)})"] = i.fp
        resolved[f"• {summary} ({where(a)})"] = i.fp
    return firing, resolved


def analyse(p1: dict[str, Any]) -> dict[str, Any]:
    from gpumond.alerts.model import fingerprint, pairs

    instances: dict[tuple[str, float], Instance] = p1["instances"]
    by_fp: dict[str, list[Instance]] = defaultdict(list)
    for inst in sorted(instances.values(), key=lambda i: i.start):
        by_fp[inst.fp].append(inst)
    restarts: list[Restart] = p1["restarts"]
    node_of_fp = {i.fp: i.source for i in instances.values()}

    def after_restart(fp: str, t: float) -> bool:
        return any(r.node == node_of_fp.get(fp) and t >= r.killed_at for r in restarts)

    def instance_at(fp: str, t: float) -> Instance | None:
        """The latest instance of `fp` that had started by `t` (50 ms of clock slack)."""
        cands = [i for i in by_fp.get(fp, []) if i.start <= t + 0.05]
        return cands[-1] if cands else None

    def still_firing(inst: Instance, t: float) -> bool:
        return inst.end is None or inst.end > t + 0.05

    sinks = {k: SinkTally() for k in ("pagerduty", "slack", "alertmanager")}
    delivered: dict[str, dict[tuple[str, float], float]] = {k: {} for k in sinks}
    resolved_at: dict[str, dict[tuple[str, float], float]] = {k: {} for k in sinks}
    records = p1["records"]
    firing_lines, resolved_lines = _slack_lookup(list(instances.values()))

    # Per sink: (time, fp, action, instance or None) in arrival order; then one state machine per fingerprint.
    events: dict[str, list[tuple[float, str, str, Instance | None]]] = {k: [] for k in ("pagerduty", "slack")}
    am_notes: list[tuple[float, dict[str, Any]]] = []
    for r in records:
        t = r.received_at.timestamp()
        if not r.accepted:
            sinks[r.kind].rejected += 1
            continue
        body = r.json()
        if r.kind == "pagerduty":
            fp = body["dedup_key"]
            if body["event_action"] == "trigger":
                start = parse_ts(body["payload"].get("timestamp"))
                inst = instances.get((fp, round(start, 3))) if start is not None else None
                events["pagerduty"].append((t, fp, "firing", inst or instance_at(fp, t)))
            else:
                events["pagerduty"].append((t, fp, "resolved", None))
        elif r.kind == "slack":
            is_resolved = "[RESOLVED]" in body["blocks"][0]["text"]["text"]
            for block in body["blocks"]:
                if block["type"] != "section":
                    continue
                for line in block["text"]["text"].split("\n"):
                    if not line.startswith("• "):
                        continue
                    if is_resolved:
                        fp = resolved_lines.get(line.rsplit(": resolved", 1)[0])
                    else:
                        fp = firing_lines.get(line)
                    if fp is None:
                        sinks["slack"].unmatched += 1
                        continue
                    events["slack"].append((t, fp, "resolved" if is_resolved else "firing",
                                            None if is_resolved else instance_at(fp, t)))
        else:
            am_notes.append((t, body))

    for kind, evs in events.items():
        tally = sinks[kind]
        open_inst: dict[str, Instance | None] = {}
        for t, fp, action, inst in sorted(evs, key=lambda e: e[0]):
            if action == "firing":
                if fp in open_inst:
                    tally.duplicates += 1
                    tally.duplicates_after_restart += after_restart(fp, t)
                    tally.dup_events.append((t, fp))
                    continue
                open_inst[fp] = inst
                if inst is not None and inst.key not in delivered[kind]:
                    delivered[kind][inst.key] = t
            else:
                if fp not in open_inst:
                    tally.orphan_resolves += 1
                    continue
                inst = open_inst.pop(fp)
                if inst is None:
                    continue
                if still_firing(inst, t):
                    tally.spurious_resolves += 1
                    tally.spurious_after_restart += after_restart(fp, t)
                    tally.spurious.append((t, inst))
                resolved_at[kind].setdefault(inst.key, t)

    # Alertmanager: one notification lists a group's alerts; follow each instance, and each group's content.
    last_content: dict[str, frozenset[tuple[str, str, str]]] = {}
    am_state: dict[tuple[str, float], str] = {}
    tally = sinks["alertmanager"]
    for t, body in sorted(am_notes, key=lambda x: x[0]):
        content = frozenset((a["fingerprint"], a["startsAt"], a["status"]) for a in body["alerts"])
        gk = body.get("groupKey", "")
        if last_content.get(gk) == content:
            tally.unchanged_renotify += 1
            tally.duplicates += 1
            tally.dup_events.extend((t, a["fingerprint"]) for a in body["alerts"])
        last_content[gk] = content
        for a in body["alerts"]:
            fp = fingerprint(pairs(a["labels"]))
            start = parse_ts(a["startsAt"])
            key = (fp, round(start or 0.0, 3))
            inst = instances.get(key)
            if inst is None:
                tally.unmatched += 1
                continue
            before = am_state.get(key)
            if a["status"] == "firing":
                if before == "resolved":  # told resolved, now firing again: a second page for one alert
                    tally.duplicates += 1
                    tally.duplicates_after_restart += after_restart(fp, t)
                    tally.dup_events.append((t, fp))
                delivered["alertmanager"].setdefault(key, t)
            elif before != "resolved":
                if still_firing(inst, t):
                    tally.spurious_resolves += 1
                    tally.spurious_after_restart += after_restart(fp, t)
                    tally.spurious.append((t, inst))
                resolved_at["alertmanager"].setdefault(key, t)
            am_state[key] = a["status"]

    # Expected vs delivered, with the reason for each miss.
    missing: dict[str, list[tuple[Instance, str]]] = {k: [] for k in sinks}
    for kind, tally in sinks.items():
        deliv = delivered[kind]
        for inst in instances.values():
            tally.expected += 1
            if inst.key in deliv:
                tally.delivered += 1
                tally.latencies[inst.kind].append(deliv[inst.key] - inst.start)
                if inst.end is not None:
                    tally.resolves_expected += 1
                    if inst.key in resolved_at[kind]:
                        tally.resolves_delivered += 1
                        tally.resolve_latencies.append(resolved_at[kind][inst.key] - inst.end)
                continue
            lasted = (inst.end - inst.start) if inst.end is not None else None
            earlier = [i for i in by_fp[inst.fp] if i.start < inst.start]
            prev = earlier[-1] if earlier else None
            if prev is not None and prev.key in deliv and (prev.key not in resolved_at[kind]
                                                            or resolved_at[kind][prev.key] > inst.start):
                tally.folded += 1
                why = "folded into the open notification of the previous instance"
            elif lasted is not None and lasted < 2.0:
                tally.short_lived += 1
                why = f"short-lived (firing {lasted:.1f} s)"
            else:
                tally.lost += 1
                why = "not delivered"
            missing[kind].append((inst, why))
    planted_rows = check_planted(p1, instances)
    return {"sinks": sinks, "missing": missing, "planted": planted_rows, "by_fp": by_fp}


def check_planted(p1: dict[str, Any], instances: dict[tuple[str, float], Instance]) -> list[list[str]]:
    """Per agent and fault family: planted (round count) vs alert instances the agent raised."""
    plan: Part1Plan = p1["plan"]
    rows = []
    for a in plan.agents:
        want: dict[str, int] = defaultdict(int)
        for _, fam, _ in planted(a):
            want[fam] += 1
        got: dict[str, int] = defaultdict(int)
        for i in instances.values():
            if i.source == a.node and (fam := family(i.labels)) is not None:
                got[fam] += 1
        for fam in sorted(set(want) | set(got)):
            mark = " **<**" if got.get(fam, 0) < want.get(fam, 0) else ""
            rows.append([a.node, fam, str(want.get(fam, 0)), f"{got.get(fam, 0)}{mark}"])
    return rows


# ----- part 3 -------------------------------------------------------------------------------------------
@dataclass
class Variant:
    key: str  # hang | healthy | none
    label: str


VARIANTS = [Variant("hang", "sinks hang"), Variant("healthy", "sinks healthy"), Variant("none", "no sinks")]


def _metric(text: str, name: str, **labels: str) -> float | None:
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            try:
                return float(line.rsplit(" ", 1)[1])
            except ValueError:
                return None
    return None


def run_part3(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    _bench.use_test_helpers()
    from tests.scripted_receiver import Hang, ScriptedReceiver as Receiver

    window_s = 5.0 if args.quick else 75.0
    hang_rx, ok_rx = Receiver().start(), Receiver().start()
    for rx_kind in ("slack", "pagerduty"):
        hang_rx.script(rx_kind, *[Hang(300.0)] * 200)
    procs: dict[str, _bench.Proc] = {}
    scrapes: dict[str, list[tuple[float, str]]] = defaultdict(list)
    scraper: _bench.Ticker | None = None
    pusher: Pusher | None = None
    urls: dict[str, str] = {}
    try:
        faults = [{"gpu": 1, "kind": "cooling", "at_s": 1, "factor": 2.5, "duration_s": 600},
                  {"gpu": 2, "kind": "xid", "at_s": 2, "code": 48},
                  {"gpu": 2, "kind": "ecc_uncorrected", "at_s": 2, "count": 1},
                  {"gpu": 3, "kind": "lost", "at_s": 3, "duration_s": 20},
                  {"gpu": 4, "kind": "xid", "at_s": 30, "code": 31},
                  {"gpu": 5, "kind": "lost", "at_s": 40, "duration_s": 20}]
        scen = write_yaml(work / "p3" / "scenario.yaml", {"faults": faults})
        for v in VARIANTS:
            if v.key == "none":
                alerting: dict[str, Any] = {}
            else:
                rx = hang_rx if v.key == "hang" else ok_rx
                alerting = {"slack": {"webhook_url": rx.slack_url},
                            "pagerduty": {"routing_key": PD_KEY, "url": rx.pagerduty_url}}
            d = work / "p3" / f"agent-{v.key}"
            cfg = write_yaml(d / "agent.yaml", {
                "state_dir": str(d / "state"), "sampling": {"fast_interval_s": 0.2, "slow_interval_s": 5},
                "policy": {"thermal": {"enabled": False}, "alerts": {"event_hold_s": 30, "throttle_after_s": 2}},
                "alerting": alerting, "log": {"format": "json"}})
            port = _bench.free_port()
            procs[f"agent-{v.key}"] = _bench.Proc(f"agent-{v.key}", agent_argv(cfg, scen, 1.0, port, f"p3-{v.key}",
                                                                         d / "timing.log"), d / "agent.log").start()
            urls[f"agent-{v.key}"] = f"http://127.0.0.1:{port}"
            d = work / "p3" / f"rules-{v.key}"
            rport = _bench.free_port()
            rcfg = rules_config(d / "rules.yaml", rport, d / "state", alerting, 0.5)
            procs[f"rules-{v.key}"] = _bench.Proc(f"rules-{v.key}", rules_argv(rcfg, d / "timing.log"), d / "rules.log").start()
            urls[f"rules-{v.key}"] = f"http://127.0.0.1:{rport}"
        for name, url in urls.items():
            procs[name].wait_http(f"{url}/healthz", START_TIMEOUT_S)
        pusher = Pusher([urls[f"rules-{v.key}"] for v in VARIANTS], ["starved-job", "healthy-job"],
                        lambda job, t: job == "starved-job")
        pusher.start()

        def scrape() -> None:
            for name, url in urls.items():
                try:
                    scrapes[name].append((time.time(), _bench.fetch(f"{url}/metrics", timeout_s=2.0).decode()))
                except OSError:
                    pass

        scraper = _bench.Ticker(1.0, scrape, "scraper").start()
        t_start = time.perf_counter()
        print(f"[part 3] 3 agents + 3 rules services up; measuring {window_s:.0f} s", file=sys.stderr, flush=True)
        time.sleep(window_s)
        t_end = time.perf_counter()
        scraper.stop()
        pusher.stop()
        alerts_seen = {}
        for name, url in urls.items():
            try:
                alerts_seen[name] = len([a for a in _bench.get_json(f"{url}/api/v1/alerts")["alerts"]
                                         if a["state"] != "pending"])
            except OSError:
                alerts_seen[name] = -1
        # Shutdown time, all at once (the hanging receiver is still hanging).
        stop_s = _bench.terminate_all(procs, STOP_TIMEOUT_S)
        # A hung request is recorded only when its hang ends; the scripted answers it used up count it now.
        hang_counts = {k: 200 - hang_rx.pending_scripts(k) for k in ("slack", "pagerduty")}
        ok_counts = {k: len(ok_rx.received(k, accepted=True)) for k in ("slack", "pagerduty")}
        inflight = stop_with_requests_in_flight(work, scen)
        timings = {}
        for name in procs:
            kind = "agent" if name.startswith("agent") else "rules"
            timings[name] = read_timing(work / "p3" / name / "timing.log", t_start, t_end,
                                        "F" if kind == "agent" else "E")
        return {"window_s": window_s, "timings": timings, "scrapes": dict(scrapes), "stop_s": stop_s,
                "hang_counts": hang_counts, "ok_counts": ok_counts, "alerts_seen": alerts_seen,
                "inflight": inflight}
    finally:
        if scraper is not None:
            scraper.stop()
        if pusher is not None:
            pusher.stop()
        for p in procs.values():
            p.terminate(STOP_TIMEOUT_S)
        hang_rx.stop()
        ok_rx.stop()


def stop_with_requests_in_flight(work: Path, scen: Path) -> dict[str, float | None]:
    """SIGTERM an agent and a rules service whose Slack and PagerDuty requests are both hanging right now."""
    _bench.use_test_helpers()
    from tests.scripted_receiver import Hang, ScriptedReceiver as Receiver

    rxs = {"agent": Receiver().start(), "rules": Receiver().start()}
    procs: dict[str, _bench.Proc] = {}
    pusher: Pusher | None = None
    try:
        for kind, rx in rxs.items():
            for k in ("slack", "pagerduty"):
                rx.script(k, *[Hang(300.0)] * 20)
            alerting = {"slack": {"webhook_url": rx.slack_url},
                        "pagerduty": {"routing_key": PD_KEY, "url": rx.pagerduty_url}}
            d = work / "p3" / f"inflight-{kind}"
            port = _bench.free_port()
            if kind == "agent":
                cfg = write_yaml(d / "agent.yaml", {
                    "state_dir": str(d / "state"), "sampling": {"fast_interval_s": 0.2, "slow_interval_s": 5},
                    "policy": {"thermal": {"enabled": False}}, "alerting": alerting, "log": {"format": "json"}})
                procs[kind] = _bench.Proc("inflight-agent", agent_argv(cfg, scen, 1.0, port, "p3-inflight", None),
                                   d / "agent.log").start()
            else:
                cfg = rules_config(d / "rules.yaml", port, d / "state", alerting, 0.5)
                procs[kind] = _bench.Proc("inflight-rules", rules_argv(cfg, None), d / "rules.log").start()
            procs[kind].wait_http(f"http://127.0.0.1:{port}/healthz", START_TIMEOUT_S)
            if kind == "rules":
                pusher = Pusher([f"http://127.0.0.1:{port}"], ["starved-job"], lambda job, t: True)
                pusher.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not all(rx.pending_scripts(k) < 20 for rx in rxs.values()
                                                      for k in ("slack", "pagerduty")):
            time.sleep(0.1)
        if not all(rx.pending_scripts(k) < 20 for rx in rxs.values() for k in ("slack", "pagerduty")):
            return {}
        time.sleep(0.5)
        return _bench.terminate_all(procs, STOP_TIMEOUT_S)
    finally:
        if pusher is not None:
            pusher.stop()
        for p in procs.values():
            p.terminate(STOP_TIMEOUT_S)
        for rx in rxs.values():
            rx.stop()


def read_timing(path: Path, t_start: float, t_end: float, tag: str) -> dict[str, list[float]]:
    """Cycle starts/durations (tag F or E) and pipeline.update durations inside the measuring window."""
    starts, durs, updates = [], [], []
    try:
        lines = path.read_text(encoding="ascii").splitlines()
    except OSError:
        lines = []
    for line in lines:
        parts = line.split()
        if len(parts) != 3:
            continue
        k, a, b = parts[0], float(parts[1]), float(parts[2])
        if not t_start <= a <= t_end:
            continue
        if k == tag:
            starts.append(a)
            durs.append(b - a)
        elif k == "U":
            updates.append(b - a)
    starts.sort()
    return {"intervals": [b - a for a, b in zip(starts, starts[1:])], "durations": durs, "updates": updates,
            "cycles": [float(len(starts))]}


# ----- report ---------------------------------------------------------------------------------------------
def q(xs: list[float], p: float) -> float:
    return _bench.quantile(xs, p) if xs else float("nan")


def fmt_s(x: float) -> str:
    if x != x:  # nan
        return "—"
    if abs(x) >= 10:
        return f"{x:,.1f} s"
    if abs(x) >= 1:
        return f"{x:.2f} s"
    return f"{x * 1e3:,.0f} ms" if abs(x) >= 0.01 else f"{x * 1e3:.2f} ms"


def fmt_ms(x: float) -> str:
    return "—" if x != x else (f"{x * 1e3:,.0f} ms" if x >= 0.1 else f"{x * 1e3:.1f} ms" if x >= 0.001
                               else f"{x * 1e6:,.0f} µs")


SINK_LABEL = {"pagerduty": "PagerDuty (Events v2)", "slack": "Slack (webhook)",
              "alertmanager": "Alertmanager → webhook"}


def report(args: argparse.Namespace, p1: dict[str, Any], a1: dict[str, Any], p3: dict[str, Any],
           load: tuple[tuple[float, ...], tuple[float, ...]]) -> str:
    plan: Part1Plan = p1["plan"]
    instances: dict[tuple[str, float], Instance] = p1["instances"]
    sinks: dict[str, SinkTally] = a1["sinks"]
    n_agent = sum(1 for i in instances.values() if i.kind == "agent")
    n_rules = len(instances) - n_agent
    out = ["# Alert delivery: notifications per sink, duplicates, firing → notification, sampling while a sink hangs",
           "", _bench.machine_block({
               "alertmanager": _bench.tool_version(ALERTMANAGER),
               "part 1 setup": f"{len(plan.agents)} agents `--sim 8 --sim-speed {plan.speed:g}` ({plan.run_s:.0f} s "
                               f"wall of planted faults, then a drain), 1 rules service (evaluation every 1 s) with "
                               f"{len(plan.starved)} pushing jobs, 1 Alertmanager (group_wait 1 s, group_interval "
                               f"2 s), all sinks on every daemon; Alertmanager sink resend_interval_s 5; "
                               f"restart_grace_s 30 (agents, simulated s)",
               "part 3 setup": f"3 agents (`--sim 8 --sim-speed 1`, fast_interval_s 0.2) + 3 rules services "
                               f"(evaluation_interval_s 0.5) concurrently for {p3['window_s']:.0f} s",
               "load average (1 min) at start / end": f"{load[0][0]:.2f} / {load[1][0]:.2f} on {os.cpu_count()} CPUs",
           }), ""]
    if args.quick:
        out += ["**Quick run (smoke test): the numbers are not meant to be quoted.**", ""]
    out += ["## What this shows", ""] + findings(p1, a1, p3) + [""]

    # ---- part 1
    out += ["## 1. Delivery and duplicates", "",
            f"Alert instances that reached `firing` in the daemons' own `GET /api/v1/alerts` over the run: "
            f"**{len(instances)}** ({n_agent} from the agents, {n_rules} from the rules service); "
            f"{sum(1 for i in instances.values() if i.end is not None)} of them resolved before the end. "
            f"Every sink should announce each (PagerDuty and Slack take severity ≥ warning; all of these are). "
            f"API polls: {p1['polls'][0]:,} answered, {p1['polls'][1]:,} failed (agents being restarted).", ""]
    rows = []
    for k in ("pagerduty", "slack", "alertmanager"):
        t = sinks[k]
        missed = []
        if t.folded:
            missed.append(f"{t.folded} folded")
        if t.short_lived:
            missed.append(f"{t.short_lived} short-lived")
        if t.lost:
            missed.append(f"**{t.lost} not delivered**")
        dup = f"{t.duplicates}" + (f" ({t.unchanged_renotify} unchanged re-notifications)"
                                   if k == "alertmanager" and t.unchanged_renotify else "")
        rows.append([SINK_LABEL[k], f"{t.delivered} / {t.expected}", ", ".join(missed) or "—",
                     f"{t.resolves_delivered} / {t.resolves_expected}", dup,
                     f"{t.duplicates_after_restart}", f"{t.spurious_resolves} ({t.spurious_after_restart})",
                     str(t.orphan_resolves) if k != "alertmanager" else "—", str(t.rejected), str(t.unmatched)])
    out.append(_bench.md_table(["sink", "triggers delivered / expected", "missed, why", "resolves delivered / "
                                "expected", "duplicates", "of which after a restart", "spurious resolves "
                                "(after a restart)", "resolves with nothing open", "rejected by receiver",
                                "unmatched"], rows))
    out += ["", "- *folded*: the alert resolved and fired again (same fingerprint) before the sink had sent the "
            "resolve; the sink reconciles towards the newest picture, so the open incident/message simply "
            "stays open and that earlier instance's resolve is not sent either (by design: nobody is paged twice for a "
            "flapping alert). *short-lived*: the alert "
            "fired and resolved within 2 s and the sink never announced it. *not delivered*: neither.",
            "- *duplicates*: PagerDuty a trigger for a dedup_key already open; Slack a firing message for an "
            "alert already announced and not resolved in Slack; Alertmanager a firing notification for an "
            "alert instance it had already notified resolved, or a group re-notified with an unchanged "
            "alert set. *spurious resolves*: a resolve sent while the daemon's API still showed the alert "
            "firing.", ""]

    # per-source breakdown of misses
    miss_rows = []
    for k in ("pagerduty", "slack", "alertmanager"):
        for inst, why in a1["missing"][k]:
            miss_rows.append([SINK_LABEL[k], inst.source, inst.labels["alertname"], inst.labels.get("gpu")
                              or inst.labels.get("job", ""), fmt_s(((inst.end or p1["end"]) - inst.start)), why])
    if miss_rows:
        out += ["Instances a sink did not announce:", ""]
        out.append(_bench.md_table(["sink", "daemon", "alert", "gpu / job", "firing for", "why"], miss_rows[:40]))
        if len(miss_rows) > 40:
            out.append(f"\n({len(miss_rows) - 40} more rows left out)")
        out.append("")

    # restarts
    out += ["### Restarts (SIGKILL, restart with the same state_dir)", ""]
    rrows = []
    for r in p1["restarts"]:
        open_names = sorted(f"{a['labels']['alertname']}{'/' + a['labels']['xid'] if 'xid' in a['labels'] else ''}"
                            f"(GPU {a['labels'].get('gpu')})" for a in r.open_at_kill)
        after = [i for i in instances.values() if i.source == r.node and i.start >= r.killed_at]
        end = p1["at_end"].get(r.node, {})
        xid = end.get("xid_ok")
        rrows.append([r.node, r.why, f"{r.sim_at_kill:.0f} s", ", ".join(open_names) or "—",
                      f"{r.up_at - r.killed_at:.1f} s", str(len(after)), f"{end.get('gpus_up', '?')} / 8",
                      "?" if xid is None else ("yes" if xid == 1 else "**no**")])
    out.append(_bench.md_table(["agent", "killed while", "simulated time", "firing at the kill", "kill → /healthz "
                                "200", "new alert instances after", "GPUs up at the end",
                                "XID watcher healthy at the end"], rrows))
    out += ["", restart_story(p1, a1), ""]

    # planted faults
    out += ["### Planted faults vs alerts the agents raised", "",
            "Per agent: rounds in which each fault was planted vs alert instances raised (the thermal "
            "fault flaps, so it can raise several per round; **<** marks fewer than planted).", ""]
    out.append(_bench.md_table(["agent", "fault → alert", "planted", "raised"], a1["planted"]))
    out.append("")

    # ---- part 2
    out += ["## 2. Firing → notification", "",
            "Receiver `received_at` − the alert's `startsAt` (the pipeline's wall-clock start of firing), per "
            "delivered trigger. Alertmanager's includes its own group_wait (1 s) / group_interval (2 s); the "
            "agents' Slack sink sends at most one message a second per sink.", ""]
    rows = []
    for k in ("pagerduty", "slack", "alertmanager"):
        for src in ("agent", "rules"):
            xs = sinks[k].latencies.get(src, [])
            if xs:
                rows.append([SINK_LABEL[k], src, str(len(xs)), fmt_s(q(xs, 0.5)), fmt_s(q(xs, 0.9)), fmt_s(max(xs))])
        xs = sinks[k].resolve_latencies
        if xs:
            rows.append([SINK_LABEL[k], "resolve (from endsAt)", str(len(xs)), fmt_s(q(xs, 0.5)), fmt_s(q(xs, 0.9)),
                         fmt_s(max(xs))])
    out.append(_bench.md_table(["sink", "source", "n", "p50", "p90", "max"], rows))
    out.append("")

    # ---- part 3
    out += part3_report(p3)
    out.append(CAVEATS)
    return "\n".join(out)


def _name(i: Instance) -> str:
    lab = i.labels
    return f"{lab['alertname']}{' XID ' + lab['xid'] if 'xid' in lab else ''} (GPU {lab.get('gpu')})"


def restart_story(p1: dict[str, Any], a1: dict[str, Any]) -> str:
    """What each restart did, from the records and the API (counts and times, no interpretation)."""
    lines = []
    sinks: dict[str, SinkTally] = a1["sinks"]
    for r in p1["restarts"]:
        mine = sorted((i for i in p1["instances"].values() if i.source == r.node), key=lambda i: i.start)
        fps = {i.fp for i in mine}
        pd = [x.json() for x in p1["records"] if x.accepted and x.received_at.timestamp() >= r.killed_at
              and x.kind == "pagerduty" and x.json()["dedup_key"] in fps]
        pd_trig = sum(1 for e in pd if e["event_action"] == "trigger")
        dups = {k: sum(1 for t, fp in s.dup_events if fp in fps and t >= r.killed_at) for k, s in sinks.items()}
        words = [f"- **{r.node}**, killed while {r.why}: after the kill PagerDuty got {pd_trig} trigger(s) and "
                 f"{len(pd) - pd_trig} resolve(s) for this node's alerts; duplicates for this node after the kill: "
                 f"PagerDuty {dups['pagerduty']}, Slack {dups['slack']}, Alertmanager {dups['alertmanager']}."]
        spur = [(sink, t, i) for sink, tally in sinks.items() for t, i in tally.spurious
                if i.source == r.node and t >= r.killed_at]
        for sink, t, i in sorted(spur, key=lambda x: x[1]):
            words.append(f"{SINK_LABEL[sink]} announced {_name(i)} **resolved** {t - r.killed_at:.0f} s after the "
                         f"kill while the agent still showed it firing.")
        by_fp: dict[str, list[Instance]] = defaultdict(list)
        for i in mine:
            by_fp[i.fp].append(i)
        for a, b in ((a, b) for insts in by_fp.values() for a, b in zip(insts, insts[1:])):
            if a.end is not None and a.end >= r.killed_at and b.start - a.end < 30 and \
                    a.labels["alertname"] != "GpuSwThermalSlowdown":
                words.append(f"{_name(a)} resolved {a.end - r.killed_at:.0f} s after the kill and fired again "
                             f"{b.start - a.end:.1f} s later as a new alert (same fingerprint: a resolve and a "
                             f"new trigger for the same dedup_key).")
        lines.append(" ".join(words))
    return "\n".join(lines)


def _ratio(p3: dict[str, Any], kind: str, a: str, b: str, key: str = "p99") -> float:
    def stat(v: str) -> float:
        iv = p3["timings"][f"{kind}-{v}"]["intervals"]
        return q(iv, 0.99) if key == "p99" else (max(iv) if iv else float("nan"))
    return stat(a) / stat(b)


def findings(p1: dict[str, Any], a1: dict[str, Any], p3: dict[str, Any]) -> list[str]:
    """The run's headline, derived from its own figures (nothing typed in by hand)."""
    sinks: dict[str, SinkTally] = a1["sinks"]
    instances: dict[tuple[str, float], Instance] = p1["instances"]
    restarts: list[Restart] = p1["restarts"]
    out = []
    dups = sum(t.duplicates for t in sinks.values())
    out.append(
        f"- **Duplicates: {dups}** over {len(instances)} alert instances and {len(restarts)} SIGKILL restart(s) "
        f"(PagerDuty {sinks['pagerduty'].duplicates}, Slack {sinks['slack'].duplicates}, Alertmanager "
        f"{sinks['alertmanager'].duplicates}).")
    parts = []
    for k in ("pagerduty", "slack", "alertmanager"):
        t = sinks[k]
        why = ", ".join(x for x in (f"{t.folded} folded" if t.folded else "",
                                    f"{t.short_lived} short-lived" if t.short_lived else "",
                                    f"**{t.lost} lost**" if t.lost else "") if x)
        parts.append(f"{SINK_LABEL[k]} {t.delivered}/{t.expected}" + (f" ({why})" if why else "")
                     + f", resolves {t.resolves_delivered}/{t.resolves_expected}")
    out.append("- **Delivered / expected**: " + "; ".join(parts) + ". Nothing was lost: every miss is a flapping "
               "alert over before the sink's turn or folded into its open notification."
               if not any(t.lost for t in sinks.values()) else "- **Delivered / expected**: " + "; ".join(parts) + ".")
    lat = []
    for k in ("pagerduty", "slack", "alertmanager"):
        xs = [x for v in sinks[k].latencies.values() for x in v]
        if xs:
            lat.append(f"{SINK_LABEL[k]} p50 {fmt_s(q(xs, 0.5))} / p90 {fmt_s(q(xs, 0.9))}")
    out.append("- **Firing → notification** (all sources): " + "; ".join(lat) + ". Slack's p90 is its one message a "
               "second per sink; Alertmanager's is its group_wait.")
    worst = max(_ratio(p3, k, "hang", b) for k in ("agent", "rules") for b in ("healthy", "none"))
    verdict = ("A hanging sink does not disturb sampling or evaluation" if worst <= 1.1
               else "A hanging sink lengthens sampling or evaluation intervals")
    out.append(f"- **{verdict}**: agent fast-cycle interval p99, sinks "
               f"hanging ÷ healthy {_ratio(p3, 'agent', 'hang', 'healthy'):.2f}, ÷ no sinks "
               f"{_ratio(p3, 'agent', 'hang', 'none'):.2f} (max {_ratio(p3, 'agent', 'hang', 'healthy', 'max'):.2f} "
               f"/ {_ratio(p3, 'agent', 'hang', 'none', 'max'):.2f}); rules evaluation interval p99 "
               f"{_ratio(p3, 'rules', 'hang', 'healthy'):.2f} / {_ratio(p3, 'rules', 'hang', 'none'):.2f}. "
               f"`AlertPipeline.update` hands over a snapshot and returns; the sinks' threads wait on the network.")
    if p3.get("inflight"):
        secs = [x for x in p3["inflight"].values() if x is not None]
        calm = [x for k, x in p3["stop_s"].items() if x is not None and not k.endswith("-hang")]
        if secs and calm:
            span = fmt_s(min(secs)) if f"{min(secs):.1f}" == f"{max(secs):.1f}" else \
                f"{min(secs):.1f}–{max(secs):.1f} s"
            out.append(f"- **Shutdown with both sinks' requests hanging takes {span}** (healthy or no sinks: "
                       f"{fmt_s(max(calm))} at most): `AlertPipeline.stop` stops every sink at once and waits "
                       f"5 s at most in all, however many sinks hang (before, one after the other: 5 s per hanging "
                       f"sink).")
    return out


def part3_report(p3: dict[str, Any]) -> list[str]:
    out = ["## 3. Sampling and evaluation while a sink hangs", "",
           f"Three agents and three rules services at once for {p3['window_s']:.0f} s, differing only in "
           f"`alerting:`. Cycle times are from inside each process (shim, see the script's docstring). "
           f"Requests the hanging receiver held (agent + rules service): Slack {p3['hang_counts']['slack']}, PagerDuty "
           f"{p3['hang_counts']['pagerduty']} (each held until the sink's 10 s timeout, then retried with "
           f"backoff); the healthy receiver accepted Slack {p3['ok_counts']['slack']}, PagerDuty "
           f"{p3['ok_counts']['pagerduty']}.", ""]
    for kind, nominal, what in (("agent", 0.2, "fast sample cycle (`Sampler.fast_cycle`)"),
                                ("rules", 0.5, "evaluation (`Evaluator.evaluate`)")):
        rows = []
        base: dict[str, dict[str, float]] = {}
        for v in VARIANTS:
            t = p3["timings"][f"{kind}-{v.key}"]
            iv, du, up = t["intervals"], t["durations"], t["updates"]
            stats = {"p50": q(iv, 0.5), "p99": q(iv, 0.99), "max": max(iv) if iv else float("nan"),
                     "d99": q(du, 0.99)}
            base[v.key] = stats
            expected = p3["window_s"] / nominal
            rows.append([v.label, f"{int(t['cycles'][0])} / {expected:.0f}", fmt_ms(stats["p50"]),
                         fmt_ms(stats["p99"]), fmt_ms(stats["max"]),
                         f"{sum(1 for x in iv if x > 1.5 * nominal)}",
                         f"{fmt_ms(q(du, 0.5))} / {fmt_ms(stats['d99'])} / {fmt_ms(max(du) if du else float('nan'))}",
                         f"{fmt_ms(q(up, 0.5))} / {fmt_ms(q(up, 0.99))} / {fmt_ms(max(up) if up else float('nan'))}"])
        out += [f"### {'Agent' if kind == 'agent' else 'Rules service'}: {what}, every {nominal:g} s", ""]
        out.append(_bench.md_table(["variant", "cycles run / scheduled", "interval p50", "interval p99",
                                    "interval max", f"intervals > {1.5 * nominal:g} s", "duration p50 / p99 / max",
                                    "`AlertPipeline.update` p50 / p99 / max"], rows))
        h, ok, no = base["hang"], base["healthy"], base["none"]
        out += ["", f"Ratios, sinks hanging ÷ healthy: interval p99 **{h['p99'] / ok['p99']:.2f}**, max "
                f"{h['max'] / ok['max']:.2f}, duration p99 {h['d99'] / ok['d99']:.2f}; hanging ÷ no sinks: "
                f"interval p99 **{h['p99'] / no['p99']:.2f}**, max {h['max'] / no['max']:.2f}, duration p99 "
                f"{h['d99'] / no['d99']:.2f}.", ""]
        # what /metrics said
        rows = []
        for v in VARIANTS:
            name = f"{kind}-{v.key}"
            texts = [t for _, t in p3["scrapes"].get(name, [])]
            if kind == "agent":
                vals = [x for t in texts if (x := _metric(t, "gpumond_collector_duration_seconds",
                                                          collector="policy")) is not None]
            else:
                vals = [x for t in texts if (x := _metric(t, "gpumond_rules_evaluation_duration_seconds"))
                        is not None]
            last = texts[-1] if texts else ""
            sent = sum(_metric(last, "gpumond_alert_sink_sent_total", sink=s) or 0 for s in ("slack", "pagerduty"))
            failed = sum(_metric(last, "gpumond_alert_sink_failed_total", sink=s) or 0
                         for s in ("slack", "pagerduty"))
            depth = sum(_metric(last, "gpumond_alert_sink_queue_depth", sink=s) or 0 for s in ("slack", "pagerduty"))
            rows.append([v.label, str(len(texts)), fmt_ms(q(vals, 0.5)), fmt_ms(q(vals, 0.99)),
                         fmt_ms(max(vals) if vals else float("nan")), f"{sent:.0f}", f"{failed:.0f}", f"{depth:.0f}",
                         str(p3["alerts_seen"].get(name, "?"))])
        gauge = ("`gpumond_collector_duration_seconds{collector=\"policy\"}`" if kind == "agent"
                 else "`gpumond_rules_evaluation_duration_seconds`")
        out += [f"From /metrics, scraped every second: {gauge} (the last cycle's value at each scrape) and the "
                "Slack + PagerDuty sink counters at the end.", ""]
        out.append(_bench.md_table(["variant", "scrapes", "gauge p50", "gauge p99", "gauge max", "sent", "failed",
                                    "queue depth", "alerts held (firing + resolved)"], rows))
        out.append("")
    rows = []
    for v in VARIANTS:
        for kind in ("agent", "rules"):
            s = p3["stop_s"].get(f"{kind}-{v.key}")
            rows.append([f"{kind}, {v.label}", "killed after 30 s" if s is None else fmt_s(s)])
    for kind, secs in p3["inflight"].items():
        rows.append([f"{kind}, sinks hang, SIGTERM while a Slack and a PagerDuty request are both in flight",
                     "killed after 30 s" if secs is None else fmt_s(secs)])
    out += ["### Shutdown (SIGTERM → exit)", "",
            "The six processes above stopped at once at the end of the window (the hanging receiver still "
            "hanging; a hanging sink may be between attempts then)" + (", and a separate agent and rules service "
            "stopped just after both of their sinks had sent a request that hangs." if p3["inflight"] else "."), ""]
    out.append(_bench.md_table(["process", "SIGTERM → exit"], rows))
    out.append("")
    return out


CAVEATS = """
## Caveats

- *Expected* is what the daemons themselves raised (their API, polled every 0.25 s): a sink is
  judged against its own daemon, not against the planted faults. Whether the daemons raised what
  they should is the separate planted-faults table. An instance that resolved and was replaced by a
  new one of the same fingerprint within one poll would escape the count; anything a sink announced
  that the API never showed would appear as *unmatched*.
- The thermal fault flaps by construction (a clogged cold plate under a training load oscillates
  around the slowdown temperature): with `throttle_after_s` 10 simulated s it raises anywhere from
  0 to ~5 short alerts per round depending on how the oscillation lines up, and those are where
  *folded* and *short-lived* come from. With the default 60 s they would be rarer.
- The agents run at `--sim-speed 5`: `for_s`, event holds and `restart_grace_s` are simulated
  seconds (÷ 5 in wall time); the sinks, Alertmanager and the receiver run in wall time. The
  Alertmanager sink's `resend_interval_s` is 5 here, so its lease is 4 × 5 = 20 s; with the default
  60 s the lease is 4 minutes and only a longer silence (a GPU that stays lost, as real ones do
  until a reset) lets it run out.
- A restarted simulator starts at 0, so it is given the rest of the node's story from the kill time
  estimated in wall time (good to about a second of simulated time).
- Latency is wall clock against wall clock on one machine; the receiver runs in this script's
  process, which also polls and pushes, so its timestamps can lag by a few ms under load.
- Part 3 runs six daemons plus the receivers on 2 shared vCPUs with other work; variants are
  concurrent, so machine noise is common to them, and the ratios, not the absolute intervals, are
  the figures to compare. The shim adds one line write per timed call in every variant alike.
  APScheduler runs the cycles on a fixed grid, so one late cycle shows as a long interval followed
  by a short one.
"""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--shim"]:
        return shim(argv[1], argv[2:])
    ap = _bench.parser(__doc__, "one agent killed once, a 10 s story, a 5 s hang window")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs, configs) and print it")
    ap.add_argument("--name", help="result file name (default alert_delivery; _quick is added with --quick)")
    args = ap.parse_args(argv)
    if not shutil.which(ALERTMANAGER):
        raise SystemExit(f"{ALERTMANAGER} is not installed: apt-get install -y prometheus-alertmanager")
    work = Path(tempfile.mkdtemp(prefix="gpumond-bench-alerts-"))
    t0 = time.monotonic()
    try:
        load0 = os.getloadavg()
        p1 = run_part1(args, work)
        a1 = analyse(p1)
        p3 = run_part3(args, work)
        load1 = os.getloadavg()
        _bench.write_result(args.name or "alert_delivery", report(args, p1, a1, p3, (load0, load1)), quick=args.quick)
        print(f"(took {time.monotonic() - t0:.0f} s)", file=sys.stderr)
    finally:
        if args.keep:
            print(f"work directory kept: {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
