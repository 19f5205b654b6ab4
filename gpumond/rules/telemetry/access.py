"""How a telemetry source reaches servers that serve TLS or ask for credentials: its `tls_config`,
`basic_auth` and `authorization`, in Prometheus' scrape-config names.

Certificates and secret files are read again when they change (certificates: in place, see
gpumond/job/tlsclient.py; the password or token file: read once per fetch), so rotation needs no restart.
"""

from __future__ import annotations

import base64
import ssl
from dataclasses import dataclass
from pathlib import Path

from gpumond.job.tlsclient import ClientTLS


class AccessError(ValueError):
    """A certificate or secret file that cannot be used; one line naming it."""


@dataclass
class Access:
    """TLS context and credentials for one source's HTTP client."""

    tls: ClientTLS | None = None
    username: str | None = None
    password_file: Path | None = None
    token_file: Path | None = None

    def verify(self) -> ssl.SSLContext | bool:
        """What to give httpx.Client(verify=...): our context, or True (the system CA bundle)."""
        return self.tls.context if self.tls is not None else True

    def refresh(self) -> str | None:
        """Re-read changed certificate files; one line when they cannot be used (the old ones stay)."""
        return self.tls.refresh() if self.tls is not None else None

    def headers(self) -> dict[str, str]:
        """The Authorization header, from the secret file as it is now; AccessError when unreadable."""
        if self.username is not None and self.password_file is not None:
            password = _read(self.password_file, "basic_auth.password_file")
            raw = f"{self.username}:{password}".encode()
            return {"Authorization": "Basic " + base64.b64encode(raw).decode()}
        if self.token_file is not None:
            return {"Authorization": "Bearer " + _read(self.token_file, "authorization.credentials_file")}
        return {}


def _read(path: Path, key: str) -> str:
    try:
        value = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as e:
        raise AccessError(f"{key}: cannot read {path}: {getattr(e, 'strerror', None) or 'not UTF-8 text'}") from None
    if not value or any(c in value for c in "\r\n"):
        raise AccessError(f"{key}: {path} must hold one line")
    return value

