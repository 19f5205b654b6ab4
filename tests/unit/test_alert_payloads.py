"""What gpumond sends to PagerDuty and Slack, how it reads their answers, and how it backs off.

Pure functions only: no sink thread and no network (the one SlackSink built here is never started).
"""

from __future__ import annotations

import json

import pytest

from gpumond.alerts.model import SEVERITIES, Alert, pairs
from gpumond.alerts.sinks import pagerduty, slack
from gpumond.alerts.sinks.base import Answer
from gpumond.alerts.sinks.notices import MemoryBook, Notice
from gpumond.alerts.sinks.pagerduty import SUMMARY_MAX, pagerduty_event
from gpumond.alerts.sinks.slack import SlackSink, slack_message, where
from gpumond.config.alerting import SlackConfig

KEY = "0123456789abcdef0123456789ABCDEF"
RUNBOOK = "https://runbooks.example/GpuXidCritical.md"
SOURCE = "http://n1:9480/metrics"
# What Events API v2 accepts for payload.severity.
PD_SEVERITIES = {"critical", "error", "warning", "info"}


def alert(name: str = "GpuXidCritical", severity: str = "critical", *, starts_at: float = 1_700_000_000.0,
          ends_at: float | None = None, summary: str | None = "XID 79 on n1 GPU 3", description: str = "fell off",
          **labels: object) -> Alert:
    lab = {"alertname": name, "severity": severity, **labels}
    ann = {"description": description, "runbook_url": RUNBOOK, "evidence": '{"xid":79}'}
    if summary is not None:
        ann["summary"] = summary
    state = "resolved" if ends_at is not None else "firing"
    return Alert(pairs(lab), pairs(ann), starts_at, ends_at, state)  # type: ignore[arg-type]


# ----- PagerDuty --------------------------------------------------------------------------------------
def test_pagerduty_trigger_fields() -> None:
    a = alert(node="n1", gpu=3, uuid="GPU-abc", xid=79, cluster="fleet-a")
    e = pagerduty_event(a, "firing", KEY, SOURCE)
    assert (e["routing_key"], e["event_action"], e["dedup_key"]) == (KEY, "trigger", a.fingerprint)
    p: dict = e["payload"]  # type: ignore[assignment]
    assert p["summary"] == "[CRITICAL] XID 79 on n1 GPU 3"
    assert p["severity"] == "critical" and p["source"] == "n1"
    assert p["class"] == "GpuXidCritical" and p["component"] == "GPU-abc" and p["group"] == "fleet-a"
    assert p["timestamp"] == "2023-11-14T22:13:20.000Z"
    details = p["custom_details"]
    assert details["labels"] == dict(a.labels)
    assert details["description"] == "fell off" and details["evidence"] == '{"xid":79}'
    assert details["runbook_url"] == RUNBOOK
    assert e["links"] == [{"href": RUNBOOK, "text": "Runbook"}, {"href": SOURCE, "text": "Source"}]
    assert e["client"] == "gpumond" and e["client_url"] == SOURCE
    json.dumps(e)  # a JSON body


def test_pagerduty_dedup_key_is_stable_and_ignores_annotations() -> None:
    a, b = alert(node="n1", summary="one"), alert(node="n1", summary="two")
    keys = {pagerduty_event(x, action, KEY, None)["dedup_key"] for x in (a, b) for action in ("firing", "resolved")}
    assert keys == {a.fingerprint}


@pytest.mark.parametrize("text", ["x" * 5000, "word " * 1000, "é" * 5000])
def test_pagerduty_summary_is_bounded(text: str) -> None:
    summary = pagerduty_event(alert(summary=text), "firing", KEY, None)["payload"]["summary"]  # type: ignore[index]
    assert len(summary) <= SUMMARY_MAX == 1024
    assert summary.startswith("[CRITICAL] ") and summary.endswith("…")


def test_pagerduty_details_are_bounded() -> None:
    e = pagerduty_event(alert(description="d" * 50_000), "firing", KEY, None)
    assert len(e["payload"]["custom_details"]["description"]) <= 4000  # type: ignore[index]
    assert len(json.dumps(e)) < 16_000


