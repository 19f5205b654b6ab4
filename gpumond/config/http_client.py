"""How gpumond's HTTP clients reach a server that serves TLS or asks for credentials: `tls_config`, `basic_auth`
and `authorization`, in Prometheus' key names, for the rules service's telemetry sources and the Alertmanager
sink (gpumond.httpaccess builds the client's TLS context and headers from them)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from gpumond.config.types import AbsolutePath, ConfigModel


class TlsClientConfig(ConfigModel):
    """`tls_config` of an HTTP client, in Prometheus' scrape-config key names."""

    # The CA that signs the servers' certificates; without it the system CA bundle is used.
    ca_file: AbsolutePath | None = None
    cert_file: AbsolutePath | None = None  # a client certificate, for servers that require one (mTLS)
    key_file: AbsolutePath | None = None
    insecure_skip_verify: bool = False

    @model_validator(mode="after")
    def _pair(self) -> TlsClientConfig:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together (a client certificate and its key)")
        return self


class BasicAuthConfig(ConfigModel):
    """`basic_auth` for servers with read-side authentication; the password is read from a file."""

    username: str = Field(min_length=1)
    password_file: AbsolutePath


class AuthorizationConfig(ConfigModel):
    """`authorization`: a bearer token read from a file (Prometheus' `authorization.credentials_file`)."""

    type: Literal["Bearer"] = "Bearer"
    credentials_file: AbsolutePath
