"""The local Slack / PagerDuty / Alertmanager receiver: the demo's (answers what it can read), the tests' (every
rule the services document; scripted misbehaviour), records, describe()."""

import dataclasses
import json
import socket
import threading
import time
from datetime import datetime, timezone

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpumond.demo.receiver import Receiver, Record, describe
from gpumond.web.serving import ListenError
from tests.ports import free_port
from tests.scripted_receiver import Hang, Respond, ScriptedReceiver

KEY = "0123456789abcdef0123456789abcdef"  # 32 characters, like a real integration key


@pytest.fixture(scope="module")
def shared():
    with ScriptedReceiver() as r:
        yield r


@pytest.fixture
def rx(shared):
    shared.clear()
    shared.on_notification = None
    yield shared
    shared.clear()


@pytest.fixture(scope="module")
def client():
    with httpx.Client(timeout=10) as c:
        yield c


def trigger(**over):
    ev = {"routing_key": KEY, "event_action": "trigger", "dedup_key": "gpumond/demo-node-00/6/xid",
          "payload": {"summary": "GPU 6 on demo-node-00: XID error (XID 48)", "source": "demo-node-00",
                      "severity": "critical"}}
    for k, v in over.items():
        if k.startswith("payload_"):
            key = k.removeprefix("payload_")
            if v is ...:
                ev["payload"].pop(key)
            else:
                ev["payload"][key] = v
        elif v is ...:
            ev.pop(k)
        else:
            ev[k] = v
    return ev


def am_message(**over):
    msg = {
        "version": "4", "groupKey": '{}:{alertname="GpuLost"}', "truncatedAlerts": 0, "status": "firing",
        "receiver": "slack", "groupLabels": {"alertname": "GpuLost", "node": "demo-node-00"},
        "commonLabels": {"alertname": "GpuLost", "node": "demo-node-00", "severity": "critical"},
        "commonAnnotations": {"summary": "GPU fell off the bus"}, "externalURL": "http://127.0.0.1:9093",
        "alerts": [{"status": "firing", "labels": {"alertname": "GpuLost", "node": "demo-node-00", "gpu": "6"},
                    "annotations": {"summary": "GPU fell off the bus"},
                    "startsAt": "2026-11-03T09:52:26.739266876+02:00", "endsAt": "0001-01-01T00:00:00Z",
                    "generatorURL": "http://127.0.0.1:9090/graph", "fingerprint": "1a30ba71cca2921f"}],
    }
    alert = msg["alerts"][0]
    for k, v in over.items():
        target, key = (alert, k.removeprefix("alert_")) if k.startswith("alert_") else (msg, k)
        if v is ...:
            target.pop(key)
        else:
            target[key] = v
    return msg


# --- the demo's receiver -----------------------------------------------------------------------------------

def test_the_demo_receiver_answers_any_readable_notification_as_the_service_would(client):
    with Receiver(new_dedup_key=lambda: "generated-key") as demo:
        # Slack's block rules are the tests' receiver's business (it refuses this): the demo answers "ok".
        assert (client.post(demo.slack_url, json={"blocks": "not a list"}).text) == "ok"
        first = client.post(demo.pagerduty_url, json={"event_action": "trigger"})
        assert first.status_code == 202 and first.json()["dedup_key"] == "generated-key"
        assert client.post(demo.pagerduty_url, json=trigger()).json()["dedup_key"] == "gpumond/demo-node-00/6/xid"
        assert client.post(demo.alertmanager_url, json={}).status_code == 200
        assert [(r.kind, r.status, r.accepted) for r in demo.received()] == [
            ("slack", 200, True), ("pagerduty", 202, True), ("pagerduty", 202, True), ("alertmanager", 200, True)]


@pytest.mark.parametrize("kind, answer", [
    ("slack", "invalid_payload"), ("pagerduty", '"status": "invalid event"'), ("alertmanager", "invalid webhook")])