@pytest.mark.parametrize("severity", SEVERITIES)
def test_pagerduty_severity_mapping(severity: str) -> None:
    e = pagerduty_event(alert(severity=severity), "firing", KEY, None)
    assert e["payload"]["severity"] == severity and severity in PD_SEVERITIES  # type: ignore[index]
    assert e["payload"]["summary"].startswith(f"[{severity.upper()}] ")  # type: ignore[index]


@pytest.mark.parametrize("labels, source", [
    ({"node": "n1", "job": "j1"}, "n1"),
    ({"job": "j1"}, "j1"),
    ({}, "gpumond"),
])
def test_pagerduty_source_is_node_then_job(labels: dict[str, str], source: str) -> None:
    assert pagerduty_event(alert(**labels), "firing", KEY, None)["payload"]["source"] == source  # type: ignore[index]


def test_pagerduty_summary_falls_back_to_alertname_and_no_links_without_urls() -> None:
    a = Alert(pairs({"alertname": "GpuLost", "severity": "critical"}), (), 0.0)
    e = pagerduty_event(a, "firing", KEY, None)
    assert e["payload"]["summary"] == "[CRITICAL] GpuLost"  # type: ignore[index]
    assert "links" not in e and "client_url" not in e
    assert e["payload"]["custom_details"] == {"labels": dict(a.labels)}  # type: ignore[index]


def test_pagerduty_resolve_has_only_the_identity() -> None:
    a = alert(node="n1", ends_at=1_700_000_600.0)
    assert pagerduty_event(a, "resolved", KEY, SOURCE) == {
        "routing_key": KEY, "event_action": "resolve", "dedup_key": a.fingerprint}


# ----- Slack ------------------------------------------------------------------------------------------
def sections(msg: dict) -> list[str]:
    return [b["text"]["text"] for b in msg["blocks"] if b["type"] == "section"]


def header(msg: dict) -> str:
    (h,) = [b for b in msg["blocks"] if b["type"] == "header"]
    assert h["text"]["type"] == "plain_text"
    return h["text"]["text"]


def test_slack_firing_message() -> None:
    a = alert(node="n1", gpu=3, xid=79)
    msg = slack_message(Notice("firing", (a,)), {a.fingerprint: SOURCE})
    assert header(msg) == ":red_circle: [CRITICAL] GpuXidCritical"
    (text,) = sections(msg)
    assert "*XID 79 on n1 GPU 3* (node n1, GPU 3, XID 79)" in text and "fell off" in text
    assert f"<{RUNBOOK}|runbook>" in text and f"<{SOURCE}|source>" in text
    assert a.fingerprint in msg["blocks"][-1]["elements"][0]["text"]
    assert msg["text"].startswith(":red_circle: [CRITICAL] GpuXidCritical")
    json.dumps(msg)


def test_slack_header_is_bounded() -> None:
    a = alert(name="A" * 400)
    for action in ("firing", "resolved"):
        assert len(header(slack_message(Notice(action, (a,))))) <= 150  # type: ignore[arg-type]


def test_slack_group_of_ten_with_huge_texts_stays_within_slack_limits() -> None:
    group = tuple(alert(node="n1", rank=r, summary=f"rank {r} " + "s" * 5000, description="d " * 20_000)
                  for r in range(10))
    for action in ("firing", "resolved"):
        msg = slack_message(Notice(action, group))  # type: ignore[arg-type]
        assert len(msg["blocks"]) <= 50
        assert all(0 < len(t) <= 3000 for t in sections(msg))
        assert len(header(msg)) <= 150
        assert len(msg["text"]) <= 3000
        assert len(json.dumps(msg)) < 40_000
        for r in range(10):  # every alert is still named
            assert any(f"rank {r} " in t for t in sections(msg))


def test_slack_many_small_alerts_share_sections() -> None:
    group = tuple(alert(node="n1", rank=r, description="short") for r in range(10))
    msg = slack_message(Notice("firing", group))
    assert len(sections(msg)) == 1 and "× 10" in header(msg)


