"""Run the service's own detectors over a scenario and score what fired against the planted truth.

Matching rules (docs/detection-benchmark.md explains why):
- A finding counts once it is `firing` (after the default k-of-n persistence); one firing episode per entity
  from when it starts firing until it resolves. An episode matches a fault when it starts firing inside
  [onset, end + GRACE_S] (the detectors look at 60 s medians, so they lag the truth).
- straggler on the slow GPU's rank: TP. straggler on a GPU of a slow node: neither TP nor FP.
- straggler_node on the slow node: TP.
- io_starved_rank on a starved rank (or on a rank of a starved node): TP.
- io_starved_job on a job with the whole-job I/O fault: TP; beside a starved outlier in a mildly starved job:
  neutral (the rank is the truth; whether the rest still wait enough for a job finding is physics, not a fault).
- hung_rank on the hung rank: TP; a hung_rank without a rank in the hung job: detected, not localised.
- job_slowdown in a job with a fault that slows it: a symptom, reported apart; without any fault: FP.
- anything else firing: FP.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

from gpumond.rules.detectors.config import DetectorConfig
from gpumond.config.rules import RulesConfig
from gpumond.rules.detectors.engine import DetectorState, evaluate, steps_key
from gpumond.rules.findings import FINDINGS_PERSISTENCE, Persistence, advance

from benchmarks.detection.faults import Fault
from benchmarks.detection.scenarios import T0, Scenario

GRACE_S = 120.0
# The service's default: jobs judged as their steps land, at most this often each (None when it is off).
_ON_STEPS = RulesConfig.model_fields["judge_on_steps"].default
ON_STEPS_S: float | None = _ON_STEPS.min_interval_s if _ON_STEPS.enabled else None
KIND_CLASS = {"straggler": "straggler", "straggler_node": "straggler_node", "io_starved_rank": "starved_rank",
              "io_starved_job": "starved_job", "hung_rank": "hung"}
CLASSES = ("starved_rank", "straggler", "starved_job", "straggler_node", "hung")


@dataclass(slots=True)
class Episode:
    """One entity firing from `fired` until `ended` (None: still firing when the run stopped)."""

    kind: str
    job: str
    node: str | None
    rank: int | None
    gpu_uuid: str | None
    fired: float
    since: float
    ended: float | None = None
    label: str = ""  # tp | fp | neutral | unlocalised | symptom
    fault: int | None = None  # index into the truths it matched
    evidence: dict = field(default_factory=dict)


@dataclass(slots=True)
class Truth:
    """One entity that should be reported: a planted fault, or one rank of a starved node."""

    fault: Fault
    cls: str
    rank: int | None
    node: str | None
    detected: bool = False
    latency_s: float | None = None
    unlocalised: bool = False  # hung job reported without its rank
    predicted: str = "none"  # confusion-matrix column
    job_finding: bool = False  # an io_starved_job fired during this fault
    rank_finding: bool = False  # an io_starved_rank fired in this job during this fault
    cause: str | None = None  # the likely_cause the finding gave


@dataclass(slots=True)
class RunResult:
    """A scenario's outcome: its truths, every firing episode, node-hours and evaluation times."""

    scenario: Scenario
    truths: list[Truth]
    episodes: list[Episode]
    node_hours: float
    eval_s: list[float]
    pushes: tuple[int, int] = (0, 0)  # the ranks' requests: (regular, early)


def run(sc: Scenario, cfg: DetectorConfig = DetectorConfig(), persistence: Persistence = FINDINGS_PERSISTENCE,
        evaluate_fn=evaluate, on_steps_s: float | None = ON_STEPS_S, **cluster_kw: object) -> RunResult:  # noqa: ANN001
    """Simulate `sc` with the real detectors and findings lifecycle, as the service runs them: every job every
    `sc.eval_s` (5 s), and between those, with `on_steps_s`, each job whose ranks pushed steps since it was last
    judged, at most every `on_steps_s` (the service's judge_on_steps; None: the periodic evaluation alone)."""
    cluster = sc.build(**cluster_kw)
    state, tracks = DetectorState(), None
    open_: dict[tuple, Episode] = {}
    episodes: list[Episode] = []
    times: list[float] = []
    t = T0 + sc.eval_s - sc.eval_phase
    tick, end = t, T0 + sc.duration_s
    keys: dict[str, tuple[float, ...]] = {}  # each job's steps when it was last judged
    while t <= end:
        cluster.advance_to(t)
        inputs = cluster.inputs(t)
        periodic = t >= tick - 1e-9
        fresh = set(inputs.jobs) if periodic else \
            {j for j, ranks in inputs.jobs.items() if steps_key(ranks) != keys.get(j)}
        if fresh or periodic:
            keys.update((j, steps_key(inputs.jobs[j])) for j in fresh)
            t1 = time.perf_counter()
            if periodic:
                state, cands = evaluate_fn(inputs, state, cfg)
            else:
                state, cands = evaluate_fn(replace(inputs, jobs={j: inputs.jobs[j] for j in fresh}), state, cfg,
                                           held=set(inputs.jobs) - fresh, arrivals=True)
            tracks, findings, _ = advance(tracks, cands, t, persistence)
            times.append(time.perf_counter() - t1)
        if periodic:
            tick += sc.eval_s
        nxt = tick if on_steps_s is None else min(tick, t + on_steps_s)
        if not (fresh or periodic):
            t = nxt
            continue
        firing = {(f.kind, f.job, f.node, f.rank, f.gpu_uuid): f for f in findings if f.state == "firing"}
        for key, f in firing.items():
            if key not in open_:
                ep = Episode(f.kind, f.job, f.node, f.rank, f.gpu_uuid, t, f.since, evidence=dict(f.evidence))
                open_[key] = ep
                episodes.append(ep)
        for key in [k for k in open_ if k not in firing]:
            open_.pop(key).ended = t
        t = nxt
    truths = expand(sc)
    label(sc, truths, episodes)
    pushes = (sum(j.regular_pushes for j in cluster.jobs), sum(j.early_pushes for j in cluster.jobs))
    return RunResult(sc, truths, episodes, sc.nodes * sc.duration_s / 3600.0, times, pushes)


