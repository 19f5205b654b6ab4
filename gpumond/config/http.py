"""The `http:` section shared by both daemons: how long and how many connections the server holds (the connection
guard that enforces it: gpumond/web/connections.py)."""

from __future__ import annotations

from pydantic import Field

from gpumond.config.types import ConfigModel


class HttpConfig(ConfigModel):
    """Bounds on the HTTP server's connections; defaults suit a scrape target."""

    # ~4.7 KB of memory per held connection: 4,096 is ~19 MiB, inside the chart's 128 Mi agent limit. One stalled
    # in its TLS handshake holds ~60 KiB, mostly OpenSSL's (benchmarks/results/tls_handshake_flood.md).
    # The cap is also lowered to fit the process's descriptor limit (RLIMIT_NOFILE minus a reserve).
    max_connections: int = Field(4096, ge=16, le=1_048_576)
    header_timeout_s: float = Field(10.0, gt=0, le=3600)
    body_timeout_s: float = Field(30.0, gt=0, le=3600)
    # Above the job SDK's 5 s push interval and usual scrape intervals, so clients reuse their connection.
    keepalive_timeout_s: float = Field(75.0, gt=0, le=3600)
    # Long enough for a slow but reading client to take a large /metrics; a client that reads nothing for
    # this long is not a scraper.
    write_timeout_s: float = Field(30.0, gt=0, le=3600)
