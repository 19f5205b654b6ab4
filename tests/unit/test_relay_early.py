"""The relay forwards a rank's early push at once: a round soon after it (one for a burst of the job's ranks, at most
one a second), for that job only, and never to a shard that is failing (an outage never raises the request rate).

The relay's real parts (listener, buffer, sender) against the rules service's real ingest (httpx's in-process
transport); time and the agent's scheduler are the tests' (FakeClock, Deferred): nothing sleeps."""

from __future__ import annotations

import json

import httpx
import pytest

from gpumond.agent.relay import Relay
from gpumond.agent.relay.early import COALESCE_S, MAX_KEYS, MIN_GAP_S, EarlyRounds
from gpumond.agent.relay.stats import RelayStats
from gpumond.config.agent import RelayConfig
from gpumond.web.client import Access
from gpumond.wire.media import EARLY_HEADER
from tests.fakes import Deferred, FakeClock
from tests.unit.test_relay_endpoint import push, send
from tests.unit.test_relay_sender import TOKEN, service

GPU = "GPU-00000000-0000-0000-0000-0000000000"
EARLY = {EARLY_HEADER: "1"}


class Upstream:
    """The rules service's ingest, answering every batch, or 503 while `down`; keeps each batch's job and pushes."""

    def __init__(self) -> None:
        self.ingest, self._handle = service()
        self.down = False
        self.batches: list[tuple[str, int]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if self.down:
            return httpx.Response(503, json={"error": "restarting"})
        batch = json.loads(request.content)
        self.batches.append((batch["job"], len(batch["pushes"]["rank"])))
        return self._handle(request)


def relay(upstream: Upstream) -> tuple[Relay, Deferred, FakeClock]:
    deferred, clock = Deferred(), FakeClock()
    r = Relay(RelayConfig(upstream="http://rules:9481"), node="n", devices=dict, access=Access(), defer=deferred,
              clock=clock, client=httpx.Client(transport=httpx.MockTransport(upstream)))
    return r, deferred, clock


def rank_push(r: Relay, job: str, rank: int, headers: dict[str, str] | None = None, step: int = 0) -> None:
    body = push(rank, job=job, gpu_uuid=f"{GPU}{rank:02x}",
                steps=[{"step": step, "end": 1_763_760_000.0, "duration_s": 1.0, "data_wait_s": 0.1}])
    answer = send(r, body, {"Authorization": f"Bearer {TOKEN}", **(headers or {})})
    assert answer.status_code == 202, answer.text


def test_an_early_push_goes_in_a_round_soon_after_for_its_job_only() -> None:
    upstream = Upstream()
    r, deferred, _ = relay(upstream)
    rank_push(r, "calm", 0)
    assert deferred.calls == []  # a regular push waits for the regular round
    rank_push(r, "fault", 0, EARLY)
    assert [delay for delay, _ in deferred.calls] == [COALESCE_S] and upstream.batches == []
    deferred.run_next()
    assert upstream.batches == [("fault", 1)] and r.stats.early_rounds == 1
    assert [e.rank for e in r.buffer.held()] == [("calm", 0)]  # the other job keeps its cadence
    r.flush()  # the regular round
    assert upstream.batches == [("fault", 1), ("calm", 1)] and r.buffer.count == 0
    assert sum(len(w.steps) for w in upstream.ingest.ranks.jobs(1_763_760_000.0)["fault"].values()) == 1


def test_a_burst_of_the_jobs_early_pushes_goes_in_one_round() -> None:
    """Every rank of a job sees the same long step and pushes early within milliseconds: one batch, not eight."""
    upstream = Upstream()
    r, deferred, _ = relay(upstream)
    for rank in range(8):
        rank_push(r, "fault", rank, EARLY)
    assert len(deferred.calls) == 1
    deferred.run_next()
    assert upstream.batches == [("fault", 8)] and r.stats.early_rounds == 1


def test_early_rounds_come_at_most_once_a_second() -> None:
    upstream = Upstream()
    r, deferred, clock = relay(upstream)
    rank_push(r, "fault", 0, EARLY)
    deferred.run_next()
    clock.advance(0.3)
    rank_push(r, "fault", 0, EARLY, step=1)
    rank_push(r, "fault", 1, EARLY, step=1)
    # Deferred to a second after the previous round, not dropped: the push still goes before the regular round.
    assert [delay for delay, _ in deferred.calls] == [pytest.approx(MIN_GAP_S - 0.3)]
    clock.advance(MIN_GAP_S - 0.3)
    deferred.run_next()
    assert upstream.batches == [("fault", 1), ("fault", 2)] and r.stats.early_rounds == 2
    assert deferred.calls == []


def test_early_pushes_held_while_a_round_runs_get_the_next_round() -> None:
    clock, deferred = FakeClock(), Deferred()
    sent: list[frozenset] = []
    rounds: EarlyRounds

    def send_round(keys: frozenset) -> None:
        sent.append(keys)
        if len(sent) == 1:
            rounds.asked(("b", None))  # a push that arrived while this round was sending

    rounds = EarlyRounds(send_round, deferred, clock, RelayStats(clock))
    rounds.asked(("a", None))
    rounds.asked(("a", None))
    deferred.run_next()
    assert sent == [frozenset({("a", None)})]
    assert [delay for delay, _ in deferred.calls] == [MIN_GAP_S]
    deferred.run_next()
    assert sent[1] == frozenset({("b", None)}) and deferred.calls == []
    clock.advance(MIN_GAP_S)
    rounds.asked(("c", None))  # idle again: a new burst is scheduled as the first was
    assert [delay for delay, _ in deferred.calls] == [COALESCE_S]


def test_an_early_round_never_sends_to_a_failing_shard() -> None:
    """A shard that did not take the relay's last batch hears from it only on the regular rounds, once per
    relay.interval_s, even after its pause is over: early pushes never raise the request rate of an outage."""
    upstream = Upstream()
    r, deferred, clock = relay(upstream)
    upstream.down = True
    rank_push(r, "fault", 0)
    assert r.sender.flush() is False  # 503: paused at most the backoff's cap (4 s)
    requests = r.stats.errors["http_5xx"]
    rank_push(r, "fault", 1, EARLY)
    deferred.run_next()  # while paused
    clock.advance(5.0)
    rank_push(r, "fault", 2, EARLY)
    deferred.run_next()  # pause over, still failing
    assert r.stats.errors["http_5xx"] == requests == 1 and r.stats.early_rounds == 2
    upstream.down = False
    r.flush()  # the regular round tries the shard, which takes the batch
    assert upstream.batches == [("fault", 3)]
    clock.advance(MIN_GAP_S)
    rank_push(r, "fault", 3, EARLY)
    deferred.run_next()
    assert upstream.batches == [("fault", 3), ("fault", 1)]  # it answers again: early rounds send to it again


@pytest.mark.parametrize("value", ["0", "yes", ""])
def test_only_an_early_header_of_1_on_a_held_push_asks_for_a_round(value: str) -> None:
    r, deferred, _ = relay(Upstream())
    rank_push(r, "fault", 0, {EARLY_HEADER: value})
    refused = send(r, push(0, job="fault"), {"Authorization": f"Bearer {TOKEN}", **EARLY})  # no GPU to place it on
    assert refused.status_code == 422
    assert deferred.calls == []


def test_early_rounds_are_counted_in_the_relays_metrics() -> None:
    r, deferred, _ = relay(Upstream())
    rank_push(r, "fault", 0, EARLY)
    deferred.run_next()
    assert [s.value for s in r.series() if s.name == "gpumond_relay_early_rounds_total"] == [1.0]


def test_the_jobs_waiting_for_an_early_round_are_bounded() -> None:
    """Any client reaching the relay names its own jobs; past MAX_KEYS their early pushes wait for the regular round."""
    clock, deferred = FakeClock(), Deferred()
    sent: list[frozenset] = []
    rounds = EarlyRounds(sent.append, deferred, clock, RelayStats(clock))
    for i in range(MAX_KEYS + 10):
        rounds.asked((f"job-{i}", None))
    deferred.run_next()
    assert len(sent[0]) == MAX_KEYS and ("job-0", None) in sent[0]


def test_a_round_the_scheduler_cannot_take_is_asked_for_again_by_the_next_early_push() -> None:
    clock, deferred = FakeClock(), Deferred()
    sent: list[frozenset] = []
    refusals = [RuntimeError("scheduler shut down")]

    def defer(delay_s: float, fn) -> None:  # type: ignore[no-untyped-def]
        if refusals:
            raise refusals.pop()
        deferred(delay_s, fn)

    rounds = EarlyRounds(sent.append, defer, clock, RelayStats(clock))
    rounds.asked(("a", None))
    assert deferred.calls == []
    rounds.asked(("b", None))
    deferred.run_next()
    assert sent == [frozenset({("a", None), ("b", None)})]
