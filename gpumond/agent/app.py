"""Wires the agent: NVML session, sources, sampling schedule and the HTTP server."""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import Any
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.date import DateTrigger
from apscheduler.triggers.interval import IntervalTrigger

from gpumond.agent.dcgm import DcgmCompat, dcgm_types
from gpumond.agent.exposition import Rendered, Renderer
from gpumond.agent.host import HostEvidence
from gpumond.agent.identity_file import FILE_NAME as IDENTITY_FILE
from gpumond.agent.identity_file import IdentityFile
from gpumond.agent.jobs import JobAttributor
from gpumond.agent.podresources.client import PodResourcesClient, load_grpc
from gpumond.agent.metrics import metric_types
from gpumond.state.audit import AuditLog
from gpumond.agent.policy.engine import PolicyEngine
from gpumond.agent.policy.lease import Guard
from gpumond.agent.policy.lease_client import LeasePuller
from gpumond.agent.policy.state_file import StateFile
from gpumond.agent.policy.view import build_views
from gpumond.agent.relay import HeldFile, Relay, session_devices
from gpumond.agent.relay.held_file import FILE_NAME as RELAY_HELD_FILE
from gpumond.agent.sampler import Sampler
from gpumond.agent.server import AgentApp
from gpumond.agent.sources.parts import NodeParts
from gpumond.agent.sources.registry import build as build_sources
from gpumond.alerts.pipeline import AlertPipeline
from gpumond.alerts.sinks import build_sinks
from gpumond.alerts.state import FILE_NAME as ALERT_STATE_FILE
from gpumond.agent.policy.event_file import FILE_NAME as EVENT_FILE
from gpumond.agent.policy.event_file import EventFile
from gpumond.alerts.state import AlertStateFile
from gpumond.web.client import AccessError, build_access
from gpumond.config import AgentConfig
from gpumond.config.agent import PodResourcesConfig
from gpumond.config.errors import more_problems
from gpumond.nvml.events import XidWatcher
from gpumond.nvml.session import NvmlSession
from gpumond.web.connections import ConnectionLimits, ConnectionStats, connection_cap
from gpumond.web.serving import ListenError, bind, default_external_url, run_until_signalled
from gpumond.state.dirlock import StateDirBusy, StateDirLock
from gpumond.web import Web

__all__ = ["Agent", "AgentStartError", "Backend", "serve"]

log = logging.getLogger("gpumond.agent")

# At stop, the relay delivers what it holds for at most this long: inside systemd's TimeoutStopSec=30s and
# Kubernetes' 30 s grace, after the policy's restore.
RELAY_STOP_GRACE_S = 10.0
# Below this the scheduler's own overhead dominates; --sim-speed intervals are clamped to it.
_MIN_WALL_INTERVAL_S = 0.01


@dataclass(frozen=True)
class Backend:
    """Where NVML comes from: the real driver, or the simulator installed under pynvml."""

    name: str
    install: Callable[[], None] = lambda: None
    uninstall: Callable[[], None] = lambda: None
    clock: Callable[[], float] = time.monotonic  # the agent's notion of elapsed time (simulated under --sim)
    speed: float = 1.0
    extra: dict[str, object] = field(default_factory=dict)


class AgentStartError(RuntimeError):
    """The agent cannot start as configured; one line naming what and where."""


def state_dir_for(config: AgentConfig, backend: Backend) -> tuple[Path, bool]:
    """Where policy state and the audit log live, and whether it is this run's own (removed at stop).

    A simulated node that was not given a state_dir gets a fresh directory for the run: `--sim` never needs
    root, never touches a real node's state, and never restores what an earlier run's simulation (which
    starts again from zero) left behind: an old run's alerts would fire again at start."""
    if backend.name == "sim" and "state_dir" not in config.model_fields_set:
        path = Path(tempfile.mkdtemp(prefix=f"gpumond-sim-{config.node_name}-"))
        log.info("simulated node: state kept for this run only (set state_dir to keep it across restarts)",
                 extra={"state_dir": str(path)})
        return path, True
    return config.state_dir, False


