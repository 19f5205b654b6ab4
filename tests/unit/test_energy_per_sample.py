"""Energy per sample: the samples a push carries (the SDK's step_end(samples=…)) reach the energy ledger
through ingest and the rank store, and come out as gpumond_job_energy_per_sample_joules and the jobs API's
joules_per_sample. Both push encodings; retries and stale steps count no samples twice."""

from __future__ import annotations

from typing import Any

import pytest

from gpumond.config.rules import RulesConfig
from gpumond.rules.energy.tracker import EnergyTracker
from gpumond.rules.ingest.accept import Client, Ingest, Reply
from gpumond.rules.store import RankStore
from gpumond.rules.types import GpuSample, TelemetryBatch
from tests.fakes import FakeClock
from tests.push_bodies import ENCODINGS, encode

TOKEN = "push-token-0123456789"
T0 = 1_763_760_000.0
UUIDS = ("GPU-aaaaaaaa-0000-4000-8000-000000000001", "GPU-aaaaaaaa-0000-4000-8000-000000000002")


def body(encoding: str, rank: int, steps: range, t: float, samples: int | None) -> bytes:
    data: dict[str, Any] = {"job": "llama", "rank": rank, "world_size": 2, "node": "n0", "gpu_uuid": UUIDS[rank],
                            "steps": [{"step": s, "end": t, "duration_s": 1.0, "data_wait_s": 0.1,
                                       **({} if samples is None else {"samples": samples})} for s in steps]}
    raw = encode(data, encoding)
    assert raw is not None
    return raw


def board(uuid: str, t: float, joules: float) -> GpuSample:
    return GpuSample(uuid, "n0", "0", t, True, {"energy_j": joules})


def run(encoding: str, samples: int | None) -> EnergyTracker:
    """Two ranks push 5 steps per 10 s (each step `samples` per rank) while each board uses 1 kW."""
    config = RulesConfig.model_validate({"tokens": [TOKEN]})
    clock = FakeClock(T0)
    ranks = RankStore.from_config(config)
    ingest = Ingest(config=config, store=ranks, clock=clock)
    client = Client("token#0", "10.0.0.1", encoding == "columns")
    tracker = EnergyTracker(ranks.jobs)
    for i in range(3):
        t = T0 + 10.0 * i
        clock.now = t
        for rank in (0, 1):
            push = body(encoding, rank, range(5 * i, 5 * i + 5), t, samples)
            assert ingest.accept(client, push).status == 202
            assert ingest.accept(client, push) == Reply(202, {"accepted": 0, "dropped": {"duplicate": 5}})
        tracker.observe(TelemetryBatch(t, tuple(board(u, t, 1000.0 * (t - T0)) for u in UUIDS)))
    return tracker


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_the_samples_pushed_give_the_jobs_energy_per_sample(encoding: str) -> None:
    tracker = run(encoding, samples=32)
    # 20 s at 2 kW = 40 kJ over 10 steps of 2 ranks × 32 samples (the retries counted once)
    e = tracker.jobs()["llama"]
    assert (e.joules, e.steps, e.samples) == (40_000.0, 10, 640)
    series = {s.name: s.value for s in tracker.series()}
    assert series["gpumond_job_energy_per_sample_joules"] == pytest.approx(62.5)
    record = tracker.view()["jobs"][0]
    assert (record["samples"], record["joules_per_sample"]) == (640, 62.5)


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_a_job_that_reports_no_samples_has_no_energy_per_sample(encoding: str) -> None:
    tracker = run(encoding, samples=None)
    assert "gpumond_job_energy_per_sample_joules" not in {s.name for s in tracker.series()}
    record = tracker.view()["jobs"][0]
    assert (record["steps"], record["samples"], record["joules_per_sample"]) == (10, 0, None)
