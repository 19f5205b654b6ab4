"""Alert model: label rules, fingerprint identity, Alertmanager v2 JSON shape."""

from __future__ import annotations

import re

import pytest

from gpumond.alerts.model import Alert, Condition, fingerprint, pairs, rfc3339

LABELS = {"alertname": "GpuLost", "severity": "critical", "node": "n1", "gpu": 3, "uuid": "GPU-abc"}


def fnv1a64(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for byte in data:
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def test_fnv_reference_matches_the_published_test_vector() -> None:
    assert fnv1a64(b"a") == 0xAF63DC4C8601EC8C  # FNV-1a 64 of "a", from the FNV reference


def test_fingerprint_is_fnv1a_over_sorted_names_and_values_with_separators() -> None:
    labels = pairs(LABELS)
    stream = b"".join(f"{k}".encode() + b"\xff" + v.encode() + b"\xff" for k, v in sorted(labels))
    assert fingerprint(labels) == f"{fnv1a64(stream):016x}"
    assert fingerprint(()) == "cbf29ce484222325"  # Prometheus' emptyLabelSignature


def test_fingerprint_is_stable_and_depends_on_labels_only() -> None:
    a = Condition.of(LABELS, {"summary": "x"})
    b = Condition.of(dict(reversed(list(LABELS.items()))), {"summary": "different"}, for_s=30)
    assert a.fingerprint == b.fingerprint
    assert re.fullmatch(r"[0-9a-f]{16}", a.fingerprint)
    assert Condition.of({**LABELS, "gpu": 4}).fingerprint != a.fingerprint
    # The separator keeps ("ab", "c") and ("a", "bc") apart.
    assert fingerprint((("a", "bc"),)) != fingerprint((("ab", "c"),))


def test_labels_are_validated() -> None:
    with pytest.raises(ValueError, match="alertname"):
        Condition.of({"severity": "critical"})
    with pytest.raises(ValueError, match="severity"):
        Condition.of({"alertname": "X"})
    with pytest.raises(ValueError, match="severity 'page'"):
        Condition.of({"alertname": "X", "severity": "page"})
    with pytest.raises(ValueError, match="not a valid label name"):
        Condition.of({"alertname": "X", "severity": "info", "bad-name": "1"})
    with pytest.raises(ValueError, match="sorted"):
        Condition((("severity", "info"), ("alertname", "X")))
    with pytest.raises(ValueError, match="for_s"):
        Condition.of({"alertname": "X", "severity": "info"}, for_s=-1)


def test_values_become_text() -> None:
    assert dict(Condition.of(LABELS).labels)["gpu"] == "3"


def test_firing_alert_to_alertmanager() -> None:
    alert = Alert(pairs(LABELS), pairs({"summary": "lost", "runbook_url": "https://x/y#gpulost"}),
                  starts_at=1763760000.25)
    body = alert.to_alertmanager("http://node:9480/metrics", expires_at=1763760060.0)
    assert body == {
        "labels": {"alertname": "GpuLost", "gpu": "3", "node": "n1", "severity": "critical", "uuid": "GPU-abc"},
        "annotations": {"runbook_url": "https://x/y#gpulost", "summary": "lost"},
        "startsAt": "2025-11-21T21:20:00.250Z",
        "endsAt": "2025-11-21T21:21:00.000Z",
        "generatorURL": "http://node:9480/metrics",
    }
    assert "endsAt" not in alert.to_alertmanager()
    assert "generatorURL" not in alert.to_alertmanager()


def test_resolved_alert_carries_its_end() -> None:
    alert = Alert(pairs(LABELS), (), 100.0, ends_at=160.0, state="resolved")
    body = alert.to_alertmanager(expires_at=999.0)
    assert body["endsAt"] == rfc3339(160.0) == "1970-01-01T00:02:40.000Z"


def test_pending_alerts_are_not_for_alertmanager() -> None:
    with pytest.raises(ValueError):
        Alert(pairs(LABELS), (), 100.0, state="pending").to_alertmanager()


def test_ends_at_goes_with_resolved() -> None:
    with pytest.raises(ValueError):
        Alert(pairs(LABELS), (), 100.0, ends_at=120.0)
    with pytest.raises(ValueError):
        Alert(pairs(LABELS), (), 100.0, state="resolved")


def test_accessors() -> None:
    alert = Alert(pairs(LABELS), pairs({"summary": "s"}), 1.0)
    assert (alert.alertname, alert.severity, alert.label("gpu"), alert.annotation("summary")) == \
        ("GpuLost", "critical", "3", "s")
    assert alert.label("job") is None and alert.fingerprint == fingerprint(pairs(LABELS))