def test_the_demo_receiver_refuses_what_it_cannot_read_as_the_service_does(client, kind, answer):
    with Receiver() as demo:
        url = {"slack": demo.slack_url, "pagerduty": demo.pagerduty_url, "alertmanager": demo.alertmanager_url}[kind]
        r = client.post(url, content=b"[1, 2]", headers={"content-type": "application/json"})
        assert r.status_code == 400 and answer in r.text
        (rec,) = demo.received()
        assert not rec.accepted and rec.errors == ("body is a JSON list, not an object",)
        assert describe(rec).startswith("[rejected 400")


# --- Slack ------------------------------------------------------------------------------------------------

def test_slack_text_is_ok_and_recorded(rx, client):
    r = client.post(rx.slack_url, json={"text": "GpuLost on demo-node-00\nsecond line"})
    assert (r.status_code, r.text) == (200, "ok")
    assert r.headers["content-type"].startswith("text/plain")
    (rec,) = rx.received("slack")
    assert rec.kind == "slack" and rec.accepted and rec.error is None
    assert rec.path == "/slack/T00000000/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX"
    assert rec.json() == {"text": "GpuLost on demo-node-00\nsecond line"}


def test_slack_blocks_and_attachments_are_ok(rx, client):
    blocks = [
        {"type": "header", "text": {"type": "plain_text", "text": "h" * 150}},
        {"type": "section", "text": {"type": "mrkdwn", "text": "s" * 3000},
         "fields": [{"type": "mrkdwn", "text": "*GPU*\n6"}]},
        {"type": "divider"},
        {"type": "context", "elements": [{"type": "mrkdwn", "text": "runbook"}]},
    ] + [{"type": "divider"}] * 46
    assert len(blocks) == 50
    assert client.post(rx.slack_url, json={"blocks": blocks}).status_code == 200
    assert client.post(rx.slack_url, json={"attachments": [{"color": "danger", "text": "x"}]}).status_code == 200
    assert client.post(rx.slack_url, json={"text": "t" * 40_000}).status_code == 200


def section(text, kind="mrkdwn"):
    return {"type": "section", "text": {"type": kind, "text": text}}


@pytest.mark.parametrize("content, content_type, code", [
    (b"{not json", "application/json", "invalid_payload"),
    (b'{"text": "hi"}', "application/x-www-form-urlencoded", "invalid_payload"),
    (b'{"text": "hi"}', "", "invalid_payload"),
    (b'["hi"]', "application/json", "invalid_payload"),
    (b'{"text": "hi", "x": NaN}', "application/json", "invalid_payload"),
    ({"text": 5}, None, "invalid_payload"),
    ({}, None, "no_text"),
    ({"text": "", "blocks": [], "attachments": []}, None, "no_text"),
    ({"username": "gpumond"}, None, "no_text"),
    ({"text": "t" * 40_001}, None, "msg_too_long"),
    ({"blocks": {"type": "divider"}}, None, "invalid_blocks_format"),
    ({"blocks": [{"type": "divider"}] * 51}, None, "invalid_blocks"),
    ({"blocks": [{"type": "banner"}]}, None, "invalid_blocks"),
    ({"blocks": ["divider"]}, None, "invalid_blocks"),
    ({"blocks": [section("x", kind="markdown")]}, None, "invalid_blocks"),
    ({"blocks": [section("s" * 3001)]}, None, "invalid_blocks"),
    ({"blocks": [section("")]}, None, "invalid_blocks"),
    ({"blocks": [{"type": "section"}]}, None, "invalid_blocks"),
    ({"blocks": [{"type": "section", "fields": [{"type": "mrkdwn", "text": "f"}] * 11}]}, None, "invalid_blocks"),
    ({"blocks": [{"type": "header", "text": {"type": "mrkdwn", "text": "h"}}]}, None, "invalid_blocks"),
    ({"blocks": [{"type": "header", "text": {"type": "plain_text", "text": "h" * 151}}]}, None, "invalid_blocks"),
    ({"blocks": [{"type": "context", "elements": []}]}, None, "invalid_blocks"),
    ({"blocks": [{"type": "image", "image_url": "https://x/y.png"}]}, None, "invalid_blocks"),
    ({"attachments": {"text": "x"}}, None, "invalid_attachments"),
    ({"attachments": ["x"]}, None, "invalid_attachments"),
    ({"attachments": [{"text": "x"}] * 101}, None, "too_many_attachments"),
])
def test_slack_rejects_bad_payloads_with_slacks_error(rx, client, content, content_type, code):
    if isinstance(content, dict):
        r = client.post(rx.slack_url, json=content)
    else:
        r = client.post(rx.slack_url, content=content, headers={"content-type": content_type})
    assert (r.status_code, r.text) == (400, code)
    (rec,) = rx.received("slack")
    assert not rec.accepted and rec.error == code and rec.errors


