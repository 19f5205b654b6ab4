"""The SDK's route: the node relay first, the rules service directly while no relay answers, back to the relay when
it answers again; what a named relay makes optional."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gpumond.job import Reporter
from gpumond.job import reporter as reporter_module
from gpumond.job.route import resolve_route
from gpumond.job.settings import DEFAULT_RELAY, ConfigError, Identity
from gpumond.job.transport import RELAY_RETRY_S, HttpTransport, RelayTransport, Reply, TLSError
from tests.fakes import FakeClock, FakeTransport

UUID = "GPU-5b0c1234-aaaa-bbbb-cccc-0123456789ab"


class Down(FakeTransport):
    """A relay that is not there: every post is refused, until `up` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.up = False
        self.tries = 0

    def post(self, body: bytes, timeout_s: float, *, early: bool = False) -> Reply:
        self.tries += 1
        if not self.up:
            raise ConnectionRefusedError(111, "Connection refused")
        return super().post(body, timeout_s, early=early)


def test_no_relay_pushes_directly_and_the_relay_is_tried_again_later() -> None:
    relay, direct, clock = Down(), FakeTransport(), FakeClock()
    route = RelayTransport(relay, direct, clock, relay_url=DEFAULT_RELAY, direct_url="http://rules:9481")
    assert route.post(b"{}", 1).status == 202 and len(direct.raw) == 1 and not route.via_relay
    route.post(b"{}", 1)
    assert relay.tries == 1 and len(direct.raw) == 2  # not asked again before RELAY_RETRY_S
    relay.up = True
    clock.advance(RELAY_RETRY_S)
    route.post(b"{}", 1)
    assert route.via_relay and len(relay.raw) == 1 and len(direct.raw) == 2  # back to the relay


def test_without_a_direct_path_the_relay_failure_is_the_pushers_to_retry() -> None:
    relay = Down()
    route = RelayTransport(relay, FakeTransport(), FakeClock(), relay_url=DEFAULT_RELAY, direct_url="http://r:1",
                           direct_problem="this rank's GPU UUID is unknown")
    with pytest.raises(ConnectionRefusedError):
        route.post(b"{}", 1)


class BadCertificate(FakeTransport):
    """A relay whose certificate the rank cannot verify (not named in it, another CA, http spoken as https)."""

    def post(self, body: bytes, timeout_s: float, *, early: bool = False) -> Reply:
        raise TLSError("certificate verify failed: Hostname mismatch")


