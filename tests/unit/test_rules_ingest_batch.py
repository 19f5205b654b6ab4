"""A relay's batch: every push in it judged as if it had come alone, one answer naming each one's outcome."""

from __future__ import annotations

import json
from typing import Any

from gpumond.config.rules import RulesConfig
from gpumond.rules.ingest.accept import Client, Ingest
from gpumond.rules.store import RankStore
from gpumond.wire.batch import encode_batch
from gpumond.wire.media import BATCH_TYPE
from tests.fakes import FakeClock
from tests.push_bodies import encode

TOKEN = "push-token-0123456789"
NOW = 1_763_760_000.0
UUID = "GPU-5b0c1234-aaaa-bbbb-cccc-0123456789"
BATCH = Client("token#0", "127.0.0.1", batch=True)


def make(**config: Any) -> Ingest:
    cfg = RulesConfig.model_validate({"tokens": [TOKEN], **config})
    return Ingest(config=cfg, store=RankStore.from_config(cfg), clock=FakeClock(NOW))


def push(rank: int, first: int = 0, count: int = 2, job: str = "j", **over: Any) -> bytes:
    data = {"job": job, "rank": rank, "world_size": 8, "node": "n", "gpu_uuid": f"{UUID}{rank:02x}",
            "steps": [{"step": first + i, "end": NOW, "duration_s": 1.0, "data_wait_s": 0.1} for i in range(count)]}
    data.update(over)
    raw = encode(data, "columns")
    assert raw is not None
    return raw


def test_the_batch_media_type_is_admitted() -> None:
    admitted = make().admit(authorization=f"Bearer {TOKEN}", address="127.0.0.1", content_type=BATCH_TYPE,
                            content_encoding=None, content_length="100")
    assert isinstance(admitted, Client) and admitted.batch


def test_each_push_is_stored_as_if_alone_and_one_bad_push_refuses_itself_only() -> None:
    ingest = make()
    bad = push(2, world_size=2)  # rank 2 of a world of 2
    reply = ingest.accept(BATCH, encode_batch("j", [push(0), push(1, count=3), bad, push(0)]))
    assert reply.status == 202
    results = reply.body["results"]
    assert results[0] == {"accepted": 2} and results[1] == {"accepted": 3}
    assert results[2]["status"] == 422 and results[2]["error"].startswith("rank: must be less than world_size")
    assert results[3] == {"accepted": 0, "dropped": {"duplicate": 2}}  # rank 0 again: as a second push would be
    held = {rank: len(w.steps) for rank, w in ingest.ranks.jobs(NOW)["j"].items()}
    assert held == {0: 2, 1: 3}
    assert ingest.stats.requests(202) == 3 and ingest.stats.requests(422) == 1  # counted as single pushes


def test_a_push_of_another_job_is_refused_in_its_line() -> None:
    reply = make().accept(BATCH, encode_batch("j", [push(0, job="other")]))
    assert reply.body["results"][0]["status"] == 422
    assert "must be the batch's job 'j'" in reply.body["results"][0]["error"]


def test_bad_framing_refuses_the_batch_whole() -> None:
    ingest = make()
    assert ingest.accept(BATCH, b"not json\n" + push(0)).status == 400
    cut = encode_batch("j", [push(0), push(1)]).rsplit(b"\n", 1)[0]
    reply = ingest.accept(BATCH, cut)
    assert reply.status == 400 and "head says 2 pushes but 1 lines" in reply.body["error"]


def test_a_batch_for_another_shard_is_misrouted_whole() -> None:
    ingest = make(shard="0/2")
    job = next(j for j in (f"job-{i}" for i in range(100)) if __import__("zlib").crc32(j.encode()) % 2 == 1)
    reply = ingest.accept(BATCH, encode_batch(job, [push(0, job=job)]))
    assert reply.status == 421 and reply.body["shard"] == 1


def test_a_cap_refusal_carries_its_retry_after_in_the_line() -> None:
    ingest = make(limits={"max_ranks": 1})
    reply = ingest.accept(BATCH, encode_batch("j", [push(0), push(1)]))
    first, second = reply.body["results"]
    assert first == {"accepted": 2}
    assert second["status"] == 429 and second["cap"] and second["retry_after_s"] == 30
    assert json.dumps(reply.body)  # the answer is JSON as it stands
