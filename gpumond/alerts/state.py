"""Crash-safe record of the alerts firing and the notices each sink has open, so a restart pages no one twice."""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from gpumond.alerts.model import Alert, pairs
from gpumond.atomicfile import replace_atomically

log = logging.getLogger("gpumond.alerts")

VERSION = 1
FILE_NAME = "alerts-state.json"


def _to_json(a: Alert) -> dict[str, Any]:
    return {"labels": dict(a.labels), "annotations": dict(a.annotations), "starts_at": a.starts_at}


def _from_json(raw: Any) -> Alert:
    return Alert(pairs(raw["labels"]), pairs(raw["annotations"]), float(raw["starts_at"]))


class AlertStateFile:
    """`alerts-state.json` in the daemon's state directory; None keeps everything in memory (one run only)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._firing: dict[str, Alert] = {}
        self._sinks: dict[str, dict[str, Alert]] = {}
        self._failing = False  # the last write failed: say so once, retry on every update until it works
        self._load()

    def _load(self) -> None:
        if self.path is None:
            return
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return
        try:
            data = json.loads(raw.decode("utf-8"))
            if data.get("version") != VERSION:
                raise ValueError(f"unknown version {data.get('version')!r}")
            self._firing = {fp: _from_json(a) for fp, a in data["firing"].items()}
            self._sinks = {name: {fp: _from_json(a) for fp, a in book.items()} for name, book in data["sinks"].items()}
        except (ValueError, KeyError, TypeError, AttributeError) as e:  # UnicodeDecodeError is a ValueError
            aside = self.path.with_suffix(".corrupt")
            os.replace(self.path, aside)
            log.error("alert state file unreadable; set aside: alerts opened before this start will not be "
                      "resolved by it", extra={"path": str(self.path), "moved_to": str(aside), "error": str(e)})
            self._firing, self._sinks = {}, {}

    @property
    def firing(self) -> tuple[Alert, ...]:
        """Alerts that were firing when the record was last written."""
        with self._lock:
            return tuple(self._firing.values())

    def save_firing(self, alerts: Iterable[Alert]) -> None:
        """Record the alerts firing now (written only when the set changed)."""
        with self._lock:
            new = {a.fingerprint: a for a in alerts if a.state == "firing"}
            if new.keys() == self._firing.keys() and not self._failing:
                return
            self._firing = new
            self._write()  # when it fails, the next update tries again

    def book(self, sink: str) -> SinkBook:
        """The notices one sink keeps open (its NoticeBook)."""
        return SinkBook(self, sink)

    def _load_book(self, sink: str) -> dict[str, Alert]:
        with self._lock:
            return dict(self._sinks.get(sink, {}))

    def _save_book(self, sink: str, notices: dict[str, Alert]) -> None:
        with self._lock:
            self._sinks[sink] = dict(notices)
            self._write()

    def _write(self) -> bool:
        if self.path is None:
            return True
        body = json.dumps({"version": VERSION,
                           "firing": {fp: _to_json(a) for fp, a in sorted(self._firing.items())},
                           "sinks": {name: {fp: _to_json(a) for fp, a in sorted(book.items())}
                                     for name, book in sorted(self._sinks.items())}}, indent=1, sort_keys=True)
        try:
            replace_atomically(self.path, body)
        except OSError as e:  # a full disk must not stop alerting; exactly-once across restarts is then at risk
            if not self._failing:
                log.error("cannot write the alert state file (alerting goes on; a restart may notify again)",
                          extra={"path": str(self.path), "error": str(e)})
            self._failing = True
            return False
        if self._failing:
            log.warning("alert state file written again", extra={"path": str(self.path)})
        self._failing = False
        return True


class SinkBook:
    """One sink's view of the state file."""

    def __init__(self, state: AlertStateFile, sink: str) -> None:
        self._state = state
        self._sink = sink

    def load(self) -> dict[str, Alert]:
        return self._state._load_book(self._sink)

    def save(self, notices: dict[str, Alert]) -> None:
        self._state._save_book(self._sink, notices)
