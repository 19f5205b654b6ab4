"""Read-side authentication (gpumond/web/auth.py) as ASGI middleware: basic auth against bcrypt hashes, bearer
tokens, open paths, and bcrypt paid once per good password."""

from __future__ import annotations

import asyncio
import base64

import bcrypt

from gpumond.web.auth import ReadAuth

HASH = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(4)).decode()
TOKEN = "read-token-0123456789abcdef"


async def app(scope, receive, send):
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def call(auth: ReadAuth, path: str, authorization: str | None = None) -> tuple[int, dict[bytes, bytes]]:
    sent: list[dict] = []
    headers = [(b"authorization", authorization.encode())] if authorization else []

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": "http.request", "body": b""}

    asyncio.run(auth({"type": "http", "path": path, "headers": headers}, receive, send))
    return sent[0]["status"], dict(sent[0]["headers"])


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_basic_auth_and_bearer_tokens_guard_every_path_but_the_open_ones() -> None:
    auth = ReadAuth(app, users={"prometheus": HASH}, tokens=[TOKEN], open_paths=["/healthz"])
    status, headers = call(auth, "/metrics")
    assert status == 401 and headers[b"www-authenticate"] == b'Basic realm="gpumond", Bearer'
    assert call(auth, "/metrics", basic("prometheus", "s3cret"))[0] == 200
    assert call(auth, "/metrics", basic("prometheus", "wrong"))[0] == 401
    assert call(auth, "/metrics", basic("nobody", "s3cret"))[0] == 401
    assert call(auth, "/metrics", "Basic !!!not-base64")[0] == 401
    assert call(auth, "/metrics", f"Bearer {TOKEN}")[0] == 200
    assert call(auth, "/metrics", f"Bearer {TOKEN}x")[0] == 401
    assert call(auth, "/healthz")[0] == 200


def test_a_good_password_pays_bcrypt_once() -> None:
    checks: list[bytes] = []
    auth = ReadAuth(app, users={"prometheus": HASH}, tokens=[], open_paths=[])
    real = auth._checkpw
    auth._checkpw = lambda pw, h: checks.append(pw) or real(pw, h)  # counts the calls, the check stays real
    for _ in range(5):
        assert call(auth, "/metrics", basic("prometheus", "s3cret"))[0] == 200
    assert call(auth, "/metrics", basic("prometheus", "other"))[0] == 401
    assert checks == [b"s3cret", b"other"]


def test_only_the_configured_scheme_is_accepted() -> None:
    tokens_only = ReadAuth(app, users={}, tokens=[TOKEN], open_paths=[])
    assert call(tokens_only, "/metrics", basic("prometheus", "s3cret"))[0] == 401
    assert call(tokens_only, "/metrics")[1][b"www-authenticate"] == b"Bearer"
