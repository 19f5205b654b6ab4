"""A local stand-in for Slack, PagerDuty and an Alertmanager webhook: validates what senders post, records it."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gpumond.safetext import one_line
from gpumond.web.serving import bind

log = logging.getLogger("gpumond.demo.receiver")

Kind = Literal["slack", "pagerduty", "alertmanager"]
KINDS: tuple[Kind, ...] = ("slack", "pagerduty", "alertmanager")

MAX_BODY_BYTES = 1 << 20
MAX_RECORDS = 10_000

# Slack's documented limits (Block Kit reference, incoming-webhook docs).
SLACK_TEXT_MAX = 40_000
SLACK_BLOCKS_MAX = 50
SLACK_ATTACHMENTS_MAX = 100
SLACK_SECTION_TEXT_MAX = 3000
SLACK_SECTION_FIELDS_MAX = 10
SLACK_FIELD_TEXT_MAX = 2000
SLACK_HEADER_TEXT_MAX = 150
SLACK_CONTEXT_ELEMENTS_MAX = 10
SLACK_BLOCK_ID_MAX = 255
SLACK_BLOCK_TYPES = frozenset({
    "actions", "context", "divider", "file", "header", "image", "input", "markdown", "rich_text", "section",
    "table", "video",
})
SLACK_TEXT_TYPES = frozenset({"plain_text", "mrkdwn"})
# What Slack answers with each status (its documented error strings).
SLACK_STATUS_BODY = {200: "ok", 400: "invalid_payload", 403: "action_prohibited", 404: "channel_not_found",
                     410: "channel_is_archived", 429: "rate_limited", 500: "rollup_error"}

# PagerDuty Events API v2 (developer docs: "Send an Alert Event", "Events API v2 Overview").
PD_ROUTING_KEY_LEN = 32
PD_DEDUP_KEY_MAX = 255
PD_SUMMARY_MAX = 1024
PD_ACTIONS = ("trigger", "acknowledge", "resolve")
PD_SEVERITIES = ("critical", "error", "warning", "info")

AM_STATUSES = ("firing", "resolved")


@dataclass(frozen=True)
class Record:
    """One request the receiver answered, accepted or not; `json()` re-parses so the record cannot change."""

    seq: int
    received_at: datetime
    kind: Kind
    path: str
    content_type: str
    raw: bytes
    status: int
    error: str | None = None  # why the payload is invalid (Slack code / PagerDuty message); None when valid
    errors: tuple[str, ...] = ()  # every problem found, with where it is
    scripted: bool = False  # the answer was planned by a test (Receiver.planned), not found by validation
    dedup_key: str | None = None  # PagerDuty: the key answered (the sender's, or one we generated)

    @property
    def accepted(self) -> bool:
        """The sender was told its notification was delivered (a 2xx answer)."""
        return 200 <= self.status < 300

    def json(self) -> Any:
        """The parsed body (a fresh copy each call), or None if it was not JSON."""
        try:
            return _loads(self.raw)
        except ValueError:
            return None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view, as served by GET /received."""
        body = self.json()
        out: dict[str, Any] = {
            "seq": self.seq, "received_at": self.received_at.isoformat(), "kind": self.kind, "path": self.path,
            "status": self.status, "accepted": self.accepted, "scripted": self.scripted, "error": self.error,
            "errors": list(self.errors), "dedup_key": self.dedup_key, "content_type": self.content_type,
            "json": body,
        }
        if body is None:
            out["body_text"] = self.raw[:2000].decode("utf-8", "replace")
        return out


@dataclass(frozen=True)
class Verdict:
    """How the receiver answers one request: what the real service would say about its body."""

    status: int
    body: bytes | str
    media_type: str
    error: str | None = None
    errors: tuple[str, ...] = ()
    dedup_key: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _loads(raw: bytes) -> Any:
    # NaN / Infinity are Python extensions the real services' parsers refuse.
    return json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)


def _is_json_type(content_type: str) -> bool:
    return content_type.split(";", 1)[0].strip().lower() == "application/json"


def _parse_object(raw: bytes, content_type: str) -> tuple[dict[str, Any] | None, str | None]:
    if not _is_json_type(content_type):
        return None, f"Content-Type is {content_type or 'missing'!r}, not application/json"
    try:
        obj = _loads(raw)
    except ValueError as e:  # UnicodeDecodeError is a ValueError too
        return None, f"body is not valid JSON: {e}"
    if not isinstance(obj, dict):
        return None, f"body is a JSON {type(obj).__name__}, not an object"
    return obj, None


