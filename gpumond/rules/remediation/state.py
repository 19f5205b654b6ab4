"""Remediation state on disk: one JSON file replaced atomically on every change (gpumond.atomicfile)."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict
from pathlib import Path

from gpumond.atomicfile import replace_atomically
from gpumond.rules.remediation.plan import Breaker, Record, State

log = logging.getLogger("gpumond.rules.remediation")

FILE_NAME = "remediation-state.json"
VERSION = 1


def dumps(state: State) -> str:
    """The state as the file holds it."""
    return json.dumps({
        "version": VERSION,
        "records": {n: asdict(r) for n, r in sorted(state.records.items())},
        "drains": list(state.drains),
        "breaker": asdict(state.breaker) if state.breaker is not None else None,
        "straggler_since": dict(sorted(state.straggler_since.items())),
        "undone": list(state.undone),
        "noted": list(state.noted),
    }, indent=1, sort_keys=True)


def loads(text: str) -> State:
    """Parse the file; raises ValueError (with what is wrong) on anything else."""
    try:
        data = json.loads(text)
        if data.get("version") != VERSION:
            raise ValueError(f"unknown version {data.get('version')!r}")
        records = {}
        for node, r in data["records"].items():
            r = dict(r)
            r["conditions"] = tuple(r["conditions"])
            records[node] = Record(**r)
        b = data.get("breaker")
        return State(records=records, drains=tuple(float(t) for t in data["drains"]),
                     breaker=Breaker(float(b["opened_at"]), str(b["why"])) if b else None,
                     straggler_since={str(k): float(v) for k, v in data.get("straggler_since", {}).items()},
                     undone=tuple(data.get("undone", ())), noted=tuple(data.get("noted", ())))
    except (KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"malformed: {e!r}") from None


class StateFile:
    """Where remediation keeps its state; None path keeps it in memory only."""

    def __init__(self, path: Path | None) -> None:
        self.path = path

    def load(self) -> State:
        """The last saved state; a missing file is empty; a corrupt one is set aside, reported, and the
        scheduler's own view (reasons beginning `gpumond:`) lets the next evaluation adopt what was drained."""
        if self.path is None:
            return State()
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return State()
        try:
            return loads(text)
        except ValueError as e:
            aside = self.path.with_suffix(".corrupt")
            os.replace(self.path, aside)
            log.error("remediation state file unreadable; set aside (nodes gpumond drained are adopted again "
                      "from their scheduler reason)", extra={"path": str(self.path), "moved_to": str(aside),
                                                             "error": str(e)})
            return State()

    def save(self, state: State) -> None:
        """Replace the file atomically: a crash leaves the old or the new state, never half of one."""
        if self.path is not None:
            replace_atomically(self.path, dumps(state))
