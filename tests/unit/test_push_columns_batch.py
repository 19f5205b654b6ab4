"""The columnar batch (what the node relay sends): its framing refused whole, each push judged as if it had come
alone (its head, its steps, its outcome in the answer), and the store after a batch the store after its pushes one
by one."""

from __future__ import annotations

import base64
import json
import math
import struct
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpumond.config.rules import RulesConfig
from gpumond.push.batch import HeadJudge, parse_columns_batch
from gpumond.push.body import PayloadError, columns_model, head_model, parse
from gpumond.rules.ingest.accept import Client, Ingest
from gpumond.rules.store import RankStore
from gpumond.wire.batch import encode_columns_batch
from gpumond.wire.media import BATCH_COLUMNS_TYPE
from tests.fakes import FakeClock
from tests.push_bodies import encode

TOKEN = "push-token-0123456789"
NOW = 1_763_760_000.0
UUID = "GPU-5b0c1234-aaaa-bbbb-cccc-0123456789"
BATCH = Client("token#0", "127.0.0.1", batch_columns=True)
LIMITS = RulesConfig.model_validate({"tokens": [TOKEN]}).limits
MAX_STEPS, MAX_TEXT = LIMITS.max_steps_per_push, LIMITS.max_string_len


def make(**config: Any) -> Ingest:
    cfg = RulesConfig.model_validate({"tokens": [TOKEN], **config})
    return Ingest(config=cfg, store=RankStore.from_config(cfg), clock=FakeClock(NOW))


def step(n: int, **over: Any) -> dict[str, Any]:
    return {"step": n, "end": NOW - 1, "duration_s": 1.0, "data_wait_s": 0.1, **over}


def push(rank: int, first: int = 0, count: int = 2, job: str = "j", steps: list | None = None, **over: Any) -> bytes:
    data = {"job": job, "rank": rank, "world_size": 8, "node": "n", "gpu_uuid": f"{UUID}{rank:02x}",
            "steps": steps if steps is not None else [step(first + i) for i in range(count)], **over}
    raw = encode(data, "columns")
    assert raw is not None
    return raw


def batch(*pushes: bytes, job: str = "j") -> bytes:
    return encode_columns_batch(job, list(pushes))


def edit(body: bytes, change: Any) -> bytes:
    doc = json.loads(body)
    change(doc)
    return json.dumps(doc).encode()


def floats(*values: float) -> str:
    return base64.b64encode(struct.pack(f"<{len(values)}d", *values)).decode()


def results(ingest: Ingest, body: bytes) -> list[dict[str, object]]:
    reply = ingest.accept(BATCH, body)
    assert reply.status == 202, reply.body
    return reply.body["results"]  # type: ignore[return-value]


# ----- the media type and the relay's encoding -------------------------------------------------------------------
def test_the_media_type_is_admitted() -> None:
    admitted = make().admit(authorization=f"Bearer {TOKEN}", address="127.0.0.1", content_type=BATCH_COLUMNS_TYPE,
                            content_encoding=None, content_length="100")
    assert isinstance(admitted, Client) and admitted.batch_columns and not admitted.batch


@pytest.mark.parametrize("pushes", [
    [push(0), push(1, count=3)],
    # optional columns and head keys in some pushes only: filled for the others (NaN, -1, null, false)
    [push(0, steps=[step(0, comm_wait_s=0.2, samples=32)]), push(1), push(2, group="stage-1", incarnation="p1"),
     push(3, count=0, final=True)],
    [],
])
def test_each_push_comes_out_as_it_would_have_been_parsed_alone(pushes: list[bytes]) -> None:
    job, judged, _ = parse_columns_batch(batch(*pushes), HeadJudge(head_model(MAX_TEXT)), MAX_STEPS)
    assert job == "j" and len(judged) == len(pushes)
    for line, got in zip(pushes, judged):
        assert not isinstance(got, PayloadError)
        head, steps = got
        alone = parse(columns_model(MAX_TEXT, MAX_STEPS), line)
        assert head.rank_info() == alone.rank_info()
        assert (head.incarnation, head.final) == (alone.incarnation, alone.final)
        want = alone.step_columns()
        assert np.array_equal(steps.step, want.step)
        assert np.array_equal(steps.values, want.values, equal_nan=True)
        have = np.zeros(0) if steps.samples is None else np.maximum(steps.samples, 0)
        assert have.sum() == (0 if want.samples is None else np.maximum(want.samples, 0).sum())


