"""The connection guard (gpumond/connections.py) on each of uvicorn's HTTP/1.1 protocols.

Each class here only reads its parser's state to say where the client's request stands; the deadlines, the
cap and the shedding order are GuardedConnection's, one mechanism for both. httptools (llhttp) is what the
daemons serve with: uvicorn's h11 protocol costs ~3x the CPU per scrape (benchmarks/results/agent_serving.md).
h11 is kept for an install where httptools cannot be imported; the guard tests run on both.
"""

from __future__ import annotations

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from gpumond.connections import GuardedConnection

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