def test_a_relay_whose_certificate_fails_is_left_for_the_direct_path(caplog: pytest.LogCaptureFixture) -> None:
    """The rules service, verified on its own, takes the steps: retrying the relay alone lost them all once the
    rank's queue filled. The TLS problem is said once."""
    direct, clock = FakeTransport(), FakeClock()
    route = RelayTransport(BadCertificate(), direct, clock, relay_url="https://relay:9482",
                           direct_url="https://rules:9481")
    with caplog.at_level("WARNING", logger="gpumond.job"):
        assert route.post(b"{}", 1).status == 202 and route.post(b"{}", 1).status == 202
    assert len(direct.raw) == 2 and not route.via_relay
    assert [r.getMessage() for r in caplog.records if "Hostname mismatch" in r.getMessage()] != []
    assert sum("no node relay" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.parametrize("status", [404, 405])
def test_a_server_that_is_no_relay_is_left_for_the_direct_path(status: int) -> None:
    """Something else on the relay's port (the default 9482 is tried on every node) or a GPUMOND_RELAY with a path
    answers 404/405, which a relay never answers the SDK's push: the steps go directly, not dropped as refused."""
    not_relay, direct, clock = FakeTransport(Reply(status, detail="Not Found")), FakeTransport(), FakeClock()
    route = RelayTransport(not_relay, direct, clock, relay_url=DEFAULT_RELAY, direct_url="http://rules:9481")
    assert route.post(b"{}", 1).status == 202 and len(direct.raw) == 1 and not route.via_relay
    route.post(b"{}", 1)
    assert len(not_relay.raw) == 1  # asked again only after RELAY_RETRY_S
    clock.advance(RELAY_RETRY_S)
    assert route.post(b"{}", 1).status == 202 and route.via_relay  # it answers 202 now: a relay again
    # Without a direct path the answer is the pusher's, as any refusal.
    alone = RelayTransport(FakeTransport(Reply(status)), None, clock, relay_url=DEFAULT_RELAY, direct_url=None)
    assert alone.post(b"{}", 1).status == status


def test_a_named_relay_makes_endpoint_and_token_optional(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("GPUMOND_ENDPOINT", "GPUMOND_TOKEN", "GPUMOND_TOKEN_FILE", "GPUMOND_SHARDS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GPUMOND_RELAY", "http://10.0.0.7:9482")
    route = resolve_route(None, None, None, None, (None, None, None))
    assert (route.relay, route.endpoint, route.token) == ("http://10.0.0.7:9482", None, None)
    monkeypatch.delenv("GPUMOND_RELAY")
    with pytest.raises(ConfigError, match="no endpoint"):  # the loopback default alone is not a route
        resolve_route(None, None, None, None, (None, None, None))
    monkeypatch.setenv("GPUMOND_RELAY", "off")
    assert resolve_route("http://rules:9481", "t", None, None, (None, None, None)).relay is None


def test_a_rank_without_its_gpu_reports_through_a_named_relay_with_its_pid(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reporter_module, "local_gpu_uuid", lambda env: None)  # no GPU found by the rank itself
    for name in ("GPUMOND_ENDPOINT", "GPUMOND_TOKEN", "GPUMOND_TOKEN_FILE", "GPUMOND_GPU_UUID", "GPUMOND_SHARDS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GPUMOND_RELAY", "http://127.0.0.1:9")  # nothing listens: the pushes fail, never raise
    rep = Reporter(job="j", rank=0, world_size=1, handle_sigterm=False, push_interval_s=60)
    try:
        assert rep.enabled
        identity = rep.identity
        assert isinstance(identity, Identity) and identity.gpu_uuid == "" and "gpu_uuid" not in identity.head()
    finally:
        rep.close(timeout_s=0)


def test_only_pushes_to_the_relay_carry_the_ranks_pid(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from gpumond.job.route import Route
    from gpumond.wire.media import JSON_TYPE, PID_HEADER, PID_START_HEADER
    from gpumond.wire.procstat import start_ticks

    route = Route("http://127.0.0.1:9482", False, "http://rules:9481", "t", None, None)
    transport = route.transport(Identity("j", 0, 1, "n", UUID, None), JSON_TYPE, FakeClock())
    assert isinstance(transport, RelayTransport)
    assert transport._relay._headers[PID_HEADER] == str(os.getpid())  # type: ignore[attr-defined]
    assert transport._relay._headers[PID_START_HEADER] == str(start_ticks())  # type: ignore[attr-defined]
    assert not {PID_HEADER, PID_START_HEADER} & set(transport._direct._headers)  # type: ignore[union-attr,attr-defined]


def test_a_relay_serving_tls_to_an_http_url_is_named_as_the_relay() -> None:
    """A server that closes without an answer (what a TLS listener does to plain HTTP: the chart's agents with
    tls.enabled): the hint names the setting the rank got wrong, GPUMOND_RELAY, not GPUMOND_ENDPOINT."""
    import socket
    import threading

    from gpumond.job.route import Route

    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def close_each() -> None:
        for _ in range(2):  # the transport retries a fresh connection once
            conn, _ = server.accept()
            conn.recv(65536)
            conn.close()

    closer = threading.Thread(target=close_each, daemon=True)
    closer.start()
    try:
        route = Route(f"http://127.0.0.1:{port}", True, None, None, None, None)
        transport = route.transport(Identity("j", 0, 1, "n", "", None), "application/json", FakeClock())
        with pytest.raises(OSError, match=rf"use https://127.0.0.1:{port} in GPUMOND_RELAY\)") as err:
            transport.post(b"{}", 2)
        assert "GPUMOND_ENDPOINT" not in str(err.value)
    finally:
        closer.join(5)
        server.close()


class _Capture(BaseHTTPRequestHandler):
    """Answers every push with the server's `status` and keeps each request's headers."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:  # noqa: N802 — http.server's naming
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.server.seen.append(dict(self.headers))  # type: ignore[attr-defined]
        body = b'{"accepted": 0}'
        self.send_response(self.server.status)  # type: ignore[attr-defined]
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 — quiet
        pass


@contextmanager
def capturing(status: int) -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Capture)
    server.daemon_threads = True
    server.seen, server.status = [], status  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_only_early_pushes_to_the_relay_say_they_are_early() -> None:
    """Over real HTTP on 127.0.0.1: the relay hears which pushes are early; the rules service, reached directly
    while the relay is not one, never does (its pushes are unchanged)."""
    from gpumond.job.route import Route
    from gpumond.wire.media import EARLY_HEADER, JSON_TYPE

    with capturing(202) as relay, capturing(202) as rules:
        relay_url, rules_url = (f"http://127.0.0.1:{s.server_address[1]}" for s in (relay, rules))
        clock = FakeClock()
        transport = Route(relay_url, True, rules_url, "t", None, None).transport(
            Identity("j", 0, 1, "n", UUID, None), JSON_TYPE, clock)
        assert transport.post(b"{}", 2, early=True).status == 202
        assert transport.post(b"{}", 2).status == 202
        assert [h.get(EARLY_HEADER) for h in relay.seen] == ["1", None]
        relay.status = 404  # not a relay: the pushes go to the rules service directly
        assert transport.post(b"{}", 2, early=True).status == 202
        assert transport.post(b"{}", 2, early=True).status == 202
        assert len(relay.seen) == 3 and len(rules.seen) == 2
        assert [EARLY_HEADER in h for h in rules.seen] == [False, False]
        # Each half on its own: the direct path is never asked for an early push, and would not say so if it were.
        HttpTransport(rules_url, "t").post(b"{}", 2, early=True)
        assert EARLY_HEADER not in rules.seen[-1]
    not_relay, direct = FakeTransport(Reply(404)), FakeTransport()
    fallback = RelayTransport(not_relay, direct, FakeClock(), relay_url=DEFAULT_RELAY, direct_url="http://rules:9481")
    fallback.post(b"{}", 1, early=True)
    assert (not_relay.early, direct.early) == ([True], [False])