class Agent:
    """One node's agent: start() begins sampling, stop() ends it and releases NVML."""

    def __init__(self, config: AgentConfig, backend: Backend, web: Web | None = None) -> None:
        self.config = config
        self.backend = backend
        self.web = web if web is not None else Web()
        state_dir, self._own_state_dir = state_dir_for(config, backend)
        self._state_dir = state_dir
        try:  # before anything reads the state: another live agent's limits are not ours to restore
            self._lock = StateDirLock.acquire(state_dir, "agent")
        except StateDirBusy as e:
            raise AgentStartError(str(e)) from None
        except OSError as e:
            raise AgentStartError(f"state_dir {state_dir}: {e.strerror or e} (set state_dir in the config, or run "
                                  f"under systemd's StateDirectory=)") from None
        self._identities = IdentityFile(state_dir / IDENTITY_FILE)
        self.session = NvmlSession(install=backend.install, clock=backend.clock,
                                   retry_max_s=config.sampling.nvml_retry_max_s,
                                   remembered=self._identities.load())
        self.xid: XidWatcher | None = None
        jobs = None
        self.pods: PodResourcesClient | None = None
        if config.jobs.enabled:
            jobs = JobAttributor(env_vars=config.jobs.env_vars, kubernetes_pods=config.jobs.kubernetes_pods,
                                 cache_size=config.jobs.cache_size,
                                 # an entry must outlive the gap between two slow cycles to be of any use
                                 idle_evict_s=max(300.0, 3 * config.sampling.slow_interval_s))
            self.pods = pod_resources_client(config.jobs.pod_resources)
        if config.sampling.xid_events:
            self.xid = XidWatcher(self.session.handles, self.session.index_of_handle,
                                  ready=lambda: self.session.up, clock=backend.clock)
        try:
            audit = AuditLog(state_dir / "policy-audit.jsonl")
        except OSError as e:
            raise AgentStartError(f"state_dir {state_dir}: {e.strerror or e} (set state_dir in the config, or run "
                                  f"under systemd's StateDirectory=)") from None
        try:
            self.alerts = _alert_pipeline(config, state_dir, self.web.scheme)
        except AccessError as e:
            self._lock.release()
            raise AgentStartError(str(e)) from None
        self.relay: Relay | None = None
        if config.relay.enabled:
            try:
                relay_access = build_access(config.relay)
            except AccessError as e:
                self._lock.release()
                raise AgentStartError(f"relay.{e}") from None
            self.relay = Relay(config.relay, node=config.node_name, devices=session_devices(self.session),
                               access=relay_access, defer=self._run_later,
                               jobs_of=jobs.jobs_for if jobs is not None else None,
                               held=HeldFile(state_dir / RELAY_HELD_FILE, time.monotonic,
                                             buffer_max_bytes=config.relay.buffer_max_bytes))
        slack = config.policy.power_slack
        self.leases: LeasePuller | None = None
        if slack.rules_url is not None and slack.mode != "off" and config.policy.mode != "off":
            try:
                access = build_access(slack)
            except AccessError as e:
                self._lock.release()
                raise AgentStartError(f"policy.power_slack.{e}") from None
            self.leases = LeasePuller(str(slack.rules_url), config.node_name, lease_s=slack.lease_s,
                                      guard=Guard(slack.max_gpus_per_interval, slack.max_step_w),
                                      clock=backend.clock, applied=lambda: self.policy.lease_bases(), access=access)
        self.policy = PolicyEngine(config.policy, self.session, node=config.node_name,
                                   state_file=StateFile(state_dir / "policy-state.json"), audit=audit,
                                   clock=backend.clock, alerts=self.alerts,
                                   events=EventFile(state_dir / EVENT_FILE),
                                   leases=self.leases.leases if self.leases is not None else None)
        self._audit = audit
        compat = config.exposition.dcgm_compat
        per_link = config.exposition.nvlink_per_link
        dcgm = (DcgmCompat(hostname=config.node_name, hostname_label=compat.hostname_label, per_link=per_link)
                if compat.enabled else None)
        renderer = Renderer(types=metric_types() | dcgm_types()) if dcgm is not None else Renderer()
        # Filled by the HTTP server (serve()), exported each fast cycle; the cap is known now, for the first one.
        self.http_stats = ConnectionStats(cap=connection_cap(ConnectionLimits.of(config.http)))
        parts = NodeParts(self.session, hostname=config.node_name, nvlink_per_link=per_link,
                          identities=self._identities.save, xid=self.xid, jobs=jobs, pods=self.pods,
                          host=HostEvidence() if config.host.enabled else None, policy=self.policy, dcgm=dcgm)
        self.sampler = Sampler(self.session, build_sources(parts), renderer=renderer,
                               server=lambda: [*self.http_stats.series(), *self.web.series(),
                                               *(self.relay.series() if self.relay is not None else ())])
        self._scheduler = BackgroundScheduler(timezone=timezone.utc)

    def _run_later(self, delay_s: float, fn: Callable[[], object]) -> None:
        """Run `fn` once on the agent's scheduler, `delay_s` wall seconds from now (the relay's early rounds)."""
        run_at = datetime.now(timezone.utc) + timedelta(seconds=delay_s)
        self._scheduler.add_job(fn, DateTrigger(run_date=run_at), name="relay early round", misfire_grace_time=None)

    def wall_interval(self, simulated_s: float) -> float:
        """A tier's interval in wall seconds: intervals are in agent (simulated) time."""
        return max(simulated_s / self.backend.speed, _MIN_WALL_INTERVAL_S)

    def start(self) -> None:
        """Open NVML, take one full sample synchronously (so the first scrape has data), then schedule."""
        log.info("agent starting", extra={"backend": self.backend.name, "node": self.config.node_name,
                                          "listen": str(self.config.listen), "policy": self.config.policy.mode})
        self.alerts.start(self.backend.clock())
        if self.pods is not None:
            self.pods.start()  # its own thread: the first slow cycle may not have its answer yet
        self.session.open()
        if self.xid is not None:
            self.xid.start()  # also while NVML is down: it registers once NVML comes up
        self.sampler.slow_cycle()
        if self.session.up:
            problems = self.policy.check(build_views(self.session.read("fast"), self.sampler.slow_read))
            if problems:
                self.stop()
                raise AgentStartError(problems[0] + more_problems(len(problems) - 1))
        self.sampler.fast_cycle()
        now = datetime.now(timezone.utc)
        s = self.config.sampling
        for fn, interval, name in ((self.sampler.fast_cycle, s.fast_interval_s, "fast"),
                                   (self.sampler.slow_cycle, s.slow_interval_s, "slow")):
            wall = self.wall_interval(interval)
            self._scheduler.add_job(fn, IntervalTrigger(seconds=wall), id=name, name=f"{name} tier",
                                    max_instances=1, coalesce=True, misfire_grace_time=None,
                                    next_run_time=now)
        if self.leases is not None:
            self._scheduler.add_job(self.leases.poll, IntervalTrigger(
                seconds=self.wall_interval(self.config.policy.power_slack.interval_s)), id="power_slack",
                name="power-slack offers", max_instances=1, coalesce=True, next_run_time=now)
        if self.relay is not None:
            self.relay.start()
            # Wall seconds, not simulated ones: ranks push on the wall clock whatever --sim-speed says.
            self._scheduler.add_job(self.relay.flush, IntervalTrigger(seconds=self.config.relay.interval_s),
                                    id="relay", name="relay batches", max_instances=1, coalesce=True,
                                    next_run_time=now)
        self._scheduler.start()

    def stop(self) -> None:
        """Stop sampling and the XID thread, then shut NVML down."""
        if self._scheduler.running:
            self._scheduler.shutdown(wait=True)
        # The restore comes first (while NVML is open), and no later step's failure (a full disk under the
        # alert state file, a stuck thread) can skip it or another step.
        steps: list[tuple[str, Callable[[], object] | None]] = [
            ("policy restore", self.policy.stop),
            # What the ranks handed over goes upstream before the agent exits, within the shutdown grace.
            ("relay flush", (lambda: self.relay.stop(RELAY_STOP_GRACE_S)) if self.relay else None),
            ("xid watcher", self.xid.stop if self.xid else None),
            ("pod-resources client", self.pods.stop if self.pods else None), ("alerts", self.alerts.stop),
            ("power-slack client", self.leases.close if self.leases else None),
            ("audit log", self._audit.close), ("nvml", self.session.close), ("backend", self.backend.uninstall),
            ("state_dir lock", self._lock.release)]
        for name, step in steps:
            if step is None:
                continue
            try:
                step()
            except Exception as e:
                log.error("stop step failed; carrying on", extra={"step": name, "error": f"{type(e).__name__}: {e}"})
        if self._own_state_dir:
            shutil.rmtree(self._state_dir, ignore_errors=True)
        log.info("agent stopped")

    def discard(self) -> None:
        """Undo what constructing the agent did, for an agent that will never start (its port is taken)."""
        self._audit.close()
        self._lock.release()
        if self._own_state_dir:
            shutil.rmtree(self._state_dir, ignore_errors=True)

    def latest(self) -> Rendered | None:
        """What /metrics serves."""
        return self.sampler.latest

    def health(self) -> tuple[bool, str]:
        """Healthy while samples are fresh; NVML down is reported but is not a dead agent."""
        r = self.sampler.latest
        if r is None:
            return False, "no sample yet"
        age = time.time() - r.taken_at
        limit = 3 * self.wall_interval(self.config.sampling.fast_interval_s) + 5
        if age > limit:
            return False, f"stale: last sample {age:.1f}s ago"
        if not self.session.up:
            return True, f"ok (nvml down: {self.session.down_reason})"
        return True, "ok"

    def app(self) -> AgentApp:
        """The ASGI app serving this agent."""
        return AgentApp(self.latest, self.health, self.alerts.api_json)


