"""The relay's listener: POST /api/v1/push with the bodies the rules service takes, answered once the push is held.

Plain ASGI, as the rules service's push endpoint: a push's work is small and this runs on every rank's every push.
The answer is the service's shape: 202 {"accepted": n} (with "dropped": {reason: n} for steps of this rank the relay
or the service could not deliver since its last answer), or the status and one line the service would give.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import anyio.to_thread
from starlette.types import Receive, Scope, Send

from gpumond.agent.relay.buffer import BatchKey, Buffer
from gpumond.agent.relay.intake import Intake, Refused
from gpumond.agent.relay.processes import ProcessDevices
from gpumond.agent.relay.stats import RelayStats
from gpumond.agent.relay.upstream import PUSH_PATH, Refusal
from gpumond.web.body import Disconnected, declared_too_large, read_body
from gpumond.wire.media import COLUMNS_TYPE, EARLY_HEADER, JSON_TYPE, PID_HEADER, PID_START_HEADER

log = logging.getLogger("gpumond.agent.relay")

_WANTED = {b"authorization": 0, b"content-type": 1, b"content-encoding": 2, b"content-length": 3,
           PID_HEADER.lower().encode(): 4, PID_START_HEADER.lower().encode(): 5, EARLY_HEADER.lower().encode(): 6}


class RelayEndpoint:
    """The relay's ASGI app: one route, the push."""

    def __init__(self, intake: Intake, buffer: Buffer, stats: RelayStats,
                 refusal: Callable[[str | None], Refusal | None], devices: ProcessDevices,
                 early: Callable[[BatchKey], None]) -> None:
        self._intake = intake
        self._early = early  # told the key of each early push held (EarlyRounds.asked)
        self._devices = devices  # the one the intake's filler looks ranks up in
        self._buffer = buffer
        self._stats = stats
        self._refusal = refusal

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        try:
            status, body = await self._handle(scope, receive)
        except Exception:
            log.error("relay request failed", exc_info=True)
            status, body = 500, {"error": "internal error; the agent logged it"}
        raw = json.dumps(body, separators=(",", ":")).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(raw))]})
        await send({"type": "http.response.body", "body": raw})

    async def _handle(self, scope: Scope, receive: Receive) -> tuple[int, dict[str, Any]]:
        if scope["path"] != PUSH_PATH:
            return 404, {"error": f"not found: the relay serves POST {PUSH_PATH} only"}
        if scope["method"] != "POST":
            return 405, {"error": f"method not allowed: POST {PUSH_PATH}"}
        found: list[str | None] = [None] * len(_WANTED)
        for name, value in scope["headers"]:
            i = _WANTED.get(name)
            if i is not None and found[i] is None:
                found[i] = value.decode("latin-1")
        authorization, content_type, encoding, length, pid_text, start_text, early_text = found
        refused = self._refusal(authorization)
        if refused is not None:
            return refused.status, {"error": refused.message}
        media = JSON_TYPE if content_type is None else content_type.split(";")[0].strip().lower()
        if media not in (JSON_TYPE, COLUMNS_TYPE):
            return 415, {"error": f"Content-Type must be {JSON_TYPE} (steps as objects) or {COLUMNS_TYPE} (steps as "
                                  f"columns) (got {content_type[:64]!r})"}
        if encoding is not None and encoding.strip().lower() not in ("", "identity"):
            return 415, {"error": f"Content-Encoding {encoding[:32]!r} is not supported; send the JSON uncompressed"}
        limit = self._intake.max_body_bytes
        too_large = 413, {"error": f"body larger than limits.max_body_bytes ({limit} bytes)"}
        if declared_too_large(length, limit):
            return too_large
        try:
            body = await read_body(receive, limit)
        except Disconnected:
            return 400, {"error": "client disconnected before the body was complete"}
        if body is None:
            return too_large
        pid = sender_pid(pid_text)
        start = _decimal(start_text, 20) if pid is not None else None
        if pid is not None and self._devices.due(pid, start):
            # NVML is read on a worker thread: it waits on the session's lock, which the sampler holds for a whole
            # sample, and this event loop serves the agent's /healthz and /metrics too. Only then is there an await
            # between the body and the answer (a client that half-closed after its body loses an answer the server
            # gives after an await: it sees the EOF first); the judging itself then finds the pid without waiting.
            await anyio.to_thread.run_sync(self._devices.refresh)
        entry = self._intake.judge(body, columns=media == COLUMNS_TYPE, authorization=authorization, pid=pid,
                                   pid_start=start)
        if isinstance(entry, Refused):
            return entry.status, {"error": entry.message}
        if entry.size > self._buffer.max_bytes:
            return 413, {"error": f"push larger than the relay's buffer (relay.buffer_max_bytes "
                                  f"{self._buffer.max_bytes})"}
        dropped = self._buffer.add(entry)
        if dropped == [entry]:
            # Only pushes being sent fill the buffer: none is dropped for this one, which the rank sends again.
            return 503, {"error": f"the relay's buffer (relay.buffer_max_bytes {self._buffer.max_bytes}) is full "
                                  "with pushes being sent to the rules service; send again shortly"}
        for old in dropped:
            self._stats.lost(old.rank, old.steps, "buffer_full")
        self._stats.took(entry.rank, entry.steps)
        if early_text is not None and early_text.strip() == "1":
            self._early(entry.key)  # only now: a push refused or answered 503 is not held, and is sent again anyway
        answer: dict[str, Any] = {"accepted": entry.steps}
        owed = self._stats.owed(entry.rank, entry.steps)
        if owed:
            answer["dropped"] = owed
        return 202, answer


def sender_pid(text: str | None) -> int | None:
    """The pid a Gpumond-Pid header gives, or None when it gives none usable (the push then names its GPU itself).
    Its length is checked before int(): past 4,300 digits int() raises, and a header may be kilobytes long."""
    pid = _decimal(text, 10)
    return pid if pid is not None and 0 < pid < 2**31 else None


def _decimal(text: str | None, digits: int) -> int | None:
    """A header's decimal number of at most `digits` digits, else None (the length is checked before int())."""
    text = (text or "").strip()
    if not 0 < len(text) <= digits or not text.isascii() or not text.isdecimal():
        return None
    return int(text)
