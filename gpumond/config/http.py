"""The `http:` section shared by both daemons: how long and how many connections the server holds."""

from __future__ import annotations

from pydantic import Field

from gpumond.config.types import ConfigModel
from gpumond.connections import ConnectionLimits

_DEFAULTS = ConnectionLimits()


class HttpConfig(ConfigModel):
    """Bounds on the HTTP server's connections (gpumond/connections.py); defaults suit a scrape target."""

    # The cap is also lowered to fit the process's descriptor limit (RLIMIT_NOFILE minus a reserve).
    max_connections: int = Field(_DEFAULTS.max_connections, ge=16, le=1_048_576)
    header_timeout_s: float = Field(_DEFAULTS.header_timeout_s, gt=0, le=3600)
    body_timeout_s: float = Field(_DEFAULTS.body_timeout_s, gt=0, le=3600)
    keepalive_timeout_s: float = Field(_DEFAULTS.keepalive_timeout_s, gt=0, le=3600)
    write_timeout_s: float = Field(_DEFAULTS.write_timeout_s, gt=0, le=3600)

    def limits(self) -> ConnectionLimits:
        """These settings as the guard's limits."""
        return ConnectionLimits(header_timeout_s=self.header_timeout_s, body_timeout_s=self.body_timeout_s,
                                keepalive_timeout_s=self.keepalive_timeout_s, write_timeout_s=self.write_timeout_s,
                                max_connections=self.max_connections)