def expand(sc: Scenario) -> list[Truth]:
    """Truths of a scenario: one per fault, a starved node as one starved rank per GPU of the node."""
    out = []
    first = {j.name: j.first_node for j in sc.jobs}
    for f in sc.faults:
        if f.kind == "starved_node":
            base = (int(f.node[5:]) - first[f.job]) * 8  # type: ignore[index]
            out += [Truth(f, "starved_rank", base + i, f.node) for i in range(8)]
        else:
            out.append(Truth(f, f.truth, f.rank, f.node))
    return out


def _in_window(f: Fault, t: float) -> bool:
    return f.onset <= t <= f.end + GRACE_S


def _touches(tr: Truth, ep: Episode) -> bool:
    """Whether an episode is about this truth's entity (any class), for the confusion matrix."""
    f = tr.fault
    if ep.job != f.job or not _in_window(f, ep.fired):
        return False
    if ep.kind in ("io_starved_job",) or (ep.kind == "hung_rank" and ep.rank is None):
        return True
    if f.kind == "starved_job":
        return ep.kind in KIND_CLASS
    if f.kind in ("slow_node",):
        return ep.node == f.node
    return (ep.rank is not None and ep.rank == tr.rank) or (ep.kind == "straggler_node" and ep.node == tr.node)


def label(sc: Scenario, truths: list[Truth], episodes: list[Episode]) -> None:
    """Label every episode (tp / fp / neutral / unlocalised / symptom) and fill each truth's outcome."""
    for ep in episodes:
        ep.label = "fp"
        for i, tr in enumerate(truths):
            f = tr.fault
            if f.job != ep.job or not _in_window(f, ep.fired):
                continue
            hit = None
            if ep.kind == "straggler":
                if f.kind == "slow_gpu" and ep.rank == f.rank:
                    hit = "tp"
                elif f.kind == "slow_node" and ep.node == f.node:
                    hit = "neutral"
            elif ep.kind == "straggler_node":
                hit = "tp" if f.kind == "slow_node" and ep.node == f.node else None
            elif ep.kind == "io_starved_rank":
                hit = "tp" if tr.cls == "starved_rank" and ep.rank == tr.rank else None
            elif ep.kind == "io_starved_job":
                hit = "tp" if f.kind == "starved_job" else ("neutral" if f.kind == "starved_outlier" else None)
            elif ep.kind == "hung_rank" and f.kind == "hung_rank":
                hit = "tp" if ep.rank == f.rank else ("unlocalised" if ep.rank is None else None)
            elif ep.kind == "job_slowdown" and f.kind != "starved_sub":
                hit = "symptom"
            if hit is None:
                continue
            if hit == "tp" or ep.label == "fp":
                ep.label, ep.fault = hit, i
            if hit == "tp":
                break
    for i, tr in enumerate(truths):
        f = tr.fault
        mine = sorted((ep for ep in episodes if ep.fault == i and ep.label == "tp"), key=lambda e: e.fired)
        if mine:
            tr.detected, tr.latency_s, tr.predicted = True, mine[0].fired - f.onset, tr.cls
            cause = mine[0].evidence.get("likely_cause")
            tr.cause = str(cause).split(" ")[0] if cause else None
        tr.unlocalised = any(ep.fault == i and ep.label == "unlocalised" for ep in episodes)
        if not mine:
            touching = sorted((ep for ep in episodes if ep.kind in KIND_CLASS and _touches(tr, ep)),
                              key=lambda e: e.fired)
            if touching:
                tr.predicted = KIND_CLASS[touching[0].kind]
        in_job = [ep for ep in episodes if ep.job == f.job and _in_window(f, ep.fired)]
        tr.job_finding = any(ep.kind == "io_starved_job" for ep in in_job)
        tr.rank_finding = any(ep.kind == "io_starved_rank" for ep in in_job)