# --- PagerDuty --------------------------------------------------------------------------------------------

def test_pagerduty_trigger_with_every_optional_field_is_accepted(rx, client):
    ev = trigger(payload_timestamp="2015-07-17T08:42:58.315+0000", payload_component="gpu6",
                 payload_group="demo-node-00", payload_class="xid", payload_custom_details={"xid": 48},
                 links=[{"href": "https://runbooks/xid", "text": "runbook"}],
                 images=[{"src": "https://grafana/x.png"}], client="gpumond", client_url="http://127.0.0.1")
    r = client.post(rx.pagerduty_url, json=ev)
    assert r.status_code == 202
    assert r.json() == {"status": "success", "message": "Event processed", "dedup_key": "gpumond/demo-node-00/6/xid"}
    (rec,) = rx.received("pagerduty")
    assert rec.accepted and rec.dedup_key == "gpumond/demo-node-00/6/xid" and rec.path == "/v2/enqueue"


def test_pagerduty_generates_a_dedup_key_for_a_trigger_without_one(rx, client):
    r = client.post(rx.url + "/pagerduty/v2/enqueue", json=trigger(dedup_key=...))
    assert r.status_code == 202
    key = r.json()["dedup_key"]
    assert isinstance(key, str) and len(key) == 32
    assert rx.received("pagerduty")[0].dedup_key == key


@pytest.mark.parametrize("action", ["acknowledge", "resolve"])
def test_pagerduty_acknowledge_and_resolve_need_only_key_and_dedup(rx, client, action):
    r = client.post(rx.pagerduty_url, json={"routing_key": KEY, "event_action": action, "dedup_key": "k1"})
    assert r.status_code == 202 and r.json()["dedup_key"] == "k1"


@pytest.mark.parametrize("event, error", [
    (trigger(routing_key=KEY[:31]), "Length of 'routing_key' is incorrect (should be 32 characters)"),
    (trigger(routing_key=...), "'routing_key' is missing or blank"),
    (trigger(routing_key=12345), "'routing_key' must be a string"),
    (trigger(event_action="fire"), "'event_action' is invalid (must be one of: trigger, acknowledge, resolve)"),
    (trigger(event_action=...), "'event_action' is missing or blank"),
    (trigger(event_action="resolve", dedup_key=...), "'dedup_key' is missing or blank"),
    (trigger(event_action="acknowledge", dedup_key=""), "'dedup_key' is missing or blank"),
    (trigger(dedup_key="k" * 256), "Length of 'dedup_key' is too long (maximum is 255 characters)"),
    (trigger(dedup_key=7), "'dedup_key' must be a string"),
    (trigger(payload=...), "'payload' is missing or not an object"),
    (trigger(payload="GPU lost"), "'payload' is missing or not an object"),
    (trigger(payload_summary=...), "'payload.summary' is missing or blank"),
    (trigger(payload_summary="s" * 1025), "Length of 'payload.summary' is too long (maximum is 1024 characters)"),
    (trigger(payload_source=""), "'payload.source' is missing or blank"),
    (trigger(payload_severity="fatal"),
     "'payload.severity' is invalid (must be one of: critical, error, warning, info)"),
    (trigger(payload_severity=...), "'payload.severity' is missing or blank"),
    (trigger(payload_timestamp="yesterday"), "'payload.timestamp' is not a valid ISO 8601 timestamp"),
    (trigger(payload_component=6), "'payload.component' must be a string"),
    (trigger(payload_custom_details="xid 48"), "'payload.custom_details' must be an object"),
    (trigger(links={"href": "x"}), "'links' must be an array"),
    (trigger(links=[{"text": "runbook"}]), "'links[0].href' is missing or blank"),
    (trigger(images=[{"alt": "graph"}]), "'images[0].src' is missing or blank"),
    (trigger(client_url=["x"]), "'client_url' must be a string"),
])
def test_pagerduty_rejects_invalid_events_with_its_error_shape(rx, client, event, error):
    r = client.post(rx.pagerduty_url, json=event)
    assert r.status_code == 400
    body = r.json()
    assert body["status"] == "invalid event" and body["message"] == "Event object is invalid"
    assert error in body["errors"]
    (rec,) = rx.received("pagerduty")
    assert not rec.accepted and error in rec.errors and rec.dedup_key is None


