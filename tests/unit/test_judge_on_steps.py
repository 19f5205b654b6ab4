"""Jobs judged as their steps land (Evaluator.judge_arrivals, gpumond/rules/cadence.py): a job with new steps is
judged at once, at most every min_interval_s; a job with nothing new is not judged; the others keep their
findings; passes rest so that they take at most max_busy of a core. Real stores and evaluator, injected clocks."""

from __future__ import annotations

from gpumond.alerts.pipeline import log_only
from gpumond.config.rules import OnStepsConfig, RulesConfig
from gpumond.rules.cadence import due, rest_after
from gpumond.rules.evaluator import Evaluator
from gpumond.rules.findings import FINDINGS_PERSISTENCE
from gpumond.rules.store import GpuStore, RankStore
from gpumond.rules.types import RankInfo, StepRecord

T0 = 1_763_760_000.0
CONFIG = RulesConfig.model_validate({"tokens": ["push-token-0123456789"]})
WORLD = 8


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def service(cadence: OnStepsConfig = OnStepsConfig(), shard: tuple[int, int] | None = None,
            timer=None) -> tuple[RankStore, Evaluator, Clock]:
    clock = Clock(T0)
    ranks, gpus = RankStore.from_config(CONFIG), GpuStore.from_config(CONFIG)
    kw = {"timer": timer} if timer is not None else {}
    ev = Evaluator(ranks, gpus, None, alerts=log_only(persistence=FINDINGS_PERSISTENCE), clock=clock,
                   cadence=cadence, shard=shard, **kw)
    return ranks, ev, clock


def push(ranks: RankStore, job: str, first: int, count: int, now: float, starved: int | None = None) -> None:
    """`count` steps of 0.5 s from step `first` for every rank, ending by `now`; rank `starved` waits half."""
    for r in range(WORLD):
        wait = 0.25 if r == starved else 0.002
        steps = [StepRecord(k, now - 0.5 * (first + count - 1 - k), 0.5, wait) for k in range(first, first + count)]
        ranks.record(RankInfo(job, r, WORLD, f"node-{r // 4}", f"GPU-{job}-{r:02d}"), steps, now)


def test_a_job_is_judged_when_its_steps_land_and_not_when_nothing_is_new():
    ranks, ev, clock = service()
    push(ranks, "a", 0, 20, clock.t, starved=5)
    rest, next_in = ev.judge_arrivals()
    assert ev.judgements_on_steps == 1 and ev.evaluations == 0 and next_in is None
    assert [(f.kind, f.rank) for f in ev.findings()] == [("io_starved_rank", 5)]
    clock.t += 5.0
    ev.judge_arrivals()  # nothing landed: nothing judged
    assert ev.judgements_on_steps == 1


def test_pushes_within_the_minimum_interval_coalesce_into_one_judgement_when_it_has_passed():
    ranks, ev, clock = service(OnStepsConfig(min_interval_s=1.0))
    push(ranks, "a", 0, 20, clock.t)
    ev.judge_arrivals()
    clock.t += 0.25
    push(ranks, "a", 20, 1, clock.t)
    clock.t += 0.25
    push(ranks, "a", 21, 1, clock.t)
    _, next_in = ev.judge_arrivals()
    assert ev.judgements_on_steps == 1 and next_in == 0.5  # waits for the rest of its interval
    clock.t += 0.5
    _, next_in = ev.judge_arrivals()
    assert ev.judgements_on_steps == 2 and next_in is None  # both pushes, one judgement


def test_a_job_judged_on_its_steps_leaves_the_other_jobs_findings_as_they_are():
    ranks, ev, clock = service()
    push(ranks, "a", 0, 20, clock.t, starved=5)
    push(ranks, "b", 0, 20, clock.t)
    ev.judge_arrivals()
    assert ev.judgements_on_steps == 2
    before = ev.findings()
    clock.t += 2.0
    push(ranks, "b", 20, 4, clock.t)
    ev.judge_arrivals()
    assert ev.judgements_on_steps == 3
    assert [(f.job, f.kind, f.rank, f.since) for f in ev.findings()] == \
        [(f.job, f.kind, f.rank, f.since) for f in before] == [("a", "io_starved_rank", 5, T0)]


def test_a_job_of_another_shard_is_not_judged_here():
    ranks, ev, clock = service(shard=(0, 2))
    mine = next(j for j in (f"job-{i}" for i in range(64)) if ev.owns(j))
    other = next(j for j in (f"job-{i}" for i in range(64)) if not ev.owns(j))
    push(ranks, other, 0, 20, clock.t)
    ev.judge_arrivals()
    assert ev.judgements_on_steps == 0
    push(ranks, mine, 0, 20, clock.t)
    ev.judge_arrivals()
    assert ev.judgements_on_steps == 1


def test_a_pass_rests_so_that_passes_take_at_most_max_busy_of_a_core():
    ticks = iter([10.0, 10.2])  # the pass took 0.2 s
    ranks, ev, clock = service(OnStepsConfig(max_busy=0.25), timer=lambda: next(ticks))
    push(ranks, "a", 0, 20, clock.t)
    rest, _ = ev.judge_arrivals()
    assert abs(rest - 0.6) < 1e-9  # 0.2 s of 0.8 s


def test_the_periodic_evaluation_takes_what_landed_so_it_is_not_judged_again():
    ranks, ev, clock = service()
    push(ranks, "a", 0, 20, clock.t)
    ev.judge_arrivals()
    clock.t += 0.5
    push(ranks, "a", 20, 1, clock.t)
    _, next_in = ev.judge_arrivals()  # waits for its interval…
    assert next_in == 0.5
    push(ranks, "a", 21, 1, clock.t)
    ev.evaluate()  # …and the periodic evaluation judges it meanwhile, with what has landed since
    clock.t += 2.0
    ev.judge_arrivals()
    assert ev.evaluations == 1 and ev.judgements_on_steps == 1


