"""The demo's receiver held to every rule the real services document, and made to misbehave on request.

`ScriptedReceiver` answers each request as Slack, PagerDuty or an Alertmanager webhook would, all their rules
applied (tests/service_payloads.py), so a sender posting what the service would refuse is refused here too.
`script(kind, Respond(429, headers={"Retry-After": "1"}), Hang(2.0), …)` queues answers used one per request in
order; then it answers as the real service would again. `wait_for` blocks until records arrive.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from gpumond.demo.receiver import KINDS, Kind, Receiver, Record, Verdict, describe
from tests.service_payloads import strict_answer

MAX_HANG_S = 300.0
# What Slack answers with each status (its documented error strings).
SLACK_STATUS_BODY = {200: "ok", 400: "invalid_payload", 403: "action_prohibited", 404: "channel_not_found",
                     410: "channel_is_archived", 429: "rate_limited", 500: "rollup_error"}


@dataclass(frozen=True)
class Respond:
    """A planned answer: this status, optional body (str, bytes or JSON-able mapping/list) and headers."""

    status: int
    body: str | bytes | Mapping[str, Any] | list[Any] | None = None
    headers: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 100 <= self.status <= 599:
            raise ValueError(f"Respond status must be an HTTP status 100-599 (got {self.status})")
        object.__setattr__(self, "headers", MappingProxyType(dict(self.headers)))

    def verdict(self, kind: Kind, real: Verdict) -> Verdict:
        """This answer as the receiver sends it (with the service's usual body when none was given); the
        record keeps what the real service found wrong with the payload, if anything."""
        body = self.body
        media_type = "text/plain"
        if body is None:
            if kind == "slack":
                body = SLACK_STATUS_BODY.get(self.status, "")
            elif kind == "pagerduty" and self.status == 400:
                body = {"status": "invalid event", "message": "Event object is invalid", "errors": ["scripted"]}
            else:
                body = ""
        if isinstance(body, (Mapping, list)):
            body, media_type = json.dumps(dict(body) if isinstance(body, Mapping) else body), "application/json"
        return Verdict(self.status, body, media_type, real.error, real.errors,
                       dedup_key=real.dedup_key if 200 <= self.status < 300 else None, headers=self.headers)


@dataclass(frozen=True)
class Hang:
    """A planned stall: wait `seconds` (ended early by stop()), then answer `then`, or normally if None."""

    seconds: float
    then: Respond | None = None

    def __post_init__(self) -> None:
        if not 0 < self.seconds <= MAX_HANG_S:
            raise ValueError(f"Hang seconds must be in (0, {MAX_HANG_S:g}] (got {self.seconds})")


Scripted = Respond | Hang


class ScriptedReceiver(Receiver):
    """The receiver with the services' rules, answering from a queue of planned answers per kind while one is
    queued."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._scripts: dict[Kind, deque[Scripted]] = {k: deque() for k in KINDS}

    def script(self, kind: Kind, *responses: Scripted) -> None:
        """Queue planned answers for `kind`, used one per request in order; then normal behaviour resumes."""
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)} (got {kind!r})")
        for r in responses:
            if not isinstance(r, (Respond, Hang)):
                raise TypeError(f"script() takes Respond or Hang values (got {type(r).__name__})")
        with self._cond:
            self._scripts[kind].extend(responses)

    def pending_scripts(self, kind: Kind) -> int:
        """How many scripted answers for `kind` are still queued."""
        with self._cond:
            return len(self._scripts[kind])

    def clear(self) -> None:
        """Forget every record, the dropped count and any scripted answers not yet used."""
        super().clear()
        with self._cond:
            for q in self._scripts.values():
                q.clear()

    async def answer(self, kind: Kind, raw: bytes, content_type: str) -> Verdict:
        real = strict_answer(kind, raw, content_type, self._new_key)
        with self._cond:
            plan = self._scripts[kind].popleft() if self._scripts[kind] else None
        if isinstance(plan, Hang):
            try:
                await asyncio.wait_for(self.stopping().wait(), plan.seconds)
                return Verdict(503, "receiver stopping", "text/plain", real.error, real.errors)
            except asyncio.TimeoutError:
                plan = plan.then
        return real if plan is None else plan.verdict(kind, real)

    def wait_for(self, predicate: Callable[[Record], bool] = lambda r: True, timeout: float = 5.0, *,
                 kind: Kind | None = None, accepted: bool | None = None, count: int = 1) -> list[Record]:
        """Block until `count` kept records (filtered as received() does) match; return them all, or TimeoutError."""
        if not 0 < timeout <= 600:
            raise ValueError(f"timeout must be in (0, 600] seconds (got {timeout})")
        deadline = time.monotonic() + timeout
        while True:
            with self._cond:
                seq = self._seq
            matched = [r for r in self.received(kind, accepted=accepted) if predicate(r)]
            if len(matched) >= count:
                return matched
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(self._timeout_message(timeout, kind, count, len(matched)))
            with self._cond:
                self._cond.wait_for(lambda: self._seq != seq, remaining)

    def _timeout_message(self, timeout: float, kind: Kind | None, count: int, matched: int) -> str:
        records = self.received(kind)
        tally: dict[str, int] = {}
        for r in records:
            key = f"{r.kind} {r.status}"
            tally[key] = tally.get(key, 0) + 1
        seen = ", ".join(f"{k} x{n}" for k, n in sorted(tally.items())) or "nothing"
        last = f"; last: {describe(records[-1])}" if records else ""
        return (f"receiver {self.url}: {matched} of {count} wanted {kind or 'any'} record(s) matched "
                f"within {timeout:g} s; received {seen}{last}")