def test_pagerduty_summary_at_the_limit_is_fine_and_errors_are_all_listed(rx, client):
    assert client.post(rx.pagerduty_url, json=trigger(payload_summary="s" * 1024)).status_code == 202
    r = client.post(rx.pagerduty_url, json=trigger(routing_key="short", payload_severity="fatal"))
    assert r.status_code == 400 and len(r.json()["errors"]) == 2


@pytest.mark.parametrize("content, content_type", [
    (b"routing_key=x", "application/x-www-form-urlencoded"),
    (b"{oops", "application/json"),
    (b"[]", "application/json"),
])
def test_pagerduty_rejects_a_body_that_is_not_a_json_object(rx, client, content, content_type):
    r = client.post(rx.pagerduty_url, content=content, headers={"content-type": content_type})
    assert r.status_code == 400 and r.json()["status"] == "invalid event" and r.json()["errors"]


# --- Alertmanager -----------------------------------------------------------------------------------------

def test_alertmanager_webhook_is_accepted_under_any_path(rx, client):
    assert client.post(rx.alertmanager_url, json=am_message()).status_code == 200
    assert client.post(rx.alertmanager_url + "/team/gpu", json=am_message(status="resolved")).status_code == 200
    assert [r.path for r in rx.received("alertmanager", accepted=True)] == ["/alertmanager", "/alertmanager/team/gpu"]


@pytest.mark.parametrize("message, error", [
    (am_message(version="3"), "version must be \"4\""),
    (am_message(version=4), "version must be \"4\""),
    (am_message(status="pending"), "status must be firing or resolved"),
    (am_message(receiver=...), "receiver must be a non-empty string"),
    (am_message(groupLabels=...), "groupLabels must be an object"),
    (am_message(commonLabels={"gpu": 6}), "commonLabels must be an object"),
    (am_message(alerts=[]), "alerts must be a non-empty list"),
    (am_message(alert_status="active"), "alerts[0].status must be firing or resolved"),
    (am_message(alert_labels=...), "alerts[0].labels must be an object"),
    (am_message(alert_annotations=...), "alerts[0].annotations must be an object"),
    (am_message(alert_startsAt="5 minutes ago"), "alerts[0].startsAt must be an RFC 3339 timestamp"),
    (am_message(alert_endsAt=...), "alerts[0].endsAt must be an RFC 3339 timestamp"),
    (am_message(alert_fingerprint=...), "alerts[0].fingerprint must be a non-empty string"),
])
def test_alertmanager_rejects_payloads_missing_what_webhook_configs_sends(rx, client, message, error):
    r = client.post(rx.alertmanager_url, json=message)
    assert r.status_code == 400 and error in r.text
    (rec,) = rx.received("alertmanager")
    assert not rec.accepted and any(e.startswith(error) for e in rec.errors)


