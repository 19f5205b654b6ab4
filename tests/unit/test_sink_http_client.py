"""Every alert sink reaches its receiver through the one HTTP client config (tls_config / basic_auth /
authorization): over TLS with the test PKI's CA, with its credentials, and refused without the CA; a bad key or an
unreadable CA is one line at check-config."""

from __future__ import annotations

import json
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from gpumond.alerts.sinks import AlertmanagerSink, PagerDutySink, SlackSink
from gpumond.alerts.sinks.base import Answer
from gpumond.alerts.sinks.notices import MemoryBook
from gpumond.cli import main
from gpumond.config.alerting import AlertmanagerConfig, PagerDutyConfig, SlackConfig
from tests.pki import CA

KEY = "R0UT1NGKEY0123456789abcdefABCDEF"


class _Receiver(BaseHTTPRequestHandler):
    """Answers 202 and records what came: the path, the Authorization header and the JSON body."""

    got: list[tuple[str, str | None, object]]

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.server.got.append((self.path, self.headers.get("Authorization"), json.loads(body)))  # type: ignore[attr-defined]
        self.send_response(202)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> tuple[CA, Path, Path]:
    ca = CA(tmp_path_factory.mktemp("pki"))
    server = ca.issue("receiver")
    return ca, server.cert, server.key


@pytest.fixture
def https(pki: tuple[CA, Path, Path]) -> Iterator[ThreadingHTTPServer]:
    _, cert, key = pki
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    server.got = []  # type: ignore[attr-defined]
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _url(server: ThreadingHTTPServer, path: str) -> str:
    return f"https://127.0.0.1:{server.server_address[1]}{path}"


def _alertmanager(server: ThreadingHTTPServer, client: dict) -> tuple[AlertmanagerSink, str]:
    url = _url(server, "")
    sink = AlertmanagerSink(url, AlertmanagerConfig(urls=(url,), timeout_s=5, **client), evaluation_interval_s=5,
                            queue_size=10, clock=time.time)
    return sink, url + "/api/v2/alerts"


def _slack(server: ThreadingHTTPServer, client: dict) -> tuple[SlackSink, str]:
    url = _url(server, "/services/T0/B0/x")
    return SlackSink(SlackConfig(webhook_url=url, timeout_s=5, **client), book=MemoryBook(), queue_size=10,
                     clock=time.time), url


def _pagerduty(server: ThreadingHTTPServer, client: dict) -> tuple[PagerDutySink, str]:
    url = _url(server, "/v2/enqueue")
    return PagerDutySink(PagerDutyConfig(routing_key=KEY, url=url, timeout_s=5, **client), book=MemoryBook(),
                         queue_size=10, clock=time.time), url


SINKS: dict[str, Callable[[ThreadingHTTPServer, dict], tuple[object, str]]] = {
    "alertmanager": _alertmanager, "slack": _slack, "pagerduty": _pagerduty}


@pytest.mark.parametrize("kind", sorted(SINKS))
def test_a_sink_posts_over_tls_with_the_configured_ca_and_credentials(kind, https, pki, tmp_path) -> None:
    ca, _, _ = pki
    token = tmp_path / "token"
    token.write_text("s3cret-token\n")
    sink, url = SINKS[kind](https, {"tls_config": {"ca_file": str(ca.path)},
                                    "authorization": {"credentials_file": str(token)}})
    try:
        answer = sink.post(url, {"hello": kind})  # type: ignore[attr-defined]
    finally:
        sink.stop()  # type: ignore[attr-defined]
    assert isinstance(answer, Answer) and answer.status == 202, answer
    assert https.got == [(url.split(str(https.server_address[1]))[1], "Bearer s3cret-token",  # type: ignore[attr-defined]
                          {"hello": kind})]


@pytest.mark.parametrize("kind", sorted(SINKS))
def test_a_sink_without_the_ca_does_not_trust_the_receiver(kind, https, tmp_path) -> None:
    sink, url = SINKS[kind](https, {})
    try:
        answer = sink.post(url, {"hello": kind})  # type: ignore[attr-defined]
    finally:
        sink.stop()  # type: ignore[attr-defined]
    assert isinstance(answer, str) and "ConnectError" in answer, answer  # the system CAs do not know the test CA
    assert https.got == []  # type: ignore[attr-defined]


def test_basic_auth_reaches_a_slack_relay(https, pki, tmp_path) -> None:
    ca, _, _ = pki
    password = tmp_path / "password"
    password.write_text("pw\n")
    sink, url = _slack(https, {"tls_config": {"ca_file": str(ca.path)},
                               "basic_auth": {"username": "gpumond", "password_file": str(password)}})
    try:
        assert isinstance(sink.post(url, {}), Answer)
    finally:
        sink.stop()
    assert https.got[0][1] == "Basic Z3B1bW9uZDpwdw=="  # type: ignore[attr-defined]  # gpumond:pw


@pytest.mark.parametrize("sink, section", [
    ("slack", "webhook_url: https://hooks.slack.test/services/x"),
    ("pagerduty", f"routing_key: {KEY}"),
    ("alertmanager", "urls: [https://am:9093]"),
])
def test_check_config_names_a_sinks_unknown_key_and_unreadable_ca(sink, section, tmp_path, capsys) -> None:
    agent = tmp_path / "agent.yaml"
    agent.write_text(f"alerting:\n  {sink}:\n    {section}\n    tls_config: {{ca_fiel: /etc/ca.crt}}\n")
    assert main(["check-config", str(agent)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"alerting.{sink}.tls_config.ca_fiel" in err, err
    missing = tmp_path / "no-such-ca.crt"
    agent.write_text(f"alerting:\n  {sink}:\n    {section}\n    tls_config: {{ca_file: {missing}}}\n")
    assert main(["check-config", str(agent)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"alerting.{sink}.tls_config: CA file {missing}" in err, err
    both = tmp_path / "token"
    both.write_text("t\n")
    agent.write_text(f"alerting:\n  {sink}:\n    {section}\n    authorization: {{credentials_file: {both}}}\n"
                     f"    basic_auth: {{username: u, password_file: {both}}}\n")
    assert main(["check-config", "--shape-only", str(agent)]) == 2
    assert "set only one of basic_auth and authorization" in capsys.readouterr().err