def _is_iso8601(value: Any) -> bool:
    if not isinstance(value, str) or "T" not in value:
        return False
    try:
        datetime.fromisoformat(value)
    except ValueError:
        return False
    return True


# --- Slack incoming webhook -------------------------------------------------------------------------------

def _slack_text_object(obj: Any, where: str, max_len: int, types: frozenset[str] = SLACK_TEXT_TYPES) -> list[str]:
    if not isinstance(obj, dict):
        return [f"{where} must be a text object"]
    errs = []
    if obj.get("type") not in types:
        errs.append(f"{where}.type must be one of {', '.join(sorted(types))} (got {obj.get('type')!r})")
    text = obj.get("text")
    if not isinstance(text, str) or not text:
        errs.append(f"{where}.text must be a non-empty string")
    elif len(text) > max_len:
        errs.append(f"{where}.text is {len(text)} characters (max {max_len})")
    return errs


def _slack_block(block: Any, where: str) -> list[str]:
    if not isinstance(block, dict):
        return [f"{where} must be an object"]
    btype = block.get("type")
    if btype not in SLACK_BLOCK_TYPES:
        return [f"{where}.type {btype!r} is not a known block type"]
    errs = []
    block_id = block.get("block_id")
    if block_id is not None and (not isinstance(block_id, str) or len(block_id) > SLACK_BLOCK_ID_MAX):
        errs.append(f"{where}.block_id must be a string of at most {SLACK_BLOCK_ID_MAX} characters")
    if btype == "section":
        if "text" not in block and "fields" not in block:
            errs.append(f"{where} (section) needs text or fields")
        if "text" in block:
            errs += _slack_text_object(block["text"], f"{where}.text", SLACK_SECTION_TEXT_MAX)
        if "fields" in block:
            fields = block["fields"]
            if not isinstance(fields, list) or not fields or len(fields) > SLACK_SECTION_FIELDS_MAX:
                errs.append(f"{where}.fields must be a list of 1-{SLACK_SECTION_FIELDS_MAX} text objects")
            else:
                for i, f in enumerate(fields):
                    errs += _slack_text_object(f, f"{where}.fields[{i}]", SLACK_FIELD_TEXT_MAX)
    elif btype == "header":
        errs += _slack_text_object(block.get("text"), f"{where}.text", SLACK_HEADER_TEXT_MAX,
                                   frozenset({"plain_text"}))
    elif btype == "context":
        elements = block.get("elements")
        if not isinstance(elements, list) or not elements or len(elements) > SLACK_CONTEXT_ELEMENTS_MAX:
            errs.append(f"{where}.elements must be a list of 1-{SLACK_CONTEXT_ELEMENTS_MAX} elements")
        else:
            for i, el in enumerate(elements):
                if not isinstance(el, dict):
                    errs.append(f"{where}.elements[{i}] must be an object")
                elif el.get("type") in SLACK_TEXT_TYPES:
                    errs += _slack_text_object(el, f"{where}.elements[{i}]", SLACK_SECTION_TEXT_MAX)
                elif el.get("type") != "image":
                    errs.append(f"{where}.elements[{i}].type must be plain_text, mrkdwn or image")
    elif btype in ("actions", "rich_text"):
        elements = block.get("elements")
        if not isinstance(elements, list) or not elements or not all(isinstance(e, dict) for e in elements):
            errs.append(f"{where}.elements must be a non-empty list of objects")
    elif btype == "image":
        if not isinstance(block.get("image_url"), str) and not isinstance(block.get("slack_file"), dict):
            errs.append(f"{where} (image) needs image_url or slack_file")
        if not isinstance(block.get("alt_text"), str) or not block.get("alt_text"):
            errs.append(f"{where}.alt_text must be a non-empty string")
    return errs


