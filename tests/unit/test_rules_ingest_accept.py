"""Ingest: the push decisions without a server — order of checks, statuses, messages, counters."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from gpumond.config.rules import RulesConfig
from gpumond.rules.ingest.accept import Client, Ingest, Reply
from gpumond.rules.ingest.stats import INGEST_METRICS, IngestStats
from gpumond.rules.store import GpuStore, RankStore
from gpumond.wire.safetext import UNSAFE
from tests.fakes import FakeClock
from tests.push_bodies import CONTENT_TYPES, ENCODINGS, encode

TOKEN = "push-token-0123456789"
NOW = 1_763_760_000.0
UUID = "GPU-5b0c1234-aaaa-bbbb-cccc-0123456789ab"


def make(**limits: Any) -> tuple[Ingest, FakeClock]:
    config = RulesConfig.model_validate({"tokens": [TOKEN], "limits": limits})
    clock = FakeClock(NOW)
    return Ingest(config=config, store=RankStore.from_config(config), clock=clock), clock


def admit(ingest: Ingest, authorization: str | None = f"Bearer {TOKEN}", address: str = "10.0.0.1",
          content_type: str | None = "", content_encoding: str | None = None,
          content_length: str | None = "100") -> Client | Reply:
    if content_type == "":
        content_type = CONTENT_TYPES[ENCODING[0]]
    return ingest.admit(authorization=authorization, address=address, content_type=content_type,
                        content_encoding=content_encoding, content_length=content_length)


def body(job: str = "j", rank: int = 0, first: int = 0, count: int = 2, end: float = NOW, **over: Any) -> bytes:
    data = {"job": job, "rank": rank, "world_size": 8, "node": "n", "gpu_uuid": UUID[:-2] + f"{rank:02x}",
            "steps": [{"step": first + i, "end": end, "duration_s": 1.0, "data_wait_s": 0.1} for i in range(count)]}
    data.update(over)
    raw = encode(data, ENCODING[0])
    assert raw is not None
    return raw


# Every test here runs on both push encodings: the body() of this module and the admitted client follow it.
ENCODING = ["json"]
CLIENT = Client("token#0", "10.0.0.1")


@pytest.fixture(autouse=True, params=ENCODINGS)
def encoding(request: pytest.FixtureRequest):
    global CLIENT
    ENCODING[0] = request.param
    CLIENT = Client("token#0", "10.0.0.1", request.param == "columns")
    yield request.param
    ENCODING[0], CLIENT = "json", Client("token#0", "10.0.0.1")


def test_a_valid_push_is_stored_and_counted() -> None:
    ingest, _ = make()
    assert isinstance(admit(ingest), Client)
    reply = ingest.accept(CLIENT, body(count=3))
    assert reply == Reply(202, {"accepted": 3})
    # idempotent, and the answer says why nothing was stored
    assert ingest.accept(CLIENT, body(count=3)) == Reply(202, {"accepted": 0, "dropped": {"duplicate": 3}})
    assert ingest.stats.requests(202) == 2
    assert [r.step for r in ingest.ranks.jobs(NOW)["j"][0].steps] == [0, 1, 2]


@pytest.mark.parametrize(
    ("kwargs", "status", "message", "header"),
    [
        ({"authorization": None}, 401, "missing bearer token: send 'Authorization: Bearer <token>'",
         ("WWW-Authenticate", 'Bearer realm="gpumond"')),
        ({"authorization": "Bearer wrong-token-0123456789"}, 401, "invalid bearer token",
         ("WWW-Authenticate", 'Bearer realm="gpumond", error="invalid_token"')),
        ({"content_type": "text/plain"}, 415, "Content-Type must be application/json (steps as objects), "
         "application/vnd.gpumond.columns+json (steps as columns) or application/vnd.gpumond.batch-columns+json (a relay's "
         "batch) (got 'text/plain')", None),
        ({"content_encoding": "gzip"}, 415, "Content-Encoding 'gzip' is not supported; send the JSON uncompressed",
         None),
        ({"content_length": str(1_048_577)}, 413, "body larger than limits.max_body_bytes (1048576 bytes)", None),
    ],
)
def test_refusals_before_the_body(kwargs: dict, status: int, message: str, header: tuple | None) -> None:
    ingest, _ = make()
    reply = admit(ingest, **kwargs)
    assert isinstance(reply, Reply)
    assert (reply.status, reply.body) == (status, {"error": message})
    if header:
        assert header in reply.headers
    assert ingest.stats.requests(status) == 1


def test_json_content_types_with_parameters_and_no_content_type_are_fine() -> None:
    ingest, _ = make()
    assert isinstance(admit(ingest, content_type="application/json; charset=utf-8"), Client)
    assert isinstance(admit(ingest, content_type=None), Client)
    assert isinstance(admit(ingest, content_length=None), Client)  # chunked: limited while reading


def test_the_rate_limit_is_per_token_and_address_with_retry_after() -> None:
    ingest, clock = make(pushes_per_second_per_client=0.5, burst=2)
    assert isinstance(admit(ingest), Client) and isinstance(admit(ingest), Client)
    reply = admit(ingest)
    assert isinstance(reply, Reply) and reply.status == 429
    assert reply.body == {"error": "rate limit: more than 0.5 pushes/s (burst 2) from this client; retry after 2 s"}
    assert ("Retry-After", "2") in reply.headers
    assert isinstance(admit(ingest, address="10.0.0.2"), Client)  # another client is unaffected
    clock.now += 2
    assert isinstance(admit(ingest), Client)


def test_authentication_comes_before_the_rate_limit() -> None:
    ingest, _ = make(pushes_per_second_per_client=0.001, burst=1)
    for _ in range(5):
        reply = admit(ingest, authorization="Bearer nope-nope-nope-nope")
        assert isinstance(reply, Reply) and reply.status == 401
    assert isinstance(admit(ingest), Client)  # failed attempts spent nothing from the real client's bucket


def test_validation_errors_are_422_and_bad_json_400() -> None:
    ingest, _ = make()
    assert ingest.accept(CLIENT, b"{nope").status == 400
    reply = ingest.accept(CLIENT, body(rank=9))
    assert reply == Reply(422, {"error": "rank: must be less than world_size (8) (got 9)"})
    assert ingest.stats.requests(400) == 1 and ingest.stats.requests(422) == 1


def test_steps_from_the_future_are_refused_naming_the_clock() -> None:
    ingest, _ = make(max_clock_skew_s=60)
    assert ingest.accept(CLIENT, body(end=NOW + 59)).status == 202
    reply = ingest.accept(CLIENT, body(first=10, end=NOW + 3600))
    assert reply.status == 422
    assert reply.body["error"] == ("steps[0].end: 3600 s in the future, more than limits.max_clock_skew_s (60); "
                                   "check the clock of node 'n'")


def test_a_cap_refusal_is_429_with_retry_after_and_names_the_cap() -> None:
    ingest, _ = make(max_jobs=1)
    assert ingest.accept(CLIENT, body(job="a")).status == 202
    reply = ingest.accept(CLIENT, body(job="b"))
    assert reply.status == 429 and reply.body["cap"] == "jobs" and dict(reply.headers) == {"Retry-After": "30"}
    assert str(reply.body["error"]).startswith("jobs cap reached: 1 jobs held (limits.max_jobs); new job 'b' refused")
    assert ingest.accept(CLIENT, body(job="a", first=5)).status == 202
    assert ingest.ranks.counts().refused["jobs"] == 1


def test_limits_come_from_the_config() -> None:
    ingest, _ = make(max_steps_per_push=2, max_string_len=16)
    reply = ingest.accept(CLIENT, body(count=3))
    assert str(reply.body["error"]).startswith({"json": "steps: must have at most 2 items (got [{'step': 0, ",
                                                "columns": "columns: must have at most 2 steps (got 3)"}[ENCODING[0]])
    assert ingest.accept(CLIENT, body(job="j" * 17)).status == 422


def test_stats_series_cover_requests_steps_caps_and_sizes() -> None:
    ingest, _ = make(max_jobs=1)
    gpus = GpuStore(window_s=60, expire_after_s=120, max_gpus=8, max_samples=4)
    stats = IngestStats(ingest.ranks, gpus)
    ingest.stats = stats
    ingest.accept(CLIENT, body(job="a", count=4))
    ingest.accept(CLIENT, body(job="a", count=4))
    ingest.accept(CLIENT, body(job="b"))
    admit(ingest, authorization=None)
    series = {(s.name, s.labels): s.value for s in stats.series()}
    assert set(name for name, _ in series) <= set(INGEST_METRICS)
    assert series[("gpumond_rules_push_requests_total", (("code", "202"),))] == 2
    assert series[("gpumond_rules_push_requests_total", (("code", "429"),))] == 1
    assert series[("gpumond_rules_push_requests_total", (("code", "401"),))] == 1
    assert series[("gpumond_rules_push_steps_total", (("result", "accepted"),))] == 4
    assert series[("gpumond_rules_push_steps_total", (("result", "duplicate"),))] == 4
    assert series[("gpumond_rules_cap_refusals_total", (("cap", "jobs"),))] == 1
    assert series[("gpumond_rules_held", (("kind", "steps"),))] == 4
    assert series[("gpumond_rules_held_limit", (("kind", "jobs"),))] == 1
    assert series[("gpumond_rules_held", (("kind", "telemetry_gpus"),))] == 0
    assert series[("gpumond_rules_rate_limit_clients", ())] == 0


def test_a_push_beyond_one_rank_window_says_what_was_not_kept_and_why() -> None:
    ingest, _ = make(max_steps_per_push=4096, max_steps_per_rank=2048)
    reply = ingest.accept(CLIENT, body(count=4096))
    assert reply == Reply(202, {"accepted": 2048, "dropped": {"per_rank_window": 2048}})
    lines = {(s.name, s.labels): s.value for s in ingest.stats.series()}
    assert lines[("gpumond_rules_push_steps_total", (("result", "per_rank_window"),))] == 2048
    assert lines[("gpumond_rules_push_steps_total", (("result", "refused"),))] == 0


def test_a_rank_made_by_a_heartbeat_gets_the_cap_refusal_once_steps_are_full() -> None:
    ingest, _ = make(max_steps_held=4, max_steps_per_rank=4)
    assert ingest.accept(CLIENT, body(rank=1, count=0)) == Reply(202, {"accepted": 0})
    assert ingest.accept(CLIENT, body(rank=0, count=4)).status == 202
    reply = ingest.accept(CLIENT, body(rank=1, count=2))
    assert reply.status == 429 and reply.body["cap"] == "steps", reply


def test_a_restarted_process_with_a_new_incarnation_has_its_steps_counted() -> None:
    # A torchelastic restart keeps job and rank, and numbers steps again from its checkpoint.
    ingest, _ = make()
    assert ingest.accept(CLIENT, body(count=200, incarnation="p1-aaaa")) == Reply(202, {"accepted": 200})
    reply = ingest.accept(CLIENT, body(count=200, incarnation="p2-bbbb"))
    assert reply == Reply(202, {"accepted": 200})
    restarts = [s.value for s in ingest.stats.series() if s.name == "gpumond_rules_push_restarts_total"]
    assert restarts == [1.0]
    # the same process retrying is still idempotent
    assert ingest.accept(CLIENT, body(count=200, incarnation="p2-bbbb")) == \
        Reply(202, {"accepted": 0, "dropped": {"duplicate": 200}})


def test_without_an_incarnation_reused_step_numbers_are_reported_as_duplicates() -> None:
    ingest, _ = make()
    ingest.accept(CLIENT, body(count=200))
    assert ingest.accept(CLIENT, body(count=200)) == Reply(202, {"accepted": 0, "dropped": {"duplicate": 200}})


def test_steps_from_a_clock_behind_the_window_are_reported_stale() -> None:
    ingest, _ = make()
    reply = ingest.accept(CLIENT, body(count=5, end=NOW - 10_000))  # window_s is 300 by default
    assert reply == Reply(202, {"accepted": 0, "dropped": {"stale": 5}})


SAFETEXT_UNSAFE_SAMPLES = ["\x85", "\u2028", "\u2029", "\u202e", "\u202a", "\u2066", "\u2069", "\u200f", "\x9b", "\x1b"]


# ----- labels: what safetext refuses is refused here, with the field and the character named ----------
@pytest.mark.parametrize("char", SAFETEXT_UNSAFE_SAMPLES)
@pytest.mark.parametrize("field", ["job", "node", "group"])
def test_the_push_api_refuses_an_unsafe_label_naming_field_and_character(field: str, char: str) -> None:
    ingest, _ = make()
    reply = ingest.accept(CLIENT, body(**{field: f"job{char}x"}))
    assert reply.status == 422
    message = str(reply.body["error"])
    assert message.startswith(f"{field}: must not contain control characters, line separators or bidirectional "
                              f"controls (found U+{ord(char):04X})"), message
    assert UNSAFE.search(message) is None  # the refusal itself quotes the value escaped
    assert ingest.ranks.counts().ranks == 0


def test_ordinary_unicode_labels_are_accepted() -> None:
    ingest, _ = make()
    assert ingest.accept(CLIENT, body(job="Lama-70b-日本語-é", node="nœud-3")) == Reply(202, {"accepted": 2})


def test_the_openapi_pattern_excludes_the_same_characters() -> None:
    ingest, _ = make()
    pattern = ingest.model.model_json_schema()["properties"]["job"]["pattern"]
    for char in SAFETEXT_UNSAFE_SAMPLES:
        assert re.fullmatch(pattern, f"a{char}b") is None
    assert re.fullmatch(pattern, "Lama-日本語")
