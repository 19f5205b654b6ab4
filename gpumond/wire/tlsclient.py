"""The client side of TLS (standard library only): verify the server with the system CA bundle or a given CA
file, optionally present a client certificate, and re-read those files when they change.

Used by the job SDK's push and by the rules service's telemetry clients (agents' /metrics, Prometheus), so
both read certificates the same way. Reloading happens in place on the same context (new connections get the
new files; a rotated CA file adds its certificates to those already trusted, so an overlap during rotation
never breaks verification); `refresh()` is called before opening connections, not per request.
"""

from __future__ import annotations

import http.client
import os
import ssl
from pathlib import Path

# Where the SDK reads these from, when not passed as arguments (docs/job-sdk.md).
CA_FILE_ENV = "GPUMOND_CA_FILE"
CERT_FILE_ENV = "GPUMOND_CLIENT_CERT_FILE"
KEY_FILE_ENV = "GPUMOND_CLIENT_KEY_FILE"


class ClientTLS:
    """A client SSLContext (`.context`); ValueError with one line when a file cannot be used."""

    def __init__(self, ca_file: str | os.PathLike[str] | None = None, cert_file: str | os.PathLike[str] | None = None,
                 key_file: str | os.PathLike[str] | None = None, *, insecure_skip_verify: bool = False) -> None:
        if (cert_file is None) != (key_file is None):
            raise ValueError("a client certificate needs both cert_file and key_file")
        self.ca_file = Path(ca_file) if ca_file is not None else None
        self.cert_file = Path(cert_file) if cert_file is not None else None
        self.key_file = Path(key_file) if key_file is not None else None
        # PROTOCOL_TLS_CLIENT checks the host name and the chain; the floor is TLS 1.2 as on the servers. A CA
        # file replaces the system bundle (as Prometheus' tls_config.ca_file does): a private CA's servers only.
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.ca_file is None:
            self.context.load_default_certs()
        if insecure_skip_verify:
            self.context.check_hostname = False
            self.context.verify_mode = ssl.CERT_NONE
        self._stamp: tuple[object, ...] = ()
        self._load()
        self._stamp = self._stamps()

    def refresh(self) -> str | None:
        """Re-read the files if they changed; None, or one line saying why they could not be used (the
        previous ones stay in use)."""
        stamp = self._stamps()
        if stamp == self._stamp:
            return None
        try:
            self._load()
        except ValueError as e:
            return str(e)
        finally:
            self._stamp = stamp  # a bad state of the files is reported once, and retried when they change again
        return None

    def _load(self) -> None:
        if self.ca_file is not None:
            try:
                self.context.load_verify_locations(cafile=self.ca_file)
            except FileNotFoundError:
                raise ValueError(f"CA file {self.ca_file}: no such file") from None
            except (ssl.SSLError, OSError) as e:
                raise ValueError(f"CA file {self.ca_file}: not a usable PEM certificate "
                                 f"({getattr(e, 'reason', None) or e})") from None
        if self.cert_file is not None and self.key_file is not None:
            try:
                self.context.load_cert_chain(self.cert_file, self.key_file)
            except FileNotFoundError as e:
                raise ValueError(f"client certificate: {e.filename or self.cert_file}: no such file") from None
            except ssl.SSLError as e:
                if e.reason == "KEY_VALUES_MISMATCH":
                    raise ValueError(f"client certificate {self.cert_file}: the key {self.key_file} does not "
                                     f"belong to it") from None
                raise ValueError(f"client certificate {self.cert_file} / key {self.key_file}: not usable PEM "
                                 f"({e.reason or e})") from None
            except OSError as e:
                raise ValueError(f"client certificate {self.cert_file}: {e.strerror or e}") from None

    def _stamps(self) -> tuple[object, ...]:
        out: list[object] = []
        for path in (self.ca_file, self.cert_file, self.key_file):
            if path is None:
                continue
            try:
                st = path.stat()
                out.append((st.st_mtime_ns, st.st_size, st.st_ino))
            except OSError:
                out.append(None)
        return tuple(out)


# OpenSSL's X509_V_ERR_CERT_NOT_YET_VALID and X509_V_ERR_CERT_HAS_EXPIRED (x509_vfy.h), as verify_code says them.
_CERT_NOT_YET_VALID, _CERT_HAS_EXPIRED = 9, 10


def explain(exc: BaseException) -> str | None:
    """One line for a TLS failure the operator can fix, or None when `exc` is not one."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        # Its dates, not its signer: another CA file would not help.
        if exc.verify_code == _CERT_HAS_EXPIRED:
            return ("the server's certificate has expired: the server must install a renewed one (or this host's "
                    "clock is wrong); the CA is not the problem")
        if exc.verify_code == _CERT_NOT_YET_VALID:
            return ("the server's certificate is not valid yet: check this host's clock (and the date the server's "
                    "certificate starts); the CA is not the problem")
        return (f"cannot verify the server's certificate ({exc.verify_message or exc.reason}): give the CA that "
                f"signed it ({CA_FILE_ENV} for the job SDK, tls_config.ca_file for the rules service)")
    if isinstance(exc, ssl.SSLError):
        reason = exc.reason or str(exc)
        if "CERTIFICATE_REQUIRED" in reason:
            return "the server requires a client certificate: set a client certificate and key"
        if "CERTIFICATE_EXPIRED" in reason:
            return f"the server refused this client's certificate as expired ({reason}): renew the client certificate"
        if "UNKNOWN_CA" in reason or "BAD_CERTIFICATE" in reason:
            return f"the server refused this client's certificate ({reason})"
        if "WRONG_VERSION_NUMBER" in reason or "RECORD_LAYER_FAILURE" in reason:
            return f"TLS failed ({reason}): is the server speaking plain HTTP? use http:// then"
        return f"TLS failed: {reason}"
    return None


def https_instead(exc: BaseException, url: str) -> str | None:
    """The https:// form of an http:// `url` when `exc` is what a server speaking TLS does to a plain-HTTP
    request (it closes the connection without an HTTP answer, or answers with a TLS alert); else None."""
    if isinstance(exc, http.client.BadStatusLine) and url.startswith("http://"):  # RemoteDisconnected is one
        return "https://" + url.split("://", 1)[1]
    return None