def _slack(raw: bytes, content_type: str) -> Verdict:
    def bad(code: str, *why: str) -> Verdict:
        return Verdict(400, code.encode(), "text/plain", code, why)

    obj, why = _parse_object(raw, content_type)
    if obj is None:
        return bad("invalid_payload", why or "")
    text, blocks, attachments = obj.get("text"), obj.get("blocks"), obj.get("attachments")
    if text is not None and not isinstance(text, str):
        return bad("invalid_payload", f"text must be a string (got {type(text).__name__})")
    if not text and not blocks and not attachments:
        return bad("no_text", "needs a non-empty text, blocks or attachments")
    if text is not None and len(text) > SLACK_TEXT_MAX:
        # Slack itself truncates past this; refusing makes a sender that would lose text fail loudly here.
        return bad("msg_too_long", f"text is {len(text)} characters (max {SLACK_TEXT_MAX})")
    if blocks is not None:
        if not isinstance(blocks, list):
            return bad("invalid_blocks_format", f"blocks must be a list (got {type(blocks).__name__})")
        if len(blocks) > SLACK_BLOCKS_MAX:
            return bad("invalid_blocks", f"{len(blocks)} blocks (max {SLACK_BLOCKS_MAX})")
        errs = [e for i, b in enumerate(blocks) for e in _slack_block(b, f"blocks[{i}]")]
        if errs:
            return bad("invalid_blocks", *errs)
    if attachments is not None:
        if not isinstance(attachments, list) or not all(isinstance(a, dict) for a in attachments):
            return bad("invalid_attachments", "attachments must be a list of objects")
        if len(attachments) > SLACK_ATTACHMENTS_MAX:
            return bad("too_many_attachments", f"{len(attachments)} attachments (max {SLACK_ATTACHMENTS_MAX})")
        errs = [e for i, a in enumerate(attachments) if "blocks" in a
                for j, b in enumerate(a["blocks"] if isinstance(a["blocks"], list) else [None])
                for e in _slack_block(b, f"attachments[{i}].blocks[{j}]")]
        if errs:
            return bad("invalid_attachments", *errs)
    return Verdict(200, b"ok", "text/plain")


# --- PagerDuty Events API v2 ------------------------------------------------------------------------------

def _pd_string(obj: Mapping[str, Any], key: str, where: str, *, required: bool, max_len: int | None = None,
               ) -> list[str]:
    value = obj.get(key)
    if value is None or value == "":
        return [f"'{where}' is missing or blank"] if required else []
    if not isinstance(value, str):
        return [f"'{where}' must be a string"]
    if max_len is not None and len(value) > max_len:
        return [f"Length of '{where}' is too long (maximum is {max_len} characters)"]
    return []


def _pd_context(obj: Mapping[str, Any], key: str, required_field: str) -> list[str]:
    items = obj.get(key)
    if items is None:
        return []
    if not isinstance(items, list):
        return [f"'{key}' must be an array"]
    errs = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            errs.append(f"'{key}[{i}]' must be an object")
        elif not isinstance(item.get(required_field), str) or not item[required_field]:
            errs.append(f"'{key}[{i}].{required_field}' is missing or blank")
    return errs


def _pagerduty_errors(ev: Mapping[str, Any]) -> list[str]:
    errs = []
    key = ev.get("routing_key")
    if key is None or key == "":
        errs.append("'routing_key' is missing or blank")
    elif not isinstance(key, str):
        errs.append("'routing_key' must be a string")
    elif len(key) != PD_ROUTING_KEY_LEN:
        errs.append(f"Length of 'routing_key' is incorrect (should be {PD_ROUTING_KEY_LEN} characters)")
    action = ev.get("event_action")
    if action is None or action == "":
        errs.append("'event_action' is missing or blank")
    elif action not in PD_ACTIONS:
        errs.append(f"'event_action' is invalid (must be one of: {', '.join(PD_ACTIONS)})")
    errs += _pd_string(ev, "dedup_key", "dedup_key", required=action in ("acknowledge", "resolve"),
                       max_len=PD_DEDUP_KEY_MAX)
    if action == "trigger":
        payload = ev.get("payload")
        if not isinstance(payload, dict):
            errs.append("'payload' is missing or not an object")
        else:
            errs += _pd_string(payload, "summary", "payload.summary", required=True, max_len=PD_SUMMARY_MAX)
            errs += _pd_string(payload, "source", "payload.source", required=True)
            severity = payload.get("severity")
            if severity is None or severity == "":
                errs.append("'payload.severity' is missing or blank")
            elif severity not in PD_SEVERITIES:
                errs.append(f"'payload.severity' is invalid (must be one of: {', '.join(PD_SEVERITIES)})")
            if "timestamp" in payload and not _is_iso8601(payload["timestamp"]):
                errs.append("'payload.timestamp' is not a valid ISO 8601 timestamp")
            for opt in ("component", "group", "class"):
                errs += _pd_string(payload, opt, f"payload.{opt}", required=False)
            if "custom_details" in payload and not isinstance(payload["custom_details"], dict):
                errs.append("'payload.custom_details' must be an object")
        errs += _pd_context(ev, "links", "href")
        errs += _pd_context(ev, "images", "src")
        for opt in ("client", "client_url"):
            errs += _pd_string(ev, opt, opt, required=False)
    return errs


