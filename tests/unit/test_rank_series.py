"""The rules service exports what its detectors judged per rank (the Job dashboard's step and wait shares)."""

from gpumond.rules.detectors.features import RankFeatures
from gpumond.rules.evaluator import rank_series


def feat(rank: int, share: float | None) -> RankFeatures:
    # share_recent is relative to the step's mean; compute_frac and comm_frac are absolute shares.
    return RankFeatures(rank=rank, node="n1", gpu_uuid=f"GPU-{rank}", group=None, steps=20, step_time_s=0.5,
                        wait_frac=0.1 * rank, last_end=1.0, last_push=1.0, share_recent=None if share is None else -0.06,
                        compute_frac=share, comm_frac=None if share is None else 0.15)


def test_one_series_per_rank_and_value_and_nothing_for_what_the_window_cannot_give() -> None:
    out = {(s.name, dict(s.labels)["rank"]): (dict(s.labels), s.value)
           for s in rank_series({"job-a": (feat(0, 0.8), feat(1, None))})}
    assert out[("gpumond_job_rank_step_seconds", "0")] == (
        {"job": "job-a", "rank": "0", "node": "n1", "gpu_uuid": "GPU-0"}, 0.5)
    assert out[("gpumond_job_rank_data_wait_ratio", "1")][1] == 0.1
    assert out[("gpumond_job_rank_compute_ratio", "0")][1] == 0.8
    assert ("gpumond_job_rank_compute_ratio", "1") not in out  # no comm_wait pushed: left out, never 0
    assert out[("gpumond_job_rank_comm_wait_ratio", "0")][1] == 0.15
    assert out[("gpumond_job_rank_compute_share_deviation", "0")][1] == -0.06  # the relative one, by its own name
    assert len(out) == 7


def test_exported_shares_are_absolute_shares_of_the_pushed_steps() -> None:
    # The reported case: healthy ranks wait ~31 % on peers, the straggler ~8 %. The compute ratio used to be
    # exported relative to the step's mean (about -0.06 and +0.17), which the dashboard read as a share.
    from gpumond.rules.detectors.config import DetectorConfig
    from gpumond.rules.detectors.engine import DetectorState, EvalInputs, evaluate
    from gpumond.rules.types import RankInfo, RankWindow, StepRecord

    now, n = 1000.0, 8
    comm = {r: 0.08 if r == 5 else 0.31 for r in range(n)}
    jobs = {"job-a": {r: RankWindow(RankInfo("job-a", r, n, "n1", f"GPU-{r}"), tuple(
        StepRecord(k, now - 30 + k, 1.0, 0.05, comm_wait_s=comm[r]) for k in range(30)), now) for r in range(n)}}
    state, _ = evaluate(EvalInputs(now, jobs), DetectorState(), DetectorConfig())
    out = {(s.name, dict(s.labels)["rank"]): s.value for s in rank_series(state.rank_features)}
    assert out[("gpumond_job_rank_comm_wait_ratio", "0")] == 0.31
    assert out[("gpumond_job_rank_comm_wait_ratio", "5")] == 0.08
    assert abs(out[("gpumond_job_rank_compute_ratio", "0")] - 0.64) < 1e-9
    assert abs(out[("gpumond_job_rank_compute_ratio", "5")] - 0.87) < 1e-9
    assert out[("gpumond_job_rank_data_wait_ratio", "5")] == 0.05
    # What each rank computes beyond its step's mean (0.66875): the straggler +0.20, the others -0.03.
    assert abs(out[("gpumond_job_rank_compute_share_deviation", "5")] - 0.20125) < 1e-6