# --- scripted misbehaviour --------------------------------------------------------------------------------

def test_scripted_answers_come_in_order_then_normal_behaviour_resumes(rx, client):
    rx.script("slack", Respond(429, headers={"Retry-After": "2"}), Respond(500), Respond(400, body="no_service"))
    msg = {"text": "GpuLost"}
    answers = [client.post(rx.slack_url, json=msg) for _ in range(4)]
    assert [(a.status_code, a.text) for a in answers] == [
        (429, "rate_limited"), (500, "rollup_error"), (400, "no_service"), (200, "ok")]
    assert answers[0].headers["retry-after"] == "2"
    assert [r.status for r in rx.received("slack")] == [429, 500, 400, 200]
    assert all(r.error is None for r in rx.received("slack"))  # the payload itself was valid each time
    assert rx.pending_scripts("slack") == 0


def test_scripts_are_per_kind(rx, client):
    rx.script("pagerduty", Respond(500))
    assert client.post(rx.slack_url, json={"text": "x"}).status_code == 200
    assert client.post(rx.pagerduty_url, json=trigger()).status_code == 500
    assert client.post(rx.pagerduty_url, json=trigger()).status_code == 202


def test_scripted_json_body_and_pagerduty_defaults(rx, client):
    rx.script("pagerduty", Respond(400), Respond(503, body={"status": "unavailable"}))
    first = client.post(rx.pagerduty_url, json=trigger())
    assert first.status_code == 400 and first.json()["status"] == "invalid event"
    second = client.post(rx.pagerduty_url, json=trigger())
    assert second.status_code == 503 and second.json() == {"status": "unavailable"}


def test_hang_delays_then_answers_normally_or_as_told(rx, client):
    rx.script("slack", Hang(0.3), Hang(0.2, then=Respond(500)))
    t0 = time.monotonic()
    assert client.post(rx.slack_url, json={"text": "x"}).status_code == 200
    assert client.post(rx.slack_url, json={"text": "x"}).status_code == 500
    assert time.monotonic() - t0 >= 0.5
    assert [r.status for r in rx.received()] == [200, 500]


def test_a_hang_past_the_client_timeout_is_a_timeout(rx):
    rx.script("pagerduty", Hang(0.6))
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(rx.pagerduty_url, json=trigger(), timeout=0.3)
    # The receiver still answers once the hang ends, with nobody listening: its record lands here, not in a later
    # test sharing this receiver (where it was one record too many).
    (late,) = rx.wait_for(kind="pagerduty", timeout=5)
    assert late.accepted


def test_a_hung_request_ends_when_the_receiver_stops():
    rx = ScriptedReceiver().start()
    rx.script("slack", Hang(60))
    answer: dict[str, object] = {}

    def post():
        try:
            answer["status"] = httpx.post(rx.slack_url, json={"text": "x"}, timeout=20).status_code
        except httpx.HTTPError as e:
            answer["status"] = repr(e)

    t = threading.Thread(target=post)
    try:
        t.start()
        deadline = time.monotonic() + 5
        while rx.pending_scripts("slack") and time.monotonic() < deadline:  # until the handler took the Hang
            time.sleep(0.01)
        t0 = time.monotonic()
        rx.stop()
        assert time.monotonic() - t0 < 3
    finally:
        rx.stop()
    t.join(5)
    assert not t.is_alive() and answer["status"] == 503
    (rec,) = rx.received()
    assert rec.status == 503 and rec.error is None


def test_script_arguments_are_checked(rx):
    with pytest.raises(ValueError):
        rx.script("teams", Respond(500))
    with pytest.raises(TypeError):
        rx.script("slack", 500)
    with pytest.raises(ValueError):
        Hang(0)
    with pytest.raises(ValueError):
        Hang(10_000)
    with pytest.raises(ValueError):
        Respond(99)


# --- records, waiting, bounds -----------------------------------------------------------------------------

