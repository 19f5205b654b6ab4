"""The demo's pages: where its daemons send alerts, and each notification a person would get as a story event.

With no flags, Slack and PagerDuty notifications go to a built-in receiver (gpumond.demo.receiver) that
answers them as the real services would; `--slack-webhook`, `--pagerduty-routing-key` and `--alertmanager`
send to real ones instead (those are then seen where they are delivered, not here).
"""

from __future__ import annotations

import json
import re
import threading
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any

from gpumond.demo.receiver import Receiver, Record, describe
from gpumond.demo.story import Event, Place

# A well-formed, obviously fake Events API v2 key for the built-in receiver.
DEMO_ROUTING_KEY = "demo0000000000000000000000000000"
_FINGERPRINTS = re.compile(r"fingerprints? ([0-9a-f]{16}(?:, [0-9a-f]{16})*)")

PlaceOf = Callable[[dict[str, str]], Place]


class Pages:
    """Starts the built-in receiver when needed, says where alerts go, and turns notifications into events."""

    def __init__(self, *, alertmanager: Sequence[str] = (), slack_webhook: str | None = None,
                 pagerduty_routing_key: str | None = None) -> None:
        self._alertmanager = tuple(alertmanager)
        self._slack = slack_webhook
        self._pd_key = pagerduty_routing_key
        self.receiver: Receiver | None = None
        self._labels: dict[str, dict[str, str]] = {}  # fingerprint → labels, from triggers and the daemons' APIs
        self._lock = threading.Lock()
        self._sources: list[str] = []  # daemon base URLs whose /api/v1/alerts name fingerprints
        self._record: Callable[[Event], None] | None = None
        self._place: PlaceOf = lambda labels: Place(labels.get("node"), _int(labels.get("gpu")), _int(labels.get("rank")))
        self._now: Callable[[], float] = lambda: 0.0

    def start(self) -> None:
        """Start the built-in receiver if Slack or PagerDuty has no real destination."""
        if self._slack is None or self._pd_key is None:
            self.receiver = Receiver(on_notification=self._on_notification).start()

    def stop(self) -> None:
        if self.receiver is not None:
            self.receiver.stop()

    def alerting(self) -> dict[str, Any]:
        """The `alerting:` section every demo daemon gets."""
        section: dict[str, Any] = {"restart_grace_s": 10}
        if self._alertmanager:
            section["alertmanager"] = {"urls": list(self._alertmanager)}
        if self._slack is not None:
            section["slack"] = {"webhook_url": self._slack}
        elif self.receiver is not None:
            section["slack"] = {"webhook_url": self.receiver.slack_url}
        if self._pd_key is not None:
            section["pagerduty"] = {"routing_key": self._pd_key}
        elif self.receiver is not None:
            section["pagerduty"] = {"routing_key": DEMO_ROUTING_KEY, "url": self.receiver.pagerduty_url}
        return section

    def lines(self) -> list[str]:
        """What the operator is told at the start: where each kind of notification goes."""
        out = ["Pages (what a person on call would get):"]
        if self.receiver is not None:
            out.append(f"  built-in receiver {self.receiver.url}: "
                       + " and ".join(k for k, real in (("Slack", self._slack), ("PagerDuty", self._pd_key)) if not real)
                       + " notifications are answered as the real services would and printed as PAGE lines")
        if self._slack:
            out.append("  Slack: your webhook (--slack-webhook)")
        if self._pd_key:
            out.append("  PagerDuty: your routing key (--pagerduty-routing-key), Events API v2")
        if self._alertmanager:
            out.append(f"  Alertmanager: {', '.join(self._alertmanager)} (every replica gets every alert)")
        else:
            out.append("  (add --alertmanager URL to also send to an Alertmanager)")
        return out

    def follow(self, record: Callable[[Event], None], place: PlaceOf, now: Callable[[], float],
               sources: Sequence[str]) -> None:
        """From now on, each notification becomes `record(Event(kind="page", ...))` at `place(labels)`."""
        with self._lock:
            self._record, self._place, self._now, self._sources = record, place, now, list(sources)

    # ----- notifications --------------------------------------------------------------------------
    def _on_notification(self, r: Record) -> None:
        body = r.json()
        if not isinstance(body, dict):
            return
        if r.kind == "pagerduty":
            fp = str(body.get("dedup_key"))
            action = body.get("event_action")
            if action == "trigger":
                labels = body.get("payload", {}).get("custom_details", {}).get("labels") or {}
                with self._lock:
                    self._labels[fp] = {str(k): str(v) for k, v in labels.items()}
            self._emit([fp], "firing" if action == "trigger" else "resolved", "pagerduty", describe(r))
        elif r.kind == "slack":
            text = json.dumps(body.get("blocks", []))
            found = _FINGERPRINTS.search(text)
            fps = found.group(1).split(", ") if found else []
            state = "resolved" if "[RESOLVED]" in str(body.get("text", "")) else "firing"
            self._emit(fps, state, "slack", describe(r))

    def _emit(self, fingerprints: list[str], state: str, via: str, line: str) -> None:
        with self._lock:
            record, place, now = self._record, self._place, self._now
        if record is None:
            return
        for fp in fingerprints:
            labels = self._labels_of(fp)
            if not labels or labels.get("alertname") == "Watchdog":
                continue
            record(Event(now(), "page", labels["alertname"], state, place(labels), (line,), via=via))  # type: ignore[arg-type]

    def _labels_of(self, fp: str) -> dict[str, str] | None:
        with self._lock:
            if fp in self._labels:
                return self._labels[fp]
            sources = list(self._sources)
        # Not seen in a trigger (e.g. Slack only): ask the daemons, which keep resolved alerts for a while.
        for base in sources:
            try:
                with urllib.request.urlopen(f"{base}/api/v1/alerts", timeout=2.0) as resp:  # noqa: S310 - loopback
                    for a in json.load(resp).get("alerts", []):
                        with self._lock:
                            self._labels[a["fingerprint"]] = a["labels"]
            except (OSError, ValueError, KeyError):
                continue
        with self._lock:
            return self._labels.get(fp)


def _int(text: str | None) -> int | None:
    return int(text) if text is not None and text.isdigit() else None
