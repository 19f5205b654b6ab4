"""Remediation state on disk: `remediation-state.json`, read and written through gpumond.state.jsonfile.

Every record is validated on load: a bad node record is left out (its node, if gpumond drained it, is adopted
again from its scheduler reason), the rest are used. A breaker record that cannot be read keeps the breaker
open: a guard refusal must not be forgotten because its record was damaged.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from gpumond.rules.remediation.plan import Breaker, Record, State
from gpumond.state.jsonfile import Document, Flag, JsonStateFile, Number, Text

FILE_NAME = "remediation-state.json"
VERSION = 1
_CONSEQUENCE = "nodes gpumond drained are adopted again from their scheduler reason"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _RecordDoc(_Model):
    node: Text
    pool: Text
    reason: Text
    conditions: tuple[Text, ...]
    since: Number
    dry_run: Flag
    phase: Literal["draining", "drained", "resuming"] = "draining"
    fatal: Flag = False
    clear_since: Number | None = None


class _BreakerDoc(_Model):
    opened_at: Number
    why: Text
    dry_run: Flag = False


def _record(node: str, raw: Any) -> Record:
    doc = _RecordDoc.model_validate(raw)
    if doc.node != node:
        raise ValueError(f"record for {doc.node!r} filed under {node!r}")
    return Record(**doc.model_dump())


def dumps_body(state: State) -> dict[str, Any]:
    """The state as the file holds it (without the version, which the file adds)."""
    return {
        "records": {n: asdict(r) for n, r in sorted(state.records.items())},
        "drains": list(state.drains),
        "breaker": asdict(state.breaker) if state.breaker is not None else None,
        "straggler_since": dict(sorted(state.straggler_since.items())),
        "undone": list(state.undone),
        "noted": list(state.noted),
    }


@dataclass(frozen=True, slots=True)
class Loaded:
    """The state a read could trust, and what it could not."""

    state: State
    problems: tuple[str, ...] = ()


def _field(doc: Document, name: str, parse: Callable[[Any], Any], default: Any, problems: list[str]) -> Any:
    if name not in doc.body or doc.body[name] is None:
        return default
    try:
        return parse(doc.body[name])
    except (ValueError, TypeError) as e:
        problems.append(f"{name}: {str(e).splitlines()[0]}")
        return default


def _numbers(raw: Any) -> tuple[float, ...]:
    if not isinstance(raw, list) or not all(isinstance(t, int | float) and not isinstance(t, bool)
                                            and math.isfinite(t) for t in raw):
        raise ValueError("not a list of finite numbers")
    return tuple(float(t) for t in raw)


def _names(raw: Any) -> tuple[str, ...]:
    if not isinstance(raw, list) or not all(isinstance(n, str) for n in raw):
        raise ValueError("not a list of node names")
    return tuple(raw)


def _since(raw: Any) -> dict[str, float]:
    if not isinstance(raw, dict):
        raise ValueError("not an object")
    return {str(k): v for k, v in zip(raw, _numbers(list(raw.values())), strict=True)}


class StateFile:
    """Where remediation keeps its state; None path keeps it in memory only. `read_only` for the CLI."""

    def __init__(self, path: Path | None, *, read_only: bool = False, clock: Callable[[], float] = time.time,
                 dry_run: bool = False) -> None:
        self._file = JsonStateFile(path, what="remediation state", version=VERSION, sections=("records",),
                                   consequence=_CONSEQUENCE, read_only=read_only)
        self._clock = clock
        self._dry_run = dry_run  # the mode reading it: a breaker kept open by a damaged record is marked so

    @property
    def path(self) -> Path | None:
        return self._file.path

    def read(self) -> Loaded:
        """The last saved state and what could not be used of it; never raises."""
        doc = self._file.read()
        records, problems = self._file.records(doc, "records", _record)
        breaker = None
        if doc.body.get("breaker") is not None:
            try:
                breaker = Breaker(**_BreakerDoc.model_validate(doc.body["breaker"]).model_dump())
            except ValueError as e:  # pydantic's ValidationError is a ValueError
                problems.append(f"breaker: {str(e).splitlines()[0]}")
                # Fail closed: a refusal whose record was damaged still stops every action until a person looks.
                breaker = Breaker(self._clock(), "the breaker's saved record was unreadable; kept open until an "
                                                 "operator resets it", self._dry_run)
        state = State(records=records, drains=_field(doc, "drains", _numbers, (), problems), breaker=breaker,
                      straggler_since=_field(doc, "straggler_since", _since, {}, problems),
                      undone=_field(doc, "undone", _names, (), problems),
                      noted=_field(doc, "noted", _names, (), problems))
        self._file.reject(problems)
        return Loaded(state, doc.problems + tuple(problems))

    def load(self) -> State:
        """The last saved state (what could be trusted of it)."""
        return self.read().state

    def save(self, state: State) -> None:
        """Replace the file atomically: a crash leaves the old or the new state, never half of one."""
        self._file.write(dumps_body(state))
