"""The shared server over TLS on a real uvicorn, in-process (gpumond/web/tls.py + gpumond/web/connections.py):
verification and refusals with the ssl module as the client, certificate rotation without a restart, and the
connection guard holding for connections still in (or never finishing) their TLS handshake.

Certificates are made in the test (tests/pki.py). Each test waits, bounded, for the server to act.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import ssl
import struct
import time
from pathlib import Path

import pytest
from cryptography import x509

from gpumond.web.connections import ConnectionLimits, ConnectionStats
from gpumond.wire.tlsclient import ClientTLS, explain
from gpumond.web.tls import ServerTLS, ServerTLSSettings, guarded_tls
from tests.handshake_flood import client_hello
from tests.integration.guarded_server import LIMITS, WAIT_S, closed_by_server, connect
from tests.integration.guarded_server import serving as plain_or_tls_serving
from tests.integration.helpers import wait_until
from tests.pki import CA

pytestmark = pytest.mark.integration

# The first bytes of a TLS ClientHello record that announces 512 bytes and never sends them.
PARTIAL_HELLO = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"


@pytest.fixture()
def pki(tmp_path: Path) -> dict[str, object]:
    ca = CA(tmp_path / "pki")
    return {"ca": ca, "server": ca.issue("tls"), "client": ca.issue("client", client=True)}


def settings(pki: dict, auth: str = "NoClientCert") -> ServerTLSSettings:
    server = pki["server"]
    return ServerTLSSettings(cert_file=server.cert, key_file=server.key, client_auth_type=auth,
                             client_ca_file=pki["ca"].path if auth != "NoClientCert" else None)


def serving(tls: ServerTLS, limits: ConnectionLimits = LIMITS, parser: str | None = None
            ) -> contextlib.AbstractContextManager[tuple[int, ConnectionStats]]:
    return plain_or_tls_serving(limits, tls=guarded_tls(tls, handshake_timeout_s=2 * limits.header_timeout_s,
                                                         shutdown_timeout_s=1.0), parser=parser)


def client(ca: CA | None = None, cert=None) -> ssl.SSLContext:
    return ClientTLS(ca.path if ca else None, cert.cert if cert else None, cert.key if cert else None).context


def https_get(port: int, context: ssl.SSLContext) -> tuple[bytes, x509.Certificate]:
    """One GET / over TLS: the response head and the certificate the server presented."""
    with connect(port) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as s:
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            out = b""
            while chunk := s.recv(4096):
                out += chunk
            der = s.getpeercert(binary_form=True)
    return out, x509.load_der_x509_certificate(der)


def refusal(port: int, context: ssl.SSLContext) -> ssl.SSLError:
    """The ssl error a client gets (at the handshake, or at its first read under TLS 1.3)."""
    with pytest.raises(ssl.SSLError) as caught:
        https_get(port, context)
    return caught.value


# ----- verification and refusals --------------------------------------------------------------------------
def test_a_client_trusting_the_ca_is_served_and_sees_the_scheme_https(pki, http_parser: str) -> None:
    with serving(ServerTLS(settings(pki)), parser=http_parser) as (port, _):
        head, cert = https_get(port, client(pki["ca"]))
        assert head.startswith(b"HTTP/1.1 200") and cert.serial_number == pki["server"].serial


def test_a_server_signed_by_another_ca_is_refused_with_a_line_that_says_what_to_give(pki, tmp_path) -> None:
    with serving(ServerTLS(settings(pki))) as (port, _):
        e = refusal(port, client(CA(tmp_path / "other", "other-ca")))
    assert isinstance(e, ssl.SSLCertVerificationError)
    assert "cannot verify the server's certificate (unable to get local issuer certificate)" in explain(e)


def test_a_client_refusing_an_expired_server_certificate_is_told_the_dates_not_the_ca_are_wrong(pki) -> None:
    expired = pki["ca"].issue("expired", expired=True)
    s = ServerTLSSettings(cert_file=expired.cert, key_file=expired.key)
    # a server whose clock says the certificate is still valid (the daemons refuse to start with it at all)
    with serving(ServerTLS(s, wall_clock=lambda: expired.not_after - 60)) as (port, _):
        e = refusal(port, client(pki["ca"]))
    line = explain(e)
    assert line.startswith("the server's certificate has expired: the server must install a renewed one"), line
    assert "the CA is not the problem" in line and "give the CA" not in line, line


def test_mutual_tls_refuses_a_client_without_a_certificate_and_one_from_another_ca(pki, tmp_path) -> None:
    stranger = CA(tmp_path / "other", "other-ca").issue("stranger", client=True)
    with serving(ServerTLS(settings(pki, "RequireAndVerifyClientCert"))) as (port, _):
        assert https_get(port, client(pki["ca"], pki["client"]))[0].startswith(b"HTTP/1.1 200")
        missing = refusal(port, client(pki["ca"]))
        assert explain(missing) == "the server requires a client certificate: set a client certificate and key"
        unknown = refusal(port, client(pki["ca"], stranger))
        assert "the server refused this client's certificate" in explain(unknown)


def test_a_client_whose_own_certificate_expired_is_told_to_renew_it(pki) -> None:
    expired = pki["ca"].issue("old-client", client=True, expired=True)
    with serving(ServerTLS(settings(pki, "RequireAndVerifyClientCert"))) as (port, _):
        line = explain(refusal(port, client(pki["ca"], expired)))
    assert "refused this client's certificate as expired" in line and "renew the client certificate" in line, line


def test_verify_if_given_serves_a_client_without_a_certificate_but_refuses_a_bad_one(pki, tmp_path) -> None:
    stranger = CA(tmp_path / "other", "other-ca").issue("stranger", client=True)
    with serving(ServerTLS(settings(pki, "VerifyClientCertIfGiven"))) as (port, _):
        assert https_get(port, client(pki["ca"]))[0].startswith(b"HTTP/1.1 200")
        refusal(port, client(pki["ca"], stranger))


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1_1 is deprecated:DeprecationWarning")
def test_tls_1_1_is_refused(pki) -> None:
    old = client(pki["ca"])
    old.minimum_version = old.maximum_version = ssl.TLSVersion.TLSv1_1
    with serving(ServerTLS(settings(pki))) as (port, _):
        refusal(port, old)


# ----- rotation ---------------------------------------------------------------------------------------------
def test_a_rotated_certificate_is_served_to_new_connections_without_a_restart(pki) -> None:
    tls = ServerTLS(settings(pki), check_every_s=0.0)
    with serving(tls) as (port, _):
        assert https_get(port, client(pki["ca"]))[1].serial_number == pki["server"].serial
        staged = pki["ca"].issue("tls", directory=pki["server"].cert.parent / "next")
        # cert-manager's way: the new pair appears under the same names at once (here: renamed over)
        os.replace(staged.key, pki["server"].key)
        os.replace(staged.cert, pki["server"].cert)
        assert https_get(port, client(pki["ca"]))[1].serial_number == staged.serial
        assert tls.reloads == 1


def test_a_half_written_rotation_keeps_serving_the_previous_certificate(pki, caplog) -> None:
    tls = ServerTLS(settings(pki), check_every_s=0.0)
    with serving(tls) as (port, _):
        staged = pki["ca"].issue("tls", directory=pki["server"].cert.parent / "next")
        os.replace(staged.cert, pki["server"].cert)  # the new certificate, still the old key
        head, cert = https_get(port, client(pki["ca"]))
        assert head.startswith(b"HTTP/1.1 200") and cert.serial_number == pki["server"].serial
        assert "certificate files changed but cannot be used" in caplog.text
        os.replace(staged.key, pki["server"].key)  # the key follows: now the pair is used
        assert https_get(port, client(pki["ca"]))[1].serial_number == staged.serial


@pytest.mark.parametrize("when", ["expired", "not_yet_valid"])
def test_a_rotated_in_certificate_outside_its_dates_is_not_served_and_said_so(pki, caplog, when: str) -> None:
    tls = ServerTLS(settings(pki), check_every_s=0.0)
    with serving(tls) as (port, _):
        staged = pki["ca"].issue("tls", directory=pki["server"].cert.parent / "next", **{when: True})
        os.replace(staged.key, pki["server"].key)
        os.replace(staged.cert, pki["server"].cert)
        head, cert = https_get(port, client(pki["ca"]))
        assert head.startswith(b"HTTP/1.1 200") and cert.serial_number == pki["server"].serial  # the old pair
    warned = [r for r in caplog.records if r.getMessage().startswith("certificate files changed but cannot be used")]
    assert len(warned) == 1 and warned[0].levelno == logging.WARNING, caplog.text
    assert "expired on" in warned[0].error or "is not valid until" in warned[0].error, warned[0].error
    assert tls.reloads == 0
    assert tls.series()[0].value == pki["server"].not_after  # the metric names the certificate still served


def test_a_rotated_in_certificate_not_valid_yet_is_served_once_its_time_comes(pki, caplog) -> None:
    # a CA whose clock is a little ahead of this host's issues "now": the pair needs no further change to be used
    now = [time.time()]
    tls = ServerTLS(settings(pki), check_every_s=0.0, wall_clock=lambda: now[0])
    staged = pki["ca"].issue("tls", not_yet_valid=True, directory=pki["server"].cert.parent / "next")
    os.replace(staged.key, pki["server"].key)
    os.replace(staged.cert, pki["server"].cert)
    for _ in range(3):
        assert tls.series()[0].value == pki["server"].not_after  # the previous pair, still
    now[0] = staged.not_before + 1
    assert tls.series()[0].value == staged.not_after and tls.reloads == 1
    warned = [r for r in caplog.records if r.getMessage().startswith("certificate files changed but cannot be used")]
    assert len(warned) == 1 and "is not valid until" in warned[0].error, caplog.text


def test_the_expiry_metric_follows_a_rotation_without_waiting_for_a_handshake(pki) -> None:
    # a scraper on a kept-alive connection makes no new handshake: the metric must not wait for one
    tls = ServerTLS(settings(pki), check_every_s=0.0)
    assert tls.series()[0].value == pki["server"].not_after
    staged = pki["ca"].issue("tls", days=30, directory=pki["server"].cert.parent / "next")
    os.replace(staged.key, pki["server"].key)
    os.replace(staged.cert, pki["server"].cert)
    assert staged.not_after > pki["server"].not_after
    assert tls.series()[0].value == staged.not_after and tls.reloads == 1 and tls.series()[0].value == staged.not_after


def test_a_rotated_client_ca_is_used_for_new_connections(pki, tmp_path) -> None:
    tls = ServerTLS(settings(pki, "RequireAndVerifyClientCert"), check_every_s=0.0)
    new_ca = CA(tmp_path / "new", "new-ca")
    # both clients trust the server's (unchanged) CA; they differ in who signed their own certificate
    old_client = client(pki["ca"], pki["client"])
    new_client = client(pki["ca"], new_ca.issue("client", client=True))
    with serving(tls) as (port, _):
        refusal(port, new_client)
        assert https_get(port, old_client)[0].startswith(b"HTTP/1.1 200")
        os.replace(new_ca.path, pki["ca"].path)  # the server's client_ca_file now holds only the new CA
        assert https_get(port, new_client)[0].startswith(b"HTTP/1.1 200")
        refusal(port, old_client)


# ----- the connection guard over TLS ------------------------------------------------------------------------
def test_a_client_that_never_starts_or_finishes_its_handshake_is_closed_after_the_head_timeout(
        pki, http_parser: str) -> None:
    with serving(ServerTLS(settings(pki)), parser=http_parser) as (port, stats):
        silent = connect(port)
        partial = connect(port)
        partial.sendall(PARTIAL_HELLO)
        assert closed_by_server(silent) and closed_by_server(partial)
        wait_until(lambda: stats.head_timeouts == 2 and stats.open == 0, timeout=WAIT_S,
                   what="both counted and released")


def test_a_head_that_never_completes_after_the_handshake_is_closed(pki, http_parser: str) -> None:
    with serving(ServerTLS(settings(pki)), parser=http_parser) as (port, stats):
        raw = connect(port)
        s = client(pki["ca"]).wrap_socket(raw, server_hostname="127.0.0.1")
        s.sendall(b"GET /metr")
        assert closed_by_server(s)
        assert stats.head_timeouts == 1


def test_past_the_cap_a_connection_stuck_in_its_handshake_makes_room(pki, http_parser: str) -> None:
    limits = ConnectionLimits(header_timeout_s=30, body_timeout_s=30, keepalive_timeout_s=30, max_connections=4,
                              evict_after_s=0.1)
    with serving(ServerTLS(settings(pki)), limits, parser=http_parser) as (port, stats):
        stuck = [connect(port) for _ in range(4)]
        for s in stuck:
            s.sendall(PARTIAL_HELLO)
        wait_until(lambda: stats.open == 4, timeout=WAIT_S, what="four connections held")
        time.sleep(0.2)  # past evict_after_s: stuck, not just opened
        assert https_get(port, client(pki["ca"]))[0].startswith(b"HTTP/1.1 200")  # a fifth is served…
        assert closed_by_server(stuck[0])  # …by closing the one that has waited longest
        assert stats.evicted >= 1 and stats.shed == 0
        for s in stuck:
            s.close()


def test_failed_handshakes_release_their_place(pki, tmp_path, http_parser: str) -> None:
    # evict_after_s 0: the refused connections may make room at once (what is tested is their release)
    limits = ConnectionLimits(header_timeout_s=30, body_timeout_s=30, keepalive_timeout_s=30, max_connections=16,
                              evict_after_s=0.0)
    with serving(ServerTLS(settings(pki)), limits, parser=http_parser) as (port, stats):
        stranger = client(CA(tmp_path / "other", "other-ca"))
        for _ in range(20):  # more refused clients than the cap: none of them may stay counted
            refusal(port, stranger)
        with socket.create_connection(("127.0.0.1", port)) as plain:  # plain HTTP on the TLS port
            plain.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert closed_by_server(plain)
        # each refused connection is held a moment for its alert to be read (more than the cap: the oldest
        # make room), then released
        wait_until(lambda: stats.open == 0, timeout=WAIT_S, what="every failed connection released")
        assert stats.shed == 0
        assert https_get(port, client(pki["ca"]))[0].startswith(b"HTTP/1.1 200")


def test_a_kept_alive_tls_connection_serves_several_requests_then_closes_when_idle(pki, http_parser: str) -> None:
    with serving(ServerTLS(settings(pki)), parser=http_parser) as (port, stats):
        raw = connect(port)
        s = client(pki["ca"]).wrap_socket(raw, server_hostname="127.0.0.1")
        for _ in range(3):
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            out = b""
            while not out.endswith(b"\r\n\r\nok\n"):
                chunk = s.recv(4096)
                assert chunk, out
                out += chunk
            assert out.startswith(b"HTTP/1.1 200")
        assert closed_by_server(s)  # the keep-alive timeout
        assert stats.head_timeouts == 0
        wait_until(lambda: stats.open == 0, timeout=WAIT_S, what="released")


# ----- clients that leave mid-handshake ---------------------------------------------------------------------
@pytest.mark.parametrize(("leave", "line"), [
    ("reset", "client reset the connection during the TLS handshake"),
    ("half-close", "client closed the connection during the TLS handshake"),
])
def test_a_client_leaving_mid_handshake_is_logged_as_what_it_did(pki, caplog, leave: str, line: str) -> None:
    caplog.set_level(logging.DEBUG, logger="gpumond.serving")
    with serving(ServerTLS(settings(pki))) as (port, stats):
        s = connect(port, client_hello())
        wait_until(lambda: stats.open == 1, timeout=WAIT_S, what="the connection held")
        if leave == "reset":  # SO_LINGER 0: close() sends a TCP RST
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        else:
            s.shutdown(socket.SHUT_WR)
        s.close()
        wait_until(lambda: stats.open == 0, timeout=WAIT_S, what="the connection released")
        wait_until(lambda: any(r.getMessage() == line for r in caplog.records), timeout=WAIT_S, what="logged")
        silent = connect(port)  # a TCP check (a load balancer's): connects and closes without a byte
        silent.close()
        quiet = "client closed the connection during the TLS handshake"
        wait_until(lambda: [r for r in caplog.records if r.getMessage() == quiet and r.levelno == logging.DEBUG],
                   timeout=WAIT_S, what="the TCP check logged at debug only")
    said = [r for r in caplog.records if r.getMessage() == line and r.levelno == logging.INFO]
    assert len(said) == 1 and said[0].client.startswith("127.0.0.1:"), caplog.text
    assert "class" not in caplog.text.lower()
