"""gpumond's HTTP clients, built one way: `http_client` makes the httpx client of every telemetry source (agents,
Prometheus) and every alert sink (Alertmanager, Slack, PagerDuty) from the section's `tls_config`, `basic_auth`
and `authorization` (gpumond.config.http_client.HttpClientConfig, in Prometheus' key names), as Alertmanager's own
integrations share one HTTP client config.

Certificates and secret files are read again when they change (certificates: in place, see
gpumond/wire/tlsclient.py; the password or token file: read once per request round), so rotation needs no restart.
"""

from __future__ import annotations

import base64
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from gpumond.wire.tlsclient import ClientTLS


class AccessError(ValueError):
    """A certificate or secret file that cannot be used; one line naming it."""


@dataclass
class Access:
    """TLS context and credentials for one HTTP client."""

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


def build_access(spec: Any, key: str = "") -> Access:
    """A client's `tls_config`, `basic_auth` and `authorization` (a config model or a mapping of the same
    shape); AccessError (one line, naming the section `key` when given) on a bad file."""
    try:
        return _build_access(spec)
    except AccessError as e:
        raise AccessError(f"{key}.{e}" if key else str(e)) from None


def _build_access(spec: Any) -> Access:
    tls_cfg, basic, authz = (field_of(spec, k) for k in ("tls_config", "basic_auth", "authorization"))
    tls = None
    if tls_cfg is not None:
        try:
            tls = ClientTLS(field_of(tls_cfg, "ca_file"), field_of(tls_cfg, "cert_file"),
                            field_of(tls_cfg, "key_file"),
                            insecure_skip_verify=bool(field_of(tls_cfg, "insecure_skip_verify")))
        except ValueError as e:
            raise AccessError(f"tls_config: {e}") from None
    password_file, token_file = field_of(basic, "password_file"), field_of(authz, "credentials_file")
    access = Access(tls=tls, username=field_of(basic, "username"),
                    password_file=Path(password_file) if password_file else None,
                    token_file=Path(token_file) if token_file else None)
    access.headers()  # a missing secret file is a config error at start, not a failing scrape later
    return access


def field_of(obj: Any, name: str) -> Any:
    """`obj.name` or `obj[name]` (a config model or a mapping of its shape); None for a None `obj`."""
    if obj is None:
        return None
    if isinstance(obj, Mapping):
        return obj.get(name)
    return getattr(obj, name, None)


def http_client(access: Access, *, timeout: httpx.Timeout | float = 5.0, limits: httpx.Limits | None = None,
                headers: Mapping[str, str] | None = None, trust_env: bool = False) -> httpx.Client:
    """The httpx client of one telemetry source, alert sink or health check: certificates from `access` (its
    credentials are headers, read per request round by the caller), redirects never followed (a credential must not
    follow one to another host), and the environment's proxy settings ignored unless the caller asks for them (a
    proxy set for pip, say, must not sit between gpumond and its agents or receivers). Without `limits`, httpx's own
    pool bounds (100 connections, 20 kept alive); `httpx.Limits()` would be unbounded."""
    pool = {} if limits is None else {"limits": limits}
    return httpx.Client(verify=access.verify(), timeout=timeout, headers=dict(headers or {}), follow_redirects=False,
                        trust_env=trust_env, **pool)