def test_wait_for_returns_records_posted_later_from_another_thread(rx):
    def later():
        time.sleep(0.2)
        httpx.post(rx.pagerduty_url, json=trigger(event_action="resolve"), timeout=5)

    t = threading.Thread(target=later)
    t.start()
    got = rx.wait_for(lambda r: r.json()["event_action"] == "resolve", timeout=5, kind="pagerduty")
    t.join(5)
    assert len(got) == 1 and got[0].accepted


def test_wait_for_can_skip_rejected_records(rx, client):
    client.post(rx.pagerduty_url, json=trigger(routing_key="short"))
    with pytest.raises(TimeoutError):
        rx.wait_for(kind="pagerduty", accepted=True, timeout=0.2)
    client.post(rx.pagerduty_url, json=trigger())
    (ok,) = rx.wait_for(kind="pagerduty", accepted=True, timeout=2)
    assert ok.status == 202


def test_wait_for_times_out_cleanly_with_what_it_saw(rx, client):
    client.post(rx.slack_url, json={"text": "only this"})
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match=r"0 of 1 wanted pagerduty.*within 0.3 s.*received nothing"):
        rx.wait_for(lambda r: True, timeout=0.3, kind="pagerduty")
    with pytest.raises(TimeoutError, match=r"1 of 2 wanted any.*slack 200 x1.*last: Slack: only this"):
        rx.wait_for(lambda r: True, timeout=0.2, count=2)
    assert time.monotonic() - t0 < 2
    with pytest.raises(ValueError):
        rx.wait_for(lambda r: True, timeout=0)


