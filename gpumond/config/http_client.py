"""How gpumond's HTTP clients reach a server that serves TLS or asks for credentials: `tls_config`, `basic_auth`
and `authorization`, in Prometheus' key names, embedded in every client section (the rules service's telemetry
sources and every alert sink), as Alertmanager's integrations each embed one http_config
(gpumond.web.client builds the client's TLS context, headers and the httpx client from them)."""

from __future__ import annotations

from typing import Literal, Self

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


class HttpClientConfig(ConfigModel):
    """The client settings a section embeds: `tls_config` and at most one of `basic_auth` and `authorization`."""

    tls_config: TlsClientConfig | None = None
    basic_auth: BasicAuthConfig | None = None
    authorization: AuthorizationConfig | None = None

    @model_validator(mode="after")
    def _one_credential(self) -> Self:
        if self.basic_auth is not None and self.authorization is not None:
            raise ValueError("set only one of basic_auth and authorization")
        return self
