"""Shard routing: the SDK's choice of address and the service's refusal agree on every job id.

The SDK (gpumond.wire.routing.shard_endpoint) and the service (Ingest, with `shard: I/N`) must put a
job on the same shard, or every push would be refused; both are checked here for many job ids and
shard counts, against replicas built from real configs.
"""

from __future__ import annotations

import binascii
import json
import logging
import random
import string
from collections import deque

import pytest

from gpumond.config.rules import RulesConfig, Shard
from gpumond.job.payload import Record
from gpumond.job.pusher import Pusher
from gpumond.job.settings import ConfigError, resolve_shards
from gpumond.job.transport import Reply as SdkReply
from gpumond.rules.evaluator import Evaluator
from gpumond.rules.ingest.accept import Client, Ingest
from gpumond.rules.store import GpuStore, RankStore
from gpumond.wire.routing import MAX_SHARDS, shard_endpoint, shard_of

TOKEN = "push-token-0123456789"
NOW = 1_763_760_000.0
CLIENT = Client("token#0", "10.0.0.1")
TEMPLATE = "http://gpumond-rules-{shard}.gpumond-rules-shards.gpumond.svc:9481"


def job_ids(n: int, seed: int = 11) -> list[str]:
    """Job ids as schedulers make them (Slurm numbers, torchrun ids, names) plus non-ASCII ones."""
    rng = random.Random(seed)
    alphabet = string.ascii_letters + string.digits + "-_.:/" + "éß中"
    ids = [str(rng.randrange(1, 10**8)) for _ in range(n // 2)]
    ids += ["".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 40))) for _ in range(n - len(ids))]
    return ids


def replica(index: int, count: int | None) -> Ingest:
    """The push decisions of a rules replica configured with `shard: index/count` (or unsharded)."""
    data: dict[str, object] = {"tokens": [TOKEN]}
    if count is not None:
        data["shard"] = f"{index}/{count}"
    config = RulesConfig.model_validate(data)
    return Ingest(config=config, store=RankStore.from_config(config), clock=lambda: NOW)


def body(job: str) -> bytes:
    return json.dumps({"job": job, "rank": 0, "world_size": 1, "node": "n",
                       "gpu_uuid": "GPU-5b0c1234-aaaa-bbbb-cccc-0123456789ab",
                       "steps": [{"step": 0, "end": NOW - 1, "duration_s": 1.0, "data_wait_s": 0.1}]}).encode()


def test_the_hash_is_crc32_of_the_utf8_job_id_as_documented() -> None:
    # docs/deploying.md and the bare-metal examples give this one-liner; it must keep meaning the same shard.
    for job in job_ids(500):
        for n in (1, 2, 3, 4, 7, 64, MAX_SHARDS):
            assert shard_of(job, n) == binascii.crc32(job.encode("utf-8")) % n
    assert [shard_of(j, 4) for j in ("llama-70b-r3", "4242", "train-a")] == [
        binascii.crc32(b"llama-70b-r3") % 4, binascii.crc32(b"4242") % 4, binascii.crc32(b"train-a") % 4]


@pytest.mark.parametrize("count", [2, 3, 5])
def test_the_replica_the_sdk_picks_accepts_and_every_other_refuses(count: int) -> None:
    replicas = [replica(i, count) for i in range(count)]
    for job in job_ids(150, seed=count):
        url = shard_endpoint(TEMPLATE, job, count)
        chosen = int(url.removeprefix("http://gpumond-rules-").split(".")[0])
        statuses = [r.accept(CLIENT, body(job)).status for r in replicas]
        assert statuses == [202 if i == chosen else 421 for i in range(count)], (job, url)


def test_the_evaluator_owns_exactly_what_the_ingest_accepts() -> None:
    count = 4
    for index in range(count):
        shard = Shard(index, count)
        ranks = RankStore.from_config(RulesConfig.model_validate({"tokens": [TOKEN]}))
        evaluator = Evaluator(ranks, GpuStore.from_config(RulesConfig.model_validate({"tokens": [TOKEN]})), None,
                              shard=(shard.index, shard.count))
        ingest = replica(index, count)
        for job in job_ids(100):
            assert evaluator.owns(job) == (ingest.accept(CLIENT, body(job)).status == 202), job


def test_a_misrouted_push_is_refused_before_anything_is_stored_and_counted_by_owner() -> None:
    job = next(j for j in job_ids(50) if shard_of(j, 4) == 3)
    ingest = replica(1, 4)
    reply = ingest.accept(CLIENT, body(job))
    assert reply.status == 421 and reply.headers == ()
    assert reply.body == {
        "error": f"job {job!r} belongs to shard 3 of 4 (crc32(job) mod 4), not this replica (1/4): push to "
                 f"shard 3; the job SDK routes by itself with GPUMOND_SHARDS=4 and {{shard}} in GPUMOND_ENDPOINT",
        "shard": 3, "shards": 4}
    assert ingest.ranks.counts().jobs == 0 and ingest.ranks.counts().steps_accepted == 0
    series = {(s.name, s.labels): s.value for s in ingest.stats.series()}
    assert series[("gpumond_rules_push_requests_total", (("code", "421"),))] == 1
    assert series[("gpumond_rules_push_misrouted_total", (("shard", "3"),))] == 1


