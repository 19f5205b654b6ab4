"""web.client.http_client, the one factory of gpumond's HTTP clients, keeps the settings each client had before it
was shared: httpx's own connection-pool bounds unless a caller sets its own, no redirect followed, and the
environment's proxy ignored unless asked for."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from gpumond.web.client import Access, http_client


def _pool_bounds(client: httpx.Client) -> tuple[int, int]:
    # httpx has no public reader of a client's limits; its transport's pool holds them.
    pool = client._transport._pool  # type: ignore[attr-defined]  # noqa: SLF001
    return pool._max_connections, pool._max_keepalive_connections  # noqa: SLF001


def test_without_limits_a_client_has_httpx_own_pool_bounds() -> None:
    # The Prometheus source gives none: it had httpx's default pool (100 connections, 20 kept alive), not an
    # unbounded one.
    with http_client(Access()) as ours, httpx.Client() as theirs:
        assert _pool_bounds(ours) == _pool_bounds(theirs)


def test_given_limits_are_used() -> None:
    with http_client(Access(), limits=httpx.Limits(max_connections=7, max_keepalive_connections=0)) as client:
        assert _pool_bounds(client) == (7, 0)


class _Redirect(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.send_response(302)
        self.send_header("Location", "http://127.0.0.1:9/elsewhere")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def redirecting() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Redirect)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    server.shutdown()
    server.server_close()


def test_a_redirect_is_answered_not_followed_and_the_environment_proxy_ignored(redirecting, monkeypatch) -> None:
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # nothing listens there: a request through it fails
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    with http_client(Access(), timeout=5.0) as client:
        assert client.get(redirecting).status_code == 302
    with http_client(Access(), timeout=5.0, trust_env=True) as client, pytest.raises(httpx.ConnectError):
        client.get(redirecting)  # asked for (the Prometheus source), the proxy is used: refused there