# ----- hostile bodies: the batch refused whole --------------------------------------------------------------------
@pytest.mark.parametrize(("body", "status", "words"), [
    (b"not json", 400, "batch: invalid JSON"),
    (b"[1, 2]", 422, "batch: body: must be a JSON object"),
    (batch(push(0), job="").replace(b'"job":""', b'"job":7'), 422, "batch: job: must be a non-empty string"),
    (edit(batch(push(0), push(1)), lambda d: d["pushes"]["node"].pop()), 422,
     "batch: pushes.node: must hold one value per push (2) (got 1)"),
    (edit(batch(push(0)), lambda d: d["pushes"].pop("gpu_uuid")), 422, "batch: pushes.gpu_uuid: required key"),
    (edit(batch(push(0)), lambda d: d["pushes"].update(rank=0)), 422, "batch: pushes.rank: must be an array"),
    # a push's count reaching past the columns (what an index out of range would be)
    (edit(batch(push(0), push(1)), lambda d: d["pushes"].update(steps=[2, 3])), 422,
     "batch: pushes.steps: add up to 5 but the columns hold 4 values"),
    (edit(batch(push(0), push(1)), lambda d: d["pushes"].update(steps=[2**70, 2])), 422,
     f"batch: pushes.steps: add up to {2**70 + 2} but the columns hold 4 values"),
    (edit(batch(push(0), push(1)), lambda d: d["pushes"].update(steps=[-1, 5])), 422,
     "batch: pushes.steps: must be integers >= 0"),
    (edit(batch(push(0), push(1)), lambda d: d["pushes"].update(steps=[True, 3])), 422,
     "batch: pushes.steps: must be integers >= 0"),
    (edit(batch(push(0)), lambda d: d["columns"].update(end=floats(NOW))), 422,
     "batch: columns.end: must hold as many values as columns.step (2) (got 1)"),
    (edit(batch(push(0)), lambda d: d["columns"].update(duration_s="@@@")), 422,
     "batch: columns.duration_s: must be standard base64"),
    (edit(batch(push(0)), lambda d: d["columns"].update(duration_s=[1.0, 1.0])), 422,
     "batch: columns.duration_s: must be a base64 string"),
    (edit(batch(push(0)), lambda d: d.pop("columns")), 422, "batch: columns: must be a JSON object"),
])
def test_a_broken_batch_is_refused_whole_with_one_line(body: bytes, status: int, words: str) -> None:
    ingest = make()
    reply = ingest.accept(BATCH, body)
    assert reply.status == status and str(reply.body["error"]).startswith(words), reply.body
    assert "\n" not in str(reply.body["error"])
    assert ingest.ranks.job_names() == frozenset()  # nothing stored


def test_more_pushes_than_a_batch_may_hold_is_refused_whole() -> None:
    body = batch(push(0), push(1), push(2))
    with pytest.raises(ValueError, match="must hold at most 2 pushes"):
        parse_columns_batch(body, HeadJudge(head_model(MAX_TEXT)), MAX_STEPS, max_pushes=2)


# ----- hostile pushes: each refused alone, in its own words -------------------------------------------------------
@pytest.mark.parametrize(("bad", "words"), [
    (push(1, steps=[step(0), step(1, duration_s=math.nan)]), "steps[1].duration_s: must be a finite number"),
    (push(1, steps=[step(0, data_wait_s=-0.5)]), "steps[0].data_wait_s: must be at least 0 (got -0.5)"),
    (push(1, steps=[step(-3)]), "steps[0].step: must be at least 0 (got -3)"),
    (push(1, steps=[step(0, data_wait_s=0.7, comm_wait_s=0.5)]),
     "steps[0].comm_wait_s: must be at most duration_s - data_wait_s (0.3) (got 0.5)"),
    (push(1, steps=[step(0, duration_s=90_000.0)]), "steps[0].duration_s: must be at most 86400"),
    (push(1, count=MAX_STEPS + 1), f"columns: must have at most {MAX_STEPS} steps (got {MAX_STEPS + 1})"),
    (push(1, world_size=1), "rank: must be less than world_size (1)"),
    (push(1, gpu_uuid="GPU-nope"), "gpu_uuid: must be an NVML GPU UUID"),
    (push(1, node="a\u202eb"), "node: must not contain control characters"),
], ids=["nan", "negative", "negative step", "comm over", "day", "oversize", "rank", "uuid", "bidi"])
def test_a_bad_push_is_refused_alone_the_others_stored(bad: bytes, words: str) -> None:
    ingest = make()
    got = results(ingest, batch(push(0), bad, push(2, first=5)))
    assert got[0] == {"accepted": 2} and got[2] == {"accepted": 2}
    assert got[1]["status"] == 422 and str(got[1]["error"]).startswith(words), got[1]
    alone = ingest.accept(Client("token#0", "127.0.0.1", columns=True), bad)
    assert alone.body["error"] == got[1]["error"]  # the words it would have had pushed alone
    assert set(ingest.ranks.jobs(NOW)["j"]) == {0, 2}
    assert ingest.stats.requests(202) == 2 and ingest.stats.requests(422) == 2  # counted as single pushes


