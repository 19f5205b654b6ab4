"""Scrape targets: an agent's address, its /metrics URL and the node name an operator gave it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

DEFAULT_PATH = "/metrics"


@dataclass(frozen=True, slots=True)
class Target:
    """One agent to scrape."""

    address: str  # as configured ("host:port" or a URL); names the target in errors
    url: str
    host: str  # the last resort for its node name
    node: str | None = None  # operator-given (file_sd label `node`); None = ask the agent


def parse_target(spec: str, labels: Mapping[str, str] | None = None) -> Target:
    """`host:port` or `http(s)://host:port[/path]`, with Prometheus' `__scheme__` / `__metrics_path__` labels."""
    labels = labels or {}
    spec = spec.strip() if isinstance(spec, str) else spec
    if not isinstance(spec, str) or not spec or any(c.isspace() for c in spec):
        raise ValueError(f"target {spec!r} is not host:port or a URL")
    has_scheme = "://" in spec
    parts = urlsplit(spec if has_scheme else "//" + spec)
    try:
        port = parts.port  # raises on a non-numeric port
    except ValueError:
        raise ValueError(f"target {spec!r} has an invalid port") from None
    if not parts.hostname or (not has_scheme and (port is None or parts.path or parts.query)):
        raise ValueError(f"target {spec!r} is not host:port or a URL")
    scheme = parts.scheme if has_scheme else labels.get("__scheme__", "http")
    if scheme not in ("http", "https"):
        raise ValueError(f"target {spec!r}: scheme must be http or https, not {scheme!r}")
    path = parts.path if has_scheme and parts.path else labels.get("__metrics_path__", DEFAULT_PATH)
    if not path.startswith("/"):
        raise ValueError(f"target {spec!r}: metrics path {path!r} must start with /")
    query = f"?{parts.query}" if parts.query else ""
    node = labels.get("node") or None
    return Target(address=spec, url=f"{scheme}://{parts.netloc}{path}{query}", host=parts.hostname, node=node)
