"""The demo receiver made to misbehave on request, for tests and benchmarks: planned answers and stalls.

`ScriptedReceiver.script(kind, Respond(429, headers={"Retry-After": "1"}), Hang(2.0), …)` queues answers
used one per request in order; then the receiver answers as the real service would again.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from gpumond.demo.receiver import KINDS, SLACK_STATUS_BODY, Kind, Receiver, Verdict

MAX_HANG_S = 300.0


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
        """This answer as the receiver sends it (with the service's usual body when none was given)."""
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
        return Verdict(self.status, body, media_type, dedup_key=real.dedup_key if 200 <= self.status < 300
                       else None, headers=self.headers)


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
    """The receiver, answering from a queue of planned answers per kind while one is queued."""

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

    async def planned(self, kind: Kind, verdict: Verdict) -> Verdict | None:
        with self._cond:
            plan = self._scripts[kind].popleft() if self._scripts[kind] else None
        if isinstance(plan, Hang):
            try:
                await asyncio.wait_for(self.stopping().wait(), plan.seconds)
                return Verdict(503, "receiver stopping", "text/plain")
            except asyncio.TimeoutError:
                plan = plan.then
            if plan is None:
                return verdict  # the normal answer, late
        return None if plan is None else plan.verdict(kind, verdict)
