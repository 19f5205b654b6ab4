"""Job-level detectors: slowdown against the job's own baseline, and stalls (a hung rank)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from gpumond.rules.detectors.candidate import Candidate
from gpumond.rules.detectors.config import DetectorConfig
from gpumond.rules.detectors.features import GpuFeatures, RankFeatures
from gpumond.rules.detectors.stats import median, robust_z, threshold_for
from gpumond.rules.types import GpuSample, RankWindow


@dataclass(frozen=True, slots=True)
class JobBaseline:
    """The job's normal step time, learnt while it is healthy."""

    step_time_s: float
    steps_seen: int
    at: float = -float("inf")  # when it was learnt or last followed the job's drift


def due_again(last: float, now: float, cfg: DetectorConfig) -> bool:
    """Whether what accumulates across judgements (last added at `last`) takes this one: accumulate_every_s
    later, with 2 % slack (a schedule's evaluations arrive a few ms early or late)."""
    return now - last >= 0.98 * cfg.accumulate_every_s


def job_slowdown(job: str, step_times: Sequence[float], baseline: JobBaseline | None,
                 cfg: DetectorConfig, span_s: float = float("inf"),
                 now: float = float("inf")) -> tuple[JobBaseline | None, list[Candidate]]:
    """Compare the recent median job step time with the baseline; learn the baseline only while healthy, and
    only once the job's steps span `cfg.baseline_min_s` (`span_s`: from its oldest held step to `now`); it
    follows drift at most every accumulate_every_s (judged more often, it would drift faster)."""
    if len(step_times) < 3:
        return baseline, []
    recent = median(step_times)
    if baseline is None:
        if len(step_times) >= cfg.baseline_min_steps and span_s >= cfg.baseline_min_s:
            return JobBaseline(recent, len(step_times), now), []
        return None, []
    ratio = recent / baseline.step_time_s if baseline.step_time_s > 0 else 1.0
    if ratio >= cfg.slowdown_ratio:
        return baseline, [Candidate("job_slowdown", job, None, None, None, round(ratio, 3), {
            "step_time_s": round(recent, 4), "baseline_step_time_s": round(baseline.step_time_s, 4),
            "slowdown": round(ratio, 3)})]
    if abs(ratio - 1.0) < (cfg.slowdown_ratio - 1.0) / 2 and due_again(baseline.at, now, cfg):
        # Follow slow drift (longer sequences, a new data shard) but never learn a slowdown as normal.
        a = cfg.baseline_alpha
        return replace(baseline, step_time_s=(1 - a) * baseline.step_time_s + a * recent,
                       steps_seen=baseline.steps_seen + len(step_times), at=now), []
    return baseline, []


def job_alive(job: str, windows: Mapping[int, RankWindow], gpu_windows: Mapping[str, Sequence[GpuSample]],
              last_end: float, now: float, cfg: DetectorConfig) -> str | None:
    """Why the job's processes are known to be alive after its last step ended, or None.

    A hang is a process that lives but makes no progress; a job that ended or crashed has no process left.
    Evidence, either one: a rank's heartbeat (a push without steps, which the SDK sends while its process
    lives and has nothing to report) after the last step, recent; or an agent's gpumond_gpu_job_info saying
    the job's processes still hold a rank's GPU since the last step. Only positive evidence counts: an SDK
    that sends no heartbeat, or an agent that cannot attribute processes, never turns a hang into an end.
    """
    for w in windows.values():
        if w.last_beat is not None and w.last_beat > last_end and now - w.last_beat <= cfg.hang_alive_s:
            return "heartbeat"
    for w in windows.values():
        if any(s.t > last_end and job in s.jobs for s in gpu_windows.get(w.info.gpu_uuid, ())):
            return "gpu_processes"
    return None


def job_stall(job: str, ranks: Sequence[RankFeatures], gpus: Mapping[str, GpuFeatures],
              baseline: JobBaseline | None, now: float, cfg: DetectorConfig, *,
              windows: Mapping[int, RankWindow] | None = None,
              gpu_windows: Mapping[str, Sequence[GpuSample]] | None = None) -> list[Candidate]:
    """No step ended for too long while the job's processes live and the GPUs look busy (peers spinning in
    a collective): a hang.

    The culprit is the rank whose GPU is idle while its peers spin; if none stands out the finding is
    reported without a rank. All GPUs idle means the job ended or paused: no finding. A job a rank said is
    ending (`final`), or whose processes are not known to be alive (`job_alive`; a crash, or a clean end
    whose last push was lost), is no hang either: a critical page must be rare and right.
    """
    last = max((r.last_end for r in ranks if r.last_end is not None), default=None)
    if last is None or baseline is None:
        return []
    stalled_for = now - last
    limit = max(cfg.hang_min_s, cfg.hang_factor * baseline.step_time_s)
    if stalled_for < limit:
        return []
    windows = windows or {}
    if any(w.ended for w in windows.values()):
        return []
    alive = job_alive(job, windows, gpu_windows or {}, last, now, cfg)
    if alive is None:
        return []
    utils = [(r, gpus[r.gpu_uuid].utilization) for r in ranks
             if r.gpu_uuid in gpus and gpus[r.gpu_uuid].utilization is not None]
    if not utils or median([u for _, u in utils]) < cfg.hang_busy_util:  # type: ignore[misc]
        return []
    evidence: dict[str, object] = {"stalled_for_s": round(stalled_for, 1), "limit_s": round(limit, 1),
                                   "last_step_end": last, "alive": alive}
    culprits: list[RankFeatures] = []
    if len(utils) >= 2:
        thr = threshold_for(len(utils), cfg.z_base, cfg.z_tail)
        zs, med, _ = robust_z([u for _, u in utils], 0.05)  # type: ignore[misc]
        culprits = [r for (r, _), z in zip(utils, zs, strict=True) if z < -thr]
        evidence["peer_median_utilization"] = round(med, 3)
    if len(culprits) == 1:
        r = culprits[0]
        evidence["gpu_utilization"] = round(gpus[r.gpu_uuid].utilization or 0.0, 3)
        return [Candidate("hung_rank", job, r.node, r.rank, r.gpu_uuid, round(stalled_for / limit, 2), evidence)]
    evidence["localised"] = False
    return [Candidate("hung_rank", job, None, None, None, round(stalled_for / limit, 2), evidence)]
