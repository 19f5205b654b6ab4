"""One bounded HTTP GET: a whole-response deadline and a size cap on top of httpx's per-read timeouts (the telemetry
sources' fetches, the agent's power-slack offers: what a broken or hostile server sends is never held whole)."""

from __future__ import annotations

import ssl
import time
from collections.abc import Mapping

import httpx

from gpumond.wire.safetext import one_line
from gpumond.wire.tlsclient import explain


class FetchError(Exception):
    """A GET that produced no usable body; the message is one line (a telemetry batch's errors, a log line)."""


def get_bounded(client: httpx.Client, url: str, *, timeout_s: float, max_bytes: int,
                params: Mapping[str, str] | None = None,
                headers: Mapping[str, str] | None = None) -> tuple[int, bytes]:
    """(status, decoded body) within about `timeout_s` in all; FetchError on timeout, transport error or size."""
    deadline = time.monotonic() + timeout_s
    timed_out = f"timed out after {timeout_s:g}s"
    body = bytearray()
    try:
        with client.stream("GET", url, params=params, headers=headers, timeout=timeout_s) as resp:
            # httpx's timeout applies to each read; the deadline bounds a server that trickles its body.
            for chunk in resp.iter_bytes():
                body += chunk
                if len(body) > max_bytes:
                    raise FetchError(f"response larger than {max_bytes} bytes")
                if time.monotonic() > deadline:
                    raise FetchError(timed_out)
            return resp.status_code, bytes(body)
    except httpx.TimeoutException:
        raise FetchError(timed_out) from None
    except httpx.HTTPError as e:
        tls = _tls_problem(e)
        raise FetchError(one_line(tls or f"{type(e).__name__}: {e}")) from None


def _tls_problem(e: BaseException) -> str | None:
    """What to fix when a TLS handshake failed under `e` (httpx wraps the ssl error), else None."""
    seen: BaseException | None = e
    while seen is not None:
        if isinstance(seen, ssl.SSLError):
            return explain(seen)
        seen = seen.__cause__ or seen.__context__
    return None
