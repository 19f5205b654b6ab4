"""Crash-safe record of the limits the policy found and set, so a restarted agent can restore or resume."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gpumond.state.atomic import replace_atomically
from gpumond.state.jsonfile import JsonStateFile

log = logging.getLogger("gpumond.policy")

VERSION = 1


@dataclass(frozen=True, slots=True)
class LimitRecord:
    """Per GPU (keyed by UUID): the limit before gpumond touched it, and the last one gpumond set."""

    original_w: float
    last_set_w: float | None = None
    # A stop that should have restored original_w could not (the GPU was lost): the next start restores it
    # first, in any mode. An additive key: older agents ignore it, so VERSION stays 1.
    restore_pending: bool = False


@dataclass(frozen=True, slots=True)
class Loaded:
    """What a load found: the records it could trust, and whether anything in the file was not trusted.

    `trusted` False means records may be missing: a GPU without one must not adopt its current (perhaps
    capped) limit as its original."""

    records: dict[str, LimitRecord] = field(default_factory=dict)
    trusted: bool = True


class StateFile:
    """A JSON file replaced atomically on every change, read through gpumond.state.jsonfile.

    `write(path, text)` is the durable write (injected so tests can make it fail the way a full or read-only
    disk does); it raises OSError when the record could not be made."""

    def __init__(self, path: Path, write: Callable[[Path, str], None] = replace_atomically) -> None:
        self.path = path
        self._file = JsonStateFile(path, what="policy state", version=VERSION, sections=("gpus",), write=write,
                                   consequence="original limits fall back to the GPUs' default limits")

    def load(self) -> Loaded:
        """Records from the last run; a missing file is empty; a file that cannot be used is set aside and a bad
        record left out, each reported, and the load is then not trusted.

        Never raises: whatever the bytes, the agent starts (a crash here is a crash loop under systemd)."""
        doc = self._file.read()
        records, problems = self._file.records(doc, "gpus", _record)
        self._file.reject(problems)
        return Loaded(records, trusted=not doc.problems and not problems)

    def save(self, records: dict[str, LimitRecord]) -> None:
        """Atomically replace the file; a crash at any point leaves either the old or the new version.

        Raises OSError when the record could not be written (full or read-only disk)."""
        self._file.write({"gpus": {u: asdict(r) for u, r in sorted(records.items())}})


def _watts(value: object) -> float | None:
    """A power limit from the file: a finite, positive number of watts (bool is not a number here)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        w = float(value)
    except OverflowError:  # an int beyond a float's range
        return None
    return w if math.isfinite(w) and w > 0 else None


def _record(uuid: str, r: object) -> LimitRecord:
    """One GPU's record; ValueError when any field is not what this agent wrote."""
    if not isinstance(r, dict):
        raise ValueError("not an object")
    original = _watts(r.get("original_w"))
    last = r.get("last_set_w")
    last_w = None if last is None else _watts(last)
    pending = r.get("restore_pending", False)
    if original is None or (last is not None and last_w is None) or not isinstance(pending, bool):
        raise ValueError("original_w, last_set_w or restore_pending is not a limit this agent wrote")
    return LimitRecord(original, last_w, pending)
