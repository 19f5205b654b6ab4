"""The connection guard (gpumond/web/connections.py) on each of uvicorn's HTTP/1.1 protocols, and
`guarded_protocol`, which makes one server's protocol factory from them. Imported only by what serves
(gpumond/web/serving.py), so reading the config or the connection metrics never loads uvicorn (~160 ms).

Each class here only reads its parser's state to say where the client's request stands; the deadlines, the
cap and the shedding order are GuardedConnection's, one mechanism for both. httptools (llhttp) is what the
daemons serve with: uvicorn's h11 protocol costs ~3x the CPU per scrape (benchmarks/results/agent_serving.md).
h11 is kept for an install where httptools cannot be imported; the guard tests run on both.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Callable
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from gpumond.web.connections import ConnectionLimits, ConnectionStats, Guard, GuardedConnection, connection_cap
from gpumond.web.heap import heap_releaser

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # httptools is not installed: the h11 protocol serves (connections.default_parser)
    HttpToolsProtocol = None  # type: ignore[assignment,misc]


class GuardedH11Protocol(GuardedConnection, H11Protocol):
    """uvicorn's h11 protocol under the guard. h11 parses a pipelined request only once the one before it has
    been answered, so while a request is served its successor's bytes wait in `trailing_data`."""

    def _request_state(self) -> str:
        state = self.conn.their_state
        if state is h11.IDLE:
            return "head"
        return "body" if state is h11.SEND_BODY else "busy"  # DONE, MUST_CLOSE, CLOSED, ERROR: nothing due

    def _head_started(self) -> bool:
        return bool(self.conn.trailing_data[0])


if HttpToolsProtocol is not None:

    class GuardedHttpToolsProtocol(GuardedConnection, HttpToolsProtocol):
        """uvicorn's httptools protocol under the guard. llhttp parses every byte as it arrives: a pipelined
        request is queued (`pipeline`, reading paused) with `cycle` naming the newest one, and a new request's
        head has begun once `on_message_begin` made a new `scope` that no cycle holds yet."""

        def _request_state(self) -> str:
            cycle = self.cycle
            if cycle is None or cycle.response_complete:
                return "head"  # bytes arrived, and no request is in progress: a head is (still) due
            # The body of a queued request arrives only once reading resumes: due from when it is served.
            return "body" if cycle.more_body and not self.pipeline else "busy"

        def _head_started(self) -> bool:
            return self.scope is not None and (self.cycle is None or self.cycle.scope is not self.scope)
else:
    GuardedHttpToolsProtocol = None  # type: ignore[assignment,misc]


PARSERS = ("httptools", "h11")


def default_parser() -> str:
    """httptools (a declared dependency: llhttp, ~3x less CPU per request than h11) when it imports, else h11,
    so that an install without its binary wheel (a platform PyPI has none for) still serves, guarded alike."""
    return "httptools" if importlib.util.find_spec("httptools") is not None else "h11"


def guarded_protocol(limits: ConnectionLimits, *, stats: ConnectionStats | None = None,
                     cap: int | None = None, tls: Callable[[Any], asyncio.BaseProtocol] | None = None,
                     parser: str | None = None, release_heap: Callable[[], None] | None = None
                     ) -> tuple[Any, ConnectionStats]:
    """A protocol factory for uvicorn.Config(http=...) enforcing `limits`, and its counters.

    `parser`: which of uvicorn's HTTP/1.1 protocols carries the guard, "httptools" or "h11" (default:
    default_parser()). `tls`, when given, wraps each connection's protocol in a TLS protocol
    (gpumond/web/tls.py) that calls its `tcp_opened(transport)` at accept and `tcp_lost()` when the TCP
    connection ends. `release_heap` hands freed memory back to the kernel after a burst of closed connections
    (default: gpumond/web/heap.py's)."""
    parser = parser or default_parser()
    if parser not in PARSERS:
        raise ValueError(f"unknown HTTP parser {parser!r}: one of {', '.join(PARSERS)}")
    base = GuardedHttpToolsProtocol if parser == "httptools" else GuardedH11Protocol
    if base is None:
        raise ValueError("the httptools parser was asked for but httptools is not installed (pip install httptools)")
    guard = Guard(cap if cap is not None else connection_cap(limits), limits,
                   stats if stats is not None else ConnectionStats(),
                   release_heap if release_heap is not None else heap_releaser())
    # One class per server: its connections share this server's guard (cap, idle queues, counters).
    cls = type(base.__name__, (base,), {"_guard": guard, "__module__": base.__module__})
    if tls is None:
        return cls, guard.stats

    def over_tls(**kwargs: Any) -> asyncio.BaseProtocol:
        return tls(cls(**kwargs))

    return over_tls, guard.stats
