"""The server side of TLS for both daemons: an SSLContext whose certificate, key and client CA are re-read
when their files change, so rotation (cert-manager, a renewal timer) needs no restart.

How rotation works: the listening context has an SNI callback, which OpenSSL calls on every ClientHello
(also when the client sends no server name, as Prometheus does for an IP target). The callback checks the
files' (mtime, size, inode) at most once a second; when they changed it builds a new context from them
and hands it to that connection (`SSLObject.context = new`), and to every later one. A file caught half
written (a new certificate with the old key) fails to load: that is logged once and the previous context
keeps serving, so a rotation in progress never breaks a handshake. Connections already open keep the
certificate they were made with. Which clients must present a certificate (client_auth_type) and the TLS
versions come from the web config file, read once at start.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpumond.types import Series
from gpumond.web.certdates import CertificateDateError, Validity, utc, validity

log = logging.getLogger("gpumond.serving")

VERIFY_MODES = {"NoClientCert": ssl.CERT_NONE, "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
                "RequireAndVerifyClientCert": ssl.CERT_REQUIRED}
VERSIONS = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
# How long a refused handshake's connection is held after its alert is sent, so the client can read it.
LINGER_S = 1.0
# What a connection reads into (asyncio's SSLProtocol keeps one buffer per connection): before its handshake
# completes, enough for a ClientHello in a read or two; after it, one full TLS record (16 KiB of plaintext plus
# its overhead), so a large push is decrypted a record a read.
HANDSHAKE_READ_BYTES = 4 * 1024
READ_BYTES = 16 * 1024 + 256
# How often a handshake may look at the files: a flood of handshakes costs one stat() round a second.
CHECK_EVERY_S = 1.0


# name -> (type, help), for each daemon's /metrics encoder (series: ServerTLS.series()).
TLS_METRICS = {
    "gpumond_tls_certificate_not_after_timestamp_seconds": ("gauge", (
        "Unix time after which the certificate this server presents (tls_server_config.cert_file, as last "
        "loaded) is expired; exported only when serving TLS.")),
}


class TLSSetupError(RuntimeError):
    """The certificate, key or client CA cannot be used; the message is one line naming the file and why."""


class NotValidYet(TLSSetupError):
    """The certificate's not-before is still ahead: it becomes usable without any change to the files."""


@dataclass(frozen=True, slots=True)
class ServerTLSSettings:
    """What the web config's tls_server_config says, as the ssl module needs it."""

    cert_file: Path
    key_file: Path
    client_ca_file: Path | None = None
    client_auth_type: str = "NoClientCert"
    min_version: str = "TLS12"
    max_version: str = "TLS13"

    @property
    def requires_client_cert(self) -> bool:
        """True when a client without a verified certificate is refused at the handshake."""
        return self.client_auth_type == "RequireAndVerifyClientCert"