def _pagerduty(raw: bytes, content_type: str, new_key: Callable[[], str]) -> Verdict:
    ev, why = _parse_object(raw, content_type)
    errs = _pagerduty_errors(ev) if ev is not None else [why or "unreadable body"]
    if ev is None or errs:
        body = {"status": "invalid event", "message": "Event object is invalid", "errors": errs}
        return Verdict(400, json.dumps(body).encode(), "application/json", "Event object is invalid", tuple(errs))
    dedup = ev.get("dedup_key") or new_key()
    body = {"status": "success", "message": "Event processed", "dedup_key": dedup}
    return Verdict(202, json.dumps(body).encode(), "application/json", dedup_key=dedup)


# --- Alertmanager webhook_configs payload -----------------------------------------------------------------

def _string_map(value: Any, where: str) -> list[str]:
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        return [f"{where} must be an object of string values"]
    return []


def _alertmanager_errors(msg: Mapping[str, Any]) -> list[str]:
    errs = []
    if msg.get("version") != "4":
        errs.append(f"version must be \"4\" (got {msg.get('version')!r})")
    if msg.get("status") not in AM_STATUSES:
        errs.append(f"status must be firing or resolved (got {msg.get('status')!r})")
    if not isinstance(msg.get("receiver"), str) or not msg.get("receiver"):
        errs.append("receiver must be a non-empty string")
    for key in ("groupLabels", "commonLabels"):
        errs += _string_map(msg.get(key), key)
    if "commonAnnotations" in msg:
        errs += _string_map(msg["commonAnnotations"], "commonAnnotations")
    for key in ("externalURL", "groupKey"):
        if key in msg and not isinstance(msg[key], str):
            errs.append(f"{key} must be a string")
    if "truncatedAlerts" in msg and (not isinstance(msg["truncatedAlerts"], int) or msg["truncatedAlerts"] < 0):
        errs.append("truncatedAlerts must be a non-negative integer")
    alerts = msg.get("alerts")
    if not isinstance(alerts, list) or not alerts:
        return errs + ["alerts must be a non-empty list"]
    for i, alert in enumerate(alerts):
        where = f"alerts[{i}]"
        if not isinstance(alert, dict):
            errs.append(f"{where} must be an object")
            continue
        if alert.get("status") not in AM_STATUSES:
            errs.append(f"{where}.status must be firing or resolved (got {alert.get('status')!r})")
        errs += _string_map(alert.get("labels"), f"{where}.labels")
        errs += _string_map(alert.get("annotations"), f"{where}.annotations")
        for key in ("startsAt", "endsAt"):
            if not _is_iso8601(alert.get(key)):
                errs.append(f"{where}.{key} must be an RFC 3339 timestamp (got {alert.get(key)!r})")
        if not isinstance(alert.get("fingerprint"), str) or not alert.get("fingerprint"):
            errs.append(f"{where}.fingerprint must be a non-empty string")
        if "generatorURL" in alert and not isinstance(alert["generatorURL"], str):
            errs.append(f"{where}.generatorURL must be a string")
    return errs


def _alertmanager(raw: bytes, content_type: str) -> Verdict:
    msg, why = _parse_object(raw, content_type)
    errs = _alertmanager_errors(msg) if msg is not None else [why or "unreadable body"]
    if msg is None or errs:
        return Verdict(400, ("invalid webhook payload: " + "; ".join(errs)).encode(), "text/plain",
                        "invalid webhook payload", tuple(errs))
    return Verdict(200, b"ok", "text/plain")


# --- rendering --------------------------------------------------------------------------------------------

def _first_line(text: Any) -> str:
    return one_line(str(text).strip().split("\n", 1)[0], 200)


def _short_key(key: str | None) -> str:
    if not key:
        return "?"
    return key if len(key) <= 8 else key[:6] + "…"


