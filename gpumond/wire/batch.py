"""The batched pushes' two framings: the line batch (a head line, then one columnar push body a line) and the
columnar batch that the node relay sends (one head with each push's identity as arrays, one set of step columns).

The line batch (what relays of the previous version send; the service still reads it): each line is a whole push,
byte for byte what a rank would have sent alone in the columnar encoding, judged by the single-push code. The
columnar batch (docs/rules-api.md, "Batched pushes"): the service parses it once and checks all its steps at once
instead of parsing, decoding and checking every push apart (gpumond/push/batch.py). Stdlib only: the relay and the
service import it; a future SDK could too.
"""

from __future__ import annotations

import binascii
import json
import math
import struct
from collections.abc import Sequence

from gpumond.wire.media import COLUMN_FIELDS

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


# The columnar batch (BATCH_COLUMNS_TYPE): {"job": …, "pushes": {key: [one value per push]}, "columns": {…}}.
# `pushes` holds what a single push's head carries, an array per key, and `steps`, how many of the step columns'
# values belong to each push, in push order: the service cuts the columns into each push's slice by these counts,
# so the grouping holds by construction (an index column would have to be range-checked and sorted). A push's
# identity is still judged alone, so a bad one refuses that push only. `columns` are the columnar push's (media.py
# COLUMN_FIELDS), for all of the batch's steps. Optional keys and columns are left out when no push has them.
PUSH_KEYS = (("rank", True), ("world_size", True), ("node", True), ("gpu_uuid", True), ("steps", True),
             ("group", False), ("incarnation", False), ("final", False))
# What an optional column holds for a push that left it out: samples -1 (not counted), comm wait NaN (not measured).
_ABSENT = {"samples": struct.pack("<q", -1), "comm_wait_s": struct.pack("<d", math.nan)}


class LineError(BatchError):
    """A push given to encode_columns_batch is not a columnar push body; `index`: its place among them."""

    def __init__(self, index: int, message: str) -> None:
        super().__init__(f"push {index}: {message}")
        self.index = index


def encode_columns_batch(job: str, pushes: Sequence[bytes]) -> bytes:
    """One columnar batch of `pushes`, columnar push bodies of `job` (as the relay holds them, already judged);
    LineError names the first that is not one (a held file damaged on disk)."""
    heads: dict[str, list[object]] = {name: [] for name, _ in PUSH_KEYS}
    raw: dict[str, list[bytes]] = {name: [] for name, _ in COLUMN_FIELDS}
    given: set[str] = set()
    for i, line in enumerate(pushes):
        try:
            body = json.loads(line)
            values = {name: binascii.a2b_base64(text) for name, text in body["columns"].items() if name in raw}
            n = len(values["step"]) // 8
        except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError, binascii.Error) as err:
            raise LineError(i, f"not a columnar push body ({type(err).__name__}: {err})") from None
        body["steps"] = n
        for name, column in heads.items():
            value = body.get(name)
            column.append(value if value is not None or name != "final" else False)
            if value is not None and value is not False:
                given.add(name)
        for name, column in raw.items():
            if name in values:
                given.add(name)
                column.append(values[name])
            elif name in _ABSENT:
                column.append(_ABSENT[name] * n)
    out = {"job": job,
           "pushes": {name: heads[name] for name, required in PUSH_KEYS if required or name in given},
           "columns": {name: binascii.b2a_base64(b"".join(raw[name]), newline=False).decode("ascii")
                       for name, required in COLUMN_FIELDS if required or name in given}}
    return json.dumps(out, separators=(",", ":"), ensure_ascii=False).encode()
