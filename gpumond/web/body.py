"""Read a request body from ASGI `receive` up to a limit, refusing as soon as it grows past it."""

from __future__ import annotations

from starlette.types import Receive


class Disconnected(Exception):
    """The client went away before its body was complete."""


async def read_body(receive: Receive, limit: int) -> bytes | None:
    """The whole body, or None once more than `limit` bytes arrived (the rest is never read).
    Raises Disconnected when the client goes away first."""
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        kind = message["type"]
        if kind == "http.disconnect":
            raise Disconnected
        if kind != "http.request":
            continue  # not part of the body (the ASGI spec defines no other request message)
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        if chunk:
            parts.append(chunk)
        if not message.get("more_body", False):
            # A body that came in one message (most pushes) is returned as it is, without a copy.
            return parts[0] if len(parts) == 1 else b"".join(parts)


def declared_too_large(content_length: str | None, limit: int) -> bool:
    """True when Content-Length alone says the body is over `limit` (refuse before reading a byte)."""
    if content_length is None or not content_length.strip().isdecimal():
        return False  # absent (chunked) or malformed: the server's HTTP parser and read_body decide
    return int(content_length) > limit
