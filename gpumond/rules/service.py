"""Assembles the rules service: stores, telemetry source, evaluator, schedule, HTTP app."""

from __future__ import annotations

import gc
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import urlencode

from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.interval import IntervalTrigger

from gpumond import __version__
from gpumond.alerts.model import Alert
from gpumond.alerts.pipeline import ALERT_METRICS, AlertPipeline
from gpumond.alerts.sinks import SINK_METRICS, build_sinks
from gpumond.alerts.state import FILE_NAME as ALERT_STATE_FILE
from gpumond.alerts.state import AlertStateFile
from gpumond.config.rules import RulesConfig
from gpumond.rules.detectors.config import DetectorConfig
from gpumond.rules.energy.planner import SLACK_METRICS, SlackPlanner
from gpumond.rules.energy.tracker import ENERGY_METRICS, EnergyTracker
from gpumond.rules.evaluator import EVALUATION_DEAD_AFTER_S, Evaluator
from gpumond.rules.findings import findings_persistence
from gpumond.rules.http import build_app
from gpumond.rules.ingest.stats import INGEST_METRICS, IngestStats
from gpumond.rules.remediation.backends import Backend, build_backend
from gpumond.rules.remediation.remediator import REMEDIATION_METRICS, Remediator
from gpumond.rules.store import GpuStore, RankStore
from gpumond.rules.telemetry import build_source
from gpumond.web.client import AccessError
from gpumond.rules.types import TelemetryBatch, TelemetrySource
from gpumond.web.connections import CONNECTION_METRICS, ConnectionLimits, ConnectionStats, connection_cap
from gpumond.web.serving import bind, default_external_url, run_until_signalled
from gpumond.state.dirlock import StateDirBusy, StateDirLock
from gpumond.web import TLS_METRICS, Web
from gpumond.textformat import Encoder
from gpumond.types import Series

log = logging.getLogger("gpumond.rules")
EXAMPLE_TOKEN = "insecure-demo-token-replace-me"  # the token deploy/examples/rules.yaml ships
ON_STEPS_COALESCE_S = 0.05  # judgements on arrival: the shortest pause between two passes (at most 20 a second)

_HELP = {
    "gpumond_finding": ("gauge", "1 for each firing finding (straggler, io_starved_rank, io_starved_job, …)."),
    "gpumond_findings": ("gauge", "Current findings by kind and state (pending or firing)."),
    "gpumond_job_rank_step_seconds": ("gauge", "Median step time of the rank over the detectors' recent window."),
    "gpumond_job_rank_data_wait_ratio": ("gauge", "Median share of the rank's step spent waiting on its data loader, "
                                                  "0 to 1."),
    "gpumond_job_rank_comm_wait_ratio": ("gauge", "Median share of the rank's step spent waiting for its peers in "
                                                  "collectives, 0 to 1 (ranks that push comm_wait_s)."),
    "gpumond_job_rank_compute_ratio": ("gauge", "Median share of the rank's step not waiting on data or peers, 0 to 1 "
                                                "(ranks that push comm_wait_s)."),
    "gpumond_job_rank_compute_share_deviation": ("gauge", "Median of the rank's compute share minus its step's mean "
                                                          "over the job's ranks (-1 to 1; positive: computes longer "
                                                          "than its peers, as a straggler does)."),
    "gpumond_rules_evaluations_total": ("counter", "Detector evaluations run."),
    "gpumond_rules_judgements_on_steps_total": ("counter", "Jobs judged because their steps landed, between the "
                                                           "periodic evaluations (judge_on_steps)."),
    "gpumond_rules_evaluation_duration_seconds": ("gauge", "Duration of the last evaluation."),
    "gpumond_rules_evaluation_failures_total": ("counter", "Evaluations that raised an error (logged; the next one "
                                                           "runs on schedule)."),
    "gpumond_rules_evaluation_failing": ("gauge", "1 while the last evaluation failed: no finding or alert is "
                                                  "updated (GpumondRulesEvaluationFailing)."),
    "gpumond_rules_findings_resolved_total": ("counter", "Findings that fired and then resolved."),
    "gpumond_rules_jobs_ended_total": ("counter", "Jobs released because every rank sent its final push "
                                                  "(the job SDK's end of job)."),
    "gpumond_rules_telemetry_up": ("gauge", "1 when the last telemetry fetch succeeded."),
    "gpumond_rules_telemetry_errors_total": ("counter", "Telemetry fetches that failed or reported failed targets "
                                                        "or queries."),
    "gpumond_rules_telemetry_last_success_timestamp_seconds": ("gauge", "Unix time of the last telemetry fetch "
                                                                        "that returned data."),
    "gpumond_build_info": ("gauge", "Build of the running service; always 1."),
    **INGEST_METRICS,
    **CONNECTION_METRICS,
    **TLS_METRICS,
    **ALERT_METRICS,
    **SINK_METRICS,
    **REMEDIATION_METRICS,
    **ENERGY_METRICS,
    **SLACK_METRICS,
}


