"""End of job: a job that ends (or crashes) is never paged as hung; one that hangs still is.

The rules service's real stores, evaluator and alert lifecycle on an injected clock; pushes go through the
ingest's parser (the `final` field) or straight into the store; GPU telemetry is written into the GPU store.
"""

from __future__ import annotations

import json

from gpumond.alerts.pipeline import log_only
from gpumond.config.rules import RulesConfig
from gpumond.rules.evaluator import Evaluator
from gpumond.rules.findings import FINDINGS_PERSISTENCE
from gpumond.rules.ingest.accept import Client, Ingest, Reply
from gpumond.rules.store import GpuStore, RankStore
from gpumond.rules.types import GpuSample, RankInfo, StepRecord, TelemetryBatch

T0 = 1_763_760_000.0
JOB, WORLD, NODE = "llama-7b", 4, "node-0"
UUIDS = [f"GPU-5b0c1234-aaaa-bbbb-cccc-0123456789{r:02x}" for r in range(WORLD)]
CONFIG = RulesConfig.model_validate({"tokens": ["push-token-0123456789"]})


class Service:
    """Stores + evaluator on a clock that the test moves; steps of 0.5 s, telemetry every 5 s."""

    def __init__(self) -> None:
        self.t = T0
        self.ranks, self.gpus = RankStore.from_config(CONFIG), GpuStore.from_config(CONFIG)
        self.alerts = log_only(persistence=FINDINGS_PERSISTENCE)
        self.evaluator = Evaluator(self.ranks, self.gpus, None, alerts=self.alerts, clock=lambda: self.t)
        self.step = 0
        self.seen: list[tuple[float, str, str]] = []  # (t, kind, state)
        self.ingest = Ingest(config=CONFIG, store=self.ranks, clock=lambda: self.t)

    def info(self, r: int) -> RankInfo:
        return RankInfo(JOB, r, WORLD, NODE, UUIDS[r])

    def run(self, seconds: float, *, stepping: bool, beats: bool = False, gpu_jobs: tuple[str, ...] = ()) -> None:
        """Advance in 1 s ticks: steps (or heartbeats) pushed every 5 s, telemetry every 5 s (GPUs busy, as a
        simulated or shared GPU reads after the job is gone), an evaluation every 10 s."""
        pending: list[StepRecord] = []
        for _ in range(int(seconds)):
            self.t += 1.0
            if stepping:
                pending += [StepRecord(self.step, self.t - 0.5, 0.5, 0.01), StepRecord(self.step + 1, self.t, 0.5, 0.01)]
                self.step += 2
            if int(self.t) % 5 == 0:
                if pending or beats:
                    for r in range(WORLD):
                        self.ranks.store(self.info(r), pending, self.t)
                pending = []
                self.gpus.add(TelemetryBatch(self.t, tuple(
                    GpuSample(u, NODE, str(i), self.t, True, {"utilization": 0.99, "power_w": 600.0,
                                                              "power_limit_w": 700.0}, jobs=gpu_jobs)
                    for i, u in enumerate(UUIDS))))
            if int(self.t) % 10 == 0:
                for f in self.evaluator.evaluate():
                    self.seen.append((self.t, f.kind, f.state))

    def final(self, r: int) -> Reply:
        body = {"job": JOB, "rank": r, "world_size": WORLD, "node": NODE, "gpu_uuid": UUIDS[r], "steps": [],
                "final": True}
        return self.ingest.accept(Client("token#0", "10.0.0.1"), json.dumps(body).encode())

    def hung(self) -> list[tuple[float, str, str]]:
        return [s for s in self.seen if s[1] == "hung_rank"]


def test_a_job_that_ends_with_close_is_released_and_never_paged() -> None:
    svc = Service()
    svc.run(60, stepping=True)
    for r in range(WORLD):
        assert svc.final(r) == Reply(202, {"accepted": 0})
    assert svc.ranks.counts().jobs == 0 and svc.ranks.counts().ranks == 0 and svc.ranks.counts().steps == 0
    svc.run(120, stepping=False)
    assert svc.hung() == [] and svc.evaluator.jobs_ended_total == 1
    assert JOB not in svc.evaluator._state.baselines  # the detectors' state for it is released too


def test_a_crashed_job_that_stopped_pushing_is_not_paged() -> None:
    svc = Service()
    svc.run(60, stepping=True, beats=True)
    svc.run(120, stepping=False)  # SIGKILL: no final push, no heartbeat; the GPUs still read busy
    assert svc.hung() == []


def test_a_hung_job_pages_and_its_page_resolves_at_once_when_torchrun_tears_it_down() -> None:
    svc = Service()
    svc.run(60, stepping=True, beats=True)
    svc.run(60, stepping=False, beats=True)  # processes alive (heartbeats), no step: hung
    assert any(state == "firing" for _, _, state in svc.hung()), svc.seen
    firing = [a for a in svc.alerts.alerts() if a.state == "firing" and a.alertname == "TrainingRankHung"]
    assert len(firing) == 1
    for r in range(WORLD):  # torchrun's teardown: SIGTERM, and the SDK's handler sends the final push
        svc.final(r)
    svc.t += 1.0
    svc.evaluator.evaluate()
    assert [a.state for a in svc.alerts.alerts() if a.alertname == "TrainingRankHung"] == ["resolved"]
    assert svc.evaluator.findings() == ()


def test_a_hung_job_without_heartbeats_pages_when_the_agents_see_its_processes_on_the_gpus() -> None:
    svc = Service()
    svc.run(60, stepping=True, gpu_jobs=(JOB,))
    svc.run(60, stepping=False, gpu_jobs=(JOB,))
    assert any(state == "firing" for _, _, state in svc.hung()), svc.seen


def test_final_is_a_strict_boolean_and_one_rank_ending_keeps_the_job() -> None:
    svc = Service()
    svc.run(20, stepping=True)
    bad = {"job": JOB, "rank": 0, "world_size": WORLD, "node": NODE, "gpu_uuid": UUIDS[0], "steps": [],
           "final": "yes"}
    reply = svc.ingest.accept(Client("token#0", "10.0.0.1"), json.dumps(bad).encode())
    assert reply.status == 422 and "final" in json.dumps(reply.body), reply
    svc.final(0)
    assert svc.ranks.counts().jobs == 1 and svc.ranks.take_ended() == frozenset()
    assert svc.ranks.jobs(svc.t)[JOB][0].ended
