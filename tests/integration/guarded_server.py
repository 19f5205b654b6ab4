"""A minimal ASGI app behind the connection guard (gpumond/web/connections.py) on uvicorn, in-process, with raw-socket
clients: what test_connection_limits.py (plain) and test_tls_server.py (TLS) both serve and probe.

Every wait is bounded by WAIT_S.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import uvicorn

from gpumond.web.connections import ConnectionLimits, ConnectionStats
from gpumond.web.protocols import guarded_protocol
from gpumond.web.serving import bind

LIMITS = ConnectionLimits(header_timeout_s=0.5, body_timeout_s=0.5, keepalive_timeout_s=0.5, max_connections=4)
WAIT_S = 10.0


BIG = b"x" * 262_144  # /big: more than the transport's 64 KiB high-water mark, so an unread one pauses writes


async def app(scope, receive, send):  # a minimal ASGI app: reads the whole body, answers 200 (/big: 256 KiB)
    assert scope["type"] == "http"
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    body = BIG if scope["path"] == "/big" else b"ok\n"
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain"),
                                                                     (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


@contextlib.contextmanager
def serving(limits: ConnectionLimits = LIMITS, tls: Any = None, parser: str | None = None
            ) -> Iterator[tuple[int, ConnectionStats]]:
    """`app` behind the connection guard on a free loopback port (`tls`: a guarded_tls factory, else plain), on
    `parser`'s protocol (httptools or h11; default: what the daemons use)."""
    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    protocol, stats = guarded_protocol(limits, tls=tls, parser=parser)
    server = uvicorn.Server(uvicorn.Config(app, lifespan="off", access_log=False, log_config=None,
                                           http=protocol, timeout_keep_alive=limits.keepalive_timeout_s))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True)
    thread.start()
    deadline = time.monotonic() + WAIT_S
    while not server.started:
        assert time.monotonic() < deadline, "server did not start"
        time.sleep(0.01)
    try:
        yield port, stats
    finally:
        server.should_exit = True
        thread.join(WAIT_S)
        sock.close()


def connect(port: int, send: bytes = b"") -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
    if send:
        s.sendall(send)
    return s


def closed_by_server(s: socket.socket, timeout: float = WAIT_S) -> bool:
    """True once the server closed `s` (EOF or reset), reading and discarding any response."""
    s.settimeout(timeout)
    try:
        while s.recv(4096):
            pass
    except (ConnectionResetError, BrokenPipeError):
        pass
    except TimeoutError:
        return False
    return True


def never_reading(port: int) -> socket.socket:
    """A client that pipelines large GETs and reads nothing: our writes to it pause and stay paused."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    s.settimeout(WAIT_S)
    s.connect(("127.0.0.1", port))
    s.sendall(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n" * 64)
    return s


def response(s: socket.socket) -> bytes:
    """One whole response of `app` (it always ends in its 3-byte body)."""
    s.settimeout(WAIT_S)
    out = b""
    while not out.endswith(b"\r\n\r\nok\n"):
        chunk = s.recv(4096)
        assert chunk, f"closed after {out!r}"
        out += chunk
    return out


def get(port: int) -> bytes:
    with connect(port, b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n") as s:
        s.settimeout(WAIT_S)
        out = b""
        while chunk := s.recv(4096):
            out += chunk
        return out