# The identity of a finding's alert (gpumond/rules/findings.py), for gpumond_alert_active as the agent has it.
RULES_ALERT_LABELS = ("alertname", "severity", "job", "node", "rank", "uuid")

_ENCODER = Encoder(_HELP)


def render(series: Iterable[Series]) -> bytes:
    """Prometheus text for the given series (the service's /metrics is small; rendered per scrape)."""
    return _ENCODER.encode(series)


class RulesService:
    """The rules service; `start()` schedules telemetry and evaluation, `stop()` ends them."""

    def __init__(self, config: RulesConfig, *, source: TelemetrySource | None = None,
                 detectors: DetectorConfig = DetectorConfig(), clock: Callable[[], float] = time.time,
                 alerts: AlertPipeline | None = None, remediation_backend: Backend | None = None,
                 web: Web | None = None) -> None:
        self.config = config
        self.web = web if web is not None else Web()
        self.ranks = RankStore.from_config(config)
        self.gpus = GpuStore.from_config(config)
        try:
            self.source = source if source is not None else build_source(config.telemetry)
        except AccessError as e:
            raise RulesStartError(str(e)) from None
        shard = (config.shard.index, config.shard.count) if config.shard is not None else None
        self._clock = clock
        self._lock: StateDirLock | None = None
        state: Path | None = None
        if alerts is None:
            state, self._lock = _state_path(config)
            try:
                alerts = _alert_pipeline(config, state, self.web.scheme)
            except AccessError as e:
                if self._lock is not None:
                    self._lock.release()
                raise RulesStartError(str(e)) from None
        self.alerts = alerts
        self.remediator = Remediator.build(
            config.remediation, _remediation_dir(config, state),
            remediation_backend if remediation_backend is not None else build_backend(config.remediation), clock,
            telemetry_interval_s=_telemetry_interval(config) if self.source is not None else None)
        # Energy per job: each batch's energy counters credited to the jobs this replica owns.
        self.energy = EnergyTracker(self.ranks.jobs, owns=lambda job: self.evaluator.owns(job))
        self.evaluator = Evaluator(self.ranks, self.gpus, self.source, detectors=detectors, alerts=self.alerts,
                                   shard=shard, clock=clock, on_batch=self._observe,
                                   extra_conditions=self.remediator.conditions,
                                   dead_after_s=max(EVALUATION_DEAD_AFTER_S, 3 * config.evaluation_interval_s),
                                   cadence=config.judge_on_steps, steered=lambda: self.slack.steered())
        self.slack = SlackPlanner(config.power_slack, self.evaluator.rank_features, self.gpus.window, clock,
                                  detectors.recent_s)
        self.stats = IngestStats(self.ranks, self.gpus)
        self.http_stats = ConnectionStats(cap=connection_cap(ConnectionLimits.of(config.http)))  # filled by serve()
        self.app = build_app(config=config, rank_store=self.ranks, findings=self.evaluator.findings,
                             metrics=self.metrics, ready=self.evaluator.ready, clock=clock, stats=self.stats,
                             alerts=self.alerts.api_json, health=self.evaluator.health,
                             jobs=lambda: json.dumps(self.energy.view()).encode(),
                             power_offers=lambda node: json.dumps({"offers": self.slack.offers(node)}).encode())
        self._scheduler = BackgroundScheduler(timezone=timezone.utc)
        self._stopping = threading.Event()
        self._on_steps: threading.Thread | None = None

    def metrics(self) -> bytes:
        """The service's /metrics: findings, evaluation health, ingest counters."""
        series = list(self.evaluator.series())
        series += self.stats.series()
        series += self.http_stats.series()
        series += self.web.series()
        series += self.alerts.series()
        series += self.alerts.active_series(RULES_ALERT_LABELS)
        series += self.remediator.series()
        series += self.energy.series()
        series += self.slack.series()
        series.append(Series("gpumond_build_info", (("version", __version__),), 1.0))
        return render(series)

    def start(self) -> None:
        """Fetch telemetry and evaluate once, then on their intervals."""
        self.alerts.start(self._clock())
        now = datetime.now(timezone.utc)
        if self.source is not None:
            interval = _telemetry_interval(self.config)
            self._scheduler.add_job(self.evaluator.poll_telemetry, IntervalTrigger(seconds=interval),
                                    id="telemetry", max_instances=1, coalesce=True, next_run_time=now)
        self._scheduler.add_job(self.evaluator.run, IntervalTrigger(seconds=self.config.evaluation_interval_s),
                                id="evaluate", max_instances=1, coalesce=True, next_run_time=now)
        if self.config.power_slack.enabled:
            self._scheduler.add_job(self._plan_slack, IntervalTrigger(seconds=self.config.evaluation_interval_s),
                                    id="power_slack", max_instances=1, coalesce=True)
        # Sharded replicas all see every agent: only the first acts, so a node is never drained twice.
        if self.config.remediation.mode != "off" and (self.config.shard is None or self.config.shard.index == 0):
            self._scheduler.add_job(self._remediate, IntervalTrigger(seconds=self.config.remediation.interval_s),
                                    id="remediate", max_instances=1, coalesce=True)
        self._scheduler.start()
        if self.config.judge_on_steps.enabled:
            self._on_steps = threading.Thread(target=self._judge_on_steps, name="judge-on-steps", daemon=True)
            self._on_steps.start()
        log.info("rules service started", extra={
            "telemetry": self.source.name if self.source else None,
            "evaluation_interval_s": self.config.evaluation_interval_s,
            "shard": str(self.config.shard) if self.config.shard else None})
        if EXAMPLE_TOKEN in self.config.tokens:  # published in the repository: anyone can push with it
            log.warning("the example's demo push token is accepted: anyone who read deploy/examples/rules.yaml can "
                        "push; replace it (tokens_file or GPUMOND_RULES_TOKENS)", extra={"listen": str(self.config.listen)})


    def _observe(self, batch: TelemetryBatch) -> None:
        """What else each telemetry batch feeds: remediation, and energy per job (whose failure is logged and
        loses nothing else: the next batch credits the energy since the last good one)."""
        self.remediator.observe(batch)
        try:
            self.energy.observe(batch)
        except Exception:
            log.exception("energy accounting failed for this telemetry batch")

    def _plan_slack(self) -> None:
        try:
            self.slack.plan()
        except Exception:  # a planning bug must not kill the schedule; the planner withdrew every offer, leases end
            log.exception("power-slack planning failed")

    def _judge_on_steps(self) -> None:
        """Judge jobs as their steps land (woken by the store), within the cadence's bounds, until stopped. A
        failure is counted and reported as the periodic evaluation's are, and the loop goes on."""
        next_in: float | None = None
        while not self._stopping.is_set():
            # Woken by a push with new steps, or when a job that waits on its minimum interval may be judged;
            # at least every second, to see the stop.
            self.ranks.wait_fresh(min(1.0, next_in) if next_in is not None else 1.0)
            rest, next_in = self.evaluator.run_on_steps()
            # At least a moment between passes: a big job's pushes land every few milliseconds, and waking for
            # each (to find its job within its minimum interval) would cost more than it saves.
            if self._stopping.wait(max(rest, ON_STEPS_COALESCE_S)):
                return

    def _remediate(self) -> None:
        try:
            self.remediator.step(self.evaluator.findings())
        except Exception:  # a remediation bug must not kill the schedule; logged, state on disk, retried
            log.exception("remediation step failed")

    def stop(self) -> None:
        """Stop the schedule, the alert sinks and the telemetry source."""
        self._stopping.set()
        if self._on_steps is not None:
            self._on_steps.join()
        if self._scheduler.running:
            self._scheduler.shutdown(wait=True)
        self.remediator.close()
        self.alerts.stop()
        if self.source is not None:
            self.source.close()
        if self._lock is not None:
            self._lock.release()
        log.info("rules service stopped")