def pod_resources_client(cfg: PodResourcesConfig,
                         loader: Callable[[], tuple[Any, Any, Any] | str] = load_grpc) -> PodResourcesClient | None:
    """The kubelet pod-resources client the config asks for, or None (said in one log line when unusable)."""
    if cfg.enabled is False:
        return None
    if cfg.enabled == "auto" and not cfg.socket.exists():
        log.info("pod-resources socket not found: attributing GPUs by process only (not a Kubernetes node?)",
                 extra={"socket": str(cfg.socket)})
        return None
    loaded = loader()
    if isinstance(loaded, str):
        log.warning("pod-resources configured but unusable: attributing GPUs by process only",
                    extra={"socket": str(cfg.socket), "error": loaded})
        return None
    return PodResourcesClient(cfg.socket, timeout_s=cfg.timeout_s, interval_s=cfg.interval_s, grpc_modules=loaded)


def _alert_pipeline(config: AgentConfig, state_dir: Path, scheme: str = "http") -> AlertPipeline:
    """The agent's alerts: sinks from `alerting:`; alerts link to this agent's /metrics."""
    a = config.alerting
    base = a.external_url or default_external_url(config.listen, config.node_name, scheme)
    state = AlertStateFile(state_dir / ALERT_STATE_FILE)
    # The lease must outlast a fast cycle; the agent's alerts are evaluated every fast cycle.
    sinks = build_sinks(a, state, evaluation_interval_s=config.sampling.fast_interval_s)
    return AlertPipeline(a, sinks=sinks, state=state, generator_url=lambda alert: f"{base}/metrics")


