"""Crash-safe record of the limits the policy found and set, so a restarted agent can restore or resume."""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gpumond.atomicfile import replace_atomically

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
    """A JSON file replaced atomically on every change.

    `write(path, text)` is the durable write (injected so tests can make it fail the way a full or read-only
    disk does); it raises OSError when the record could not be made."""

    def __init__(self, path: Path, write: Callable[[Path, str], None] = replace_atomically) -> None:
        self.path = path
        self._write = write

    def load(self) -> Loaded:
        """Records from the last run; a missing file is empty; a corrupt one is set aside and reported.

        Never raises: whatever the bytes, the agent starts (a crash here is a crash loop under systemd)."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return Loaded()
        except OSError as e:
            log.error("policy state file cannot be read; original limits fall back to the GPUs' default limits",
                      extra={"path": str(self.path), "error": f"{e.strerror or e}"})
            return Loaded(trusted=False)
        try:
            data = json.loads(raw.decode("utf-8"))
            if not isinstance(data, dict) or data.get("version") != VERSION:
                raise ValueError(f"unknown version {data.get('version') if isinstance(data, dict) else None!r}")
            gpus = data["gpus"]
            if not isinstance(gpus, dict):
                raise ValueError("'gpus' is not an object")
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
            self._set_aside(f"{type(e).__name__}: {e}"[:200])
            return Loaded(trusted=False)
        records: dict[str, LimitRecord] = {}
        bad: list[str] = []
        for uuid, r in gpus.items():
            record = _record(r)
            if record is None:
                bad.append(uuid)
            else:
                records[uuid] = record
        if bad:
            self._set_aside(f"invalid record(s) for {', '.join(sorted(bad))[:200]}")
            return Loaded(records, trusted=False)
        return Loaded(records)

    def _set_aside(self, error: str) -> None:
        """Keep the bad file for a post-mortem under a name no later corruption overwrites."""
        aside = self.path.with_suffix(".corrupt")
        n = 0
        while aside.exists():
            n += 1
            aside = self.path.with_suffix(f".corrupt.{n}")
        try:
            os.replace(self.path, aside)
        except OSError as e:
            log.error("policy state file unreadable and cannot be set aside; original limits fall back to the "
                      "GPUs' default limits", extra={"path": str(self.path), "error": error,
                                                     "move_error": f"{e.strerror or e}"})
            return
        log.error("policy state file unreadable; set aside, original limits fall back to the GPUs' default "
                  "limits", extra={"path": str(self.path), "moved_to": str(aside), "error": error})

    def save(self, records: dict[str, LimitRecord]) -> None:
        """Atomically replace the file; a crash at any point leaves either the old or the new version.

        Raises OSError when the record could not be written (full or read-only disk)."""
        body = json.dumps({"version": VERSION, "gpus": {u: asdict(r) for u, r in sorted(records.items())}},
                          indent=1, sort_keys=True)
        self._write(self.path, body)


def _watts(value: object) -> float | None:
    """A power limit from the file: a finite, positive number of watts (bool is not a number here)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        w = float(value)
    except OverflowError:  # an int beyond a float's range
        return None
    return w if math.isfinite(w) and w > 0 else None


def _record(r: object) -> LimitRecord | None:
    """One GPU's record, or None when any field is not what this agent wrote."""
    if not isinstance(r, dict):
        return None
    original = _watts(r.get("original_w"))
    last = r.get("last_set_w")
    last_w = None if last is None else _watts(last)
    pending = r.get("restore_pending", False)
    if original is None or (last is not None and last_w is None) or not isinstance(pending, bool):
        return None
    return LimitRecord(original, last_w, pending)
