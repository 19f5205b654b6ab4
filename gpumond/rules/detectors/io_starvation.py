"""I/O starvation: a rank (or the whole job) blocked on its data loader.

A starved rank shows high data-loader wait with low utilization and power on its GPU, while its peers
wait in collectives instead (high utilization, no data wait). When most ranks wait on data, the data
pipeline itself is the bottleneck: that is one job-level finding, not many rank findings — and a rank that
waits far more than the rest is still named, its loader being a problem of its own. Host CPU and
iowait from the agent say whether a starved rank is CPU-bound or storage-bound.

A rank is an outlier on two kinds of evidence: its median wait over the recent window against its peers'
(a robust z), or sequential evidence step by step (sequential.py, the straggler's test on data-wait shares),
which names a rank starved well past its peers within a few steps and fires at once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpumond.rules.detectors.candidate import Candidate
from gpumond.rules.detectors.config import DetectorConfig
from gpumond.rules.detectors.features import GpuFeatures, HostFeatures, RankFeatures, host_features
from gpumond.rules.detectors.sequential import Evidence, StepShares, judge, wait_test
from gpumond.rules.detectors.stats import median, median_without, robust_z, threshold_for
from gpumond.rules.types import HostSample


def _cause(host: HostFeatures | None, cfg: DetectorConfig) -> str:
    if host is None:
        return "unknown (no host evidence)"
    if host.cpu_iowait is not None and host.cpu_iowait >= cfg.iowait_high:
        return "storage (host iowait high)"
    if host.cpu_utilization is not None and host.cpu_utilization >= cfg.cpu_busy:
        return "cpu (host CPU saturated)"
    return "unknown (host CPU and iowait normal: check the loader, network storage, or sharding)"


def _host_evidence(host: HostFeatures | None) -> dict[str, object]:
    if host is None:
        return {}
    return {k: round(v, 4) for k, v in (("host_cpu_utilization", host.cpu_utilization),
                                        ("host_cpu_iowait", host.cpu_iowait),
                                        ("host_disk_read_bytes_per_s", host.disk_read_bytes_per_s))
            if v is not None}


def detect_io_starvation(job: str, ranks: Sequence[RankFeatures], gpus: Mapping[str, GpuFeatures],
                         hosts: Mapping[str, HostFeatures], cfg: DetectorConfig,
                         steps: StepShares | None = None,
                         host_windows: Mapping[str, Sequence[HostSample]] | None = None) -> list[Candidate]:
    """`io_starved_rank` for each rank whose data wait is an outlier among its peers, and `io_starved_job` when
    most of the other ranks wait on data too: both facts when both hold, the outlier alone when it dominates.

    Inside a job whose ranks wait on data as a rule (its median rank at least `wait_min_frac`), the ranks' waits
    spread with the shared pipeline (each loader drains at its own pace, and while the pipeline slows they cross
    into waiting at different evaluations), so an outlier there must also wait `outlier_wait_ratio` times the
    job's median rank: its own loader is slow, not the job's pipeline. The job is then judged without its
    outliers, so one rank that waits most of its step cannot make a job whose other ranks wait a little look
    starved. Sequential evidence (`steps`: the job's per-step shares, sequential.step_shares) names a rank
    only while neither the job's median nor the median rank over the run's own steps waits `wait_min_frac`
    (a job whose pipeline just slowed still has a window median from before). Such a rank's host evidence is
    read from `host_windows` over the run's own steps: it fires seconds after the onset, when the window's
    medians still show the host before."""
    # A rank with a handful of steps (a job just started) is not judged: one missed prefetch is its median.
    waiting = [r for r in ranks if r.wait_frac is not None and r.steps >= cfg.min_steps]
    if not waiting:
        return []
    outliers = _outliers(waiting, cfg)
    ordered = sorted(r.wait_frac for r in waiting)  # type: ignore[type-var]
    job_med = median(ordered)

    def others(r: RankFeatures) -> float:
        """The median wait of the job's other ranks: in a small job a rank's own wait moves the job's median (of
        two ranks it is half of it), so it is set against the rest; in a large one the two are the same."""
        level = median_without(ordered, r.wait_frac)  # type: ignore[arg-type]
        return job_med if level is None else level

    # Where the other ranks wait on data as a rule, the spread is their pipeline's: an outlier must also wait
    # outlier_wait_ratio times their median (its own loader is slow, not the job's pipeline).
    outliers = [o for o in outliers if _apart_from(o[0].wait_frac, others(o[0]), cfg)]  # type: ignore[arg-type]
    # Sequential evidence judges each step against that step's peers, in units of that step's own spread
    # (wait_test's row noise), so it works whatever the job's own level. Where the other ranks wait as a rule
    # (the job's window median, or the peers' over the run's own steps: a pipeline that just slowed still has
    # a window median from before), each loader drains at its own pace and per-step waits scatter by factors
    # of 2–4, so the run's mean must also be `outlier_wait_ratio` times its peers': the told-apart rule of the
    # window medians, on the run's own steps.
    seq = {r.rank: (r, ev) for r, ev in _sequential(waiting, steps, cfg)
           if ev.mean >= cfg.wait_min_frac and _apart_from(ev.mean, max(others(r), ev.peer), cfg)}
    out = [_rank_candidate(job, r, ev.z, ev.peer, gpus, _since(hosts, host_windows, r.node, ev.start), cfg, ev)
           for r, ev in seq.values()]
    out += [_rank_candidate(job, r, z, med, gpus, hosts, cfg) for r, z, med in outliers if r.rank not in seq]
    named = {r.rank for r, _, _ in outliers} | set(seq)
    rest = [r for r in waiting if r.rank not in named]
    if _job_starved(rest, cfg):
        starved = [r for r in rest if r.wait_frac >= cfg.job_wait_min_frac]  # type: ignore[operator]
        job_med = median([r.wait_frac for r in rest])  # type: ignore[misc]
        nodes = sorted({r.node for r in starved})
        out.append(Candidate("io_starved_job", job, None, None, None, round(job_med, 4), {
            "median_data_wait_frac": round(job_med, 4), "ranks_starved": len(starved), "ranks": len(rest),
            "min_cost_frac": cfg.job_min_cost_frac, "nodes": nodes[:16],
            **({"outlier_ranks": sorted(named)} if named else {}),
            "meaning": "the whole job waits on its data pipeline"}))
    return out


def _apart_from(wait: float, level: float, cfg: DetectorConfig) -> bool:
    """A rank's wait is its own loader's, not the job's pipeline: its peers do not wait as a rule (`level`, their
    median; for a sequential run the higher of their window median and theirs over the run's steps), or it waits
    `outlier_wait_ratio` times their level."""
    return level < cfg.wait_min_frac or wait >= cfg.outlier_wait_ratio * level


def _job_starved(waiting: Sequence[RankFeatures], cfg: DetectorConfig) -> bool:
    """The job's pipeline is the bottleneck: most ranks wait and the wait costs a real share of the step (a job
    whose ranks all wait ~5 % on data is healthy)."""
    if len(waiting) < 2:
        return False
    starved = sum(r.wait_frac >= cfg.job_wait_min_frac for r in waiting)  # type: ignore[operator]
    return starved >= cfg.job_wait_rank_frac * len(waiting) \
        and median([r.wait_frac for r in waiting]) >= cfg.job_min_cost_frac  # type: ignore[misc]


def _since(hosts: Mapping[str, HostFeatures], windows: Mapping[str, Sequence[HostSample]] | None, node: str,
           start: float) -> Mapping[str, HostFeatures]:
    """`hosts` with `node`'s features taken over its samples since `start`, where there are any."""
    samples = [h for h in (windows or {}).get(node, ()) if h.t >= start]
    return {**hosts, node: host_features(node, samples)} if samples else hosts


