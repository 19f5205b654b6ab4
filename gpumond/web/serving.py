"""Serving an ASGI app under uvicorn the way both daemons need: bind first, bounded connections (see
gpumond/web/connections.py), logs in the daemon's format, clean exit on SIGTERM."""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from gpumond.config.types import ListenAddress
from gpumond.web.connections import ConnectionLimits, ConnectionStats

log = logging.getLogger("gpumond.serving")

# SIGHUP stops a daemon exactly like SIGTERM (limits restored, exit 0). Neither daemon reloads its config:
# most of it (listen address, NVML backend, sampling schedule, state_dir, sinks) is fixed at start, and a
# reload that silently ignored those keys would be worse than a restart, which the policy already survives
# (state file: resume). The hazard SIGHUP brought was its default action: a hang-up (an agent started by hand
# in a terminal that closes) killed the process without restoring the limits it had set.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

if TYPE_CHECKING:
    from gpumond.web.tls import ServerTLS

# How long SIGTERM waits for responses in flight before cancelling them. Well inside systemd's
# TimeoutStopSec=30s and Kubernetes' 30 s grace period, so on_stop (the policy's restore) always runs.
SHUTDOWN_GRACE_S = 5.0


class ListenError(RuntimeError):
    """The listen address cannot be bound; the message says which and why."""


def bind(host: str, port: int) -> socket.socket:
    """Bind the listen socket before anything starts, so a taken port is one clear error, not a traceback."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted sockets inherit TCP_NODELAY. asyncio only sets it itself for sockets it creates; without it
    # h11's separate head and body writes meet Nagle + the client's delayed ACK: ~40 ms per response.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise ListenError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.set_inheritable(True)
    return sock


def run_until_signalled(app: Any, sock: socket.socket, *, on_stop: Callable[[], None] = lambda: None,
                        limits: ConnectionLimits = ConnectionLimits(), stats: ConnectionStats | None = None,
                        tls: ServerTLS | None = None, more_sockets: Sequence[socket.socket] = ()) -> None:
    """Serve `app` on `sock` until SIGTERM/SIGINT/SIGHUP; then `on_stop()`; the process exits normally (status 0).

    `stats` receives the connection guard's counters (for the daemon's /metrics); `tls` serves HTTPS;
    `more_sockets` are served by the same server, guard and TLS (the agent's relay listener)."""
    # Here, not at the top: a daemon's start-up imports this module (ListenError) before its config is known to
    # be good, and a refused config must not wait for uvicorn (~160 ms).
    import uvicorn

    from gpumond.web.protocols import default_parser, guarded_protocol

    class _Server(uvicorn.Server):
        """uvicorn, minus re-raising the signal after shutdown: that would kill us before on_stop runs."""

        def _stop_on(self, sig: int, frame: Any) -> None:
            if not self.should_exit:
                log.info("stopping", extra={"signal": signal.Signals(sig).name,
                                            "note": "SIGHUP stops as SIGTERM does; restart to apply a new config"
                                            if sig == signal.SIGHUP else ""})
            self.handle_exit(sig, frame)

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            previous = {sig: signal.signal(sig, self._stop_on) for sig in STOP_SIGNALS}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    wrap = None
    if tls is not None:
        from gpumond.web.tls import guarded_tls

        # A handshake is held to the head timeout by the guard; asyncio's own limits are only a backstop.
        wrap = guarded_tls(tls, handshake_timeout_s=2 * limits.header_timeout_s,
                           shutdown_timeout_s=min(limits.header_timeout_s, SHUTDOWN_GRACE_S))
    parser = default_parser()
    protocol, _ = guarded_protocol(limits, stats=stats, tls=wrap, parser=parser)
    if parser != "httptools":  # said once: the same guard, at ~3x the CPU per request
        log.warning("httptools cannot be imported; serving HTTP with h11 (slower)", extra={"parser": parser})
    # log_config=None: uvicorn's loggers keep no handler of their own; gpumond.logs writes their lines.
    # The protocol is uvicorn's httptools one (h11 where httptools cannot be imported), extended with the
    # guard's timeouts and cap (gpumond/web/protocols.py); never uvicorn's own choice, which has no guard.
    cfg = uvicorn.Config(app, lifespan="off", access_log=False, log_config=None, server_header=False,
                         http=protocol, timeout_keep_alive=limits.keepalive_timeout_s,
                         timeout_graceful_shutdown=SHUTDOWN_GRACE_S)
    try:
        _Server(cfg).run(sockets=[sock, *more_sockets])
    finally:
        on_stop()
        for s in (sock, *more_sockets):
            s.close()


def default_external_url(listen: ListenAddress, name: str, scheme: str = "http") -> str:
    """How others reach a daemon listening on `listen`: by `name` when it listens on every address."""
    host = name if listen.host in ("0.0.0.0", "::", "") else str(listen).rsplit(":", 1)[0]
    return f"{scheme}://{host}:{listen.port}"
