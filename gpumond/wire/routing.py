"""Which rules shard owns a job, and that shard's push address: the one definition the SDK and the service share.

Standard library only (zlib), so the job SDK can import it; the rules service imports it from here too, so
a job's shard can never differ between the replica that refuses a push and the SDK that routed it.
"""

from __future__ import annotations

import zlib

MAX_SHARDS = 1024  # the same bound `--shard I/N` takes
PLACEHOLDER = "{shard}"


def shard_of(job: str, count: int) -> int:
    """Stable shard of a job id: CRC-32 of its UTF-8 bytes modulo `count` (the same in every process)."""
    return zlib.crc32(job.encode("utf-8")) % count


def shard_endpoint(template: str, job: str, count: int | None) -> str:
    """`template` with every `{shard}` replaced by the job's shard number; unchanged without sharding."""
    if count is None:
        return template
    # Textual, not str.format: a URL may hold other braces, and `{shard}` may sit in the host, the port or
    # the path (http://rules-{shard}.rules-shards:9481, or http://127.0.0.1:948{shard} for local replicas).
    return template.replace(PLACEHOLDER, str(shard_of(job, count)))
