"""The alert model shared by the agent and the rules service: conditions, alerts, identity."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

Pairs = tuple[tuple[str, str], ...]
AlertState = Literal["pending", "firing", "resolved"]

# PagerDuty's Events API v2 accepts exactly these; Alertmanager routes on any string.
SEVERITIES = ("critical", "error", "warning", "info")
REQUIRED_LABELS = ("alertname", "severity")

_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_FNV64_OFFSET = 14695981039346656037
_FNV64_PRIME = 1099511628211
_SEPARATOR = 0xFF  # cannot occur in UTF-8, so "a"+"bc" and "ab"+"c" hash differently


def pairs(mapping: Mapping[str, Any]) -> Pairs:
    """A mapping as the sorted (name, text) pairs that labels and annotations are stored as."""
    return tuple(sorted((str(k), str(v)) for k, v in mapping.items()))


def fingerprint(labels: Pairs) -> str:
    """Alertmanager's identity of a label set: FNV-1a 64 over sorted names and values, 16 hex digits.

    Same algorithm as prometheus/common `LabelSet.Fingerprint`, so the value matches what
    Alertmanager shows for the alert and serves as a stable PagerDuty dedup_key.
    """
    h = _FNV64_OFFSET
    for name, value in sorted(labels):
        for part in (name, value):
            for byte in part.encode("utf-8"):
                h = ((h ^ byte) * _FNV64_PRIME) & 0xFFFFFFFFFFFFFFFF
            h = ((h ^ _SEPARATOR) * _FNV64_PRIME) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def rfc3339(unix_s: float) -> str:
    """Unix seconds as the UTC RFC 3339 text Alertmanager expects, to the millisecond."""
    text = datetime.fromtimestamp(unix_s, tz=UTC).isoformat(timespec="milliseconds")
    return text.replace("+00:00", "Z")


def _check_labels(labels: Pairs) -> None:
    names = [name for name, _ in labels]
    if names != sorted(set(names)):
        raise ValueError(f"labels must be sorted and unique: {names}")
    for name in names:
        if not _LABEL_NAME.fullmatch(name):
            raise ValueError(f"{name!r} is not a valid label name")
    given = dict(labels)
    for name in REQUIRED_LABELS:
        if not given.get(name):
            raise ValueError(f"an alert needs a non-empty {name!r} label")
    if given["severity"] not in SEVERITIES:
        raise ValueError(f"severity {given['severity']!r} is not one of {', '.join(SEVERITIES)}")


@dataclass(frozen=True, slots=True)
class Condition:
    """Something true now that should become an alert once it has held for `for_s` seconds."""

    labels: Pairs
    annotations: Pairs = ()
    for_s: float = 0.0
    # Fire at once, whatever for_s and persistence say (e.g. a finding two independent signals agree on).
    immediate: bool = False
    # What the daemon wants back from the lifecycle with this alert (a finding's score and evidence).
    payload: object = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        _check_labels(self.labels)
        if self.for_s < 0:
            raise ValueError("for_s must not be negative")

    @classmethod
    def of(cls, labels: Mapping[str, Any], annotations: Mapping[str, Any] | None = None,
           for_s: float = 0.0, *, immediate: bool = False, payload: object = None) -> Condition:
        """Build from plain mappings; values become text. A None label is left out."""
        return cls(pairs({k: v for k, v in labels.items() if v is not None}), pairs(annotations or {}), for_s,
                   immediate, payload)

    @property
    def fingerprint(self) -> str:
        """Identity of the alert this condition feeds (labels only)."""
        return fingerprint(self.labels)


@dataclass(frozen=True, slots=True)
class Alert:
    """One alert as sinks see it: stable labels, current annotations, when it started and ended.

    `starts_at` is when it began firing (for a pending alert: since when it has been pending);
    `ends_at` is set once it resolved.
    """

    labels: Pairs
    annotations: Pairs
    starts_at: float
    ends_at: float | None = None
    state: AlertState = "firing"

    def __post_init__(self) -> None:
        _check_labels(self.labels)
        if (self.ends_at is not None) != (self.state == "resolved"):
            raise ValueError("ends_at is set exactly when the alert is resolved")

    @property
    def fingerprint(self) -> str:
        """Alertmanager's identity of this alert (labels only, never annotations)."""
        return fingerprint(self.labels)

    def label(self, name: str) -> str | None:
        """One label's value, or None."""
        return dict(self.labels).get(name)

    def annotation(self, name: str) -> str | None:
        """One annotation's value, or None."""
        return dict(self.annotations).get(name)

    @property
    def alertname(self) -> str:
        """The `alertname` label."""
        return dict(self.labels)["alertname"]

    @property
    def severity(self) -> str:
        """The `severity` label."""
        return dict(self.labels)["severity"]

    def to_alertmanager(self, generator_url: str | None = None,
                        expires_at: float | None = None) -> dict[str, Any]:
        """One element of Alertmanager's `POST /api/v2/alerts` array.

        A firing alert carries `endsAt = expires_at` when given: like Prometheus (which sends
        now + 4 × the resend interval), the sender re-sends while firing, and Alertmanager
        resolves it by itself if the sender dies. A resolved alert carries its real end.
        Pending alerts are not for Alertmanager.
        """
        if self.state == "pending":
            raise ValueError("a pending alert is not sent to Alertmanager")
        body: dict[str, Any] = {
            "labels": dict(self.labels),
            "annotations": dict(self.annotations),
            "startsAt": rfc3339(self.starts_at),
        }
        ends_at = self.ends_at if self.state == "resolved" else expires_at
        if ends_at is not None:
            body["endsAt"] = rfc3339(ends_at)
        if generator_url:
            body["generatorURL"] = generator_url
        return body