def _sequential(waiting: Sequence[RankFeatures], steps: StepShares | None,
                cfg: DetectorConfig) -> list[tuple[RankFeatures, Evidence]]:
    """Ranks with sequential evidence of waiting longer than their group, step by step. Many ranks on many nodes
    at once is the job's pipeline (its loaders drain at their own pace), not outliers, as for stragglers."""
    if steps is None or steps.waits is None:
        return []
    held = set(steps.ranks)
    by_group: dict[tuple[str | None, str | None], list[RankFeatures]] = {}
    for r in waiting:
        if r.rank in held:
            by_group.setdefault(r.peers, []).append(r)
    test = wait_test(cfg)
    out: list[tuple[RankFeatures, Evidence]] = []
    for members in by_group.values():
        ids = [r.rank for r in members]
        found = judge(steps.columns(ids, of="waits"), steps.starts, steps.ends, ids, cfg, test,
                      medians=steps.peer_medians(ids, of="waits"))
        node_of = {r.rank: r.node for r in members}
        nodes = len(set(node_of.values()))
        if len(found) <= max(1, cfg.max_outlier_frac * len(members)) \
                or len({node_of[k] for k in found}) <= max(1, cfg.max_outlier_frac * nodes):
            out.extend((r, found[r.rank]) for r in members if r.rank in found)
    return out