def _slack_headline(msg: Mapping[str, Any]) -> str:
    if isinstance(msg.get("text"), str) and msg["text"].strip():
        return _first_line(msg["text"])
    blocks = msg.get("blocks") if isinstance(msg.get("blocks"), list) else []
    for wanted in ("header", "section"):
        for b in blocks:
            if isinstance(b, dict) and b.get("type") == wanted and isinstance(b.get("text"), dict):
                if str(b["text"].get("text", "")).strip():
                    return _first_line(b["text"]["text"])
    attachments = msg.get("attachments") if isinstance(msg.get("attachments"), list) else []
    for a in attachments:
        for key in ("title", "fallback", "pretext", "text"):
            if isinstance(a, dict) and str(a.get(key, "")).strip():
                return _first_line(a[key])
    return "(no text)"


def _pagerduty_headline(ev: Mapping[str, Any], dedup_key: str | None) -> str:
    action = str(ev.get("event_action", "?")).upper()
    key = _short_key(dedup_key or (ev.get("dedup_key") if isinstance(ev.get("dedup_key"), str) else None))
    payload = ev.get("payload") if isinstance(ev.get("payload"), dict) else {}
    if action == "TRIGGER":
        summary = _first_line(payload.get("summary", ""))
        return f"PagerDuty TRIGGER {payload.get('severity', '?')} [dedup {key}] {summary}"
    return f"PagerDuty {action} [dedup {key}]"


def _alertmanager_headline(msg: Mapping[str, Any]) -> str:
    alerts = [a for a in msg.get("alerts") or [] if isinstance(a, dict)] if isinstance(msg.get("alerts"), list) else []
    names = sorted({str(a["labels"].get("alertname", "?")) if isinstance(a.get("labels"), dict) else "?"
                    for a in alerts}) or ["?"]
    group = msg.get("groupLabels") if isinstance(msg.get("groupLabels"), dict) else {}
    labels = ", ".join(f"{k}={v}" for k, v in sorted(group.items()) if k != "alertname")
    line = f"Alertmanager webhook receiver={msg.get('receiver', '?')} {msg.get('status', '?')}: {', '.join(names)}"
    if labels:
        line += f" ({labels})"
    if len(alerts) > 1:
        line += f" [{len(alerts)} alerts]"
    return line


def describe(record: Record) -> str:
    """One human line for a notification, e.g. `PagerDuty TRIGGER critical [dedup 3f2a…] GPU 6 …`."""
    body = record.json()
    if not isinstance(body, dict):
        line = {"slack": "Slack", "pagerduty": "PagerDuty", "alertmanager": "Alertmanager webhook"}[record.kind]
        line += " (unreadable body)"
    elif record.kind == "slack":
        line = f"Slack: {_slack_headline(body)}"
    elif record.kind == "pagerduty":
        line = _pagerduty_headline(body, record.dedup_key)
    else:
        line = _alertmanager_headline(body)
    if record.scripted:
        return f"[scripted {record.status}] {line}"
    if not record.accepted:
        # Slack's error is its code; PagerDuty's and Alertmanager's first detail says more than their umbrella.
        reason = record.error if record.kind == "slack" or not record.errors else record.errors[0]
        return f"[rejected {' '.join(filter(None, (str(record.status), reason)))}] {line}"
    return line


# --- the server -------------------------------------------------------------------------------------------

