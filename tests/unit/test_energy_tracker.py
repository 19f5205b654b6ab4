"""Energy per job in the rules service: boards joined to the jobs whose ranks run on them (MIG slices by their
share of the board), exported on /metrics and /api/v1/jobs, and a job-end record in the log."""

from __future__ import annotations

import asyncio
import json
import logging

import httpx
import pytest

from gpumond.config.rules import RulesConfig
from gpumond.rules.energy import attribution
from gpumond.rules.energy.tracker import EnergyTracker
from gpumond.rules.service import RulesService
from gpumond.rules.store import RankStore
from gpumond.rules.types import GpuSample, RankInfo, StepRecord, TelemetryBatch, TelemetryNeed

P = "GPU-aaaaaaaa-0000-4000-8000-000000000001"
Q = "GPU-aaaaaaaa-0000-4000-8000-000000000002"
M3 = "MIG-bbbbbbbb-0000-4000-8000-000000000003"
M4 = "MIG-bbbbbbbb-0000-4000-8000-000000000004"


def board(uuid: str, t: float, joules: float, up: bool = True) -> GpuSample:
    return GpuSample(uuid, "n0", "0", t, up, {"energy_j": joules, "power_w": 300.0})


def mig(uuid: str, parent: GpuSample, profile: str) -> GpuSample:
    return GpuSample(uuid, parent.node, parent.gpu, parent.t, parent.up, parent.values, parent_uuid=parent.uuid,
                     mig_profile=profile)


def store() -> RankStore:
    return RankStore(window_s=300, expire_after_s=600, max_jobs=10, max_ranks=100, max_gpus=100,
                     max_steps_per_rank=1000, max_steps_held=10_000)


def push(ranks: RankStore, job: str, rank: int, uuid: str, step: int, now: float, final: bool = False) -> None:
    ranks.record(RankInfo(job, rank, 2, "n0", uuid), [StepRecord(step, now, 1.0, 0.0)], now, final=final)


def test_mig_slices_are_charged_their_share_of_the_board_and_only_live_whole_boards_are_read() -> None:
    parent = board(P, 10.0, 5000.0)
    samples = [parent, mig(M3, parent, "3g.40gb"), mig(M4, parent, "4g.40gb"), board(Q, 10.0, 1.0, up=False)]
    ranks = store()
    push(ranks, "small", 0, M3, 1, 10.0)
    push(ranks, "big", 0, M4, 1, 10.0)
    push(ranks, "big", 1, Q, 1, 10.0)
    held = attribution.holders(ranks.jobs(10.0), samples)
    assert held[P] == (("big", pytest.approx(4 / 7)), ("small", pytest.approx(3 / 7)))
    assert held[Q] == (("big", 1.0),)
    assert [(r.uuid, r.joules) for r in attribution.readings(samples)] == [(P, 5000.0)]
    assert attribution.compute_slices("1g.10gb") == 1 and attribution.compute_slices("odd") == 1


def test_a_job_is_credited_while_it_runs_and_logged_with_its_total_when_it_ends(caplog) -> None:
    ranks = store()
    tracker = EnergyTracker(ranks.jobs)
    for i, t in enumerate((0.0, 10.0, 20.0)):
        push(ranks, "llama", 0, P, 100 + 5 * i, t)
        push(ranks, "llama", 1, Q, 100 + 5 * i, t)
        tracker.observe(TelemetryBatch(t, (board(P, t, 3000 * t), board(Q, t, 1000 + 2000 * t))))
    e = tracker.jobs()["llama"]
    assert (e.joules, e.mean_power_w, e.steps, e.joules_per_step) == (100_000.0, 5000.0, 10, 10_000.0)
    series = {s.name: s.value for s in tracker.series()}
    assert series == {"gpumond_job_energy_joules_total": 100_000.0, "gpumond_job_power_watts": 5000.0,
                      "gpumond_job_energy_per_step_joules": 10_000.0}
    push(ranks, "llama", 0, P, 115, 25.0, final=True)
    push(ranks, "llama", 1, Q, 115, 25.0, final=True)
    with caplog.at_level(logging.INFO, logger="gpumond.rules"):
        tracker.observe(TelemetryBatch(30.0, (board(P, 30.0, 90_000), board(Q, 30.0, 61_000))))
    line = next(r for r in caplog.records if r.getMessage() == "job ended: energy")
    assert (line.job, line.energy_joules, line.steps) == ("llama", 100_000.0, 10)
    assert tracker.jobs() == {} and tracker.view()["jobs"] == [{
        "job": "llama", "state": "ended", "energy_joules": 100_000.0, "mean_power_watts": 5000.0,
        "measured_seconds": 20.0, "steps": 10, "joules_per_step": 10_000.0, "samples": 0,
        "joules_per_sample": None}]


def test_a_sharded_replica_counts_only_the_jobs_it_owns() -> None:
    ranks = store()
    push(ranks, "mine", 0, P, 1, 0.0)
    push(ranks, "theirs", 0, Q, 1, 0.0)
    tracker = EnergyTracker(ranks.jobs, owns=lambda job: job == "mine")
    tracker.observe(TelemetryBatch(0.0, (board(P, 0.0, 0.0), board(Q, 0.0, 0.0))))
    assert set(tracker.jobs()) == {"mine"}


class Batches:
    """A telemetry source handing out prepared batches (the agents' side is tested on real scrapes elsewhere)."""

    name = "prepared"

    def __init__(self, batches: list[TelemetryBatch]) -> None:
        self.batches = batches

    def fetch(self, need: TelemetryNeed | None = None) -> TelemetryBatch:
        return self.batches.pop(0)

    def close(self) -> None:
        pass


def test_the_service_exports_job_energy_on_metrics_and_the_jobs_api(tmp_path) -> None:
    token = "t" * 32
    source = Batches([TelemetryBatch(t, (board(P, t, 400.0 * t),)) for t in (1.0, 11.0)])
    service = RulesService(RulesConfig.model_validate({"tokens": [token], "state_dir": str(tmp_path)}),
                           source=source)
    try:
        push(service.ranks, "llama", 0, P, 7, 1.0)
        service.evaluator.poll_telemetry()
        service.evaluator.poll_telemetry()
        text = service.metrics().decode()
        assert 'gpumond_job_energy_joules_total{job="llama"} 4000.0' in text
        assert 'gpumond_job_power_watts{job="llama"} 400.0' in text

        async def get() -> httpx.Response:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=service.app),
                                         base_url="http://rules") as client:
                return await client.get("/api/v1/jobs")

        body = json.loads(asyncio.run(get()).content)
        assert body["jobs"][0]["job"] == "llama" and body["jobs"][0]["energy_joules"] == 4000.0
        assert body["jobs"][0]["state"] == "running"
    finally:
        service.stop()
