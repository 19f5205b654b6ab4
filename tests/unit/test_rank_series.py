"""The rules service exports what its detectors judged per rank (the Job dashboard's step and wait shares)."""

from gpumond.rules.detectors.features import RankFeatures
from gpumond.rules.evaluator import rank_series


def feat(rank: int, share: float | None) -> RankFeatures:
    return RankFeatures(rank=rank, node="n1", gpu_uuid=f"GPU-{rank}", group=None, steps=20, step_time_s=0.5,
                        wait_frac=0.1 * rank, last_end=1.0, last_push=1.0, share_recent=share)


def test_one_series_per_rank_and_value_and_nothing_for_what_the_window_cannot_give() -> None:
    out = {(s.name, dict(s.labels)["rank"]): (dict(s.labels), s.value)
           for s in rank_series({"job-a": (feat(0, 0.8), feat(1, None))})}
    assert out[("gpumond_job_rank_step_seconds", "0")] == (
        {"job": "job-a", "rank": "0", "node": "n1", "gpu_uuid": "GPU-0"}, 0.5)
    assert out[("gpumond_job_rank_data_wait_ratio", "1")][1] == 0.1
    assert out[("gpumond_job_rank_compute_ratio", "0")][1] == 0.8
    assert ("gpumond_job_rank_compute_ratio", "1") not in out  # no comm_wait pushed: left out, never 0
    assert len(out) == 5