def _alert_pipeline(config: RulesConfig, state_path: Path | None, scheme: str = "http") -> AlertPipeline:
    """The service's alerts: sinks from `alerting:`, state in `state_path`, links to the finding in the API."""
    a = config.alerting
    base = a.external_url or default_external_url(config.listen, socket.gethostname(), scheme)
    state = AlertStateFile(state_path)
    sinks = build_sinks(a, state, evaluation_interval_s=config.evaluation_interval_s)

    def generator_url(alert: Alert) -> str | None:
        query = {k: v for k, v in (("job", alert.label("job")),) if v}
        return f"{base}/api/v1/findings" + (f"?{urlencode(query)}" if query else "")

    persistence = findings_persistence(config.findings.min_duration_s, config.findings.resolve_after_s)
    return AlertPipeline(a, sinks=sinks, state=state, persistence=persistence, generator_url=generator_url)


def _state_path(config: RulesConfig) -> tuple[Path | None, StateDirLock | None]:
    """Where alert state lives, locked for this service; the default directory unwritable (a dev run as a user)
    keeps it in memory (nothing shared, nothing to lock). RulesStartError when another live service holds it."""
    path = config.state_dir / ALERT_STATE_FILE
    try:
        config.state_dir.mkdir(parents=True, exist_ok=True)
        if os.access(config.state_dir, os.W_OK):
            return path, StateDirLock.acquire(config.state_dir, "rules")
    except StateDirBusy as e:
        raise RulesStartError(str(e)) from None
    except OSError:
        pass
    if "state_dir" in config.model_fields_set:
        raise RulesStartError(f"state_dir {config.state_dir}: not writable (set state_dir to a writable directory, "
                              f"or run under systemd's StateDirectory=)")
    log.warning("state_dir is not writable: alert state is kept in memory, so a restart may notify again "
                "(set state_dir or --state-dir)", extra={"state_dir": str(config.state_dir)})
    return None, None