def test_without_sharding_every_job_is_accepted_and_a_single_shard_owns_all() -> None:
    for job in job_ids(40):
        assert replica(0, None).accept(CLIENT, body(job)).status == 202
        assert replica(0, 1).accept(CLIENT, body(job)).status == 202
        assert shard_endpoint(TEMPLATE, job, 1) == TEMPLATE.replace("{shard}", "0")


def test_the_placeholder_is_replaced_wherever_it_is() -> None:
    job = next(j for j in job_ids(50) if shard_of(j, 10) == 7)
    assert shard_endpoint("http://127.0.0.1:1234{shard}", job, 10) == "http://127.0.0.1:12347"
    assert shard_endpoint("https://r{shard}.x/{shard}/p", job, 10) == "https://r7.x/7/p"
    assert shard_endpoint("http://rules:9481", job, None) == "http://rules:9481"


@pytest.mark.parametrize(("shards", "endpoint", "env", "message"), [
    (None, TEMPLATE, {}, "the endpoint has {shard}: pass shards= or set GPUMOND_SHARDS"),
    (4, "http://rules:9481", {}, "shards is 4 but the endpoint has no {shard}"),
    (None, "http://rules:9481", {"GPUMOND_SHARDS": "4"}, "shards is 4 but the endpoint has no {shard}"),
    (None, TEMPLATE, {"GPUMOND_SHARDS": "four"}, "GPUMOND_SHARDS must be an integer"),
    (0, TEMPLATE, {}, "shards must be ≥ 1"),
    (MAX_SHARDS + 1, TEMPLATE, {}, f"shards must be ≤ {MAX_SHARDS}"),
])
def test_shard_settings_that_cannot_route_are_refused(shards: int | None, endpoint: str, env: dict[str, str],
                                                      message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("{", r"\{").replace("}", r"\}")):
        resolve_shards(shards, endpoint, env)


def test_shard_settings_from_argument_or_environment() -> None:
    assert resolve_shards(None, "http://rules:9481", {}) is None
    assert resolve_shards(None, TEMPLATE, {"GPUMOND_SHARDS": " 8 "}) == 8
    assert resolve_shards(2, TEMPLATE, {"GPUMOND_SHARDS": "8"}) == 2


class Refusing:
    """An SDK transport that answers 421 to every push, as a replica of another shard does."""

    def __init__(self) -> None:
        self.posts = 0

    def post(self, body: bytes, timeout_s: float, *, early: bool = False) -> SdkReply:
        self.posts += 1
        return SdkReply(421, None, "job 'j' belongs to shard 1 of 2 (crc32(job) mod 2), not this replica (0/2)")

    def close(self) -> None:
        pass


def test_the_sdk_drops_a_misrouted_batch_once_with_one_line_saying_what_to_set(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="gpumond.job")
    q: deque[Record] = deque(maxlen=100)
    q.extend((i, float(i), 1.0, 0.1, None) for i in range(25))
    transport = Refusing()
    p = Pusher(q, {"job": "j", "rank": 0, "world_size": 1, "node": "n",
                   "gpu_uuid": "GPU-11111111-1111-1111-1111-111111111111", "group": None}, transport,
               interval_s=3600, max_steps=10, timeout_s=1.0, clock=lambda: 1000.0, wall=lambda: 1.7e9)
    assert p.drain(1.0) is None  # no retry asked for: each batch is sent once and dropped
    assert transport.posts == 3 and (p.pushed, p.dropped, p.failed) == (0, 25, 3)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "\n" not in lines[0]
    assert "HTTP 421: job 'j' belongs to shard 1 of 2" in lines[0]
    assert "set GPUMOND_SHARDS" in lines[0] and "{shard} in GPUMOND_ENDPOINT" in lines[0]


def test_a_reporter_with_a_template_but_no_count_disables_itself_and_never_raises(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from gpumond.job import Reporter

    monkeypatch.delenv("GPUMOND_SHARDS", raising=False)
    rep = Reporter(endpoint=TEMPLATE, token="t", job="j", node="n", gpu_uuid="GPU-11111111-1111-1111-1111-111111111111")
    assert not rep.enabled
    assert rep.stats.last_error is not None and "GPUMOND_SHARDS" in rep.stats.last_error
    rep.step_end()  # training goes on
    rep.close()