def test_due_splits_waiting_jobs_by_their_minimum_interval():
    d = due({"a": 1.0, "b": 2.0, "c": 3.0}, {"a": 9.5, "b": 8.0}, 10.0, 1.0)
    assert d.now == {"b", "c"} and dict(d.waiting) == {"a": 1.0} and d.next_at == 10.5
    assert due({}, {}, 10.0, 1.0) == due({}, {"a": 1.0}, 10.0, 1.0)
    assert rest_after(0.3, 1.0) == 0.0 and abs(rest_after(0.3, 0.5) - 0.3) < 1e-12


def test_the_service_judges_a_job_as_its_steps_land_between_its_periodic_evaluations(tmp_path) -> None:
    import time

    from gpumond.rules.service import RulesService

    cfg = RulesConfig.model_validate({"tokens": ["t" * 32], "state_dir": str(tmp_path),
                                      "evaluation_interval_s": 3600})
    svc = RulesService(cfg)
    svc.start()
    try:
        deadline = time.monotonic() + 10.0
        while svc.evaluator.evaluations == 0 and time.monotonic() < deadline:
            time.sleep(0.02)  # the periodic evaluation at start has run: the next is an hour away
        push(svc.ranks, "a", 0, 20, time.time())
        while svc.evaluator.judgements_on_steps == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert svc.evaluator.judgements_on_steps == 1
        assert b"gpumond_rules_judgements_on_steps_total 1" in svc.metrics()
    finally:
        svc.stop()
    off = RulesService(cfg.model_copy(update={"judge_on_steps": OnStepsConfig(enabled=False)}))
    off.start()
    off.stop()
    assert off._on_steps is None


def test_a_failing_judgement_on_arrival_is_counted_and_reported_as_a_failing_evaluation_is():
    class Broken(RankStore):
        def take_fresh(self):
            raise RuntimeError("store broke")

    ranks = Broken.from_config(CONFIG)
    ev = Evaluator(ranks, GpuStore.from_config(CONFIG), None, clock=lambda: T0)
    assert ev.run_on_steps() == (1.0, None)  # rest a second, then try again
    ok, line = ev.evaluation_status()
    assert ev.evaluation_failures_total == 1 and "store broke" in line


def _synchronous(ranks: RankStore, first: int, count: int, now: float, slow: dict[int, float]) -> None:
    """`count` synchronous 0.5 s steps (ending by `now`) from step `first`: rank r computes 0.4 s × slow.get(r, 1)
    (± 2 %, fixed per rank and step), and every rank waits in the collective for the slowest."""
    for k in range(first, first + count):
        busy = [0.4 * slow.get(r, 1.0) * (1 + 0.02 * (((r * 7 + k * 13) % 11) / 5 - 1)) for r in range(WORLD)]
        step = max(busy) + 0.1
        end = now - step * (first + count - 1 - k)
        for r in range(WORLD):
            ranks.record(RankInfo("a", r, WORLD, f"node-{r // 4}", f"GPU-a-{r:02d}"),
                         [StepRecord(k, end, step, 0.002, None, step - busy[r] - 0.002)], now)


def _fetch(gpus: GpuStore, times: list[float], throttled: set[int]) -> None:
    """One fetch: a sample at each of `times` for every GPU of job "a", those of `throttled` ranks showing a reason."""
    from gpumond.rules.types import GpuSample, TelemetryBatch

    samples = tuple(
        GpuSample(f"GPU-a-{r:02d}", f"node-{r // 4}", str(r % 4), t, True,
                  {"sm_clock_hz": 1.98e9, "sm_clock_max_hz": 1.98e9, "power_w": 600.0, "power_limit_w": 700.0,
                   "utilization": 0.99, "temperature_c": 70.0, "throttle_hw_thermal": 0.0,
                   "throttle_sw_thermal": 0.0, "throttle_hw_power_brake": 0.0,
                   "throttle_hw_slowdown": float(r in throttled)})
        for t in times for r in range(WORLD))
    gpus.add(TelemetryBatch(times[-1], samples))


def test_a_judgement_on_arrival_reads_a_fetch_that_landed_since_the_periodic_evaluation() -> None:
    # Rank 5's GPU began to throttle, and its steps to run 1.5x, after the periodic evaluation: a fetch and six slow
    # steps (3 s, under the 10 s a silent straggler waits) land before the next. The judgement on arrival measures
    # the GPUs again for that fetch, so the cause on the GPU counts and the straggler fires at once.
    clock = Clock(T0)
    ranks, gpus = RankStore.from_config(CONFIG), GpuStore.from_config(CONFIG)
    ev = Evaluator(ranks, gpus, None, alerts=log_only(persistence=FINDINGS_PERSISTENCE), clock=clock)
    _fetch(gpus, [T0 - 55 + 5 * i for i in range(12)], set())
    _synchronous(ranks, 0, 100, T0, {})
    ev.evaluate()
    assert ev.findings() == ()
    clock.t = T0 + 4.0
    _fetch(gpus, [T0 + 2.0, T0 + 4.0], {5})
    _synchronous(ranks, 100, 6, clock.t, {5: 1.5})
    ev.judge_arrivals()
    (f,) = ev.findings()
    assert (f.kind, f.rank, f.state) == ("straggler", 5, "firing")
    assert f.evidence["signals"]["sequential"]["gpu_cause"] == ["hw_slowdown"]