def serve(agent: Agent) -> None:
    """Run the agent until SIGTERM/SIGINT, then stop it cleanly (restoring limits; exit status 0)."""
    relay = agent.relay
    socks = []
    if relay is not None and _same_port(agent.config.listen, relay.config.listen):
        agent.discard()
        raise AgentStartError(f"relay.listen {relay.config.listen} takes the port of listen {agent.config.listen}: "
                              "give the relay its own port (default 9482; --relay-listen)")
    try:
        socks.append(bind(agent.config.listen.host, agent.config.listen.port))
        if relay is not None:
            socks.append(bind(relay.config.listen.host, relay.config.listen.port))
    except ListenError as e:
        for sock in socks:
            sock.close()
        agent.discard()  # e.g. a --sim run's own state directory, which would otherwise stay in /tmp
        if relay is not None and len(socks) == 1:
            raise ListenError(f"relay.listen: {e} (another agent's relay? choose another port with "
                              f"--relay-listen)") from None
        raise
    agent.start()
    web = agent.web
    log.info("serving", extra={"url": f"{web.scheme}://{agent.config.listen}/metrics",
                               "client_auth": web.tls.settings.client_auth_type if web.tls else None,
                               "read_auth": bool(web.users or web.tokens)})
    app = web.wrap(agent.app(), open_paths=("/healthz", "/readyz", "/"))  # probes carry no credentials
    if relay is not None:
        log.info("relaying", extra={"url": f"{web.scheme}://{relay.config.listen}/api/v1/push",
                                    "upstream": relay.config.upstream, "interval_s": relay.config.interval_s})
        # The ranks' pushes carry push tokens for the rules service, not the web config's read credentials.
        app = by_listener(socks[1], relay.app, app)
    run_until_signalled(app, socks[0], on_stop=agent.stop, limits=ConnectionLimits.of(agent.config.http),
                        stats=agent.http_stats, tls=web.tls, more_sockets=socks[1:])


def _same_port(a: Any, b: Any) -> bool:
    """Whether two listen addresses would take one socket (both sockets bind with SO_REUSEADDR, so the second
    bind succeeds and only the listen() fails, later, with a traceback)."""
    wildcard = ("0.0.0.0", "::", "")
    return a.port == b.port and (a.host == b.host or a.host in wildcard or b.host in wildcard)


def by_listener(relay_sock: Any, relay_app: Any, other: Any) -> Any:
    """One ASGI app for both listeners: a connection to the relay's socket reaches the relay, any other `other`."""
    host, port = relay_sock.getsockname()[:2]

    async def app(scope: Any, receive: Any, send: Any) -> None:
        server = scope.get("server")
        if server is not None and server[1] == port and server[0] == host:
            await relay_app(scope, receive, send)
        else:
            await other(scope, receive, send)

    return app
