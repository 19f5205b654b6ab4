"""Where a rank's pushes go: the node relay (the agent on this node) first, the rules service directly while no
relay answers; each resolved once, from the arguments, else the environment."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from gpumond.job.settings import (ConfigError, Identity, resolve_endpoint, resolve_relay, resolve_shards, resolve_tls,
                                  resolve_token)
from gpumond.job.transport import HttpTransport, RelayTransport, Transport
from gpumond.wire.media import PID_HEADER, PID_START_HEADER
from gpumond.wire.procstat import start_ticks
from gpumond.wire.routing import shard_endpoint
from gpumond.wire.tlsclient import ClientTLS


@dataclass(frozen=True, slots=True)
class Route:
    """The resolved addresses and credentials: `relay` None when off, `endpoint` None when only a relay was named."""

    relay: str | None
    named: bool  # the relay was named (relay= or GPUMOND_RELAY), not the loopback default
    endpoint: str | None
    token: str | None
    shards: int | None
    tls: ClientTLS | None

    def transport(self, identity: Identity, content_type: str, clock: Callable[[], float]) -> Transport:
        """The transport for this rank: the relay with the direct path behind it, or the direct path alone."""
        direct = None
        if self.endpoint is not None:
            # A job's shard is fixed for its run, so its address is chosen once, here.
            url = shard_endpoint(self.endpoint, identity.job, self.shards)
            direct = HttpTransport(url, self.token, self.tls, content_type)
        if self.relay is None:
            assert direct is not None, "resolve_route names an endpoint when the relay is off"
            return direct
        # The relay is reached on this node: over https with the same CA as the rules service (the agent serves
        # the relay with its web config's certificate), over http without any.
        relay_tls = self.tls if self.relay.startswith("https://") else None
        # The relay finds this rank's GPU by its process id and start time (the service never sees them).
        started = start_ticks()
        sender = {PID_HEADER: str(os.getpid()), **({PID_START_HEADER: str(started)} if started is not None else {})}
        relay = HttpTransport(self.relay, self.token, relay_tls, content_type, sender,
                              setting=("the node relay", "GPUMOND_RELAY"), to_relay=True)
        # Directly, a push must be whole: the service needs the GPU the relay would have filled in.
        problem = None if identity.gpu_uuid else ("this rank's GPU UUID is unknown (set GPUMOND_GPU_UUID to push "
                                                  "without the relay)")
        return RelayTransport(relay, direct, clock, relay_url=self.relay,
                              direct_url=shard_endpoint(self.endpoint, identity.job, self.shards) if self.endpoint
                              else None, direct_problem=problem, named=self.named)


def resolve_route(endpoint: str | None, token: str | None, shards: int | None, relay: str | None,
                  tls_files: tuple[str | None, str | None, str | None]) -> Route:
    """Resolve the route from arguments and environment; ConfigError names what is missing or wrong.

    A relay named explicitly (relay= or GPUMOND_RELAY) makes the endpoint and the token optional: the relay knows
    the rules service and may push under its own node credential. The default relay (loopback) only adds a first
    try in front of the endpoint, which stays required."""
    environ = os.environ
    relay_url, named = resolve_relay(relay, environ)
    explicit = named and relay_url is not None
    url = resolve_endpoint(endpoint, environ, optional=explicit)
    secret = resolve_token(token, environ, optional=explicit)
    count = resolve_shards(shards, url, environ) if url is not None else None
    tls = resolve_tls(*tls_files, environ)
    if relay_url is not None and not relay_url.startswith(("http://", "https://")):
        raise ConfigError(f"GPUMOND_RELAY must be an http:// or https:// URL, or off (got {relay_url!r})")
    return Route(relay_url, named, url, secret, count, tls)
