"""Bounding what a connection may hold, for both daemons' HTTP server (uvicorn's httptools or h11 protocol,
extended: gpumond/web/protocols.py, which also builds a server's protocol factory, `guarded_protocol`).

uvicorn 0.54 closes a connection only after a response (its keep-alive timeout): a connection that sends
nothing, or half a request line, or a body byte a minute, is held forever, and ~1,100 of them exhaust a
1,024-descriptor limit so that /metrics, /healthz and the push API stop answering. Its `limit_concurrency`
does not help: it answers 503 to *requests* once that many connections exist, so idle attackers would get
real scrapes refused. What is added here:

- a **head timeout**: a request's head (request line and headers) must be complete within `header_timeout_s`
  of the connection opening, or of the request's first byte on a kept-alive connection;
- a **body timeout**: the body must be complete within `body_timeout_s` of the head;
- the **keep-alive idle timeout** is uvicorn's (`keepalive_timeout_s`), closing with `abort()` when the client
  has not read our response, since `close()` would wait for it forever;
- a **write timeout**: a connection whose writes the transport has paused (the client does not read what
  we send, e.g. it pipelines requests and never reads) for `write_timeout_s` is aborted. uvicorn waits on
  such a client with no timer of its own, which held SIGTERM (and so the policy's restore) forever;
- a **connection cap**, the smaller of `max_connections` and what the descriptor limit leaves room for
  (a container's 1,048,576 descriptors alone would let a flood hold ~4.7 KB x 917,504 connections): a
  connection past it first closes the connection that has waited longest without a complete request head,
  if that has waited at least `evict_after_s`, then the longest kept-alive idle one, then the longest
  write-paused one; when none of those is held (every held connection is busy with a request, or opened
  less than `evict_after_s` ago and its head not read yet) the newest is shed (closed at once).

  Why a connection without a head is spared its first second: the server accepts a whole backlog of
  connections before it reads any of them, so a just-accepted one "has no head" only because its bytes are
  not read yet. Closing it for the next one accepted closed every connection of a burst but the last: 2,048
  job ranks pushing every 5 s against a 256-connection cap (the ratio of 32,768 ranks to the default 4,096)
  took 30 s a pass, per-rank p99 26 s, ~7,000 connections closed a pass (benchmarks/results/
  push_burst_scaled.md; at 32,768 ranks and the default cap no push was answered within a minute). Shedding
  the newest instead serves the connections in the order they came, and the shed client retries later.

Over TLS (gpumond/web/tls.py) the guard takes a connection at its TCP accept, before the handshake: a
client that never completes its handshake is held to the same head timeout, counts against the same cap and
is the first evicted, exactly like one that never sends its request head.

Each kind of closing has its own log call site, so that one flood's rate limit (gpumond.logs) never hides
another kind's warning, and its own counter (`ConnectionStats`), exported on both daemons' /metrics. The
warnings go through `log_limited`: past the cap every new connection closes one, and a warning the rate limit
holds back is then not built at all.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpumond.config.http import HttpConfig
from gpumond.logs import log_limited
from gpumond.types import Series

log = logging.getLogger("gpumond.serving")

_UNLIMITED_CAP = 65_536


_DEFAULTS = HttpConfig()  # the defaults (and why they are what they are) live with the `http:` section


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """Timeouts and the connection cap of one server (config: the `http:` section of either daemon)."""

    header_timeout_s: float = _DEFAULTS.header_timeout_s
    body_timeout_s: float = _DEFAULTS.body_timeout_s
    keepalive_timeout_s: float = _DEFAULTS.keepalive_timeout_s
    write_timeout_s: float = _DEFAULTS.write_timeout_s
    max_connections: int = _DEFAULTS.max_connections
    # A connection without a complete request head makes room for a new one only once it has waited this long:
    # younger, its head is most likely unread rather than unsent (the module doc). Far below header_timeout_s,
    # so a silent client still loses its place long before its head deadline.
    evict_after_s: float = 1.0

    @classmethod
    def of(cls, http: HttpConfig) -> ConnectionLimits:
        """A daemon's `http:` section as the guard's limits."""
        return cls(header_timeout_s=http.header_timeout_s, body_timeout_s=http.body_timeout_s,
                   keepalive_timeout_s=http.keepalive_timeout_s, write_timeout_s=http.write_timeout_s,
                   max_connections=http.max_connections)


def connection_cap(limits: ConnectionLimits, nofile: int | None = None) -> int:
    """How many connections to hold: `max_connections`, lowered to what the descriptor limit leaves room for."""
    if nofile is None:
        nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if nofile == resource.RLIM_INFINITY or nofile <= 0:
        return min(limits.max_connections, _UNLIMITED_CAP)
    # The reserve covers everything else the process opens: NVML, state and log files, outgoing scrape and
    # alert connections, threads' pipes. 1,024 -> 896 connections; 65,536 (deploy/systemd) -> 57,344.
    return min(limits.max_connections, max(16, nofile - max(64, nofile // 8)))


# name -> (type, help), for each daemon's /metrics encoder.
CONNECTION_METRICS = {
    "gpumond_http_connections_open": ("gauge", "HTTP connections held by this server now."),
    "gpumond_http_connections_peak": ("gauge", "Most HTTP connections held at once since the server started."),
    "gpumond_http_connections_limit": ("gauge", "The server's connection cap (http.max_connections, lowered to fit "
                                                "the descriptor limit)."),
    "gpumond_http_connections_closed_total": ("counter", (
        "HTTP connections the server closed to bound them, by reason (head_timeout, body_timeout, write_timeout, "
        "evicted, shed).")),
}

CLOSE_REASONS = ("head_timeout", "body_timeout", "write_timeout", "evicted", "shed")


class ConnectionStats:
    """What the guard holds and has closed, by reason; one per server, read by its /metrics."""

    def __init__(self, cap: int = 0) -> None:
        """`cap`: the connection cap the server will hold (connection_cap()), known before it starts, so a
        sample taken before serving (the agent's first) already exports the real limit, never 0."""
        self.head_timeouts = 0
        self.body_timeouts = 0
        self.write_timeouts = 0
        self.evicted = 0
        self.shed = 0
        self.open = 0
        self.peak = 0
        self.cap = cap

    def series(self) -> list[Series]:
        """The CONNECTION_METRICS series (counters as plain ints: one writer, the event loop's thread)."""
        closed = (self.head_timeouts, self.body_timeouts, self.write_timeouts, self.evicted, self.shed)
        out = [Series("gpumond_http_connections_open", (), float(self.open)),
               Series("gpumond_http_connections_peak", (), float(self.peak)),
               Series("gpumond_http_connections_limit", (), float(self.cap))]
        out += [Series("gpumond_http_connections_closed_total", (("reason", reason),), float(n))
                for reason, n in zip(CLOSE_REASONS, closed)]
        return out


# Once this many connections closed since the heap was last released, it is released RELEASE_DELAY_S later
# (gpumond/web/heap.py): a flood's memory goes back to the kernel once the flood is over, at most once a delay. A
# release runs on the event loop: ~5 ms after 4,000 stalled handshakes were freed (180 MB), once.
RELEASE_AFTER_CLOSED = 256
RELEASE_DELAY_S = 1.0


class Guard:
    """Shared by every connection of one server: the idle connections in age order, and the counters."""

    def __init__(self, cap: int, limits: ConnectionLimits, stats: ConnectionStats,
                 release_heap: Callable[[], None]) -> None:
        self.cap = cap
        self.release_heap = release_heap
        self.closed_since_release = 0
        self.release_due: Any = None  # the timer of the next release, once one is due
        self.limits = limits
        self.waiting: OrderedDict[Any, float] = OrderedDict()  # no complete request head yet: since when
        self.kept: OrderedDict[Any, None] = OrderedDict()  # kept alive between requests
        self.paused: OrderedDict[Any, None] = OrderedDict()  # writes paused: the client is not reading
        self.held: set[Any] = set()  # every connection taken, including those still in their TLS handshake
        self.stats = stats
        stats.cap = cap

    def victim(self, now: float) -> tuple[Any, str] | None:
        """The connection to close for a new one at `now`, and why it may go: longest waiting for a head (once
        it has waited evict_after_s), longest kept idle, longest write-paused (a client that reads nothing gets
        nothing from waiting longer); None: shed the new one."""
        if self.waiting:
            oldest, since = next(iter(self.waiting.items()))
            if now - since >= self.limits.evict_after_s:
                return oldest, "no_request_head"
        for idle, kind in ((self.kept, "kept_alive_idle"), (self.paused, "client_not_reading")):
            if idle:
                return next(iter(idle)), kind
        return None

    def forget(self, conn: Any) -> None:
        self.waiting.pop(conn, None)
        self.kept.pop(conn, None)

    def closed(self, loop: asyncio.AbstractEventLoop) -> None:
        """A connection ended: after a burst of them, hand the heap's free memory back (RELEASE_AFTER_CLOSED)."""
        self.closed_since_release += 1
        if self.closed_since_release >= RELEASE_AFTER_CLOSED and self.release_due is None:
            self.release_due = loop.call_later(RELEASE_DELAY_S, self._release)

    def _release(self) -> None:
        self.release_due = None
        self.closed_since_release = 0
        self.release_heap()


class GuardedConnection:
    """The guard's deadlines, cap and shedding for one connection (see the module doc), mixed into one of
    uvicorn's HTTP/1.1 protocols (gpumond/web/protocols.py). That protocol says only where the client's
    request stands (`_request_state`, `_serving`, `_head_started`); every decision is made here, once for
    both parsers."""

    _guard: Guard  # set per server by guarded_protocol()
    _timer: Any = None
    _phase: str | None = None
    _write_timer: Any = None
    _tcp: Any = None  # the TCP transport, under TLS; plain: the same as self.transport
    _held = False
    # provided by the uvicorn protocol this is mixed into
    loop: asyncio.AbstractEventLoop
    transport: Any

    # -- what the parser knows (each protocol class answers these) --------------------------------------------
    def _request_state(self) -> str:
        """After bytes arrived: "head" (no request is being answered, and the next one's head is not complete),
        "body" (a request's head is complete and its body is still due), or "busy" (being answered)."""
        raise NotImplementedError

    def _serving(self) -> bool:
        """Right after a response completed: whether another (pipelined) request is now being answered (both
        uvicorn protocols name the request being answered `cycle`)."""
        cycle = getattr(self, "cycle", None)
        return cycle is not None and not cycle.response_complete

    def _head_started(self) -> bool:
        """Right after a response completed: whether part of the next request already arrived."""
        raise NotImplementedError

    # -- taking and releasing the connection ------------------------------------------------------------------
    def tcp_opened(self, tcp: Any) -> None:
        """Take the connection: count it, make room under the cap, start its head deadline."""
        guard = self._guard
        self._tcp = tcp
        self._held = True
        guard.held.add(self)
        held = len(guard.held)
        guard.stats.open = held
        guard.stats.peak = max(guard.stats.peak, held)
        if held > guard.cap:
            found = guard.victim(self.loop.time())
            if found is None:
                guard.stats.shed += 1
                log_limited(log, logging.WARNING, "connection shed: every held connection is busy or just opened", {
                    "cap": guard.cap, "total": guard.stats.shed})
                tcp.abort()
                return
            victim, kind = found
            guard.stats.evicted += 1
            log_limited(log, logging.WARNING, "connection closed to make room", {
                "cap": guard.cap, "closed": kind, "total": guard.stats.evicted})
            victim._close("evicted")
        guard.waiting[self] = self.loop.time()
        self._arm("head", guard.limits.header_timeout_s)

    def tcp_lost(self) -> None:
        """The TCP connection ended (under TLS this may be before any request: a failed handshake)."""
        self._disarm()
        self._unpause()
        guard = self._guard
        guard.forget(self)
        if self._held:
            self._held = False
            guard.held.discard(self)
            guard.stats.open = len(guard.held)
            guard.closed(self.loop)

    # -- the asyncio / uvicorn protocol events ----------------------------------------------------------------
    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        if self._tcp is None:  # plain HTTP: the TCP connection is this transport
            self.tcp_opened(transport)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)  # type: ignore[misc]
        self._track()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]  # may start a pipelined request at once
        if self.transport.is_closing():
            return
        if self._serving():  # a pipelined request is being served
            self._track()
            return
        self._disarm()
        guard = self._guard
        guard.forget(self)
        if self._head_started():  # part of the next request already arrived: its head is due
            guard.waiting[self] = self.loop.time()
            self._arm("head", guard.limits.header_timeout_s)
        else:  # uvicorn's keep-alive timer runs now
            guard.kept[self] = None

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._unpause()
        self._guard.forget(self)
        super().connection_lost(exc)  # type: ignore[misc]
        self.tcp_lost()

    def pause_writing(self) -> None:
        super().pause_writing()  # type: ignore[misc]
        if self._write_timer is None and not self.transport.is_closing():
            self._guard.paused[self] = None
            self._write_timer = self.loop.call_later(self._guard.limits.write_timeout_s, self._write_expired)

    def resume_writing(self) -> None:
        self._unpause()
        super().resume_writing()  # type: ignore[misc]

    def timeout_keep_alive_handler(self) -> None:
        super().timeout_keep_alive_handler()  # type: ignore[misc]
        self._close("keep_alive")  # close() waits for a client that never reads our response

    # -- deadlines ---------------------------------------------------------------------------------------------
    def _track(self) -> None:
        """After bytes arrived: which deadline applies now, by the state of the client's request."""
        if self.transport.is_closing():
            return
        guard = self._guard
        state = self._request_state()
        if state == "head":
            if self._phase is None:  # the first bytes of a request on a kept-alive connection
                guard.kept.pop(self, None)
                guard.waiting[self] = self.loop.time()
                self._arm("head", guard.limits.header_timeout_s)
            return
        guard.forget(self)  # a request head arrived: busy until its response is complete
        if state == "body":
            if self._phase != "body":
                self._arm("body", guard.limits.body_timeout_s)
        else:  # nothing more to wait for from the client
            self._disarm()

    def _unpause(self) -> None:
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None
        self._guard.paused.pop(self, None)

    def _write_expired(self) -> None:
        guard = self._guard
        self._write_timer = None
        guard.paused.pop(self, None)
        if self.transport.is_closing() and not self.transport.get_write_buffer_size():
            return
        guard.stats.write_timeouts += 1
        log_limited(log, logging.WARNING, "connection closed: client did not read the response in time", {
            "timeout_s": guard.limits.write_timeout_s, "total": guard.stats.write_timeouts,
            "client": _peer(self)})
        self._close("write")

    def _arm(self, phase: str, seconds: float) -> None:
        self._disarm()
        self._phase = phase
        self._timer = self.loop.call_later(seconds, self._expired, phase)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._phase = None, None

    def _expired(self, phase: str) -> None:
        guard = self._guard
        self._timer = None
        if self._tcp.is_closing():
            return
        if phase == "head":
            guard.stats.head_timeouts += 1
            log_limited(log, logging.WARNING, "connection closed: request head not complete in time", {
                "timeout_s": guard.limits.header_timeout_s, "total": guard.stats.head_timeouts,
                "client": _peer(self)})
        else:
            guard.stats.body_timeouts += 1
            log_limited(log, logging.WARNING, "connection closed: request body not complete in time", {
                "timeout_s": guard.limits.body_timeout_s, "total": guard.stats.body_timeouts,
                "client": _peer(self)})
        self._close(phase)

    def _close(self, why: str) -> None:
        self._disarm()
        self._unpause()
        self._guard.forget(self)
        tcp = self._tcp
        if tcp is not self.transport:  # TLS: a close_notify would wait on the peer; drop the TCP connection
            tcp.abort()
        elif not tcp.is_closing() or tcp.get_write_buffer_size():
            tcp.abort()  # never wait on a peer that does not read


def _peer(conn: Any) -> str:
    client = getattr(conn, "client", None)
    if client is None and conn._tcp is not None:  # still in its TLS handshake
        client = conn._tcp.get_extra_info("peername")
    return f"{client[0]}:{client[1]}" if client else "unknown"
