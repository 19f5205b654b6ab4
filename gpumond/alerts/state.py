"""Crash-safe record of the alerts firing and the notices each sink has open, so a restart pages no one twice."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from gpumond.alerts.model import Alert, pairs
from gpumond.state.jsonfile import Document, JsonStateFile, Number, Text

log = logging.getLogger("gpumond.alerts")

VERSION = 1
FILE_NAME = "alerts-state.json"


class _AlertDoc(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    labels: dict[Text, Text]
    annotations: dict[Text, Text]
    starts_at: Number


def _to_json(a: Alert) -> dict[str, Any]:
    return {"labels": dict(a.labels), "annotations": dict(a.annotations), "starts_at": a.starts_at}


def _alert(key: str, raw: Any) -> Alert:
    doc = _AlertDoc.model_validate(raw)
    if not doc.labels.get("alertname"):
        raise ValueError("no alertname label")
    return Alert(pairs(doc.labels), pairs(doc.annotations), doc.starts_at)


def _by_fingerprint(alerts: dict[str, Alert]) -> dict[str, Alert]:
    # An alert is filed under its labels' fingerprint, whatever key the file used: a key that does not match
    # would make a sink resolve what it never sees firing again, at every update, forever.
    return {a.fingerprint: a for a in alerts.values()}


class AlertStateFile:
    """`alerts-state.json` in the daemon's state directory; None keeps everything in memory (one run only).

    Read through gpumond.state.jsonfile: a file that cannot be used is set aside (alerts opened before this start are
    then not resolved by it), a record that cannot be trusted is left out and the rest used."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._file = JsonStateFile(path, what="alert state", version=VERSION, sections=("firing", "sinks"),
                                   consequence="alerts opened before this start will not be resolved by it")
        self._lock = threading.Lock()
        self._firing: dict[str, Alert] = {}
        self._sinks: dict[str, dict[str, Alert]] = {}
        self._failing = False  # the last write failed: say so once, retry on every update until it works
        self._load()

    def _load(self) -> None:
        doc = self._file.read()
        firing, problems = self._file.records(doc, "firing", _alert)
        self._firing = _by_fingerprint(firing)
        sinks = doc.body.get("sinks", {})
        if not isinstance(sinks, dict):
            problems.append(f"sinks: a JSON {type(sinks).__name__}, not an object")
            sinks = {}
        for name in sinks:
            book, bad = self._file.records(Document(sinks), name, _alert)
            self._sinks[str(name)] = _by_fingerprint(book)
            problems += [f"sinks.{p}" for p in bad]
        self._file.reject(problems)
        if problems:
            self._write()  # the bad records are kept aside once, not copied again at every start

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
        body = {"firing": {fp: _to_json(a) for fp, a in sorted(self._firing.items())},
                "sinks": {name: {fp: _to_json(a) for fp, a in sorted(book.items())}
                          for name, book in sorted(self._sinks.items())}}
        try:
            self._file.write(body)
        except (OSError, ValueError) as e:  # ValueError: a NaN that slipped in (never written as JSON)  # a full disk must not stop alerting; exactly-once across restarts is then at risk
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
