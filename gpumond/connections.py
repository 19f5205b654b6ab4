"""Bounding what a connection may hold, for both daemons' HTTP server (uvicorn's h11 protocol, extended).

uvicorn 0.54 closes a connection only after a response (its keep-alive timeout): a connection that sends
nothing, or half a request line, or a body byte a minute, is held forever, and ~1,100 of them exhaust a
1,024-descriptor limit so that /metrics, /healthz and the push API stop answering. Its `limit_concurrency`
does not help: it answers 503 to *requests* once that many connections exist, so idle attackers would get
real scrapes refused. What is added here:

- a **head timeout**: a request's head (request line and headers) must be complete within `head_timeout_s`
  of the connection opening, or of the request's first byte on a kept-alive connection;
- a **body timeout**: the body must be complete within `body_timeout_s` of the head;
- the **keep-alive idle timeout** is uvicorn's (`keep_alive_s`), closing with `abort()` when the client
  has not read our response, since `close()` would wait for it forever;
- a **connection cap** below the process's descriptor limit: a connection past it first closes the
  connection that has waited longest without a complete request head, then the longest kept-alive idle
  one; when every held connection is busy with a request, the newest is shed (closed at once).
"""

from __future__ import annotations

import logging
import resource
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("gpumond.serving")

_UNLIMITED_CAP = 65_536


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """Timeouts and the connection cap of one server; `max_connections` None derives it from RLIMIT_NOFILE."""

    head_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    # Above the job SDK's 5 s push interval and usual scrape intervals, so clients reuse their connection.
    keep_alive_s: float = 75.0
    max_connections: int | None = None


def connection_cap(limits: ConnectionLimits, nofile: int | None = None) -> int:
    """How many connections to hold: the configured cap, else the descriptor limit minus a reserve."""
    if limits.max_connections is not None:
        return limits.max_connections
    if nofile is None:
        nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if nofile == resource.RLIM_INFINITY or nofile <= 0:
        return _UNLIMITED_CAP
    # The reserve covers everything else the process opens: NVML, state and log files, outgoing scrape and
    # alert connections, threads' pipes. 1,024 -> 896 connections; 65,536 (deploy/systemd) -> 57,344.
    return max(16, nofile - max(64, nofile // 8))


class ConnectionStats:
    """What the guard has closed, by reason; one per server."""

    def __init__(self) -> None:
        self.head_timeouts = 0
        self.body_timeouts = 0
        self.evicted = 0
        self.shed = 0
        self.peak = 0


class _Guard:
    """Shared by every connection of one server: the idle connections in age order, and the counters."""

    def __init__(self, cap: int, limits: ConnectionLimits) -> None:
        self.cap = cap
        self.limits = limits
        self.waiting: OrderedDict[Any, None] = OrderedDict()  # no complete request head yet
        self.kept: OrderedDict[Any, None] = OrderedDict()  # kept alive between requests
        self.stats = ConnectionStats()

    def victim(self) -> Any | None:
        """The connection to close for a new one: longest waiting for a head, else longest kept idle."""
        for idle in (self.waiting, self.kept):
            if idle:
                return next(iter(idle))
        return None

    def forget(self, conn: Any) -> None:
        self.waiting.pop(conn, None)
        self.kept.pop(conn, None)


def guarded_protocol(limits: ConnectionLimits, *, cap: int | None = None) -> tuple[type[H11Protocol], ConnectionStats]:
    """An h11 protocol class for uvicorn.Config(http=...) enforcing `limits`, and its counters."""
    guard = _Guard(cap if cap is not None else connection_cap(limits), limits)

    class GuardedH11Protocol(H11Protocol):
        """uvicorn's h11 protocol with head/body timeouts and the connection cap (see the module doc)."""

        _timer: Any = None
        _phase: str | None = None

        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            super().connection_made(transport)
            held = len(self.connections)
            guard.stats.peak = max(guard.stats.peak, held)
            if held > guard.cap:
                victim = guard.victim()
                if victim is None:
                    guard.stats.shed += 1
                    _say("connection shed: every held connection is busy", cap=guard.cap,
                         total=guard.stats.shed)
                    self.transport.abort()
                    return
                guard.stats.evicted += 1
                _say("idle connection closed to make room", cap=guard.cap, total=guard.stats.evicted)
                victim._close("evicted")
            guard.waiting[self] = None
            self._arm("head", guard.limits.head_timeout_s)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            self._track()

        def on_response_complete(self) -> None:
            super().on_response_complete()  # may start a pipelined request at once
            if self.transport.is_closing():
                return
            if self.cycle is not None and not self.cycle.response_complete:
                self._track()  # a pipelined request is being served
                return
            self._disarm()
            guard.forget(self)
            if self.conn.trailing_data[0]:  # part of the next request already arrived: its head is due
                guard.waiting[self] = None
                self._arm("head", guard.limits.head_timeout_s)
            else:  # uvicorn's keep-alive timer runs now
                guard.kept[self] = None

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            guard.forget(self)
            super().connection_lost(exc)

        def timeout_keep_alive_handler(self) -> None:
            super().timeout_keep_alive_handler()
            self._close("keep_alive")  # close() waits for a client that never reads our response

        def _track(self) -> None:
            """After bytes arrived: which deadline applies now, by the state of the client's request."""
            if self.transport.is_closing():
                return
            state = self.conn.their_state
            if state is h11.IDLE:
                if self._phase is None:  # the first bytes of a request on a kept-alive connection
                    guard.kept.pop(self, None)
                    guard.waiting[self] = None
                    self._arm("head", guard.limits.head_timeout_s)
                return
            guard.forget(self)  # a request head arrived: busy until its response is complete
            if state is h11.SEND_BODY:
                if self._phase != "body":
                    self._arm("body", guard.limits.body_timeout_s)
            else:  # DONE, MUST_CLOSE, CLOSED, ERROR: nothing more to wait for from the client
                self._disarm()

        def _arm(self, phase: str, seconds: float) -> None:
            self._disarm()
            self._phase = phase
            self._timer = self.loop.call_later(seconds, self._expired, phase)

        def _disarm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
            self._timer, self._phase = None, None

        def _expired(self, phase: str) -> None:
            self._timer = None
            if self.transport.is_closing():
                return
            if phase == "head":
                guard.stats.head_timeouts += 1
                _say("connection closed: request head not complete in time", timeout_s=guard.limits.head_timeout_s,
                     total=guard.stats.head_timeouts, client=_peer(self))
            else:
                guard.stats.body_timeouts += 1
                _say("connection closed: request body not complete in time", timeout_s=guard.limits.body_timeout_s,
                     total=guard.stats.body_timeouts, client=_peer(self))
            self._close(phase)

        def _close(self, why: str) -> None:
            self._disarm()
            guard.forget(self)
            if not self.transport.is_closing() or self.transport.get_write_buffer_size():
                self.transport.abort()  # never wait on a peer that does not read

    return GuardedH11Protocol, guard.stats


def _peer(conn: Any) -> str:
    client = getattr(conn, "client", None)
    return f"{client[0]}:{client[1]}" if client else "unknown"


def _say(message: str, **fields: object) -> None:
    # One line per call site; gpumond.logs rate-limits a flood of them and reports the count.
    log.warning(message, extra=fields)

