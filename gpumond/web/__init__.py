"""Both daemons' HTTP server and gpumond's HTTP clients, in one place: serving under uvicorn (`serving`), the
connection guard (`connections`, on uvicorn's protocols in `protocols`; `heap` hands a flood's memory back),
TLS (`tls`, `certdates`) and read-side authentication (`auth`) set by one web config file (`config`:
`--web.config.file` or the `web_config_file` key), and the HTTP clients' factory (`client`).

`load_web` turns the web config file into what a server does beyond plain HTTP; without one, or with an empty
one, a daemon serves plain HTTP with no read-side authentication."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpumond.config.errors import ConfigError
from gpumond.types import Series
from gpumond.web.tls import TLS_METRICS, ServerTLS, ServerTLSSettings, TLSSetupError

__all__ = ["TLS_METRICS", "Web", "load_web"]


@dataclass(frozen=True)
class Web:
    """What a daemon's HTTP server does beyond plain HTTP: TLS, and who may read."""

    tls: ServerTLS | None = None
    users: dict[str, str] = field(default_factory=dict)
    tokens: frozenset[str] = frozenset()

    @property
    def scheme(self) -> str:
        """`https` when serving TLS, else `http`."""
        return "https" if self.tls is not None else "http"

    def series(self) -> list[Series]:
        """What the server's /metrics says of its TLS (TLS_METRICS); nothing over plain HTTP."""
        return self.tls.series() if self.tls is not None else []

    def wrap(self, app: Any, open_paths: Iterable[str]) -> Any:
        """`app` behind read-side authentication when users or tokens are configured, else `app` itself."""
        if not self.users and not self.tokens:
            return app
        from gpumond.web.auth import ReadAuth

        return ReadAuth(app, users=self.users, tokens=self.tokens, open_paths=open_paths)


def load_web(path: Path | None) -> Web:
    """The web config at `path` (None: plain HTTP), certificates loaded; ConfigError is one line for exit 2."""
    if path is None:
        return Web()
    # Here, not at the top: the package's clients (the agent's sinks) need not load the file's models.
    from gpumond.web.config import load_web_config, read_bearer_tokens

    config = load_web_config(path)
    tokens = read_bearer_tokens(config.bearer_tokens_file, str(path)) if config.bearer_tokens_file else frozenset()
    tls = None
    if (t := config.tls_server_config) is not None:
        try:
            tls = ServerTLS(ServerTLSSettings(cert_file=t.cert_file, key_file=t.key_file,
                                              client_ca_file=t.client_ca_file, client_auth_type=t.client_auth_type,
                                              min_version=t.min_version, max_version=t.max_version))
        except TLSSetupError as e:
            raise ConfigError(str(path), str(e)) from None
    return Web(tls=tls, users=dict(config.basic_auth_users), tokens=tokens)
