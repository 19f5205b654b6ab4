"""A local stand-in for Slack, PagerDuty and an Alertmanager webhook: answers what senders post, records it.

The demo's built-in receiver: each notification is answered as the service answers one it can read (Slack's
"ok", PagerDuty's dedup key) and handed to `on_notification`, which prints it as a PAGE line. A body that is
not a JSON object gets the service's own refusal. The services' detailed rules (Block Kit limits, Events API
fields) are the tests' business: they check every payload gpumond sends against them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gpumond.wire.safetext import one_line
from gpumond.web.serving import bind

log = logging.getLogger("gpumond.demo.receiver")

Kind = Literal["slack", "pagerduty", "alertmanager"]
KINDS: tuple[Kind, ...] = ("slack", "pagerduty", "alertmanager")

MAX_BODY_BYTES = 1 << 20
MAX_RECORDS = 10_000


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
            "status": self.status, "accepted": self.accepted, "error": self.error,
            "errors": list(self.errors), "dedup_key": self.dedup_key, "content_type": self.content_type,
            "json": body,
        }
        if body is None:
            out["body_text"] = self.raw[:2000].decode("utf-8", "replace")
        return out


@dataclass(frozen=True)
class Verdict:
    """How the receiver answers one request: what the service would say about its body."""

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


def parse_object(raw: bytes, content_type: str) -> tuple[dict[str, Any] | None, str | None]:
    """The body as a JSON object, or None and why it is not one."""
    if not _is_json_type(content_type):
        return None, f"Content-Type is {content_type or 'missing'!r}, not application/json"
    try:
        obj = _loads(raw)
    except ValueError as e:  # UnicodeDecodeError is a ValueError too
        return None, f"body is not valid JSON: {e}"
    if not isinstance(obj, dict):
        return None, f"body is a JSON {type(obj).__name__}, not an object"
    return obj, None


# --- the services' answers --------------------------------------------------------------------------------

SLACK_OK = Verdict(200, b"ok", "text/plain")
WEBHOOK_OK = Verdict(200, b"ok", "text/plain")  # Alertmanager's webhook_configs expects any 2xx


def slack_refusal(code: str, *why: str) -> Verdict:
    """Slack's refusal: a 400 whose body is its error code (invalid_payload, no_text, …)."""
    return Verdict(400, code.encode(), "text/plain", code, why)


def pagerduty_accepted(dedup_key: str) -> Verdict:
    """The Events API v2's 202, naming the alert's dedup key."""
    body = {"status": "success", "message": "Event processed", "dedup_key": dedup_key}
    return Verdict(202, json.dumps(body).encode(), "application/json", dedup_key=dedup_key)


def pagerduty_refusal(errors: Sequence[str]) -> Verdict:
    """The Events API v2's 400, listing what is wrong with the event."""
    body = {"status": "invalid event", "message": "Event object is invalid", "errors": list(errors)}
    return Verdict(400, json.dumps(body).encode(), "application/json", "Event object is invalid", tuple(errors))


def alertmanager_refusal(errors: Sequence[str]) -> Verdict:
    """A webhook receiver's 400 (Alertmanager retries it like any failure)."""
    return Verdict(400, ("invalid webhook payload: " + "; ".join(errors)).encode(), "text/plain",
                   "invalid webhook payload", tuple(errors))


def readable_answer(kind: Kind, raw: bytes, content_type: str, new_key: Callable[[], str]) -> Verdict:
    """The service's answer to a notification it can read (a JSON object); its refusal of one it cannot."""
    obj, why = parse_object(raw, content_type)
    if obj is None:
        why = why or "unreadable body"
        if kind == "slack":
            return slack_refusal("invalid_payload", why)
        return pagerduty_refusal([why]) if kind == "pagerduty" else alertmanager_refusal([why])
    if kind == "pagerduty":
        given = obj.get("dedup_key")
        return pagerduty_accepted(given if isinstance(given, str) and given else new_key())
    return SLACK_OK if kind == "slack" else WEBHOOK_OK


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
    if not record.accepted:
        # Slack's error is its code; PagerDuty's and Alertmanager's first detail says more than their umbrella.
        reason = record.error if record.kind == "slack" or not record.errors else record.errors[0]
        return f"[rejected {' '.join(filter(None, (str(record.status), reason)))}] {line}"
    return line


# --- the server -------------------------------------------------------------------------------------------

class Receiver:
    """Slack / PagerDuty / Alertmanager-webhook endpoints on 127.0.0.1, recording every request.

    `answer` says how one request is answered; a subclass may answer otherwise (stricter, later, refusing).
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
        """Stop serving; an answer still waiting on `stopping()` is told at once; waits at most `timeout` seconds."""
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

    def clear(self) -> None:
        """Forget every record and the dropped count."""
        with self._cond:
            self._records.clear()
            self._dropped = 0

    async def answer(self, kind: Kind, raw: bytes, content_type: str) -> Verdict:
        """How this request is answered: as the service answers a notification it can read."""
        return readable_answer(kind, raw, content_type, self._new_key)

    # request handling (runs on the server thread)

    async def _slack(self, request: Request) -> Response:
        return await self._handle(request, "slack")

    async def _pagerduty(self, request: Request) -> Response:
        return await self._handle(request, "pagerduty")

    async def _alertmanager(self, request: Request) -> Response:
        return await self._handle(request, "alertmanager")

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

    async def _handle(self, request: Request, kind: Kind) -> Response:
        content_type = request.headers.get("content-type", "")
        path = request.url.path
        raw = await self._read_body(request)
        if raw is None:
            msg = f"body over {self._max_body} bytes"
            self._record(kind, path, content_type, b"", 413, "request_too_large", (msg,), None)
            return Response(msg, 413, media_type="text/plain")
        answer = await self.answer(kind, raw, content_type)
        self._record(kind, path, content_type, raw, answer.status, answer.error, answer.errors, answer.dedup_key)
        return Response(answer.body, answer.status, headers=dict(answer.headers), media_type=answer.media_type)

    def stopping(self) -> asyncio.Event:
        """Set when stop() begins (on the server's loop): what an answer that takes its time waits on."""
        if self._stop_evt is None:  # only None if a request were served outside start(); be safe anyway
            self._stop_evt = asyncio.Event()
        return self._stop_evt

    def _record(self, kind: Kind, path: str, content_type: str, raw: bytes, status: int, error: str | None,
                errors: tuple[str, ...], dedup_key: str | None) -> None:
        received_at = datetime.fromtimestamp(self._clock(), timezone.utc)
        with self._cond:
            self._seq += 1
            record = Record(self._seq, received_at, kind, path, content_type, raw, status, error, errors, dedup_key)
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