def test_a_remembered_head_does_not_stand_for_one_of_another_json_type() -> None:
    ingest = make()
    assert results(ingest, batch(push(1)))[0] == {"accepted": 2}
    for wrong in (True, 1.0):  # equal to 1 as a dict key, but not a rank
        got = results(ingest, edit(batch(push(1, first=2)), lambda d, w=wrong: d["pushes"].update(rank=[w])))[0]
        assert got["status"] == 422 and str(got["error"]).startswith("rank: "), got
    got = results(ingest, edit(batch(push(1, first=2)), lambda d: d["pushes"].update(node=[["n"]])))[0]
    assert got["status"] == 422 and str(got["error"]).startswith("node: ")


def test_duplicate_ranks_are_pushes_in_turn() -> None:
    got = results(make(), batch(push(0), push(0), push(0, first=1)))
    assert got == [{"accepted": 2}, {"accepted": 0, "dropped": {"duplicate": 2}},
                   {"accepted": 1, "dropped": {"duplicate": 1}}]


def test_a_batch_for_another_shard_is_misrouted_whole() -> None:
    ingest = make(shard="0/2")
    job = next(j for j in (f"job-{i}" for i in range(100)) if __import__("zlib").crc32(j.encode()) % 2 == 1)
    reply = ingest.accept(BATCH, batch(push(0, job=job), job=job))
    assert reply.status == 421 and reply.body["shard"] == 1


def test_a_cap_refusal_carries_its_retry_after_in_its_result() -> None:
    first, second = results(make(limits={"max_ranks": 1}), batch(push(0), push(1)))
    assert first == {"accepted": 2}
    assert second["status"] == 429 and second["cap"] == "ranks" and second["retry_after_s"] == 30


# ----- the store after a batch is the store after its pushes one by one -------------------------------------------
# Mostly valid steps (a refused push stores nothing, so refusals must not crowd out what the store does), some
# stale, retried, in the future, or breaking a rule; ranks repeated, restarted (a new incarnation), ending.
_valid_step = st.builds(lambda n, end, c, s: step(n, end=end, comm_wait_s=c, samples=s), st.integers(0, 12),
                        st.sampled_from([NOW - 1, NOW - 50, NOW - 10_000]), st.sampled_from([None, 0.2]),
                        st.sampled_from([None, 4]))
_bad_step = st.sampled_from([step(1, duration_s=math.nan), step(2, data_wait_s=-1.0), step(3, end=NOW + 5_000),
                             step(4, comm_wait_s=5.0)])
_steps = st.lists(st.one_of(_valid_step, _valid_step, _valid_step, _valid_step, _valid_step, _bad_step), max_size=6)
_pushes = st.lists(st.tuples(st.integers(0, 3), _steps, st.sampled_from([None, "p1", "p2"]),
                             st.sampled_from([False, False, False, True]), st.sampled_from([8, 8, 8, 2])),
                   max_size=10)


def _snapshot(ingest: Ingest) -> tuple[object, ...]:
    jobs = {job: {rank: (w.info, w.last_beat, w.ended, w.samples,
                         [(s.step, s.end, s.duration_s, s.data_wait_s, s.comm_wait_s) for s in w.steps])
                  for rank, w in ranks.items()} for job, ranks in ingest.ranks.jobs(NOW).items()}
    return repr(jobs), ingest.ranks.counts(), ingest.ranks.take_ended()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
@given(_pushes)
def test_a_batch_stores_what_its_pushes_one_by_one_store(pushes: list) -> None:
    lines = [push(rank, steps=steps, incarnation=inc, final=final, world_size=world)
             for rank, steps, inc, final, world in pushes]
    one_by_one, batched = make(limits={"max_steps_per_rank": 16}), make(limits={"max_steps_per_rank": 16})
    alone = [one_by_one.accept(Client("token#0", "127.0.0.1", columns=True), line) for line in lines]
    want = [r.body if r.status == 202 else {"status": r.status, **r.body, **(
        {"retry_after_s": 30} if r.status == 429 else {})} for r in alone]
    assert results(batched, batch(*lines)) == want
    assert _snapshot(batched) == _snapshot(one_by_one)


_json = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
                     max_leaves=6)
_VALID = json.loads(batch(push(0), push(1, steps=[step(0, comm_wait_s=0.2, samples=3)]), push(2, count=0)))


@settings(max_examples=150, deadline=None, database=None)
@given(st.sampled_from([("job",), *(("pushes", k) for k in _VALID["pushes"]), *(("columns", k) for k in _VALID["columns"]),
                        ("pushes",), ("columns",)]), _json)
def test_any_json_in_any_place_is_answered_never_raised(where: tuple[str, ...], value: object) -> None:
    doc = json.loads(json.dumps(_VALID))
    target = doc
    for key in where[:-1]:
        target = target[key]
    target[where[-1]] = value
    reply = make().accept(BATCH, json.dumps(doc).encode())  # an exception here would be the endpoint's 500
    assert reply.status in (202, 400, 422), reply
    for result in reply.body.get("results", []):  # type: ignore[union-attr]
        assert result.get("status", 202) in (202, 422), result
