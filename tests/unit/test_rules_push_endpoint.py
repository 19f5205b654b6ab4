"""The push route's own ASGI endpoint: what it answers (byte for byte as Starlette's Response did), how it reads
the body, and that the rules app hands it pushes without Starlette."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest
from starlette.responses import Response

from gpumond.config.rules import RulesConfig
from gpumond.rules.http import RulesApp, build_app
from gpumond.rules.ingest.accept import Reply
from gpumond.rules.ingest.endpoint import encode
from gpumond.rules.store import RankStore
from tests.fakes import FakeClock
from tests.push_bodies import CONTENT_TYPES, ENCODINGS
from tests.push_bodies import encode as encode_body

TOKEN = "push-token-0123456789"
NOW = 1_763_760_000.0
UUID = "GPU-5b0c1234-aaaa-bbbb-cccc-0123456789ab"
LIMIT = 1024  # limits.max_body_bytes, its smallest


def service(store: RankStore | None = None) -> tuple[RulesApp, RankStore]:
    config = RulesConfig.model_validate({"tokens": [TOKEN], "limits": {"max_body_bytes": LIMIT}})
    store = store if store is not None else RankStore.from_config(config)
    app = build_app(config=config, rank_store=store, findings=list, metrics=lambda: b"", ready=lambda: (True, ""),
                    clock=FakeClock(NOW))
    return app, store


def push_body(encoding: str, count: int = 2) -> bytes:
    data = {"job": "j", "rank": 0, "world_size": 8, "node": "n", "gpu_uuid": UUID,
            "steps": [{"step": i, "end": NOW, "duration_s": 1.0, "data_wait_s": 0.1} for i in range(count)]}
    raw = encode_body(data, encoding)
    assert raw is not None
    return raw


def call(app: Any, messages: list[dict[str, Any]], *, method: str = "POST", path: str = "/api/v1/push",
         headers: list[tuple[bytes, bytes]] | None = None, encoding: str = "json") -> tuple[int, dict, bytes, int]:
    """(status, headers, body, messages received) of one request through the ASGI app."""
    if headers is None:
        headers = [(b"authorization", f"Bearer {TOKEN}".encode()),
                   (b"content-type", CONTENT_TYPES[encoding].encode())]
    sent: list[dict[str, Any]] = []
    received = 0

    async def receive() -> dict[str, Any]:
        nonlocal received
        received += 1
        assert received <= len(messages), "read past the end of the request"
        return messages[received - 1]

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "", "headers": headers,
             "client": ("10.0.0.1", 40000), "server": ("127.0.0.1", 9481)}
    asyncio.run(app(scope, receive, send))
    start, *bodies = sent
    return start["status"], dict(start["headers"]), b"".join(m.get("body", b"") for m in bodies), received


def whole(body: bytes) -> list[dict[str, Any]]:
    return [{"type": "http.request", "body": body, "more_body": False}]


@pytest.mark.parametrize("reply", [
    Reply(202, {"accepted": 64}),
    Reply(202, {"accepted": 3, "dropped": {"duplicate": 2, "stale": 1}}),
    Reply(401, {"error": "invalid bearer token"}, (("WWW-Authenticate", 'Bearer realm="gpumond", error="x"'),)),
    Reply(429, {"error": "ranks cap reached", "cap": "ranks"}, (("Retry-After", "30"),)),
    Reply(422, {"error": "job: must not contain control characters (found U+0085 'é')"}),
], ids=["accepted", "dropped", "401", "429", "422"])
def test_replies_are_the_bytes_starlettes_response_sent(reply: Reply) -> None:
    # What the push route answered before it had its own endpoint: a Starlette Response of the JSON body.
    before = Response(json.dumps(reply.body, separators=(",", ":")).encode(), status_code=reply.status,
                      headers=dict(reply.headers), media_type="application/json")
    start, body = encode(reply)
    assert start["status"] == reply.status
    assert list(start["headers"]) == before.raw_headers
    assert body["body"] == before.body
    assert encode(reply) == (start, body)  # the cached usual answer stays the same answer


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_a_push_reaches_the_endpoint_without_starlette(encoding: str) -> None:
    app, store = service()

    async def no_starlette(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError(f"Starlette was asked for {scope['method']} {scope['path']}")

    app.starlette = no_starlette  # type: ignore[assignment]
    status, headers, body, _ = call(app, whole(push_body(encoding)), encoding=encoding)
    assert (status, json.loads(body)) == (202, {"accepted": 2})
    assert headers[b"content-type"] == b"application/json" and headers[b"content-length"] == b"%d" % len(body)
    assert store.counts().steps == 2
    with pytest.raises(AssertionError, match="Starlette was asked for GET"):
        call(app, whole(b""), method="GET")


def test_other_methods_on_the_push_path_are_starlettes_405() -> None:
    app, _ = service()
    status, headers, body, _ = call(app, whole(b""), method="GET")
    assert status == 405 and headers[b"allow"] == b"POST"
    assert json.loads(body) == {"error": "method GET not allowed on /api/v1/push"}


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_a_body_in_chunks_is_read_whole(encoding: str) -> None:
    app, store = service()
    raw = push_body(encoding)
    chunks = [{"type": "http.request", "body": raw[i:i + 100], "more_body": True} for i in range(0, len(raw), 100)]
    chunks.append({"type": "http.request", "body": b"", "more_body": False})
    status, _, body, received = call(app, chunks, encoding=encoding)
    assert (status, json.loads(body), received) == (202, {"accepted": 2}, len(chunks))
    assert store.counts().steps == 2


def test_a_client_gone_before_its_body_ends_gets_400_and_nothing_is_stored() -> None:
    app, store = service()
    raw = push_body("json")
    status, _, body, _ = call(app, [{"type": "http.request", "body": raw[:20], "more_body": True},
                                    {"type": "http.disconnect"}])
    assert (status, json.loads(body)) == (400, {"error": "client disconnected before the body was complete"})
    assert store.counts().steps == 0 and store.counts().ranks == 0


def test_a_body_past_the_limit_is_refused_as_soon_as_it_passes_it() -> None:
    app, store = service()
    chunk = {"type": "http.request", "body": b" " * 300, "more_body": True}  # no Content-Length: chunked
    status, _, body, received = call(app, [chunk] * 10)
    assert (status, json.loads(body)) == (413, {"error": f"body larger than limits.max_body_bytes ({LIMIT} bytes)"})
    assert received == 4  # 1,200 bytes > 1,024: nothing after the chunk that crossed the limit is read
    assert store.counts().ranks == 0


def test_a_declared_length_past_the_limit_is_refused_before_reading() -> None:
    app, _ = service()
    headers = [(b"authorization", f"Bearer {TOKEN}".encode()), (b"content-length", b"%d" % (LIMIT + 1))]
    status, _, _, received = call(app, whole(b"x" * (LIMIT + 1)), headers=headers)
    assert (status, received) == (413, 0)


def test_the_first_of_a_repeated_header_counts_as_starlette_read_it() -> None:
    app, _ = service()
    good, bad = (b"authorization", f"Bearer {TOKEN}".encode()), (b"authorization", b"Bearer wrong-token-000000")
    json_type = (b"content-type", b"application/json")
    assert call(app, whole(push_body("json")), headers=[good, bad, json_type])[0] == 202
    status, headers, _, received = call(app, whole(push_body("json")), headers=[bad, good, json_type])
    assert (status, received) == (401, 0) and b"invalid_token" in headers[b"www-authenticate"]


class _BrokenStore(RankStore):
    def record(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug in the store")


def test_an_unexpected_failure_is_a_json_500_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    config = RulesConfig.model_validate({"tokens": [TOKEN]})
    app, _ = service(_BrokenStore.from_config(config))
    with caplog.at_level(logging.ERROR, logger="gpumond.rules.http"):
        status, headers, body, _ = call(app, whole(push_body("json")))
    assert (status, json.loads(body)) == (500, {"error": "internal error; the rules service logged it"})
    assert headers[b"content-type"] == b"application/json"
    assert any(r.message == "request failed" and r.exc_info for r in caplog.records)
