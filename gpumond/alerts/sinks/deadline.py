"""A total deadline for one sink request: httpx's timeouts are per connect / read / write, so a receiver that
answers 200 and then drips a byte every few seconds would hold the sink's worker for ever.

The request's TCP socket is caught through httpcore's `trace` extension when it connects; a timer shuts it down
when the deadline passes, which ends whatever read or write is blocked on it (a shutdown, unlike a close, wakes
a thread blocked in recv on Linux). The caller's client must not reuse connections (keep-alive off): a reused
connection is never "connected", so its socket would escape the timer.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from typing import Any


class RequestDeadline:
    """Pass `extensions={"trace": d.trace}` to the request; `cancel()` when done; `expired` says if it fired."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds = seconds
        self._clock = clock
        self._end = clock() + seconds
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._sock: socket.socket | None = None
        self._done = False
        self.expired = False

    def trace(self, event: str, info: dict[str, Any]) -> None:
        """httpcore's trace hook: arm the timer on the socket the request just connected."""
        if event != "connection.connect_tcp.complete":
            return
        stream = info.get("return_value")
        sock = stream.get_extra_info("socket") if stream is not None else None
        if not isinstance(sock, socket.socket):
            return
        with self._lock:
            if self._done:
                return
            self._sock = sock
            self._timer = threading.Timer(max(0.0, self._end - self._clock()), self._fire)
            self._timer.daemon = True
            self._timer.start()

    def passed(self) -> bool:
        """The deadline is behind us (also checked between body chunks)."""
        return self.expired or self._clock() >= self._end

    def _fire(self) -> None:
        with self._lock:
            if self._done or self._sock is None:
                return
            self.expired = True
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:  # already closed: the request ended as the timer fired
                pass

    def cancel(self) -> None:
        """The request is over: the timer must not touch a socket that may be reused for something else."""
        with self._lock:
            self._done = True
            if self._timer is not None:
                self._timer.cancel()