Outlier = tuple[RankFeatures, float | None, float]  # (rank, its z or None in a small group, the peer median)


def _outliers(waiting: Sequence[RankFeatures], cfg: DetectorConfig) -> list[Outlier]:
    """Ranks whose data wait sits above their group's (a robust z past the group's threshold, and at least
    `wait_min_frac`); in a group too small for a z-score, an absolute wait high enough to matter on its own."""
    out: list[Outlier] = []
    by_group: dict[tuple[str | None, str | None], list[RankFeatures]] = {}
    for r in waiting:
        by_group.setdefault(r.peers, []).append(r)
    for members in by_group.values():
        if len(members) < cfg.min_peers:
            med = median([m.wait_frac for m in members])  # type: ignore[misc]
            out.extend((r, None, med) for r in members
                       if r.wait_frac >= max(2 * cfg.wait_min_frac, 0.1))  # type: ignore[operator]
            continue
        thr = threshold_for(len(members), cfg.z_base, cfg.z_tail)
        zs, med, _ = robust_z([r.wait_frac for r in members], cfg.floor_wait_frac)  # type: ignore[misc]
        out.extend((r, z, med) for r, z in zip(members, zs, strict=True)
                   if z > thr and r.wait_frac >= cfg.wait_min_frac)  # type: ignore[operator]
    return out


def _rank_candidate(job: str, r: RankFeatures, z: float | None, med: float, gpus: Mapping[str, GpuFeatures],
                    hosts: Mapping[str, HostFeatures], cfg: DetectorConfig, ev: Evidence | None = None) -> Candidate:
    """The finding on one rank; on sequential evidence (`ev`) its wait is the run's mean and it fires at once."""
    g = gpus.get(r.gpu_uuid)
    gpu_ev = {}
    if g is not None:
        gpu_ev = {k: round(v, 4) for k, v in (("gpu_utilization", g.utilization),
                                              ("gpu_power_ratio", g.power_ratio)) if v is not None}
    host = hosts.get(r.node)
    score = r.wait_frac if z is None else z  # type: ignore[assignment]
    wait = r.wait_frac if ev is None else ev.mean
    seq = {} if ev is None else {"sequential": {"evidence": ev.evidence, "steps": ev.steps, "span_s": ev.span_s,
                                                "excess_data_wait_frac": ev.magnitude, "z": ev.z}}
    return Candidate("io_starved_rank", job, r.node, r.rank, r.gpu_uuid, round(score, 2), {  # type: ignore[arg-type]
        "group": r.group, "data_wait_frac": round(wait, 4),  # type: ignore[arg-type]
        "peer_median_data_wait_frac": round(med, 4), "likely_cause": _cause(host, cfg),
        **({"mig_profile": r.mig_profile} if r.mig_profile else {}), **gpu_ev, **_host_evidence(host), **seq},
        sustained=ev is not None)
