"""The relay's sender against the rules service's real ingest decisions (through httpx's in-process transport):
batches per job, routed by shard, Retry-After and backoff honoured, refusals dropped and owed to their ranks."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable

import httpx

from gpumond.agent.relay.buffer import ENTRY_OVERHEAD, Buffer, Entry
from gpumond.agent.relay.stats import RelayStats
from gpumond.agent.relay.upstream import BACKOFF_CAP_S, MAX_REFUSALS, REFUSAL_HOLD_S, Sender
from gpumond.config.rules import RulesConfig
from gpumond.rules.ingest.accept import Ingest, Reply
from gpumond.rules.store import RankStore
from gpumond.web.client import Access
from gpumond.wire.retry import Backoff
from gpumond.wire.routing import shard_of
from tests.fakes import FakeClock
from tests.push_bodies import encode

TOKEN = "push-token-0123456789"
NOW = 1_763_760_000.0
UUID = "GPU-5b0c1234-aaaa-bbbb-cccc-0123456789"


def line(job: str, rank: int, first: int = 0, count: int = 2, **over: object) -> bytes:
    data = {"job": job, "rank": rank, "world_size": 8, "node": "n", "gpu_uuid": f"{UUID}{rank:02x}",
            "steps": [{"step": first + i, "end": NOW, "duration_s": 1.0, "data_wait_s": 0.1} for i in range(count)],
            **over}
    raw = encode(data, "columns")
    assert raw is not None
    return raw


def service() -> tuple[Ingest, Callable[[httpx.Request], httpx.Response]]:
    config = RulesConfig.model_validate({"tokens": [TOKEN]})
    ingest = Ingest(config=config, store=RankStore.from_config(config), clock=FakeClock(NOW))

    def handle(request: httpx.Request) -> httpx.Response:
        admitted = ingest.admit(authorization=request.headers.get("authorization"), address="127.0.0.1",
                                content_type=request.headers.get("content-type"), content_encoding=None,
                                content_length=request.headers.get("content-length"))
        reply = admitted if isinstance(admitted, Reply) else ingest.accept(admitted, request.content)
        return httpx.Response(reply.status, json=reply.body, headers=dict(reply.headers))

    return ingest, handle


def make(handler: Callable[[httpx.Request], httpx.Response], *, shards: int | None = None,
         upstream: str = "http://rules:9481") -> tuple[Sender, Buffer, RelayStats, FakeClock]:
    clock = FakeClock()
    buffer = Buffer(1 << 20, 600, clock)
    stats = RelayStats(clock)
    client = httpx.Client(transport=httpx.MockTransport(handler))
    sender = Sender(buffer=buffer, stats=stats, upstream=upstream, shards=shards, access=Access(), client=client,
                    clock=clock, backoff=lambda: Backoff(1.0, 8.0, jitter=0))
    return sender, buffer, stats, clock


def hold(buffer: Buffer, clock: FakeClock, job: str, rank: int, raw: bytes, steps: int = 2,
         auth: str | None = f"Bearer {TOKEN}") -> Entry:
    e = Entry((job, auth), (job, rank), raw, steps, clock())
    assert buffer.add(e) == []
    return e


def test_each_job_goes_in_one_batch_and_every_step_is_stored() -> None:
    ingest, handle = service()
    seen: list[httpx.Request] = []
    sender, buffer, stats, clock = make(lambda r: seen.append(r) or handle(r))
    for rank in range(4):
        hold(buffer, clock, "a", rank, line("a", rank))
        hold(buffer, clock, "b", rank, line("b", rank))
    assert sender.flush() is True
    assert len(seen) == 2 and {json.loads(r.content)["job"] for r in seen} == {"a", "b"}
    assert stats.forwarded == 16 and buffer.count == 0
    assert sum(len(w.steps) for w in ingest.ranks.jobs(NOW)["a"].values()) == 8


def test_batches_go_to_their_jobs_shard() -> None:
    _, handle = service()
    hosts: list[str] = []
    sender, buffer, _, clock = make(lambda r: hosts.append(r.url.host) or handle(r),
                                    shards=4, upstream="http://rules-{shard}:9481")
    for job in ("a", "b", "c"):
        hold(buffer, clock, job, 0, line(job, 0))
    sender.flush()
    assert sorted(hosts) == sorted(f"rules-{shard_of(j, 4)}" for j in ("a", "b", "c"))


def test_429_holds_everything_for_retry_after_then_delivers_in_order() -> None:
    ingest, handle = service()
    answers = [httpx.Response(429, json={"error": "busy"}, headers={"Retry-After": "5"})]
    sender, buffer, stats, clock = make(lambda r: answers.pop(0) if answers else handle(r))
    hold(buffer, clock, "a", 0, line("a", 0, first=0))
    hold(buffer, clock, "a", 0, line("a", 0, first=2))
    assert sender.flush() is False and buffer.count == 2 and stats.errors["http_429"] == 1
    clock.advance(4.9)
    assert sender.flush() is False and buffer.count == 2  # still paused: no request made
    clock.advance(0.2)
    assert sender.flush() is True and stats.forwarded == 4
    assert list(ingest.ranks.jobs(NOW)["a"][0].columns.step) == [0, 1, 2, 3]


def test_no_answer_backs_off_and_counts() -> None:
    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused")

    sender, buffer, stats, clock = make(down)
    hold(buffer, clock, "a", 0, line("a", 0))
    url = "http://rules:9481/api/v1/push"
    assert sender.flush() is False and sender.paused_until(url) == clock() + 1.0
    clock.advance(1.0)
    sender.flush()
    assert sender.paused_until(url) == clock() + 2.0 and stats.errors["connect"] == 2 and buffer.count == 1


def test_a_refused_push_is_dropped_and_owed_to_its_rank_the_others_delivered() -> None:
    _, handle = service()
    sender, buffer, stats, clock = make(handle)
    hold(buffer, clock, "a", 0, line("a", 0))
    hold(buffer, clock, "a", 9, line("a", 9, world_size=8))  # rank 9 of 8: the service refuses it alone
    sender.flush()
    assert stats.forwarded == 2 and stats.dropped["refused"] == 2
    assert stats.owed(("a", 9), 5) == {"relay_refused": 2} and stats.owed(("a", 0), 5) == {}


def test_the_services_own_drops_reach_the_rank_under_its_names_and_a_retry_s_duplicates_do_not() -> None:
    _, handle = service()
    sender, buffer, stats, clock = make(handle)
    hold(buffer, clock, "a", 0, line("a", 0))
    sender.flush()
    hold(buffer, clock, "a", 0, line("a", 0))  # the same steps again: the service drops them as duplicates
    sender.flush()
    assert stats.owed(("a", 0), 5) == {"duplicate": 2} and stats.dropped["refused"] == 0
    again = hold(buffer, clock, "a", 0, line("a", 0))
    again.attempts = 1  # sent before without an answer: that attempt stored them
    sender.flush()
    assert stats.owed(("a", 0), 5) == {} and stats.forwarded == 4


def test_a_refused_token_is_answered_at_the_relay_in_the_services_words() -> None:
    _, handle = service()
    sender, buffer, stats, clock = make(handle)
    hold(buffer, clock, "a", 0, line("a", 0), auth="Bearer wrong-token-0123456789")
    sender.flush()
    refusal = sender.refusal("Bearer wrong-token-0123456789")
    assert refusal is not None and refusal.status == 401 and refusal.message == "invalid bearer token"
    assert sender.refusal(f"Bearer {TOKEN}") is None and stats.dropped["refused"] == 2
    clock.advance(61)
    assert sender.refusal("Bearer wrong-token-0123456789") is None  # tried upstream again after a while


def test_a_202_without_results_is_sent_again() -> None:
    sender, buffer, stats, clock = make(lambda r: httpx.Response(202, content=b'{"accepted": 2}'))
    hold(buffer, clock, "a", 0, line("a", 0))
    assert sender.flush() is False and stats.errors["bad_answer"] == 1 and buffer.count == 1


def test_a_shard_that_is_down_holds_only_its_own_jobs() -> None:
    ingest, handle = service()
    down = f"rules-{shard_of('a', 2)}"

    def partly(request: httpx.Request) -> httpx.Response:
        if request.url.host == down:
            raise httpx.ConnectError("connection refused")
        return handle(request)

    other = next(j for j in (f"job-{i}" for i in range(50)) if shard_of(j, 2) != shard_of("a", 2))
    sender, buffer, stats, clock = make(partly, shards=2, upstream="http://rules-{shard}:9481")
    hold(buffer, clock, "a", 0, line("a", 0))
    hold(buffer, clock, other, 0, line(other, 0))
    assert sender.flush() is False
    assert stats.forwarded == 2 and [e.rank for e in buffer.held()] == [("a", 0)]


def test_a_held_push_that_is_not_a_columnar_body_is_dropped_and_told_the_others_delivered() -> None:
    ingest, handle = service()
    sender, buffer, stats, clock = make(handle)
    hold(buffer, clock, "a", 0, line("a", 0))
    hold(buffer, clock, "a", 1, b'{"rank": 1, "columns": "damaged on disk"}')
    hold(buffer, clock, "a", 2, line("a", 2))
    assert sender.flush() is True and buffer.count == 0
    assert stats.forwarded == 4 and stats.dropped == {"refused": 2}
    assert sorted(ingest.ranks.jobs(NOW)["a"]) == [0, 2]
    assert stats.owed(("a", 1), 5) == {"relay_refused": 2}


def test_the_default_backoff_is_capped_at_two_intervals_with_full_jitter() -> None:
    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused")

    clock = FakeClock()
    buffer = Buffer(1 << 20, 600, clock)
    sender = Sender(buffer=buffer, stats=RelayStats(clock), upstream="http://rules:9481", shards=None,
                    access=Access(), client=httpx.Client(transport=httpx.MockTransport(down)), clock=clock)
    hold(buffer, clock, "a", 0, line("a", 0))
    url = "http://rules:9481/api/v1/push"
    waits = []
    for _ in range(40):
        sender.flush()
        waits.append(sender.paused_until(url) - clock())
        clock.advance(waits[-1])
    assert max(waits) < BACKOFF_CAP_S == 4.0  # back within a cap of the service's return, however long it was gone
    assert min(waits[8:]) < 1.0 and max(waits[8:]) > 3.0  # spread over the cap: relays do not return together


def _refusing(request: httpx.Request) -> httpx.Response:
    return httpx.Response(401, json={"error": "invalid bearer token"})


def test_refusals_of_credentials_never_seen_again_are_forgotten() -> None:
    """Garbage tokens from anything on the node: each refusal is held for a while, then forgotten, not kept for good."""
    sender, buffer, _, clock = make(_refusing)
    for i in range(300):
        hold(buffer, clock, "a", 0, line("a", 0), auth=f"Bearer garbage-{i:06d}")
    sender.flush()
    assert sender.refusals_held == 300
    clock.advance(REFUSAL_HOLD_S * 10)
    hold(buffer, clock, "a", 0, line("a", 0), auth="Bearer one-more-garbage")
    sender.flush()
    assert sender.refusals_held == 1


def test_the_refusals_held_are_capped_the_oldest_forgotten_first() -> None:
    sender, buffer, _, clock = make(_refusing)
    for i in range(MAX_REFUSALS + 50):
        hold(buffer, clock, "a", 0, line("a", 0), auth=f"Bearer garbage-{i:06d}")
        if i % 1000 == 999:
            sender.flush()  # the buffer holds about 1,200 of these
    sender.flush()
    assert sender.refusals_held == MAX_REFUSALS
    assert sender.refusal("Bearer garbage-000049") is None and sender.refusal("Bearer garbage-000050") is not None


def test_the_stop_flush_keeps_its_deadline_however_many_shards_hang() -> None:
    """Each shard takes the connection and never answers: one send may wait only until the deadline, and no send
    starts after it (before, each hung shard cost a whole client timeout within one round)."""
    clock = FakeClock()
    waits: list[dict[str, float]] = []

    def hung(request: httpx.Request) -> httpx.Response:
        timeout = request.extensions["timeout"]
        waits.append(timeout)
        clock.advance(timeout["read"])  # the whole read timeout passes without an answer
        raise httpx.ReadTimeout("timed out", request=request)

    buffer = Buffer(1 << 20, 600, clock)
    sender = Sender(buffer=buffer, stats=RelayStats(clock), upstream="http://rules-{shard}:9481", shards=4,
                    access=Access(), client=httpx.Client(transport=httpx.MockTransport(hung), timeout=10.0),
                    clock=clock, timer=clock, sleep=clock.advance)
    for shard in range(4):
        job = next(j for j in (f"job-{i}" for i in range(100)) if shard_of(j, 4) == shard)
        hold(buffer, clock, job, 0, line(job, 0))
    deadline = clock() + 1.5
    sender.flush_until(deadline)
    assert len(waits) == 1 and all(w <= 1.5 for w in waits[0].values())
    assert clock() <= deadline and buffer.count == 4  # all still held, to be kept for the next start


def test_a_hung_service_holds_the_stop_flush_only_until_its_deadline() -> None:
    """A real socket on 127.0.0.1 that accepts and never answers, against the real client's 10 s timeout."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        clock = time.monotonic
        buffer = Buffer(1 << 20, 600, clock)
        sender = Sender(buffer=buffer, stats=RelayStats(clock), upstream=f"http://127.0.0.1:{port}", shards=None,
                        access=Access(), client=httpx.Client(timeout=10.0), clock=clock)
        hold(buffer, FakeClock(clock()), "a", 0, line("a", 0))
        started = clock()
        sender.flush_until(started + 0.5)
        assert clock() - started < 5.0 and buffer.count == 1