def build_context(s: ServerTLSSettings, now: float) -> tuple[ssl.SSLContext, Validity]:
    """A server context from the files named in `s`, and its certificate's validity period; TLSSetupError says
    which file is wrong and how, also when the certificate is expired or not yet valid at `now` (Unix
    seconds): OpenSSL would serve it, and every client would refuse it."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = VERSIONS[s.min_version]
    ctx.maximum_version = VERSIONS[s.max_version]
    ctx.verify_mode = VERIFY_MODES[s.client_auth_type]
    for key, path in (("cert_file", s.cert_file), ("key_file", s.key_file), ("client_ca_file", s.client_ca_file)):
        if path is not None and not os.access(path, os.R_OK):
            why = "no such file" if not path.exists() else "not readable by this user"
            raise TLSSetupError(f"tls_server_config.{key}: cannot read {path}: {why}")
    try:
        ctx.load_cert_chain(s.cert_file, s.key_file)
    except ssl.SSLError as e:
        if e.reason == "KEY_VALUES_MISMATCH":
            raise TLSSetupError(f"tls_server_config: the key in {s.key_file} does not belong to the certificate in "
                                f"{s.cert_file} (give the key the certificate was issued for)") from None
        raise TLSSetupError(f"tls_server_config: cannot load the certificate {s.cert_file} with the key "
                            f"{s.key_file}: {e.reason or e} (both must be PEM; an encrypted key is not "
                            f"supported)") from None
    if s.client_ca_file is not None:
        try:
            ctx.load_verify_locations(cafile=s.client_ca_file)
        except ssl.SSLError as e:
            raise TLSSetupError(f"tls_server_config.client_ca_file: {s.client_ca_file} holds no usable PEM "
                                f"certificate: {e.reason or e}") from None
    try:
        dates = validity(s.cert_file.read_text(encoding="ascii", errors="replace"))
    except (OSError, CertificateDateError) as e:
        raise TLSSetupError(f"tls_server_config.cert_file: {s.cert_file}: {e}") from None
    if (problem := dates.problem(now)) is not None:
        raise (NotValidYet if now < dates.not_before else TLSSetupError)(f"tls_server_config.cert_file: the certificate in {s.cert_file} {problem}: clients "
                            f"refuse it; install a certificate valid now (not before {utc(dates.not_before)}, "
                            f"not after {utc(dates.not_after)}; this host's clock says {utc(now)})")
    return ctx, dates


class ServerTLS:
    """The listening context (`.context`) and the files behind it, re-read on change (see the module doc)."""

    def __init__(self, settings: ServerTLSSettings, *, clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time, check_every_s: float = CHECK_EVERY_S) -> None:
        """`clock` paces the checks of the files; `wall_clock` (Unix seconds) is what a certificate's dates are
        compared with."""
        self.settings = settings
        self._clock = clock
        self._wall_clock = wall_clock
        self._check_every_s = check_every_s
        self._lock = threading.Lock()
        self._stamp = self._stamps()
        # raises TLSSetupError: the daemon exits 2 with its line
        self.context, self.validity = build_context(settings, wall_clock())
        self.context.sni_callback = self._on_client_hello
        self._current = self.context
        self._next_check = clock() + check_every_s
        self._failed_stamp: tuple[object, ...] | None = None  # files that failed: not rebuilt until they change
        self._warned_stamp: tuple[object, ...] | None = None  # files whose failure was logged
        self.reloads = 0

    def current(self) -> ssl.SSLContext:
        """The context new connections get: rebuilt first when the files changed since the last look."""
        now = self._clock()
        if now < self._next_check:
            return self._current
        with self._lock:
            self._next_check = now + self._check_every_s
            stamp = self._stamps()
            if stamp == self._stamp or stamp == self._failed_stamp:
                return self._current
            try:
                fresh, dates = build_context(self.settings, self._wall_clock())
            except TLSSetupError as e:
                if stamp != self._warned_stamp:  # said once per state of the files
                    self._warned_stamp = stamp
                    log.warning("certificate files changed but cannot be used; still serving the previous ones",
                                extra={"error": str(e)})
                # Retried when the files change again; one not valid yet (issued "now" by a CA whose clock is a
                # little ahead of this host's) also at each later look, so it is served once its time comes.
                if not isinstance(e, NotValidYet):
                    self._failed_stamp = stamp
                return self._current
            self._current, self.validity, self._stamp = fresh, dates, stamp
            self._failed_stamp = self._warned_stamp = None
            self.reloads += 1
            log.info("certificate files changed: new connections get them", extra={
                "cert_file": str(self.settings.cert_file), "not_after": utc(dates.not_after),
                "reloads": self.reloads})
            return fresh

    def series(self) -> list[Series]:
        """TLS_METRICS: the not-after time of the certificate new connections get."""
        # Looked at now, not only at a handshake: a scraper on a kept-alive connection makes none, and the metric
        # would otherwise name a renewed certificate's predecessor (and its expiry alert) until one came.
        self.current()
        return [Series("gpumond_tls_certificate_not_after_timestamp_seconds", (), self.validity.not_after)]

    def _on_client_hello(self, conn: ssl.SSLObject, server_name: str | None, ctx: ssl.SSLContext) -> None:
        try:
            fresh = self.current()
            if fresh is not ctx:
                conn.context = fresh
        except Exception:  # noqa: BLE001 - an exception here fails the handshake; the old context is better
            log.exception("certificate reload failed; serving the previous certificate")

    def _stamps(self) -> tuple[object, ...]:
        out: list[object] = []
        for path in (self.settings.cert_file, self.settings.key_file, self.settings.client_ca_file):
            if path is None:
                continue
            try:
                st = path.stat()  # follows symlinks: a Kubernetes Secret volume swaps a `..data` link
                out.append((st.st_mtime_ns, st.st_size, st.st_ino))
            except OSError:
                out.append(None)
        return tuple(out)


def guarded_tls(server: ServerTLS, *, handshake_timeout_s: float,
                shutdown_timeout_s: float) -> Callable[[Any], asyncio.BaseProtocol]:
    """Wraps one connection's guarded HTTP protocol (gpumond/web/connections.py: httptools or h11) in asyncio's TLS
    protocol.

    The TLS layer is made here, per connection, rather than by passing `ssl=` to uvicorn, so that the
    connection guard sees the TCP connection at accept (`tcp_opened`) and when it ends (`tcp_lost`), also when
    the handshake never completes: asyncio tells the application protocol nothing before a handshake succeeds.
    `asyncio.sslproto.SSLProtocol` is what `loop.create_server(ssl=...)` itself uses (Python 3.11+)."""
    from asyncio import sslproto

    class GuardedTLS(sslproto.SSLProtocol):
        """TLS for one connection, telling the guard when the TCP connection opens and ends."""

        # asyncio reads into one buffer per connection, allocated with the protocol: 256 KiB by default, so
        # every connection, even one stalled in its handshake, held 256 KiB (with OpenSSL's own handshake
        # state, ~310 KB). A ClientHello is a few hundred bytes: the handshake reads into HANDSHAKE_READ_BYTES,
        # and only an established connection gets READ_BYTES, one full TLS record.
        max_size = HANDSHAKE_READ_BYTES

        def __init__(self, app: Any) -> None:
            super().__init__(app.loop, app, server.context, None, server_side=True,
                             ssl_handshake_timeout=handshake_timeout_s, ssl_shutdown_timeout=shutdown_timeout_s)
            self._guarded = app
            self._received = False

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)  # starts the handshake
            self._guarded.tcp_opened(transport)

        def buffer_updated(self, nbytes: int) -> None:
            self._received = True
            super().buffer_updated(nbytes)

        def connection_lost(self, exc: Exception | None) -> None:
            # A reset reaches only here (asyncio closes the transport without a word); the guard's own closings
            # (timeouts, eviction) abort with no exception and are logged by the guard.
            if isinstance(exc, ConnectionError) and self._state == sslproto.SSLProtocolState.DO_HANDSHAKE:
                self._abandoned("client reset the connection during the TLS handshake")
            super().connection_lost(exc)
            self._guarded.tcp_lost()

        def _on_handshake_complete(self, handshake_exc: BaseException | None) -> None:
            tcp = self._transport
            if handshake_exc is None:
                self.max_size = READ_BYTES  # the next read allocates it (SSLProtocol.get_buffer)
            if handshake_exc is None or tcp is None:
                super()._on_handshake_complete(handshake_exc)
                return
            if not isinstance(handshake_exc, ssl.SSLError):
                # The client closed its side mid-handshake: asyncio passes the ConnectionResetError *class*
                # (its eof_received). There is no alert to send and no one to read it: drop the connection.
                self._abandoned("client closed the connection during the TLS handshake")
                tcp.abort()
                return
            # asyncio drops the connection at once on a failed handshake, discarding the alert OpenSSL wrote
            # (certificate required, unknown CA, protocol version). Under TLS 1.3 a client learns of a refused
            # certificate only after it has sent its request: closing now would make its write or read fail
            # with a bare "EOF" or "reset". So the alert is sent, and the connection is held (reading nothing,
            # still counted by the guard) for LINGER_S before it is dropped: the client reads why.
            log.info("TLS handshake refused", extra={"client": _peer(tcp), "error": _reason(handshake_exc)})
            with contextlib.suppress(Exception):
                if self._handshake_timeout_handle is not None:
                    self._handshake_timeout_handle.cancel()
                    self._handshake_timeout_handle = None
                self._process_outgoing()
                self._set_state(sslproto.SSLProtocolState.UNWRAPPED)
                tcp.pause_reading()
                self._loop.call_later(LINGER_S, tcp.abort)
                return
            super()._on_handshake_complete(handshake_exc)

        def _abandoned(self, what: str) -> None:
            # A TCP check (a load balancer's, a tcpSocket probe) connects and closes without a byte: not news.
            level = logging.INFO if self._received else logging.DEBUG
            log.log(level, what, extra={"client": _peer(self._transport) if self._transport else "unknown"})

    return GuardedTLS


def _peer(tcp: asyncio.BaseTransport) -> str:
    peer = tcp.get_extra_info("peername")
    return f"{peer[0]}:{peer[1]}" if peer else "unknown"


def _reason(exc: BaseException) -> str:
    return str(getattr(exc, "reason", None) or exc).lower().replace("_", " ")