def test_records_are_immutable(rx, client):
    client.post(rx.slack_url, json={"text": "x"})
    (rec,) = rx.received()
    rec.json()["text"] = "changed"
    assert rec.json() == {"text": "x"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        rec.status = 500  # type: ignore[misc]


def test_on_notification_sees_accepted_records_only_and_cannot_break_delivery(rx, client):
    seen = []
    rx.on_notification = seen.append
    client.post(rx.slack_url, json={"text": "good"})
    client.post(rx.slack_url, json={})
    assert [describe(r) for r in seen] == ["Slack: good"]
    rx.on_notification = lambda r: 1 / 0
    assert client.post(rx.slack_url, json={"text": "still ok"}).status_code == 200


def test_get_received_serves_every_record_as_json(rx, client):
    client.post(rx.slack_url, json={"text": "a"})
    client.post(rx.slack_url, content=b"nope", headers={"content-type": "text/plain"})
    body = client.get(rx.url + "/received").json()
    assert body["dropped"] == 0
    assert [(r["kind"], r["status"], r["error"]) for r in body["records"]] == [
        ("slack", 200, None), ("slack", 400, "invalid_payload")]
    assert body["records"][0]["json"] == {"text": "a"} and body["records"][1]["body_text"] == "nope"


def test_oversized_body_is_413_and_old_records_are_dropped_and_counted():
    with Receiver(max_body=1024, max_records=3) as rx, httpx.Client(timeout=5) as c:
        r = c.post(rx.slack_url, json={"text": "x" * 2000})
        assert r.status_code == 413
        assert rx.received()[0].status == 413 and rx.received()[0].error == "request_too_large"
        for i in range(4):
            c.post(rx.slack_url, json={"text": str(i)})
        assert [r.json()["text"] for r in rx.received()] == ["1", "2", "3"]
        assert rx.dropped == 2


def test_a_chunked_body_is_cut_off_at_the_limit_too():
    def chunks():
        for _ in range(4):
            yield b'{"text": "' + b"x" * 400

    with Receiver(max_body=1024) as rx:
        r = httpx.post(rx.slack_url, content=chunks(), headers={"content-type": "application/json"}, timeout=5)
        assert r.status_code == 413


def test_a_declared_oversized_body_is_refused_before_it_is_sent():
    with Receiver(max_body=1024) as rx, socket.create_connection(("127.0.0.1", int(rx.url.rsplit(":", 1)[1])),
                                                                 timeout=3) as s:
        s.sendall(b"POST /v2/enqueue HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 10000000\r\n\r\n")
        assert s.recv(100).startswith(b"HTTP/1.1 413")


def test_given_port_lifecycle_and_port_in_use():
    port = free_port()
    rx = Receiver(port=port)
    with pytest.raises(RuntimeError):
        rx.url
    with rx:
        assert rx.url == f"http://127.0.0.1:{port}"
        with pytest.raises(ListenError):
            Receiver(port=port).start()
        with pytest.raises(RuntimeError):
            rx.start()
    rx.stop()  # idempotent
    with pytest.raises(httpx.ConnectError):
        httpx.post(f"http://127.0.0.1:{port}/slack/x", json={"text": "x"}, timeout=1)


def test_unknown_paths_and_methods(rx, client):
    assert client.post(rx.url + "/teams", json={"text": "x"}).status_code == 404
    assert client.get(rx.slack_url).status_code == 405
    assert rx.received() == []


# --- describe() -------------------------------------------------------------------------------------------

def rec(kind, body, status=200, **kw):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return Record(1, datetime(2026, 11, 3, tzinfo=timezone.utc), kind, "/x", "application/json", raw, status, **kw)


def test_describe_pagerduty():
    assert describe(rec("pagerduty", trigger(), 202, dedup_key="3f2a9c0d1e2b4a5f")) == (
        "PagerDuty TRIGGER critical [dedup 3f2a9c…] GPU 6 on demo-node-00: XID error (XID 48)")
    resolve = {"routing_key": KEY, "event_action": "resolve", "dedup_key": "k1"}
    assert describe(rec("pagerduty", resolve, 202, dedup_key="k1")) == "PagerDuty RESOLVE [dedup k1]"
    bad = rec("pagerduty", trigger(routing_key="x"), 400, error="Event object is invalid",
              errors=("Length of 'routing_key' is incorrect (should be 32 characters)",))
    assert describe(bad).startswith("[rejected 400 Length of 'routing_key' is incorrect")


def test_describe_slack():
    assert describe(rec("slack", {"text": "GpuLost\nmore"})) == "Slack: GpuLost"
    blocks = [{"type": "divider"}, {"type": "header", "text": {"type": "plain_text", "text": "XID 79 on node-3"}}]
    assert describe(rec("slack", {"blocks": blocks})) == "Slack: XID 79 on node-3"
    assert describe(rec("slack", {"attachments": [{"fallback": "fb"}]})) == "Slack: fb"
    assert describe(rec("slack", {"text": "hi"}, 429)) == "[rejected 429] Slack: hi"
    assert describe(rec("slack", {}, 400, error="no_text")) == "[rejected 400 no_text] Slack: (no text)"
    assert describe(rec("slack", b"{oops", 400, error="invalid_payload")) == (
        "[rejected 400 invalid_payload] Slack (unreadable body)")


def test_describe_alertmanager():
    assert describe(rec("alertmanager", am_message())) == (
        "Alertmanager webhook receiver=slack firing: GpuLost (node=demo-node-00)")
    two = am_message()
    two["alerts"] = two["alerts"] * 2
    assert describe(rec("alertmanager", two)).endswith("[2 alerts]")


KEYS = ["text", "blocks", "attachments", "type", "payload", "event_action", "summary", "severity", "alerts", "labels",
        "alertname", "groupLabels", "receiver", "status", "dedup_key"]
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.fixed_dictionaries({}, optional=dict.fromkeys(KEYS, inner)),
    max_leaves=12)


@settings(max_examples=200, deadline=None)
@given(kind=st.sampled_from(["slack", "pagerduty", "alertmanager"]),
       body=st.fixed_dictionaries({}, optional=dict.fromkeys(KEYS, json_values)) | json_values,
       status=st.sampled_from([200, 202, 400, 429]))
def test_describe_never_raises_whatever_was_posted(kind, body, status):
    assert isinstance(describe(rec(kind, body, status)), str)
