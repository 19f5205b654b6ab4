"""JSON-lines audit logs (the agent policy's, fleet remediation's): one object per action, fsynced before it is reported."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


class AuditLog:
    """Append-only JSON lines; each line is flushed and fsynced so a crash never loses a finished action."""

    def __init__(self, path: Path, wall: Callable[[], float] = time.time) -> None:
        self.path = path
        self._wall = wall
        self._lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(path, "a", encoding="utf-8")  # noqa: SIM115 - lives as long as the agent

    def write(self, action: str, **fields: Any) -> dict[str, Any]:
        """Append one entry: ts (unix), action, then the given fields (gpu, uuid, before_w, after_w, reason…)."""
        entry = {"ts": round(self._wall(), 3), "action": action, **fields}
        line = json.dumps(entry, ensure_ascii=False, separators=(",", ":"))
        with self._lock:
            self._f.write(line + "\n")
            self._f.flush()
            os.fsync(self._f.fileno())
        return entry

    def close(self) -> None:
        """Close the file."""
        with self._lock:
            self._f.close()
