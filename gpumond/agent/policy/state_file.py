"""Crash-safe record of the limits the policy found and set, so a restarted agent can restore or resume."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass
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


class StateFile:
    """A JSON file replaced atomically on every change."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> dict[str, LimitRecord]:
        """Records from the last run; a missing file is empty, a corrupt one is set aside and reported."""
        try:
            raw = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        try:
            data = json.loads(raw)
            if data.get("version") != VERSION:
                raise ValueError(f"unknown version {data.get('version')!r}")
            return {uuid: LimitRecord(float(r["original_w"]),
                                      None if r.get("last_set_w") is None else float(r["last_set_w"]),
                                      r.get("restore_pending", False) is True)
                    for uuid, r in data["gpus"].items()}
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            aside = self.path.with_suffix(".corrupt")
            os.replace(self.path, aside)
            log.error("policy state file unreadable; set aside, original limits from it are lost",
                      extra={"path": str(self.path), "moved_to": str(aside), "error": str(e)})
            return {}

    def save(self, records: dict[str, LimitRecord]) -> None:
        """Atomically replace the file; a crash at any point leaves either the old or the new version."""
        body = json.dumps({"version": VERSION, "gpus": {u: asdict(r) for u, r in sorted(records.items())}},
                          indent=1, sort_keys=True)
        replace_atomically(self.path, body)
