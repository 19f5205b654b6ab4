"""JSON-lines audit logs (the agent policy's, fleet remediation's): one object per action, fsynced before it is reported."""

from __future__ import annotations

import errno
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _open_append(path: Path) -> int:
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)


class AuditLog:
    """Append-only JSON lines; each line is written unbuffered and fsynced so a crash never loses a finished
    action. A write that fails (full or read-only disk) raises OSError and leaves nothing buffered behind.

    `opener(path) -> fd` is injected so tests can point the log at a device that fails like a full disk."""

    def __init__(self, path: Path, wall: Callable[[], float] = time.time,
                 opener: Callable[[Path], int] = _open_append) -> None:
        self.path = path
        self._wall = wall
        self._lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = opener(path)

    def write(self, action: str, **fields: Any) -> dict[str, Any]:
        """Append one entry: ts (unix), action, then the given fields (gpu, uuid, before_w, after_w, reason…)."""
        entry = {"ts": round(self._wall(), 3), "action": action, **fields}
        line = (json.dumps(entry, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")
        with self._lock:
            if self._fd is None:
                raise OSError(errno.EBADF, "audit log closed")
            # One write call per line: O_APPEND keeps lines whole; no userspace buffer can replay a failed
            # line into the next one.
            written = os.write(self._fd, line)
            if written != len(line):
                raise OSError(errno.ENOSPC, f"short write ({written} of {len(line)} bytes)")
            os.fsync(self._fd)
        return entry

    def close(self) -> None:
        """Close the file."""
        with self._lock:
            if self._fd is not None:
                fd, self._fd = self._fd, None
                os.close(fd)
