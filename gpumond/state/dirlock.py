"""One live daemon per state directory: an advisory lock (flock) on `<state_dir>/gpumond.lock`.

Two agents on one state directory would each record the other's power limits as "original" and restore the
wrong ones; two rules services would overwrite each other's alert state and page twice. flock belongs to the
open file, so the kernel drops it when the holder exits, crashes or is killed: no stale lock to clean up.
The file names its holder (daemon and pid) so the refusal can say who.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import TextIO

LOCK_FILE = "gpumond.lock"


class StateDirBusy(RuntimeError):
    """Another live daemon holds the state directory; the message is the one line to print."""


class StateDirLock:
    """Held from `acquire` until `release` (or the process ends)."""

    def __init__(self, path: Path, file: TextIO) -> None:
        self.path = path
        self._file: TextIO | None = file

    @classmethod
    def acquire(cls, directory: Path, daemon: str) -> StateDirLock:
        """Lock `directory` for `daemon` ("agent", "rules"); StateDirBusy if a live one holds it, OSError if the
        directory cannot be created or written."""
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / LOCK_FILE
        f = open(path, "a+", encoding="utf-8")  # noqa: SIM115 - held for the daemon's life; "a+": no truncation yet
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = " ".join(f.read(200).split()) or "gpumond daemon"
            f.close()
            raise StateDirBusy(f"state_dir {directory} is in use by another live {holder}; give this one its own "
                               f"state directory (--state-dir DIR, or state_dir in the config)") from None
        except BaseException:
            f.close()
            raise
        f.seek(0)
        f.truncate()
        f.write(f"gpumond {daemon} (pid {os.getpid()})\n")
        f.flush()
        return cls(path, f)

    def release(self) -> None:
        """Unlock (idempotent); the file stays, naming the last holder."""
        if self._file is not None:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_UN)
            self._file.close()
            self._file = None