def test_a_push_in_flight_is_not_dropped_for_room_so_its_rank_is_never_told_both() -> None:
    """The listener fills the buffer while a batch is in flight: the idle pushes make room, the one being sent is
    delivered and counted once, and its rank hears of no loss."""
    ingest, handle = service()
    clock = FakeClock()
    first = line("a", 0)
    size = len(first) + len(f"Bearer {TOKEN}") + 1 + ENTRY_OVERHEAD
    buffer = Buffer(3 * size, 600, clock)
    stats = RelayStats(clock)
    evicted: list[Entry] = []

    def meanwhile(request: httpx.Request) -> httpx.Response:
        if not evicted:
            for step in (0, 2, 4):  # rank 1's pushes arrive while rank 0's is being sent, as the listener takes them
                for old in buffer.add(Entry(("b", f"Bearer {TOKEN}"), ("b", 1), line("b", 1, first=step), 2, clock())):
                    evicted.append(old)
                    stats.lost(old.rank, old.steps, "buffer_full")
        return handle(request)

    sender = Sender(buffer=buffer, stats=stats, upstream="http://rules:9481", shards=None, access=Access(),
                    client=httpx.Client(transport=httpx.MockTransport(meanwhile)), clock=clock)
    hold(buffer, clock, "a", 0, first)
    sender.flush()
    assert [e.rank for e in evicted] == [("b", 1)]  # the oldest idle push, not the one in flight
    assert stats.owed(("a", 0), 5) == {} and stats.owed(("b", 1), 5) == {"relay_buffer_full": 2}
    assert stats.forwarded == 2 and stats.dropped == {"buffer_full": 2}
    assert len(ingest.ranks.jobs(NOW)["a"][0].columns.step) == 2 and buffer.count == 2


def test_pushes_a_send_could_not_deliver_may_be_dropped_for_room_again() -> None:
    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused")

    clock = FakeClock()
    first = line("a", 0)
    buffer = Buffer(len(first) + len(f"Bearer {TOKEN}") + 1 + ENTRY_OVERHEAD, 600, clock)
    sender = Sender(buffer=buffer, stats=RelayStats(clock), upstream="http://rules:9481", shards=None,
                    access=Access(), client=httpx.Client(transport=httpx.MockTransport(down)), clock=clock)
    old = hold(buffer, clock, "a", 0, first)
    sender.flush()
    assert buffer.add(Entry(old.key, old.rank, line("a", 0, first=2), 2, clock())) == [old]  # the newer push is held
