"""One evaluation: windows in, candidates out. Pure; the service and the benchmark run this same code."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpumond.rules.detectors.candidate import Candidate
from gpumond.rules.detectors.compute_share import job_shares
from gpumond.rules.detectors.config import DetectorConfig
from gpumond.rules.detectors.features import (
    GpuFeatures,
    HostFeatures,
    gpu_features,
    host_features,
    job_step_times,
    rank_features,
)
from gpumond.rules.detectors.io_starvation import detect_io_starvation
from gpumond.rules.detectors.job import JobBaseline, job_slowdown, job_stall
from gpumond.rules.detectors.straggler import detect_stragglers
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


@dataclass(frozen=True, slots=True)
class DetectorState:
    """What detectors remember between evaluations, per job: the learnt step-time baseline, each rank's
    recent compute shares (for the long look), and the job's workload structure."""

    baselines: Mapping[str, JobBaseline] = field(default_factory=dict)
    shares: Mapping[str, Mapping[int, tuple[float, ...]]] = field(default_factory=dict)
    structure: Mapping[str, Structure] = field(default_factory=dict)


def evaluate(inputs: EvalInputs, state: DetectorState, cfg: DetectorConfig) -> tuple[DetectorState, list[Candidate]]:
    """Run every detector on every job; returns the new state and this evaluation's candidates."""
    since = inputs.now - cfg.recent_s
    baselines = dict(state.baselines)
    share_state = dict(state.shares)
    structure = dict(state.structure)
    out: list[Candidate] = []
    for job, ranks in inputs.jobs.items():
        feats = [rank_features(w, since) for w in ranks.values()]
        shares = job_shares(ranks, since, state.shares.get(job, {}), cfg.share_short_steps, cfg.share_min_steps,
                            cfg.share_long_evals)
        share_state[job] = {rank: sh.history for rank, sh in shares.items()}
        gpus: dict[str, GpuFeatures] = {}
        hosts: dict[str, HostFeatures] = {}
        for r in feats:
            if r.node in inputs.absent_nodes:
                continue  # no telemetry from that agent: never judged a straggler on missing data
            samples = [s for s in inputs.gpu_windows.get(r.gpu_uuid, ()) if s.t >= since]
            if samples:
                gpus[r.gpu_uuid] = gpu_features(r.gpu_uuid, samples)
            if r.node not in hosts:
                hs = [h for h in inputs.host_windows.get(r.node, ()) if h.t >= since]
                if hs:
                    hosts[r.node] = host_features(r.node, hs)
        baseline, slow = job_slowdown(job, job_step_times(ranks, since, inputs.now), baselines.get(job), cfg)
        if baseline is not None:
            baselines[job] = baseline
        last = max((r.last_end for r in feats if r.last_end is not None), default=None)
        stall_gpus = gpus
        if last is not None and inputs.now - last >= cfg.hang_min_s:
            # Judge a stall on what the GPUs did since the last step ended, not on the whole window:
            # a checkpoint (writers idle) and a hang (peers spin, the culprit idles) differ only there.
            stall_gpus = {}
            for r in feats:
                ss = [s for s in inputs.gpu_windows.get(r.gpu_uuid, ()) if s.t > last + 1.0]
                if ss and r.node not in inputs.absent_nodes:
                    stall_gpus[r.gpu_uuid] = gpu_features(r.gpu_uuid, ss)
        stall = job_stall(job, feats, stall_gpus, baseline, inputs.now, cfg)
        if stall:
            out.extend(stall)
            continue  # a stalled job's windows say nothing about stragglers or starvation
        active = [r for r in feats if r.steps > 0]
        out.extend(slow)
        starved = detect_io_starvation(job, active, gpus, hosts, cfg)
        out.extend(starved)
        # A starved rank's GPU idles and so sits apart from its peers; starvation is the explanation.
        explained = {c.rank for c in starved if c.kind == "io_starved_rank"}
        known = structure.get(job)
        found = detect_stragglers(job, active, gpus, cfg, {r: sh for r, sh in shares.items() if r not in explained},
                                  known.nodes if known else frozenset(), learning=known is None or not known.done)
        if found.judged:
            structure[job] = learn(known, found.blocks, inputs.now, cfg.structure_learn_s)
        out.extend(c for c in found.candidates if c.rank not in explained)
    for kept in (baselines, share_state, structure):
        for job in [j for j in kept if j not in inputs.jobs]:
            del kept[job]  # the job expired from the store: forget it
    return DetectorState(baselines, share_state, structure), out
