"""A TLS handshake flood: connections that send a real ClientHello and then nothing, so the server has answered
and holds each one's handshake half done. Used by tests/integration/test_tls_handshake_flood.py (the figures it
once measured: benchmarks/results/tls_handshake_flood.md)."""

from __future__ import annotations

import socket
import ssl

LOOPBACK = "127.0.0.1"


def client_hello() -> bytes:
    """The first flight of a default TLS client (TLS 1.3 capable): what a real client sends on connecting."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    out = ssl.MemoryBIO()
    conn = ctx.wrap_bio(ssl.MemoryBIO(), out, server_hostname=LOOPBACK)
    try:
        conn.do_handshake()
    except ssl.SSLWantReadError:  # it now waits for the server's answer, which it will never read
        pass
    return out.read()


def stalled(port: int, n: int, first: bytes | None = None, timeout_s: float = 10.0,
            tls: ssl.SSLContext | None = None) -> list[socket.socket]:
    """`n` connections to 127.0.0.1:`port`, each having sent `first` (default: a ClientHello; or a request head
    that never ends, over plain HTTP or, with `tls`, after a completed handshake) and nothing after it."""
    hello = client_hello() if first is None else first
    out: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.create_connection((LOOPBACK, port), timeout=timeout_s)
            out.append(s)
            if tls is not None:
                out[-1] = s = tls.wrap_socket(s, server_hostname=LOOPBACK)
            s.sendall(hello)
    except BaseException:
        close_all(out)
        raise
    return out


def close_all(socks: list[socket.socket]) -> None:
    for s in socks:
        s.close()


