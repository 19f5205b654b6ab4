"""The rules service's loop body: pull telemetry, run the detectors on this shard's jobs, keep findings."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TypeVar

from gpumond.config.rules import OnStepsConfig
from gpumond.rules.detectors.config import DetectorConfig
from gpumond.rules.detectors.engine import DetectorState, EvalInputs, FeatureFns, evaluate
from gpumond.rules.detectors.features import RankFeatures
from gpumond.alerts.pipeline import AlertPipeline, log_only
from gpumond.wire.routing import shard_of
from gpumond.rules.cadence import due, rest_after
from gpumond.rules.findings import FINDINGS_PERSISTENCE, conditions_of, findings_of
from gpumond.rules.store import GpuStore, RankStore
from gpumond.alerts.model import Condition
from gpumond.rules.types import Finding, RankWindow, TelemetryBatch, TelemetryNeed, TelemetrySource
from gpumond.types import Series

log = logging.getLogger("gpumond.rules")
_T = TypeVar("_T")

# A failing telemetry source is logged when it starts failing, then at most this often while it still fails
# (with the count of failed fetches in between), and once when it recovers.
TELEMETRY_LOG_EVERY_S = 300.0
# Evaluations failing this long (the service: or three evaluation intervals, if longer) make /healthz answer 503:
# the process is alive but does not do its job, and a restart (which validates every state file again) is the
# remedy a liveness probe applies. Shorter failures are reported on /healthz, /readyz and /metrics without it.
EVALUATION_DEAD_AFTER_S = 60.0


# Shares are absolute, 0–1 of the step. The detectors compare each rank's compute share with its step's
# mean over the ranks; that deviation has its own name, so no reader takes it for a share.
_RANK_SERIES = (("gpumond_job_rank_step_seconds", "step_time_s"),
                ("gpumond_job_rank_data_wait_ratio", "wait_frac"),
                ("gpumond_job_rank_comm_wait_ratio", "comm_frac"),
                ("gpumond_job_rank_compute_ratio", "compute_frac"),
                ("gpumond_job_rank_compute_share_deviation", "share_recent"))


def rank_series(features: Mapping[str, Sequence[RankFeatures]]) -> list[Series]:
    """Per rank, what the detectors judged over the recent window: median step time; median data-wait,
    comm-wait and compute shares of the step (the last two and the deviation only for ranks that push
    comm_wait_s); a value the window cannot give is left out."""
    out = []
    for job, feats in sorted(features.items()):
        for f in feats:
            labels = (("job", job), ("rank", str(f.rank)), ("node", f.node), ("gpu_uuid", f.gpu_uuid))
            out.extend(Series(name, labels, float(v)) for name, attr in _RANK_SERIES
                       if (v := getattr(f, attr)) is not None)
    return out


class Evaluator:
    """Owns the detector state and the findings; every public method is safe to call from any thread."""

    def __init__(self, ranks: RankStore, gpus: GpuStore, source: TelemetrySource | None, *,
                 detectors: DetectorConfig = DetectorConfig(), alerts: AlertPipeline | None = None,
                 shard: tuple[int, int] | None = None, clock: Callable[[], float] = time.time,
                 timer: Callable[[], float] = time.perf_counter,
                 on_batch: Callable[[TelemetryBatch], None] | None = None,
                 extra_conditions: Callable[[], list[Condition]] = list,
                 dead_after_s: float = EVALUATION_DEAD_AFTER_S, cadence: OnStepsConfig = OnStepsConfig(),
                 steered: Callable[[], Collection[str]] = frozenset, running: bool = True) -> None:
        self._ranks = ranks
        self._gpus = gpus
        self._source = source
        self._cfg = detectors
        # Running statistics (each job's per-step peer medians kept between its judgements), or with `running`
        # False the reference path that finds every one afresh: the same findings, for benchmarks and tests.
        self._fns = FeatureFns(running=running)
        # Findings are alerts: one lifecycle decides pending / firing / resolved, and the same pipeline
        # delivers them (log always; Alertmanager, Slack, PagerDuty as configured).
        self.alerts = alerts if alerts is not None else log_only(persistence=FINDINGS_PERSISTENCE)
        self._shard = shard
        self._clock = clock
        self._timer = timer
        # Other consumers of what telemetry and the lifecycle carry (fleet remediation): fed, never consulted.
        self._on_batch = on_batch
        self._extra_conditions = extra_conditions
        # GPUs whose limit is steered on their measurements (power-slack offers): read every fetch, as suspects are.
        self._steered = steered
        self._lock = threading.Lock()
        # Periodic evaluations and judgements on arrival run on different threads: one at a time, with the failure
        # bookkeeping around them (re-entrant: _guarded holds it around evaluate and judge_arrivals).
        self._serial = threading.RLock()
        self._cadence = cadence
        self._waiting: dict[str, float] = {}  # jobs with steps not yet judged → when the first of them landed
        self._judged_at: dict[str, float] = {}  # held jobs → when last judged
        self.judgements_on_steps = 0
        self._state = DetectorState()
        self._findings: tuple[Finding, ...] = ()
        # What the next fetch is for: the GPUs of this replica's jobs and those in a finding (None until the first
        # evaluation: everything). The source may ask less of the database for it (telemetry/promql_need).
        self._need: TelemetryNeed | None = None
        self.evaluations = 0
        self.last_duration_s = 0.0
        self.telemetry_ok: bool | None = None
        self.telemetry_error: str | None = None
        self.telemetry_errors_total = 0  # fetches that failed, or reported failed targets / queries
        self.telemetry_last_success: float | None = None
        self._failing_since: float | None = None
        self._failures_unlogged = 0
        self._logged_at = 0.0
        self.resolved_total = 0
        self.jobs_ended_total = 0
        self.evaluation_failures_total = 0
        self._dead_after_s = dead_after_s  # the service: max(60 s, three evaluation intervals)
        self.evaluation_error: str | None = None
        self._evaluation_failing_since: float | None = None
        self._evaluation_logged_at = 0.0

    def owns(self, job: str) -> bool:
        """Whether this replica evaluates `job` (always, without sharding)."""
        return self._shard is None or shard_of(job, self._shard[1]) == self._shard[0]

    def poll_telemetry(self) -> None:
        """Fetch one telemetry batch into the GPU store; a failing source is reported, never raised."""
        if self._source is None:
            return
        try:
            batch = self._source.fetch(self._need)
        except Exception as e:  # a source bug must not stop evaluation on push data
            self.telemetry_ok, self.telemetry_error = False, repr(e)
            self._telemetry_outcome()
            return
        self._gpus.add(batch)
        if self._on_batch is not None:
            self._on_batch(batch)
        self.telemetry_ok = bool(batch.gpus) or not batch.errors
        self.telemetry_error = "; ".join(batch.errors[:3]) if batch.errors else None
        self._telemetry_outcome()

    def _telemetry_outcome(self) -> None:
        """Count and log (rate-limited) how the last fetch went; pushes and evaluation carry on either way."""
        assert self._source is not None
        now = self._clock()
        name = self._source.name
        if self.telemetry_ok:
            self.telemetry_last_success = now
        if self.telemetry_error is None:
            if self._failing_since is not None:
                log.info("telemetry source recovered", extra={"source": name,
                                                              "failed_for_s": round(now - self._failing_since, 1)})
            self._failing_since, self._failures_unlogged = None, 0
            return
        self.telemetry_errors_total += 1
        self._failures_unlogged += 1
        first = self._failing_since is None
        if first:
            self._failing_since = now
        if first or now - self._logged_at >= TELEMETRY_LOG_EVERY_S:
            log.warning("telemetry source failing" if first else "telemetry source still failing",
                        extra={"source": name, "error": self.telemetry_error, "fetches_failed": self._failures_unlogged,
                               "some_data": bool(self.telemetry_ok),
                               "note": "pushes are still accepted; detectors run on push data alone"})
            self._logged_at, self._failures_unlogged = now, 0

    def telemetry_status(self) -> str:
        """One line on the telemetry source for /healthz and /readyz."""
        if self._source is None:
            return "telemetry: none configured (detectors run on pushes alone)"
        name = self._source.name
        if self.telemetry_ok is None:
            return f"telemetry {name}: no fetch yet"
        if self.telemetry_error is None:
            return f"telemetry {name}: ok"
        since = f" since {self._failing_since:.0f}" if self._failing_since is not None else ""
        state = "partly failing" if self.telemetry_ok else "failing"
        return f"telemetry {name}: {state}{since} ({self.telemetry_errors_total} failed fetches): {self.telemetry_error}"

    def evaluate(self) -> tuple[Finding, ...]:
        """One evaluation over every job this replica owns; returns the current findings."""
        with self._serial:
            start = self._timer()
            now = self._clock()
            # Before the snapshot: a job released after it is reported by the next evaluation.
            ended = self._ranks.take_ended()
            self._ranks.take_fresh()  # every job is judged now: what landed so far waits for nothing more
            self._waiting = {}
            self._ranks.expire(now)
            self._gpus.expire(now)
            jobs = {j: r for j, r in self._ranks.jobs(now).items() if self.owns(j)}
            self._judge(now, jobs, (), ended)
            self.evaluations += 1
            self.jobs_ended_total += len(ended)
            self.last_duration_s = self._timer() - start
        return self._findings

    def judge_arrivals(self) -> tuple[float, float | None]:
        """Judge the jobs whose steps landed since they were last judged, each at most every
        `cadence.min_interval_s`; the others held as they are. Returns how long to rest before the next pass (so
        that these passes take at most `cadence.max_busy` of a core) and how long until a job that waits now may
        be judged (None: none waits)."""
        with self._serial:
            now = self._clock()
            for job, landed in self._ranks.take_fresh().items():
                if self.owns(job):
                    self._waiting.setdefault(job, landed)
            chosen = due(self._waiting, self._judged_at, now, self._cadence.min_interval_s)
            self._waiting = dict(chosen.waiting)
            next_in = None if chosen.next_at is None else chosen.next_at - now
            if not chosen.now:
                return 0.0, next_in
            start = self._timer()
            jobs = self._ranks.jobs(now, chosen.now)
            held = [j for j in self._ranks.job_names() if j not in jobs and self.owns(j)]
            self._judge(now, jobs, held, frozenset(), arrivals=True)
            self.judgements_on_steps += len(jobs)
            took = self._timer() - start
        return rest_after(took, self._cadence.max_busy), next_in

    def _judge(self, now: float, jobs: Mapping[str, Mapping[int, RankWindow]], held: Collection[str],
               ended: frozenset[str], arrivals: bool = False) -> None:
        """Judge `jobs` (with `held` kept as last judged: any other job is forgotten) and update the alerts."""
        since = now - self._cfg.recent_s
        uuids = {w.info.gpu_uuid for ranks in jobs.values() for w in ranks.values()}
        nodes = {w.info.node for ranks in jobs.values() for w in ranks.values()}
        # A judgement on arrival reads its jobs' steps against their last periodic picture (engine.Windowed): of the
        # GPUs' windows it needs only its candidates', and a job judged whole for the first time reads its own.
        # The count before the windows: a fetch landing in between is then measured again by the next judgement.
        fetches = self._gpus.fetches
        windows = self._gpus.windows_on_demand(uuids, since) if arrivals else self._gpus.windows(uuids, since)
        inputs = EvalInputs(now=now, jobs=jobs,
                            gpu_windows=windows,
                            host_windows={n: self._gpus.hosts(n, since) for n in nodes},
                            absent_nodes=self._gpus.absent_nodes(), telemetry_seq=fetches)
        steered = frozenset(self._steered()) if not arrivals else frozenset()  # before our lock: it takes its own
        with self._lock:
            self._state, candidates = evaluate(inputs, self._state, self._cfg, self._fns, held=held,
                                               arrivals=arrivals)
            # A job whose ranks all said they ended has no findings left: they resolve now, not resolve_after_s later.
            transitions = self.alerts.update(conditions_of(candidates, self._gpu_index) + self._extra_conditions(),
                                             now, ended=lambda labels: bool(ended) and dict(labels).get("job") in ended)
            self._findings = tuple(findings_of(self.alerts.entries()))
            if not arrivals:  # every owned job was judged: what the next fetch needs (rules/telemetry/promql_need)
                self._need = TelemetryNeed(gpus=frozenset(uuids),
                                           suspects=frozenset(f.gpu_uuid for f in self._findings if f.gpu_uuid)
                                           | steered)
            self.resolved_total += sum(1 for t in transitions if t.new == "resolved" and t.alert.alertname != "Watchdog")
        self._judged_at = {j: self._judged_at[j] for j in held if j in self._judged_at} | dict.fromkeys(jobs, now)

    def run(self) -> None:
        """One scheduled evaluation. A failure is counted, said on /healthz, /readyz and /metrics
        (gpumond_rules_evaluation_failing) and logged (the first, then every TELEMETRY_LOG_EVERY_S), never
        raised: the schedule goes on, and the next evaluation may succeed."""
        self._guarded(self.evaluate, None)

    def run_on_steps(self) -> tuple[float, float | None]:
        """judge_arrivals, a failure counted and reported as run()'s are; after one, rest a second."""
        return self._guarded(self.judge_arrivals, (1.0, None))

    def _guarded(self, judge: Callable[[], _T], failed: _T) -> _T:
        """judge(), or `failed` when it raised: counted, reported and logged (rate-limited), never raised."""
        with self._serial:
            return self._counted(judge, failed)

    def _counted(self, judge: Callable[[], _T], failed: _T) -> _T:
        try:
            out = judge()
        except Exception as e:  # an evaluation bug must not kill the schedule
            now = self._clock()
            self.evaluation_failures_total += 1
            self.evaluation_error = f"{type(e).__name__}: {e}"[:300]
            first = self._evaluation_failing_since is None
            if first:
                self._evaluation_failing_since = now
            if first or now - self._evaluation_logged_at >= TELEMETRY_LOG_EVERY_S:
                self._evaluation_logged_at = now
                log.exception("evaluation failed: no finding or alert is updated until it succeeds"
                              if first else "evaluation still failing", extra={
                                  "failures": self.evaluation_failures_total})
            return failed
        if self._evaluation_failing_since is not None:
            log.warning("evaluation recovered", extra={
                "failed_for_s": round(self._clock() - self._evaluation_failing_since, 1),
                "failures": self.evaluation_failures_total})
        self._evaluation_failing_since, self.evaluation_error = None, None
        return out

    def evaluation_status(self) -> tuple[bool, str]:
        """Whether evaluation works (False once it has failed for `dead_after_s`), and a line on it."""
        since = self._evaluation_failing_since
        if since is None:
            return True, f"evaluations: {self.evaluations}"
        failing_for = self._clock() - since
        return (failing_for < self._dead_after_s,
                f"evaluation FAILING for {failing_for:.0f} s ({self.evaluation_failures_total} failures, "
                f"{self.evaluations} evaluations done): {self.evaluation_error}; no finding or alert is updated "
                f"(see the service's log)")

    def _gpu_index(self, uuid: str) -> str | None:
        """The GPU's index on its node, from the newest telemetry sample (None when no agent reported it)."""
        window = self._gpus.window(uuid, 0.0)
        return window[-1].gpu if window else None

    def rank_features(self) -> Mapping[str, Sequence[RankFeatures]]:
        """What the last evaluation measured per rank of each job it owns (step time, compute share, …)."""
        return self._state.rank_features

    def findings(self) -> tuple[Finding, ...]:
        """Current findings (pending and firing), highest score first."""
        return self._findings

    def ready(self) -> tuple[bool, str]:
        """Readiness means "can accept pushes": the push path needs only this process and its stores, so it is
        ready while it serves. A telemetry outage is reported (here, /healthz, /metrics, the log) but must not
        take the push API out of a Kubernetes Service: jobs would lose their steps for the whole outage."""
        return True, f"ready: accepting pushes\n{self.evaluation_status()[1]}\n{self.telemetry_status()}"

    def health(self) -> tuple[bool, str]:
        """/healthz: unhealthy once evaluation has failed for `dead_after_s`; evaluation and
        telemetry, one line each."""
        ok, evaluation = self.evaluation_status()
        return ok, f"{'ok' if ok else 'unhealthy'}\n{evaluation}\n{self.telemetry_status()}"

    def series(self) -> Sequence[Series]:
        """gpumond_finding{…} for firing findings, and the evaluator's own health."""
        out = []
        for f in self._findings:
            if f.state != "firing":
                continue
            labels = (("kind", f.kind), ("job", f.job), ("node", f.node or ""),
                      ("rank", "" if f.rank is None else str(f.rank)), ("gpu_uuid", f.gpu_uuid or ""))
            out.append(Series("gpumond_finding", labels, 1.0))
        counts: dict[tuple[str, str], int] = {}
        for f in self._findings:
            counts[(f.kind, f.state)] = counts.get((f.kind, f.state), 0) + 1
        out += [Series("gpumond_findings", (("kind", k), ("state", s)), float(n)) for (k, s), n in sorted(counts.items())]
        out += rank_series(self._state.rank_features)
        out.append(Series("gpumond_rules_evaluations_total", (), float(self.evaluations)))
        out.append(Series("gpumond_rules_judgements_on_steps_total", (), float(self.judgements_on_steps)))
        out.append(Series("gpumond_rules_evaluation_failures_total", (), float(self.evaluation_failures_total)))
        out.append(Series("gpumond_rules_evaluation_failing", (),
                          0.0 if self._evaluation_failing_since is None else 1.0))
        out.append(Series("gpumond_rules_evaluation_duration_seconds", (), self.last_duration_s))
        out.append(Series("gpumond_rules_findings_resolved_total", (), float(self.resolved_total)))
        out.append(Series("gpumond_rules_jobs_ended_total", (), float(self.jobs_ended_total)))
        if self._source is not None and self.telemetry_ok is not None:
            source = (("source", self._source.name),)
            out.append(Series("gpumond_rules_telemetry_up", source, 1.0 if self.telemetry_ok else 0.0))
            out.append(Series("gpumond_rules_telemetry_errors_total", source, float(self.telemetry_errors_total)))
            if self.telemetry_last_success is not None:
                out.append(Series("gpumond_rules_telemetry_last_success_timestamp_seconds", source,
                                  self.telemetry_last_success))
        return out