def _remediation_dir(config: RulesConfig, alert_state: Path | None) -> Path | None:
    """Remediation keeps its state and operator requests next to the alert state (in the locked state_dir);
    with an injected alert pipeline, in state_dir only when the caller set it (else in memory)."""
    if alert_state is not None:
        return alert_state.parent
    if "state_dir" in config.model_fields_set:
        config.state_dir.mkdir(parents=True, exist_ok=True)
        return config.state_dir
    return None


class RulesStartError(RuntimeError):
    """The service cannot start as configured; one line naming what and where."""


def _telemetry_interval(config: RulesConfig) -> float:
    t = config.telemetry
    if t.prometheus is not None:
        return t.prometheus.interval_s
    return t.scrape.interval_s


# A JSON push makes a GC-tracked object per step while it is parsed (held steps are columns, untracked), and a
# telemetry fetch a dict per series; default thresholds ran full collections often (p99 push latency 525 ms → 57 ms
# at 32,768 ranks when raised). Public so that benchmarks run the daemon's setting.
GC_THRESHOLDS = (100_000, 50, 1000)


def serve(service: RulesService) -> None:
    """Run the service until SIGTERM/SIGINT; exit cleanly."""
    gc.set_threshold(*GC_THRESHOLDS)
    sock = bind(service.config.listen.host, service.config.listen.port)
    service.start()
    web = service.web
    log.info("serving", extra={"url": f"{web.scheme}://{service.config.listen}/api/v1/findings",
                               "client_auth": web.tls.settings.client_auth_type if web.tls else None,
                               "read_auth": bool(web.users or web.tokens)})
    # Probes carry no credentials; the push API has its own bearer tokens.
    app = web.wrap(service.app, open_paths=("/healthz", "/readyz", "/api/v1/push"))
    run_until_signalled(app, sock, on_stop=service.stop, limits=ConnectionLimits.of(service.config.http),
                        stats=service.http_stats, tls=web.tls)
