"""The batched push's framing: a head line naming the job and the count, then one columnar push body a line.

Each line is a whole push, byte for byte what a rank would have sent alone in the columnar encoding, so the rules
service judges every rank of a batch with the code that judges single pushes, and a bad line refuses that line
only. Lines, not a JSON array: the service finds each push with one bytes.split instead of parsing the batch
twice (once as an array, once per push), and compact JSON never holds a raw newline. Stdlib only: the relay and
the service import it; a future SDK could too.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

# A batch holds at most this many pushes (the body limit bounds it first for any real push; this bounds the work
# an empty-looking batch of heartbeats can ask for).
MAX_BATCH_PUSHES = 65_536


class BatchError(ValueError):
    """The framing is wrong (not the pushes in it); the message is one line saying what."""


def encode_batch(job: str, pushes: Sequence[bytes]) -> bytes:
    """One batch body: the head line, then each push body (compact JSON: no newline inside) on its own line."""
    head = json.dumps({"job": job, "pushes": len(pushes)}, separators=(",", ":"), ensure_ascii=False).encode()
    return b"\n".join((head, *pushes))


def split_batch(body: bytes, max_pushes: int = MAX_BATCH_PUSHES) -> tuple[str, list[bytes]]:
    """(job, push bodies) of a batch; BatchError when the head is not {"job": str, "pushes": n} or n lines differ."""
    lines = body.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()  # a trailing newline ends the last line, it does not start another
    if not lines:
        raise BatchError("empty batch: the first line must be {\"job\": …, \"pushes\": N}")
    try:
        head = json.loads(lines[0])
    except (ValueError, UnicodeDecodeError):
        raise BatchError("line 1: the batch's head must be a JSON object {\"job\": …, \"pushes\": N}") from None
    job = head.get("job") if isinstance(head, dict) else None
    count = head.get("pushes") if isinstance(head, dict) else None
    if not isinstance(job, str) or not job:
        raise BatchError("line 1: job: must be a non-empty string")
    if not isinstance(count, int) or isinstance(count, bool) or not 0 <= count <= max_pushes:
        raise BatchError(f"line 1: pushes: must be an integer from 0 to {max_pushes}")
    pushes = lines[1:]
    if len(pushes) != count:
        raise BatchError(f"the head says {count} pushes but {len(pushes)} lines follow it (a cut-off batch?)")
    return job, pushes