class Receiver:
    """Slack / PagerDuty / Alertmanager-webhook endpoints on 127.0.0.1, recording every request.

    A test that needs a misbehaving service overrides `planned` (tests/scripted_receiver.py).
    """

    # uvicorn + Starlette rather than http.server: the daemons' own HTTP stack (a real HTTP/1.1 server with
    # keep-alive, so senders' connection reuse is exercised as against the real
    # services), and a stalled answer is an awaitable that stop() cancels, with no thread parked per request.

    def __init__(self, port: int = 0, *, max_body: int = MAX_BODY_BYTES, max_records: int = MAX_RECORDS,
                 on_notification: Callable[[Record], None] | None = None,
                 clock: Callable[[], float] = time.time, new_dedup_key: Callable[[], str] = lambda: uuid.uuid4().hex,
                 ) -> None:
        if max_body < 1 or max_records < 1:
            raise ValueError("max_body and max_records must be positive")
        self._port, self._max_body, self._clock, self._new_key = port, max_body, clock, new_dedup_key
        # Called on the server thread with each accepted record, before the sender gets its answer: keep it quick.
        self.on_notification = on_notification
        self._cond = threading.Condition()
        self._records: deque[Record] = deque(maxlen=max_records)
        self._dropped = 0
        self._seq = 0
        self._thread: threading.Thread | None = None
        self._server: uvicorn.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_evt: asyncio.Event | None = None
        self._bound_port: int | None = None
        self._started = threading.Event()
        self._failure: BaseException | None = None
        self.app = Starlette(routes=[
            Route("/slack", self._slack, methods=["POST"]),
            Route("/slack/{rest:path}", self._slack, methods=["POST"]),
            Route("/pagerduty/v2/enqueue", self._pagerduty, methods=["POST"]),
            Route("/v2/enqueue", self._pagerduty, methods=["POST"]),
            Route("/alertmanager", self._alertmanager, methods=["POST"]),
            Route("/alertmanager/{rest:path}", self._alertmanager, methods=["POST"]),
            Route("/received", self._received, methods=["GET"]),
        ])

    # lifecycle

    def start(self, timeout: float = 5.0) -> Receiver:
        """Bind 127.0.0.1 (the given port, or a free one) and serve from a background thread."""
        if self._thread is not None:
            raise RuntimeError("receiver already started")
        self._started.clear()
        self._failure = None
        sock = bind("127.0.0.1", self._port)
        self._bound_port = int(sock.getsockname()[1])
        config = uvicorn.Config(self.app, lifespan="off", access_log=False, log_config=None, log_level="warning",
                                server_header=False, timeout_graceful_shutdown=2)
        server = self._server = uvicorn.Server(config)

        def run() -> None:
            try:
                asyncio.run(self._serve(server, sock))
            except BaseException as e:  # noqa: BLE001 - reported by start(), never a silent dead thread
                self._failure = e
                self._started.set()
            finally:
                sock.close()

        self._thread = threading.Thread(target=run, name=f"receiver:{self._bound_port}", daemon=True)
        self._thread.start()
        if not self._started.wait(timeout) or self._failure is not None or not server.started:
            self.stop()
            raise RuntimeError(f"receiver on 127.0.0.1:{self._bound_port} did not start: {self._failure!r}")
        return self

    async def _serve(self, server: uvicorn.Server, sock: socket.socket) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop_evt = asyncio.Event()
        serving = asyncio.ensure_future(server.serve(sockets=[sock]))
        # uvicorn sets `started` once listening; poll briefly so start() returns only when requests work.
        while not server.started and not serving.done():
            await asyncio.sleep(0.005)
        self._started.set()
        await serving

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving; stalled (Hang) requests end at once with 503; waits at most `timeout` seconds."""
        thread = self._thread
        if thread is None:
            return
        if self._loop is not None and self._stop_evt is not None and not self._loop.is_closed():
            try:
                self._loop.call_soon_threadsafe(self._stop_evt.set)
            except RuntimeError:  # the loop closed between the check and the call
                pass
        if self._server is not None:
            self._server.should_exit = True
        thread.join(timeout)
        if thread.is_alive() and self._server is not None:
            self._server.force_exit = True
            thread.join(1.0)
        self._thread = None

    def __enter__(self) -> Receiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """Base URL, e.g. http://127.0.0.1:40123 (only once started)."""
        if self._bound_port is None:
            raise RuntimeError("receiver not started: call start() first")
        return f"http://127.0.0.1:{self._bound_port}"

    @property
    def slack_url(self) -> str:
        """A Slack incoming-webhook URL served here."""
        return self.url + "/slack/T00000000/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX"

    @property
    def pagerduty_url(self) -> str:
        """The PagerDuty Events API v2 enqueue URL served here."""
        return self.url + "/v2/enqueue"

    @property
    def alertmanager_url(self) -> str:
        """An Alertmanager webhook_configs URL served here."""
        return self.url + "/alertmanager"

    # reading and steering

    def received(self, kind: Kind | None = None, *, accepted: bool | None = None) -> list[Record]:
        """Records kept so far, oldest first, optionally only one kind and/or only (not) accepted ones."""
        _check_kind(kind)
        with self._cond:
            records = list(self._records)
        return [r for r in records
                if (kind is None or r.kind == kind) and (accepted is None or r.accepted == accepted)]

    @property
    def dropped(self) -> int:
        """How many of the oldest records were dropped to stay within max_records."""
        with self._cond:
            return self._dropped

    def wait_for(self, predicate: Callable[[Record], bool] = lambda r: True, timeout: float = 5.0, *,
                 kind: Kind | None = None, accepted: bool | None = None, count: int = 1) -> list[Record]:
        """Block until `count` kept records (filtered as received() does) match; return them all, or TimeoutError."""
        _check_kind(kind)
        if not 0 < timeout <= 600:
            raise ValueError(f"timeout must be in (0, 600] seconds (got {timeout})")
        deadline = time.monotonic() + timeout
        while True:
            with self._cond:
                seq = self._seq
            matched = [r for r in self.received(kind, accepted=accepted) if predicate(r)]
            if len(matched) >= count:
                return matched
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(self._timeout_message(timeout, kind, count, len(matched)))
            with self._cond:
                self._cond.wait_for(lambda: self._seq != seq, remaining)

    def _timeout_message(self, timeout: float, kind: Kind | None, count: int, matched: int) -> str:
        records = self.received(kind)
        tally: dict[str, int] = {}
        for r in records:
            key = f"{r.kind} {r.status}"
            tally[key] = tally.get(key, 0) + 1
        seen = ", ".join(f"{k} x{n}" for k, n in sorted(tally.items())) or "nothing"
        last = f"; last: {describe(records[-1])}" if records else ""
        return (f"receiver {self._bound_port}: {matched} of {count} wanted {kind or 'any'} record(s) matched "
                f"within {timeout:g} s; received {seen}{last}")

    def clear(self) -> None:
        """Forget every record and the dropped count."""
        with self._cond:
            self._records.clear()
            self._dropped = 0

    async def planned(self, kind: Kind, verdict: Verdict) -> Verdict | None:
        """The answer a test planned instead of `verdict` (None: answer as the real service would)."""
        return None

    # request handling (runs on the server thread)

    async def _slack(self, request: Request) -> Response:
        return await self._handle(request, "slack", lambda raw, ct: _slack(raw, ct))

    async def _pagerduty(self, request: Request) -> Response:
        return await self._handle(request, "pagerduty", lambda raw, ct: _pagerduty(raw, ct, self._new_key))

    async def _alertmanager(self, request: Request) -> Response:
        return await self._handle(request, "alertmanager", lambda raw, ct: _alertmanager(raw, ct))

    async def _received(self, request: Request) -> Response:
        return JSONResponse({"dropped": self.dropped, "records": [r.to_dict() for r in self.received()]})

    async def _read_body(self, request: Request) -> bytes | None:
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self._max_body:
            return None
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self._max_body:
                return None
            chunks.append(chunk)
        return b"".join(chunks)

    async def _handle(self, request: Request, kind: Kind, judge: Callable[[bytes, str], Verdict]) -> Response:
        content_type = request.headers.get("content-type", "")
        path = request.url.path
        raw = await self._read_body(request)
        if raw is None:
            msg = f"body over {self._max_body} bytes"
            self._record(kind, path, content_type, b"", 413, "request_too_large", (msg,), False, None)
            return Response(msg, 413, media_type="text/plain")
        verdict = judge(raw, content_type)
        planned = await self.planned(kind, verdict)
        answer = planned or verdict
        self._record(kind, path, content_type, raw, answer.status, verdict.error, verdict.errors,
                     planned is not None, answer.dedup_key)
        return Response(answer.body, answer.status, headers=dict(answer.headers), media_type=answer.media_type)

    def stopping(self) -> asyncio.Event:
        """Set when stop() begins (on the server's loop): what a stalled answer waits on."""
        if self._stop_evt is None:  # only None if a request were served outside start(); be safe anyway
            self._stop_evt = asyncio.Event()
        return self._stop_evt

    def _record(self, kind: Kind, path: str, content_type: str, raw: bytes, status: int, error: str | None,
                errors: tuple[str, ...], scripted: bool, dedup_key: str | None) -> None:
        received_at = datetime.fromtimestamp(self._clock(), timezone.utc)
        with self._cond:
            self._seq += 1
            record = Record(self._seq, received_at, kind, path, content_type, raw, status, error, errors,
                            scripted, dedup_key)
            if len(self._records) == self._records.maxlen:
                self._dropped += 1
            self._records.append(record)
            self._cond.notify_all()
        callback = self.on_notification
        if callback is not None and record.accepted:
            try:
                callback(record)
            except Exception:  # a broken printer must not turn a delivered notification into a 500
                log.exception("on_notification callback failed", extra={"kind": kind, "seq": record.seq})


def _check_kind(kind: str | None) -> None:
    if kind is not None and kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)} (got {kind!r})")
