"""The web config file (`--web.config.file`): TLS and read-side authentication, in Prometheus
exporter-toolkit's shape and key names, so an operator's node_exporter file mostly works as it is.

Where gpumond differs, it refuses the key with one line rather than accepting and ignoring it:
- `client_auth_type` RequestClientCert and RequireAnyClientCert (a client certificate asked for but not
  verified) are refused: Python's ssl module cannot accept an unverified certificate, and gpumond would not
  want to. NoClientCert, VerifyClientCertIfGiven and RequireAndVerifyClientCert work as in exporter-toolkit.
- `min_version` is TLS12 or TLS13 (TLS10 / TLS11 are refused); `cipher_suites`, `curve_preferences`,
  `prefer_server_cipher_suites`, `client_allowed_sans`, inline `cert` / `key` and `http_server_config`
  are not supported (OpenSSL's defaults for TLS 1.2+ apply; the daemons speak HTTP/1.1 only).
- `bearer_tokens_file` is gpumond's own addition: read-side bearer tokens, one per line, next to (or
  instead of) `basic_auth_users`.
Relative paths are taken from the web config file's directory, as exporter-toolkit does.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, PlainValidator, field_validator, model_validator

from gpumond.config.errors import ConfigError
from gpumond.config.load import load_config
from gpumond.config.tokens import read_tokens_file
from gpumond.config.types import ConfigModel, Hidden

CLIENT_AUTH_TYPES = ("NoClientCert", "VerifyClientCertIfGiven", "RequireAndVerifyClientCert")
_UNVERIFIED = ("RequestClientCert", "RequireAnyClientCert")
_UNSUPPORTED_TLS_KEYS = {
    "cipher_suites": "OpenSSL's default TLS 1.2+ ciphers are used",
    "curve_preferences": "OpenSSL's default groups are used",
    "prefer_server_cipher_suites": "OpenSSL's default ordering is used",
    "client_allowed_sans": "any client certificate signed by client_ca_file is accepted",
    "cert": "give the certificate as cert_file",
    "key": "give the key as key_file",
}
# bcrypt's modular crypt forms ($2a$, $2b$, $2y$), as `htpasswd -B` and exporter-toolkit's docs produce.
_BCRYPT = re.compile(r"\$2[aby]\$\d\d\$[./A-Za-z0-9]{53}")


def _users(hidden: Hidden) -> dict[str, str]:
    value = hidden.value
    if not isinstance(value, dict):
        raise ValueError("must map user names to bcrypt hashes")
    for user, hashed in value.items():
        if not isinstance(user, str) or not user or ":" in user:
            raise ValueError(f"user {user!r}: a user name must be a non-empty string without ':'")
        if not isinstance(hashed, str) or not _BCRYPT.fullmatch(hashed):
            raise ValueError(f"user {user!r}: the value must be a bcrypt hash ($2y$10$…, e.g. from "
                             "`htpasswd -nBC 10 \"\" | tr -d ':\\n'`), not a password")
    return dict(value)


Users = Annotated[dict[str, str], PlainValidator(_users), BeforeValidator(Hidden)]


class TlsServerConfig(ConfigModel):
    """`tls_server_config`: the server's certificate and key, and whether clients must present one."""

    cert_file: Path = Field(strict=False)
    key_file: Path = Field(strict=False)
    client_auth_type: str = "NoClientCert"
    client_ca_file: Path | None = Field(None, strict=False)
    min_version: Literal["TLS12", "TLS13"] = "TLS12"
    max_version: Literal["TLS12", "TLS13"] = "TLS13"

    @model_validator(mode="before")
    @classmethod
    def _refuse_unsupported(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key, why in _UNSUPPORTED_TLS_KEYS.items():
                if key in data:
                    raise ValueError(f"{key}: not supported by gpumond ({why}); remove it")
            if data.get("min_version") in ("TLS10", "TLS11"):
                raise ValueError(f"min_version: {data['min_version']} is refused; gpumond serves TLS 1.2 and 1.3 "
                                 "only (use TLS12 or TLS13)")
        return data

    @field_validator("client_auth_type")
    @classmethod
    def _known_auth(cls, value: str) -> str:
        if value in _UNVERIFIED:
            raise ValueError(f"{value} (a client certificate that is not verified) is not supported by gpumond: "
                             "use VerifyClientCertIfGiven or RequireAndVerifyClientCert with client_ca_file")
        if value not in CLIENT_AUTH_TYPES:
            raise ValueError(f"must be one of {', '.join(CLIENT_AUTH_TYPES)} (got {value!r})")
        return value

    @model_validator(mode="after")
    def _ca_matches_auth(self) -> TlsServerConfig:
        verifies = self.client_auth_type != "NoClientCert"
        if verifies and self.client_ca_file is None:
            raise ValueError(f"client_auth_type {self.client_auth_type} needs client_ca_file (the CA that signs "
                             "client certificates)")
        if not verifies and self.client_ca_file is not None:
            raise ValueError("client_ca_file is set but client_auth_type is NoClientCert: set client_auth_type to "
                             "RequireAndVerifyClientCert (or VerifyClientCertIfGiven), or remove client_ca_file")
        if self.min_version == "TLS13" and self.max_version == "TLS12":
            raise ValueError("max_version TLS12 is below min_version TLS13")
        return self


class WebConfig(ConfigModel):
    """The whole web config file; an empty file means plain HTTP and no read-side authentication."""

    tls_server_config: TlsServerConfig | None = None
    # user -> bcrypt hash (`htpasswd -nBC 10 "" | tr -d ':\\n'`). A wrong value may be a password pasted by
    # mistake, so it is never echoed in an error.
    basic_auth_users: Users = Field(default_factory=dict)
    bearer_tokens_file: Path | None = Field(None, strict=False)

    @model_validator(mode="before")
    @classmethod
    def _refuse_http_server_config(cls, data: Any) -> Any:
        if isinstance(data, dict) and "http_server_config" in data:
            raise ValueError("http_server_config: not supported by gpumond (it serves HTTP/1.1 only and sets no "
                             "extra headers); remove it")
        return data


def load_web_config(path: Path) -> WebConfig:
    """Load a web config file; relative paths in it are taken from its directory. Raises ConfigError."""
    config = load_config(path, WebConfig)
    base = Path(path).parent

    def resolved(p: Path | None) -> Path | None:
        return None if p is None else p if p.is_absolute() else base / p

    tls = config.tls_server_config
    if tls is not None:
        tls = tls.model_copy(update={"cert_file": resolved(tls.cert_file), "key_file": resolved(tls.key_file),
                                     "client_ca_file": resolved(tls.client_ca_file)})
    return config.model_copy(update={"tls_server_config": tls,
                                     "bearer_tokens_file": resolved(config.bearer_tokens_file)})


def read_bearer_tokens(path: Path, source: str) -> frozenset[str]:
    """The tokens in a `bearer_tokens_file` (one a line, `#` comments); ConfigError when unreadable or bad."""
    tokens = read_tokens_file(path, source, "bearer_tokens_file")
    if not tokens:
        raise ConfigError(source, f"bearer_tokens_file: {path} holds no token")
    return frozenset(tokens)
