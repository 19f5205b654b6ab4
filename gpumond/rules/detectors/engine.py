"""One evaluation: windows in, candidates out. Pure; the service and the benchmark run this same code.

Incremental: a job whose inputs hold nothing new since it was last judged (no push, heartbeat or step from
any rank, no telemetry sample from any of its GPUs, the same nodes absent) keeps that judgement's candidates
instead of being judged again, up to `rejudge_s` of wall time (stall and liveness rules read the clock)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import chain
from operator import attrgetter

import numpy as np

from gpumond.rules.detectors.activity import with_activity_many
from gpumond.rules.detectors.candidate import Candidate
from gpumond.rules.detectors.compute_share import Shares, job_shares
from gpumond.rules.detectors.config import DetectorConfig
from gpumond.rules.detectors.features import GpuFeatures, HostFeatures, RankFeatures, host_features
from gpumond.rules.detectors.gpu_batch import gpu_features_many
from gpumond.rules.detectors.io_starvation import detect_io_starvation
from gpumond.rules.detectors.job import JobBaseline, due_again, job_slowdown, job_stall
from gpumond.rules.detectors.rank_batch import job_rank_features
from gpumond.rules.detectors.peer_rows import PeerRows, RowMedians
from gpumond.rules.detectors.sequential import StepShares, step_shares
from gpumond.rules.detectors.step_matrix import RecentSteps, read_steps
from gpumond.rules.detectors.sm_activity import node_relative
from gpumond.rules.detectors.straggler import LooksKept, StragglerResult, detect_stragglers
from gpumond.rules.detectors.structure import Structure, learn
from gpumond.rules.types import GpuSample, HostSample, RankWindow


@dataclass(frozen=True, slots=True)
class EvalInputs:
    """What one evaluation sees: pushed rank windows and telemetry windows, already bounded in time."""

    now: float
    jobs: Mapping[str, Mapping[int, RankWindow]]
    gpu_windows: Mapping[str, Sequence[GpuSample]] = field(default_factory=dict)
    host_windows: Mapping[str, Sequence[HostSample]] = field(default_factory=dict)
    absent_nodes: frozenset[str] = frozenset()
    # How many telemetry fetches the GPU windows hold (GpuStore.fetches): a judgement on arrival measures a job's
    # windows again when a fetch landed since its picture was measured.
    telemetry_seq: int = 0


@dataclass(frozen=True, slots=True)
class DetectorState:
    """What detectors remember between evaluations, per job: the learnt step-time baseline, each rank's
    recent compute shares (for the long look) and since when the job has them, and its workload structure."""

    baselines: Mapping[str, JobBaseline] = field(default_factory=dict)
    shares: Mapping[str, Mapping[int, tuple[float, ...]]] = field(default_factory=dict)
    structure: Mapping[str, Structure] = field(default_factory=dict)
    # Not memory: the last evaluation's per-rank features, kept so the service can export what it judged
    # (gpumond_job_rank_* on its /metrics, the Job dashboard) without computing them twice.
    rank_features: Mapping[str, tuple[RankFeatures, ...]] = field(default_factory=dict)
    shares_since: Mapping[str, float] = field(default_factory=dict)
    # The times of the evaluations in the long look (the same for every rank of a job): its horizon is wall time.
    share_times: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    # Each job's last judgement: what its inputs were, when, and what it found (incremental evaluation).
    judged: Mapping[str, Judged] = field(default_factory=dict)
    # Each job's per-step peer medians at its last judgement (running statistics: peer_rows.py). Not compared: no
    # result depends on whether a median was kept or found again.
    peer_rows: Mapping[str, Mapping[Hashable, RowMedians]] = field(default_factory=dict, compare=False)
    # What each job's last periodic judgement measured over its windows, which a judgement on arrival takes as it
    # is (see `Windowed`). Not compared: it is derived from the inputs, like rank_features.
    windowed: Mapping[str, Windowed] = field(default_factory=dict, compare=False)


@dataclass(frozen=True, slots=True)
class Windowed:
    """A job's windowed picture at its last periodic judgement: its ranks' and GPUs' features over the window,
    its compute-share looks, host features, SM activity, and whether it was stalled. A judgement on arrival
    judges the job's new steps (the sequential tests) against this picture instead of measuring the windows
    again: what the windowed looks say is validated at one look per periodic run (docs/detectors.md, "When a job
    is judged"), and measuring them was most of a judgement's cost (at 32,768 ranks ~60 % of it). Telemetry is
    fetched on its own schedule: a judgement on arrival after a fetch measures the GPUs' side again
    (`telemetry_seq`)."""

    feats: tuple[RankFeatures, ...]
    shares: Mapping[int, Shares]
    gpus: Mapping[str, GpuFeatures]
    hosts: Mapping[str, HostFeatures]
    activity: Mapping[str, float]
    stalled: bool
    telemetry_seq: int = 0  # EvalInputs.telemetry_seq when it was measured
    # What the straggler detector's peer looks found on this picture (straggler.Looks per group), by the job's
    # starved ranks (left out of the looks) and then the nodes split off: found by the periodic judgement that
    # made the picture, taken by the judgements on arrival against it (running statistics only; a picture
    # measured again is a new one, with none). Filled as judgements find them, never changed once there.
    looks: dict[frozenset[int], LooksKept] = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class Judged:
    """A job's last judgement: the fingerprint of its inputs (`inputs_key`), when, and its candidates."""

    key: tuple[float, ...]
    at: float
    candidates: tuple[Candidate, ...]
    # The candidates of its last periodic judgement that wait on persistence (neither sustained nor corroborated):
    # what a judgement on arrival keeps of them (see `evaluate`).
    windowed: tuple[Candidate, ...] = ()
    # A judgement on arrival: a periodic evaluation judges the job again, new data or not. Taking the judgement on
    # arrival as the periodic one instead (to save its CPU) samples the windowed looks when steps land, i.e. right
    # after a rank's early push of a step that stood out: the uneven-sequence control then fired (a recent look,
    # z 6.3, in 1 of 3 seeds of the detection benchmark) and telemetry-only findings came a tick later.
    arrival: bool = False


_PUSH, _BEAT, _COLS, _INFO = attrgetter("last_push"), attrgetter("last_beat"), attrgetter("columns"), attrgetter("info")


def _is_not_none(x: object) -> bool:
    return x is not None


_STEPS_KEY_LEN = 4  # steps_key's fields, which inputs_key begins with


def steps_key(ranks: Mapping[int, RankWindow]) -> tuple[float, ...]:
    """What changes when a job's ranks push: their newest push and heartbeat, and their held steps (how many,
    and the sum of each rank's newest end). One pass per field over the ranks (C-level getters), not one Python
    loop body per rank, at about a third of the cost."""
    ws = list(ranks.values())
    push = max(chain((-1.0,), map(_PUSH, ws)))
    beat = max(chain((-1.0,), filter(_is_not_none, map(_BEAT, ws))))
    cols = list(map(_COLS, ws))
    ends = -1.0
    if None not in cols:
        counts = [len(c.step) for c in cols]  # a numpy length, not StepView's Python __len__
        for c, k in zip(cols, counts):
            if k:
                ends += c.values.item(k - 1)  # row 0's last: the newest end, as a Python float
    else:
        counts = [len(w.steps) for w in ws]
        for w, k in zip(ws, counts):
            if k:
                ends += w.steps[-1].end
    return (push, beat, float(sum(counts)), ends)


def inputs_key(ranks: Mapping[int, RankWindow], gpu_windows: Mapping[str, Sequence[GpuSample]],
               absent_nodes: frozenset[str]) -> tuple[float, ...]:
    """What changes when a job has anything new: its steps_key, its GPUs' newest telemetry sample, and how
    many of its ranks sit on absent nodes. Read for every job at every periodic evaluation, judged or not."""
    infos = list(map(_INFO, ranks.values()))
    absent = sum(i.node in absent_nodes for i in infos) if absent_nodes else 0
    newest = max(chain((-1.0,), (g[-1].t for i in infos if (g := gpu_windows.get(i.gpu_uuid)))))
    return steps_key(ranks) + (newest, float(absent))


@dataclass(frozen=True, slots=True)
class FeatureFns:
    """How features are computed: the vectorised batches by default; tests inject plain references."""

    ranks: Callable[..., tuple[list[RankFeatures], list[float]]] = job_rank_features
    gpus: Callable[..., dict[str, GpuFeatures]] = gpu_features_many
    # Running statistics: each job's per-step peer medians kept from its last judgement and found again only for
    # the steps whose cells changed (peer_rows.py). False: every one found afresh (the reference path; the same
    # results, held equal by tests/unit/test_running_peer_medians.py).
    running: bool = True


def evaluate(inputs: EvalInputs, state: DetectorState, cfg: DetectorConfig,
             fns: FeatureFns = FeatureFns(), held: Collection[str] = (),
             arrivals: bool = False) -> tuple[DetectorState, list[Candidate]]:
    """Run every detector on every job with something new (every job, at least each `rejudge_s`); a job with
    nothing new keeps its last candidates. Returns the new state and this evaluation's candidates.

    `held`: jobs not in these inputs that are still held and not judged now (a judgement of the jobs whose
    steps just landed): they keep their state and their last candidates, which are returned with the others.
    Any other job missing from the inputs has expired and is forgotten.

    `arrivals`: a judgement of jobs whose steps landed, between the periodic evaluations. Of its candidates only
    those that fire at once (sequential evidence, corroborated) are taken; those that wait on persistence (the
    median looks, stalls, job-level findings) stay as the last periodic evaluation left them. Their thresholds
    and the findings' minimum duration were validated at one evaluation per 5 s: sampled every second, a
    median look's excursion is seen from its first second rather than from the next 5 s tick, and one of
    ~23 s then outlasted the 20 s minimum (the uneven-sequence control fired on it)."""
    since = inputs.now - cfg.recent_s
    baselines = dict(state.baselines)
    share_state = dict(state.shares)
    structure = dict(state.structure)
    rank_features: dict[str, tuple[RankFeatures, ...]] = {}
    shares_since = dict(state.shares_since)
    share_times = dict(state.share_times)
    judged = dict(state.judged)
    peer_rows = dict(state.peer_rows)
    windowed_of = dict(state.windowed)
    out: list[Candidate] = []
    for job, ranks in inputs.jobs.items():
        job_start = len(out)  # where this job's candidates start
        last = judged.get(job)
        picture = windowed_of.get(job) if arrivals and job in state.rank_features else None
        if arrivals and picture is None:
            _read_all(inputs.gpu_windows)
        if picture is not None and last is not None:
            # Its telemetry part as the last judgement read it: reading every GPU's newest sample is what a judgement
            # on arrival avoids (a fetch since the picture is caught by telemetry_seq below).
            key = steps_key(ranks) + last.key[_STEPS_KEY_LEN:]
        else:
            key = inputs_key(ranks, inputs.gpu_windows, inputs.absent_nodes)
        if last is not None and last.key == key and inputs.now - last.at < cfg.rejudge_s \
                and job in state.rank_features and (arrivals or not last.arrival):
            out.extend(last.candidates)
            rank_features[job] = state.rank_features[job]
            continue
        if picture is not None:
            rank_features[job] = state.rank_features[job]
            if picture.telemetry_seq != inputs.telemetry_seq and not picture.stalled:
                # Telemetry landed since the picture (fetches run on their own schedule): its GPUs are measured
                # again, and the new picture serves the judgements on arrival after this one.
                picture = windowed_of[job] = _with_telemetry(picture, inputs, cfg, fns, since)
            _judge_steps(job, ranks, inputs, state, cfg, fns, since, picture, structure, out, peer_rows)
        else:
            _judge_job(job, ranks, inputs, state, cfg, fns, since, baselines, share_state, structure, rank_features,
                       shares_since, share_times, out, peer_rows, windowed_of)
        if arrivals:
            windowed = last.windowed if last is not None else ()
            out[job_start:] = _on_arrival(out[job_start:], windowed)
        else:
            windowed = tuple(c for c in out[job_start:] if not _immediate(c))
        judged[job] = Judged(key, inputs.now, tuple(out[job_start:]), windowed, arrivals)
    for job in held:
        last = judged.get(job)
        if job not in inputs.jobs and last is not None and job in state.rank_features:
            out.extend(last.candidates)
            rank_features[job] = state.rank_features[job]
    for kept in (baselines, share_state, structure, shares_since, share_times, judged, peer_rows, windowed_of):
        for job in [j for j in kept if j not in inputs.jobs and j not in held]:
            del kept[job]  # the job expired from the store: forget it
    return DetectorState(baselines, share_state, structure, shares_since=shares_since, share_times=share_times,
                         rank_features=rank_features, judged=judged, peer_rows=peer_rows,
                         windowed=windowed_of), out


def _read_all(windows: Mapping[str, Sequence[GpuSample]]) -> None:
    """Read every window of an on-demand mapping at once (GpuStore.windows_on_demand), before a judgement that
    reads them all: one at a time they cost about twice as much. A plain mapping has nothing to read."""
    read_all = getattr(windows, "read_all", None)
    if read_all is not None:
        read_all()


def _judge_job(job: str, ranks: Mapping[int, RankWindow], inputs: EvalInputs, state: DetectorState,
               cfg: DetectorConfig, fns: FeatureFns, since: float, baselines: dict, share_state: dict,
               structure: dict, rank_features: dict, shares_since: dict, share_times: dict,
               out: list[Candidate], peer_rows: dict, windowed_of: dict) -> None:
    """Judge one job: its candidates appended to `out`, its state updated in the dicts passed in."""
    job_start = len(out)
    # All of a job's ranks and GPUs at once (numpy): per-rank Python loops cost ~75 µs a GPU. The steps are read
    # once, for the rank features and the per-step shares both.
    read = read_steps(list(ranks.values()), since)
    feats, step_times = fns.ranks(ranks, since, inputs.now, cfg.share_short_steps, cfg.min_steps, cfg.share_trim,
                                  short_s=cfg.share_short_s, steps=read)
    if job not in shares_since and any(r.share_recent is not None for r in feats):
        shares_since[job] = inputs.now
    # The long look averages full windows only: a young job's windows all hold its first seconds.
    full = inputs.now - shares_since.get(job, inputs.now) >= cfg.recent_s
    times = tuple(t for t in share_times.get(job, ()) if t > inputs.now - cfg.share_long_s)
    # A window joins the long look at most every accumulate_every_s (a judgement between keeps its history).
    full = full and (not times or due_again(times[-1], inputs.now, cfg))
    if full:
        times += (inputs.now,)
    share_times[job] = times
    ready = bool(times) and inputs.now - times[0] >= cfg.share_long_min_s
    feats = [_with_device_kind(r, inputs.gpu_windows.get(r.gpu_uuid)) if r.gpu_uuid.startswith("MIG-") else r
             for r in feats]  # tested inline: a call per rank cost ~2 µs (cProfile, 32,768 ranks)
    rank_features[job] = tuple(feats)
    shares = job_shares(feats, state.shares.get(job, {}), cfg.min_steps, len(times), full, ready)
    share_state[job] = {rank: sh.history for rank, sh in shares.items()}
    # No telemetry from an absent node's agent: its GPUs are never judged stragglers on missing data.
    reporting = [r for r in feats if r.node not in inputs.absent_nodes]
    gpus = fns.gpus([r.gpu_uuid for r in reporting], inputs.gpu_windows, since)
    hosts = _hosts(reporting, inputs, since)
    first = _oldest_end(read, inputs.now)
    baseline, slow = job_slowdown(job, step_times, baselines.get(job), cfg, span_s=inputs.now - first,
                                  now=inputs.now)
    if baseline is not None:
        baselines[job] = baseline
    last = max((r.last_end for r in feats if r.last_end is not None), default=None)
    stall_gpus = gpus
    if last is not None and inputs.now - last >= cfg.hang_min_s:
        # Judge a stall on what the GPUs did since the last step ended, not on the whole window:
        # a checkpoint (writers idle) and a hang (peers spin, the culprit idles) differ only there.
        stall_gpus = fns.gpus([r.gpu_uuid for r in reporting], inputs.gpu_windows, last + 1.0,
                                       strict=True)
    stall = job_stall(job, feats, stall_gpus, baseline, inputs.now, cfg, windows=ranks,
                      gpu_windows=inputs.gpu_windows)
    if stall:
        out.extend(stall)
        windowed_of[job] = Windowed(tuple(feats), {}, {}, {}, {}, stalled=True, telemetry_seq=inputs.telemetry_seq)
        return  # a stalled job's windows say nothing about stragglers or starvation
    active = [r for r in feats if r.steps > 0]
    out.extend(slow)
    peers = PeerRows(state.peer_rows.get(job), reuse=fns.running)
    steps = step_shares(ranks, since, read, peers)
    starved = detect_io_starvation(job, active, gpus, hosts, cfg, steps, inputs.host_windows)
    out.extend(starved)
    # A starved rank's GPU idles and so sits apart from its peers; starvation is the explanation.
    explained = {c.rank for c in starved if c.kind == "io_starved_rank"}
    known = structure.get(job)
    activity = _activity(active, shares, reporting, inputs, since, cfg)
    windowed_of[job] = Windowed(tuple(feats), shares, gpus, hosts, activity, stalled=False,
                                telemetry_seq=inputs.telemetry_seq)
    found = _stragglers(job, active, gpus, cfg, shares, explained, known, steps, activity,
                        windowed_of[job].looks if fns.running else None)
    if found.judged:
        structure[job] = learn(known, found.blocks, inputs.now, cfg.structure_learn_s, found.current)
    out.extend(c for c in found.candidates if c.rank not in explained)
    if fns.running:
        peer_rows[job] = peers.kept()
    # GPM activity and NVLink replays as evidence (NVLink as a named cause) on what was found for the job.
    job_gpus = {r.gpu_uuid: r.node for r in reporting}
    out[job_start:] = with_activity_many(out[job_start:], inputs.gpu_windows, job_gpus, since)


def _judge_steps(job: str, ranks: Mapping[int, RankWindow], inputs: EvalInputs, state: DetectorState,
                 cfg: DetectorConfig, fns: FeatureFns, since: float, picture: Windowed, structure: Mapping,
                 out: list[Candidate], peer_rows: dict) -> None:
    """A judgement on arrival: the job's steps (the sequential tests, on the steps as they are now) against its
    last periodic judgement's windowed picture. The rest of what a periodic judgement does (the windowed looks,
    the job's baseline and stall, structure learning, the long look's history) is left to the periodic runs,
    which a judgement on arrival never stands in for; its candidates that wait on persistence are dropped by
    `_on_arrival` anyway."""
    if picture.stalled:
        return  # a stalled job's windows say nothing about stragglers or starvation
    job_start = len(out)
    read = read_steps(list(ranks.values()), since)
    peers = PeerRows(state.peer_rows.get(job), reuse=fns.running)
    steps = step_shares(ranks, since, read, peers)
    active = [r for r in picture.feats if r.steps > 0]
    starved = detect_io_starvation(job, active, picture.gpus, picture.hosts, cfg, steps, inputs.host_windows)
    out.extend(starved)
    explained = {c.rank for c in starved if c.kind == "io_starved_rank"}
    found = _stragglers(job, active, picture.gpus, cfg, picture.shares, explained, structure.get(job), steps,
                        picture.activity, picture.looks if fns.running else None)
    out.extend(c for c in found.candidates if c.rank not in explained)
    if fns.running:
        peer_rows[job] = peers.kept()
    job_gpus = {r.gpu_uuid: r.node for r in picture.feats if r.node not in inputs.absent_nodes}
    out[job_start:] = with_activity_many(out[job_start:], inputs.gpu_windows, job_gpus, since)


def _with_telemetry(picture: Windowed, inputs: EvalInputs, cfg: DetectorConfig, fns: FeatureFns,
                    since: float) -> Windowed:
    """The picture with its GPUs, hosts and SM activity measured again on the telemetry now held; its ranks'
    features and compute-share looks (the steps' windowed side) as they were."""
    reporting = [r for r in picture.feats if r.node not in inputs.absent_nodes]
    _read_all(inputs.gpu_windows)
    gpus = fns.gpus([r.gpu_uuid for r in reporting], inputs.gpu_windows, since)
    active = [r for r in picture.feats if r.steps > 0]
    activity = _activity(active, picture.shares, reporting, inputs, since, cfg)
    return replace(picture, gpus=gpus, hosts=_hosts(reporting, inputs, since), activity=activity,
                   telemetry_seq=inputs.telemetry_seq, looks={})  # the looks read the GPUs: found again


def _hosts(reporting: Sequence[RankFeatures], inputs: EvalInputs, since: float) -> dict[str, HostFeatures]:
    """The host features of the reporting ranks' nodes, over their samples since `since`."""
    hosts: dict[str, HostFeatures] = {}
    for node in dict.fromkeys(r.node for r in reporting):
        hs = [h for h in inputs.host_windows.get(node, ()) if h.t >= since]
        if hs:
            hosts[node] = host_features(node, hs)
    return hosts


def _stragglers(job: str, active: Sequence[RankFeatures], gpus: Mapping[str, GpuFeatures], cfg: DetectorConfig,
                shares: Mapping[int, Shares], explained: set[int], known: Structure | None,
                steps: StepShares | None, activity: Mapping[str, float],
                looks: dict[frozenset[int], LooksKept] | None = None) -> StragglerResult:
    """detect_stragglers on a job's ranks, its starved ranks (`explained`) left out of the compute-share looks: a
    starved rank's GPU idles and so sits apart from its peers, and starvation is the explanation. `looks`: the
    picture's (Windowed.looks), where what the peer looks found is kept for these starved ranks; None: found
    afresh."""
    kept = None if looks is None else looks.setdefault(frozenset(explained), {})
    return detect_stragglers(job, active, gpus, cfg, {r: sh for r, sh in shares.items() if r not in explained},
                             known.nodes if known else frozenset(), learning=known is None or not known.done,
                             steps=steps if shares else None, activity=activity, looks=kept)


def _immediate(c: Candidate) -> bool:
    """Fires at once, without waiting on persistence: its detector's own test required the evidence to last."""
    return c.sustained or c.corroborated


def _on_arrival(new: list[Candidate], windowed: tuple[Candidate, ...]) -> list[Candidate]:
    """A job's candidates after a judgement on arrival: its new ones that fire at once, then the last periodic
    judgement's that wait on persistence (but for an entity now flagged at once)."""
    now = [c for c in new if _immediate(c)]
    keys = {c.key for c in now}
    return now + [c for c in windowed if c.key not in keys]


def _activity(active: Sequence[RankFeatures], shares: Mapping[int, object], reporting: Sequence[RankFeatures],
              inputs: EvalInputs, since: float, cfg: DetectorConfig) -> dict[str, float]:
    """SM activity against the node's, for the GPUs of ranks without a compute share (none: nothing to do)."""
    if all(r.rank in shares for r in active):
        return {}
    return node_relative(inputs.gpu_windows, {r.gpu_uuid: r.node for r in reporting}, since, cfg.min_peers,
                         cfg.min_samples, cfg.sm_trim)


def _oldest_end(read: RecentSteps | None, default: float) -> float:
    """The earliest of the ranks' oldest steps' ends (`default` when no rank holds a step): the min of each
    rank's first held step's end (RecentSteps.first_end). Where one is NaN, Python's min over them in rank order,
    as a loop over the windows gives (numpy's min would be NaN)."""
    if read is None:
        return default
    oldest = read.first_end[read.counts > 0]
    return float(oldest.min()) if not np.isnan(oldest).any() else min(oldest.tolist())


def _with_device_kind(r: RankFeatures, window: Sequence[GpuSample] | None) -> RankFeatures:
    """The rank with its MIG profile (from the newest telemetry of its device) when it runs on a MIG slice."""
    if not r.gpu_uuid.startswith("MIG-"):
        return r
    profile = window[-1].mig_profile if window else None
    return replace(r, mig_profile=profile or "mig")
