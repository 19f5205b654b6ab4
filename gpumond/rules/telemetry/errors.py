"""Error lines for TelemetryBatch.errors: one line each, bounded, never a traceback."""

from __future__ import annotations

LIMIT = 300


def one_line(e: BaseException | str, limit: int = LIMIT) -> str:
    """`e` as one whitespace-collapsed line of at most `limit` characters."""
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= limit else text[:limit] + "…"
