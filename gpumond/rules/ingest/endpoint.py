"""POST /api/v1/push as a plain ASGI app: Ingest's decisions with as little HTTP machinery around them as it takes.

A push is the rules service's hot path (a 32,768-rank job stepping twice a second sends 1,024 pushes/s to one
process), and a push's own work is a few hundred microseconds: Starlette's router, Request, Response and
middleware stack were about a third of it (docs/rules-api.md, "Performance"). So this endpoint reads
the few headers it needs from the ASGI scope, the body from `receive`, and answers with pre-encoded bytes. It is
the only implementation of the push route: the rules app hands it POSTs of PUSH_PATH before Starlette sees them,
and Starlette's route for the path is this same object (so other methods get the app's 405).
"""

from __future__ import annotations

import functools
import json
import logging
from typing import Any

from starlette.types import Receive, Scope, Send

from gpumond.rules.ingest.accept import Ingest, Reply
from gpumond.web.body import Disconnected, read_body

log = logging.getLogger("gpumond.rules.http")

PUSH_PATH = "/api/v1/push"

_JSON = (b"content-type", b"application/json")
# The headers Ingest.admit reads, by their ASGI (lowercase) names -> their place in its arguments.
_WANTED = {b"authorization": 0, b"content-type": 1, b"content-encoding": 2, b"content-length": 3}
_DISCONNECTED = Reply(400, {"error": "client disconnected before the body was complete"})
_FAILED = Reply(500, {"error": "internal error; the rules service logged it"})


class PushEndpoint:
    """The push route: admit (before reading the body), read the body up to its limit, accept, answer JSON."""

    def __init__(self, ingest: Ingest) -> None:
        self.ingest = ingest

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            reply = await self._handle(scope, receive)
        except Exception:  # the same answer as every other route's unexpected failure
            log.error("request failed", exc_info=True, extra={"path": scope.get("path")})
            reply = _FAILED
        start, body = encode(reply)
        await send(start)
        await send(body)

    async def _handle(self, scope: Scope, receive: Receive) -> Reply:
        ingest = self.ingest
        found: list[str | None] = [None, None, None, None]
        for name, value in scope["headers"]:
            i = _WANTED.get(name)
            if i is not None and found[i] is None:  # the first of a repeated header counts, as Starlette reads
                found[i] = value.decode("latin-1")
        client = scope.get("client")
        admitted = ingest.admit(authorization=found[0], address=client[0] if client else "unknown",
                                content_type=found[1], content_encoding=found[2], content_length=found[3])
        if isinstance(admitted, Reply):
            return admitted
        try:
            body = await read_body(receive, ingest.max_body_bytes)
        except Disconnected:
            return _DISCONNECTED
        if body is None:
            return ingest.too_large()
        return ingest.accept(admitted, body)


def encode(reply: Reply) -> tuple[dict[str, Any], dict[str, Any]]:
    """The reply as its two ASGI messages: headers (reply's own, then Content-Length and Content-Type) and body."""
    if reply.status == 202 and not reply.headers and reply.body.keys() == {"accepted"}:
        headers, body = _accepted(reply.body["accepted"])  # type: ignore[arg-type]  # the usual answer, cached
    else:
        body = json.dumps(reply.body, separators=(",", ":")).encode()
        headers = (*((k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in reply.headers),
                   (b"content-length", b"%d" % len(body)), _JSON)
    return ({"type": "http.response.start", "status": reply.status, "headers": headers},
            {"type": "http.response.body", "body": body})


@functools.lru_cache(maxsize=4096)
def _accepted(n: int) -> tuple[tuple[tuple[bytes, bytes], ...], bytes]:
    body = b'{"accepted":%d}' % n
    return ((b"content-length", b"%d" % len(body)), _JSON), body