def test_slack_sink_splits_a_large_group_into_messages_of_ten() -> None:
    sink = SlackSink(SlackConfig(webhook_url="https://hooks.example/services/x"), book=MemoryBook(),
                     queue_size=100, clock=lambda: 0.0)
    try:
        alerts = [alert(job="j1", rank=r, summary="s" * 4000, description="d" * 4000) for r in range(25)]
        alerts.append(alert(job="j2", rank=0))
        notices = sink.group("firing", alerts)
        assert sorted(len(n.alerts) for n in notices) == [1, 5, 10, 10]
        for n in notices:
            msg = slack_message(n)
            assert len(msg["blocks"]) <= 50 and all(len(t) <= 3000 for t in sections(msg))
    finally:
        sink.stop()


def test_slack_resolved_message_says_resolved_and_how_long() -> None:
    a = alert(node="n1", gpu=3, starts_at=1000.0, ends_at=1000.0 + 3725.0)
    msg = slack_message(Notice("resolved", (a,)))
    assert "RESOLVED" in header(msg) and "GpuXidCritical" in header(msg)
    (text,) = sections(msg)
    assert "resolved after 1h02m" in text and "(node n1, GPU 3)" in text
    assert "fell off" not in text  # a resolve is one line
    short = alert(starts_at=0.0, ends_at=305.0)
    assert "resolved after 5m05s" in sections(slack_message(Notice("resolved", (short,))))[0]
    assert "resolved after 42s" in sections(slack_message(Notice("resolved", (alert(ends_at=1_700_000_042.0),))))[0]


def test_where_names_node_gpu_job_rank_and_xid() -> None:
    assert where(alert(node="n1", gpu=3, job="llama", rank=7, xid=79)) == "node n1, GPU 3, job llama, rank 7, XID 79"
    assert where(alert(job="llama", rank=0)) == "job llama, rank 0"
    assert where(alert(cluster="fleet-a")) == "fleet-a"
    assert where(alert()) == ""


# ----- answers ----------------------------------------------------------------------------------------
CLASSIFIERS = [pytest.param(pagerduty.classify, id="pagerduty"), pytest.param(slack.classify, id="slack")]
NOW = 1_700_000_000.0


@pytest.mark.parametrize("classify", CLASSIFIERS)
@pytest.mark.parametrize("status", [200, 202, 204])
def test_classify_2xx_is_ok(classify, status: int) -> None:
    assert classify(Answer(status, {}, "ok"), NOW).ok


@pytest.mark.parametrize("classify", CLASSIFIERS)
@pytest.mark.parametrize("header_value, seconds", [("7", 7.0), ("100000", 300.0), (None, None), ("soon", None)])
def test_classify_429_retries_after_retry_after(classify, header_value: str | None, seconds: float | None) -> None:
    o = classify(Answer(429, {} if header_value is None else {"retry-after": header_value}, ""), NOW)
    assert (o.ok, o.retry, o.retry_after_s) == (False, True, seconds)


@pytest.mark.parametrize("classify", CLASSIFIERS)
@pytest.mark.parametrize("status", [408, 500, 502, 503, 504])
def test_classify_408_and_5xx_are_retried(classify, status: int) -> None:
    o = classify(Answer(status, {}, "oops"), NOW)
    assert (o.ok, o.retry, o.retry_after_s) == (False, True, None)
    assert str(status) in o.reason


@pytest.mark.parametrize("classify", CLASSIFIERS)
@pytest.mark.parametrize("status", [400, 403, 404])
def test_classify_refusals_are_not_retried(classify, status: int) -> None:
    o = classify(Answer(status, {}, "invalid_payload"), NOW)
    assert (o.ok, o.retry) == (False, False)
    assert str(status) in o.reason


def test_pagerduty_refusal_names_the_errors_it_got() -> None:
    body = json.dumps({"status": "invalid event", "message": "Event object is invalid",
                       "errors": ["'payload.summary' is missing"]})
    assert "'payload.summary' is missing" in pagerduty.classify(Answer(400, {}, body), NOW).reason
    assert "x" * 300 not in pagerduty.classify(Answer(400, {}, "x" * 5000), NOW).reason


def test_slack_refusal_reason_is_bounded() -> None:
    assert len(slack.classify(Answer(400, {}, "no_service " * 1000), NOW).reason) < 150
