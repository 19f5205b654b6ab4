"""Read a request body up to a limit, refusing as soon as it grows past it."""

from __future__ import annotations

from collections.abc import AsyncIterator


async def read_limited(chunks: AsyncIterator[bytes], limit: int) -> bytes | None:
    """The whole body, or None once more than `limit` bytes arrived (the rest is never read)."""
    parts: list[bytes] = []
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            return None
        if chunk:
            parts.append(chunk)
    return b"".join(parts)


def declared_too_large(content_length: str | None, limit: int) -> bool:
    """True when Content-Length alone says the body is over `limit` (refuse before reading a byte)."""
    if content_length is None or not content_length.strip().isdecimal():
        return False  # absent (chunked) or malformed: the server's HTTP parser and read_limited decide
    return int(content_length) > limit
