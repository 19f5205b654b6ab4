"""What the relay still held when it stopped (the rules service not answering within the stop's grace), kept in
the state directory and taken again at the next start: a relay restart then loses nothing its ranks handed over.

The file holds each push's line and the Authorization it came with: it is written like every state file (a
temporary file of mode 0600, renamed over), and removed once read, so a push is taken back once; unlike other state
files no copy of a damaged one is kept.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gpumond.agent.relay.buffer import Entry
from gpumond.state.jsonfile import JsonStateFile, Number, Text

log = logging.getLogger("gpumond.agent.relay")

FILE_NAME = "relay-held.json"
VERSION = 1


class _Held(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    job: Text
    rank: int = Field(ge=0, strict=True)
    authorization: Text | None = None
    line: Text
    steps: int = Field(ge=0, strict=True)
    age_s: Number = Field(ge=0)
    # Sends that got no usable answer: a "duplicate" from the service for such a push means an earlier send stored
    # it, not that it is lost. Absent in files of earlier versions: none then.
    attempts: int = Field(0, ge=0, strict=True)


class HeldFile:
    """`<state_dir>/relay-held.json`: save at stop, load (and remove) at start."""

    def __init__(self, path: Path, clock: Callable[[], float], *, buffer_max_bytes: int = 64 * 1024 * 1024) -> None:
        self.path = path
        self._clock = clock
        # What a full buffer can write: each held push costs the buffer at least its line and credential, which the
        # file JSON-escapes to at most 6 bytes a byte (a latin-1 credential byte as \u00XX; a line's quote is 2).
        of_path = functools.partial(JsonStateFile, path, what="relay held pushes", version=VERSION,
                                    sections=("pushes",), max_bytes=6 * buffer_max_bytes + (1 << 20),
                                    consequence="the pushes the relay held at its last stop are not delivered")
        self._file = of_path()
        # Read without the copies other state files keep of a damaged file for a post-mortem: this one holds the
        # ranks' push tokens, and a copy is made with the process's umask (readable by others in a container).
        # It is removed once read instead, damaged or not.
        self._reader = of_path(read_only=True)

    def save(self, entries: list[Entry], *, in_flight: bool = False) -> bool:
        """Keep `entries` (oldest first) for the next start; False (logged) when the file cannot be written.
        `in_flight`: a batch was still being sent, so any of them may yet be stored (counted as one more attempt)."""
        now = self._clock()
        body: dict[str, Any] = {"pushes": {
            str(i): {"job": e.rank[0], "rank": e.rank[1], "authorization": e.key[1], "line": e.line.decode("utf-8"),
                     "steps": e.steps, "age_s": max(0.0, now - e.received), "attempts": e.attempts + in_flight}
            for i, e in enumerate(entries)}}
        try:
            self._file.write(body)
        except OSError as e:
            log.error("cannot keep the relay's undelivered pushes for the next start; they are lost",
                      extra={"path": str(self.path), "pushes": len(entries), "error": e.strerror or str(e)})
            return False
        return True

    def load(self) -> list[Entry]:
        """The pushes a previous run kept, oldest first, aged as they were; the file is removed once read."""
        doc = self._reader.read()
        records, problems = self._reader.records(doc, "pushes", lambda _, v: _Held.model_validate(v))
        self._reader.reject(problems)
        now = self._clock()
        out = [Entry((r.job, r.authorization), (r.job, r.rank), r.line.encode("utf-8"), r.steps, now - r.age_s,
                     attempts=r.attempts)
               for _, r in sorted(records.items(), key=lambda kv: int(kv[0]) if kv[0].isdecimal() else 0)]
        if doc.body or doc.problems or problems:
            try:
                self.path.unlink(missing_ok=True)
            except OSError as e:
                log.error("cannot remove the relay's held-pushes file; its pushes may be sent again at the next "
                          "start (the rules service drops them as duplicates)",
                          extra={"path": str(self.path), "error": e.strerror or str(e)})
        return out
