"""The agent's held events (XIDs, ECC increases, NVLink replay rises) across restarts: `alert-events.json`.

An event has no "still true" of its own: its alert stays active for `event_hold_s` after it was seen. Kept only
in memory, a restart would forget it and resolve the alert early (a page resolved 30 s after an XID 48 held for
600 s; an XID 79 that drained a node, resolved by an agent upgrade). So each change to the held events is
written here, and a starting agent takes them back with what is left of their hold.

Times are kept as Unix time (what outlives the process); the engine's clock, which times the hold, is monotonic
on real GPUs and starts over with the process, so a restored event's clock time is `now - (wall_now -
last_wall)`. An event from the future (the clock was set back) is held from now.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gpumond.agent.policy.alert_rules import AgentAlertState, EventRecord
from gpumond.state.jsonfile import JsonStateFile, Number, Text

log = logging.getLogger("gpumond.policy")

FILE_NAME = "alert-events.json"
MAX_AHEAD_S = 86_400.0  # an event this far in the future is not an event this agent saw
VERSION = 1
_KINDS = ("xid", "ecc", "nvlink")  # xid: key is the XID code; nvlink: the link; ecc: none


class _EventDoc(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Text
    key: int = Field(strict=True, ge=0)  # the XID code or the NVLink link; 0 for ECC
    gpu: int = Field(strict=True, ge=0)
    uuid: Text
    count: Number
    first_wall: Number
    last_wall: Number


@dataclass(frozen=True, slots=True)
class HeldEvents:
    """The events part of AgentAlertState, on Unix time."""

    xid: tuple[tuple[int, EventRecord], ...] = ()
    ecc: tuple[EventRecord, ...] = ()
    nvlink: tuple[tuple[int, EventRecord], ...] = ()

    @classmethod
    def of(cls, state: AgentAlertState) -> HeldEvents:
        return cls(state.xid_events, state.ecc_events, state.nvlink_events)

    def into(self, state: AgentAlertState) -> AgentAlertState:
        return replace(state, ecc_events=self.ecc, xid_events=self.xid, nvlink_events=self.nvlink)


def _entries(events: HeldEvents) -> dict[str, dict[str, Any]]:
    rows = ([("xid", k, r) for k, r in events.xid] + [("ecc", 0, r) for r in events.ecc]
            + [("nvlink", k, r) for k, r in events.nvlink])
    return {f"{kind}:{key}:{r.uuid}": {"kind": kind, "key": key, "gpu": r.gpu, "uuid": r.uuid, "count": r.count,
                                       "first_wall": r.first_wall, "last_wall": r.last_wall}
            for kind, key, r in rows}


def _parse(name: str, raw: Any) -> _EventDoc:
    doc = _EventDoc.model_validate(raw)
    if doc.kind not in _KINDS:
        raise ValueError(f"unknown kind {doc.kind!r}")
    if doc.last_wall < doc.first_wall:
        raise ValueError("last_wall before first_wall")
    return doc


class EventFile:
    """Where the agent keeps its held events; `path` None keeps nothing (a run without a state directory)."""

    def __init__(self, path: Path | None) -> None:
        self._file = JsonStateFile(path, what="alert event", version=VERSION, sections=("events",),
                                   consequence="events seen before this start are not held for their event_hold_s")
        self._saved: HeldEvents | None = None
        self._failing = False

    def load(self, now: float, wall_now: float, hold_s: float) -> HeldEvents:
        """The events still within their hold, on the engine's clock (`now`, its Unix time `wall_now`)."""
        doc = self._file.read()
        docs, problems = self._file.records(doc, "events", _parse)
        for key, d in list(docs.items()):
            if d.last_wall > wall_now + MAX_AHEAD_S:  # a wall time no clock drift explains (and no message prints)
                problems.append(f"events[{key!r}]: last seen {d.last_wall - wall_now:.0f} s in the future")
                del docs[key]
        self._file.reject(problems)
        xid: list[tuple[int, EventRecord]] = []
        ecc: list[EventRecord] = []
        nvlink: list[tuple[int, EventRecord]] = []
        for d in docs.values():
            age_last, age_first = max(wall_now - d.last_wall, 0.0), max(wall_now - d.first_wall, 0.0)
            if age_last >= hold_s:
                continue
            # An event from the future (the clock was set back) is held from now, and saved as now: a restart
            # must not hold it for its whole hold again.
            record = EventRecord(d.gpu, d.uuid, now - age_first, now - age_last, d.count,
                                 min(d.first_wall, wall_now), min(d.last_wall, wall_now))
            if d.kind == "xid":
                xid.append((d.key, record))
            elif d.kind == "ecc":
                ecc.append(record)
            else:
                nvlink.append((d.key, record))
        held = HeldEvents(tuple(sorted(xid, key=lambda i: (i[1].gpu, i[0]))), tuple(sorted(ecc, key=lambda r: r.gpu)),
                          tuple(sorted(nvlink, key=lambda i: (i[1].gpu, i[0]))))
        if held != HeldEvents():
            log.info("held events restored", extra={"xids": len(held.xid), "ecc": len(held.ecc),
                                                    "nvlink": len(held.nvlink)})
        self._saved = None if problems else held  # after a rejected record: rewritten at the first save
        return held

    def save(self, events: HeldEvents) -> None:
        """Record the held events when they changed; a failed write is said once and tried at the next change."""
        if events == self._saved and not self._failing:
            return
        try:
            self._file.write({"events": _entries(events)})
        except (OSError, ValueError) as e:
            if not self._failing:
                log.warning("cannot record held events (a restart now would forget them)",
                            extra={"path": str(self._file.path), "error": getattr(e, "strerror", None) or str(e)})
            self._failing = True
            return
        self._failing = False
        self._saved = events
