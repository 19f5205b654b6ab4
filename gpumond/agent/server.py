"""The agent's HTTP surface as a bare ASGI app: /metrics from the render cache, /healthz."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from gpumond.agent.exposition import Rendered

CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


def accepts_gzip(header: bytes) -> bool:
    """RFC 9110 content negotiation for gzip: `gzip;q=0` refuses it, `*` accepts it unless gzip is refused."""
    weights: dict[bytes, float] = {}
    for item in header.split(b","):
        coding, _, params = item.strip().partition(b";")
        q = 1.0
        for p in params.split(b";"):
            name, _, val = p.strip().partition(b"=")
            if name.strip().lower() == b"q":
                try:
                    q = float(val)
                except ValueError:
                    q = 0.0
        weights[coding.strip().lower()] = q
    if b"gzip" in weights:
        return weights[b"gzip"] > 0
    return weights.get(b"*", 0.0) > 0


def _accepts_gzip(scope: Scope) -> bool:
    for k, v in scope.get("headers", ()):
        if k == b"accept-encoding":
            return accepts_gzip(v)
    return False


class AgentApp:
    """Serves whatever the sampler rendered last; a scrape never waits on NVML."""

    def __init__(self, latest: Callable[[], Rendered | None], health: Callable[[], tuple[bool, str]],
                 alerts: Callable[[], bytes] = lambda: b'{"alerts":[]}') -> None:
        self._latest = latest
        self._health = health
        self._alerts = alerts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return  # lifespan is off; nothing else is spoken here
        path, method = scope["path"], scope["method"]
        if method not in ("GET", "HEAD"):
            await _reply(send, 405, b"method not allowed\n", extra=[(b"allow", b"GET, HEAD")])
        elif path == "/metrics":
            r = self._latest()
            if r is None:
                await _reply(send, 503, b"no sample yet\n")
            elif _accepts_gzip(scope):
                await _reply(send, 200, r.gzipped, CONTENT_TYPE, [(b"content-encoding", b"gzip")], method)
            else:
                await _reply(send, 200, r.plain, CONTENT_TYPE, method=method)
        elif path == "/healthz":
            ok, why = self._health()
            await _reply(send, 200 if ok else 503, (why + "\n").encode(), method=method)
        elif path == "/api/v1/alerts":
            await _reply(send, 200, self._alerts(), b"application/json", method=method)
        elif path == "/":
            await _reply(send, 200, b"gpumond agent: /metrics /healthz /api/v1/alerts\n", method=method)
        else:
            await _reply(send, 404, b"not found: try /metrics, /healthz or /api/v1/alerts\n")


async def _reply(send: Send, status: int, body: bytes, content_type: bytes = b"text/plain; charset=utf-8",
                 extra: list[tuple[bytes, bytes]] | None = None, method: str = "GET") -> None:
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    headers.extend(extra or ())
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": b"" if method == "HEAD" else body})
