"""Power-slack offers in the rules service (gpumond/rules/energy/planner.py): from the detectors' compute shares
and each GPU's measured operating points, per node; withdrawn at once when the job's step time rises."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from gpumond.config.rules import PowerSlackRulesConfig, RulesConfig
from gpumond.rules.detectors.features import RankFeatures
from gpumond.rules.energy.planner import SlackPlanner
from gpumond.rules.service import RulesService
from gpumond.rules.types import GpuSample, TelemetryBatch, TelemetryNeed

UUIDS = [f"GPU-5b0c3b0a-0000-4000-8000-00000000000{i}" for i in range(4)]


class World:
    """What the planner reads: the detectors' features of one 4-rank job and its GPUs' recent samples."""

    def __init__(self) -> None:
        self.t = 1000.0
        self.step_s = 1.0
        self.shares = [0.75, 0.75, 0.75, 0.95]  # rank 3 is the slowest: the others wait on it
        self.comm_timed = True
        self.limits = dict.fromkeys(UUIDS, 700.0)
        self.last_end: float | None = None  # None: steps end as time goes

    def features(self) -> dict:
        return {"llama": tuple(RankFeatures(rank=i, node="node-1", gpu_uuid=u, group=None, steps=50,
                                            step_time_s=self.step_s, wait_frac=0.0,
                                            last_end=self.t if self.last_end is None else self.last_end,
                                            last_push=self.t, compute_frac=self.shares[i] if self.comm_timed else None)
                               for i, u in enumerate(UUIDS))}

    def window(self, uuid: str, since: float) -> list[GpuSample]:
        limit = self.limits[uuid]
        # The H100 curve under a limit: the clock falls until idle + dyn·(f/f_max)^2.5 fits it.
        f = 1980e6 * min(1.0, ((limit - 75) / 615) ** 0.4)
        values = {"power_limit_w": limit, "sm_clock_hz": f, "power_w": min(690.0, limit), "utilization": 0.97}
        return [GpuSample(uuid, "node-1", str(UUIDS.index(uuid)), self.t - k, True, values) for k in range(10)]

    def clock(self) -> float:
        return self.t


def planner(world: World) -> SlackPlanner:
    return SlackPlanner(PowerSlackRulesConfig(), world.features, world.window, world.clock, 60.0)


def plan(p: SlackPlanner, world: World, times: int) -> None:
    for _ in range(times):
        world.t += 10
        p.plan()


SETTLED = 7  # evaluations 10 s apart until a GPU's measurements span the detectors' 60 s window


def test_the_gpus_that_wait_are_offered_a_step_down_once_measured() -> None:
    world = World()
    p = planner(world)
    plan(p, world, SETTLED - 1)
    assert p.offers("node-1") == []  # the baseline is learnt, the measurements do not span recent_s yet
    plan(p, world, 1)
    offers = p.offers("node-1")
    assert [o["gpu_uuid"] for o in offers] == UUIDS[:3]
    assert all(o["basis"] == "probe" and o["limit_w"] == 640.0 and o["job"] == "llama" for o in offers)
    assert p.offers("node-2") == []
    names = {s.name for s in p.series()}
    assert {"gpumond_power_slack_offer_watts", "gpumond_power_slack_offering"} <= names


def test_after_a_limit_changes_the_offer_holds_it_until_the_measurements_are_of_it() -> None:
    world = World()
    p = planner(world)
    plan(p, world, SETTLED)
    for u in UUIDS[:3]:
        world.limits[u] = 640.0  # the agents applied the probe
    plan(p, world, SETTLED - 1)
    assert {(o["basis"], o["limit_w"]) for o in p.offers("node-1")} == {("hold", 640.0)}
    plan(p, world, 1)
    offers = p.offers("node-1")
    assert {o["basis"] for o in offers} == {"probe"} and all(o["limit_w"] < 640.0 for o in offers)


def test_a_rising_step_time_withdraws_every_offer_at_once() -> None:
    world = World()
    p = planner(world)
    plan(p, world, SETTLED)
    assert p.offers("node-1")
    world.step_s = 1.02  # above the baseline by more than half the 2 % margin
    plan(p, world, 1)
    assert p.offers("node-1") == []
    world.step_s = 1.0
    plan(p, world, 20)
    assert p.offers("node-1") == []  # held off for hold_s (600 s)
    assert ("gpumond_power_slack_backoffs_total", 1.0) in [(s.name, s.value) for s in p.series()]


def test_a_job_whose_steps_stopped_gets_nothing() -> None:
    world = World()
    p = planner(world)
    plan(p, world, SETTLED)
    assert p.offers("node-1")
    world.last_end = world.t
    plan(p, world, 6)
    assert p.offers("node-1")  # within the recent window (60 s)
    plan(p, world, 1)
    assert p.offers("node-1") == []


def test_a_job_without_comm_wait_gets_nothing() -> None:
    world = World()
    world.comm_timed = False
    p = planner(world)
    plan(p, world, 10)
    assert p.offers("node-1") == []


def test_the_service_serves_offers_per_node_and_wants_the_node(tmp_path) -> None:
    service = RulesService(RulesConfig.model_validate({"tokens": ["t" * 32], "state_dir": str(tmp_path)}))
    try:
        async def get(path: str) -> httpx.Response:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=service.app),
                                         base_url="http://rules") as client:
                return await client.get(path)

        ok = asyncio.run(get("/api/v1/power/offers?node=node-1"))
        assert ok.status_code == 200 and ok.json() == {"offers": []}
        bad = asyncio.run(get("/api/v1/power/offers"))
        assert bad.status_code == 400 and "node: required" in bad.text
    finally:
        service.stop()


def test_the_gpus_offered_a_limit_are_steered() -> None:
    world = World()
    p = planner(world)
    plan(p, world, SETTLED - 1)
    assert p.steered() == frozenset()
    plan(p, world, 1)
    assert p.steered() == frozenset(UUIDS[:3])
    world.step_s = 1.02  # withdrawn: no longer steered
    plan(p, world, 1)
    assert p.steered() == frozenset()


class Needs:
    """A telemetry source that says what each fetch was asked for (its answers: no GPU)."""

    name = "recording"

    def __init__(self) -> None:
        self.asked: list[TelemetryNeed | None] = []

    def fetch(self, need: TelemetryNeed | None = None) -> TelemetryBatch:
        self.asked.append(need)
        return TelemetryBatch(0.0, ())

    def close(self) -> None:
        pass


def test_the_gpus_offered_a_limit_are_fetched_every_fetch_as_suspects_are(tmp_path) -> None:
    """With telemetry.prometheus.detail_s, a GPU that is no suspect is read only every detail_s: an offered GPU
    must be read every fetch, or its recent window runs empty between detail fetches, its offer is withdrawn
    and its lease ends (then steps down again from the top)."""
    source = Needs()
    service = RulesService(RulesConfig.model_validate({"tokens": ["t" * 32], "state_dir": str(tmp_path)}),
                           source=source)
    try:
        world = World()
        service.slack = planner(world)  # the service reads the planner it holds at each evaluation
        plan(service.slack, world, SETTLED)
        service.evaluator.evaluate()
        service.evaluator.poll_telemetry()
        assert source.asked[-1] is not None and source.asked[-1].suspects == frozenset(UUIDS[:3])
    finally:
        service.stop()


def test_a_plan_that_fails_withdraws_every_offer() -> None:
    """Offers left standing by a failing plan would be renewed by the agents for as long as it fails: the leases
    would never run out, even after the job ended."""
    world = World()
    failing = False

    def features() -> dict:
        if failing:
            raise RuntimeError("a planning bug")
        return world.features()

    p = SlackPlanner(PowerSlackRulesConfig(), features, world.window, world.clock, 60.0)
    plan(p, world, SETTLED)
    assert p.offers("node-1")
    failing = True
    with pytest.raises(RuntimeError):
        p.plan()
    assert p.offers("node-1") == [] and p.steered() == frozenset()
